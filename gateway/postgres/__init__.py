"""The PostgreSQL adapters: the pool and the migrations of ``sql/``, inventory rows,
orders and the flush (``orders``), and coalesced look-ups of orders.

Driver errors become ``gateway.domain.errors`` here; they import the domain only.
"""
