"""Chaos suite: real Redis, Sentinel, PostgreSQL and gateway processes, broken on purpose.

The infrastructure lives beside the scenarios: ``servers`` (private servers on
free ports), ``proxy`` (a TCP fault proxy), ``gateways`` (gateway
subprocesses), ``driver`` (retrying clients) and ``invariants`` (what must hold
in PostgreSQL afterwards).
"""
