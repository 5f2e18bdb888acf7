"""The load tests' pure code."""
