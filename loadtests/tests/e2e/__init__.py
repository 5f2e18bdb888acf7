"""The load tests against a real gateway."""
