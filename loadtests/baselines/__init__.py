"""The baselines the gateway is benchmarked against: a bare aiohttp app and a naive
implementation, each a server a bench starts (``python -m loadtests.baselines.<name>``)."""
