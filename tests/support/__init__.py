"""Test support shared by tests/ and loadtests/: ports, processes, polling,
private servers, the fault proxy, gateway subprocesses, the load driver, the
invariants and HTTP helpers. Plain code, no fixtures: conftest files build
their fixtures from it."""
