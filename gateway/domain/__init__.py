"""The domain: purchases, orders, outcomes, errors and sale rules, as pure values.

No I/O, and no import from any other layer of the gateway: every layer above
speaks in these types.
"""
