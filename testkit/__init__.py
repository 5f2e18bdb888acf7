"""Test support shared by tests/ and loadtests/: ports, processes, polling,
private servers, the fault proxy, gateway subprocesses, the load driver, the
invariants and HTTP helpers. Plain code, no fixtures: conftest files build
their fixtures from it.

A package of its own, beside both suites, so that neither imports the other.
Like them it is imported from the repository's root (pytest's rootdir, or the
working directory of ``python -m loadtests.<command>``) and is not in the
wheel, which ships ``gateway`` alone.
"""
