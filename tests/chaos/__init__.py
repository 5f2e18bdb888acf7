"""Chaos suite: real Redis, Sentinel, PostgreSQL and gateway processes, broken on purpose.

The servers, the fault proxy, the gateway subprocesses, the load driver and
the invariants live in ``testkit`` (shared with the integration, e2e and
load tests). Here: ``stacks`` (the topologies), ``sale`` (one sale with a fault
in its middle), ``checks``, ``faults`` (aimed faults) and ``reporting``.
"""
