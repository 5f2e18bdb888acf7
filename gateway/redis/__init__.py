"""The Redis adapters: the client, the Lua scripts' loader and callers, every key's
name (``layout``), reservations and their settlement, the queue strategy's
streams, the waiting rooms and the change feed.

Driver errors become ``gateway.domain.errors`` here. They import the domain and
the lock package only; the change feed tells the layers above through
subscribers the wiring registers.
"""
