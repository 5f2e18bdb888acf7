"""The load tests' own tests: they import ``loadtests`` and ``testkit``, never ``tests``."""
