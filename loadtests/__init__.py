"""Load tests: wrk benchmarks, Locust profiles and the baseline apps they compare with.

Each module here is a command (``python -m loadtests.<name>``): ``bench`` and
``bench_<subject>`` measure, ``compare`` runs the strategies x locks
comparison, ``locust_run`` runs Locust, ``profile_hotspots`` profiles. Their
library is ``lib/``, the baseline servers they start ``baselines/``, and the
tests of both ``tests/``.
"""
