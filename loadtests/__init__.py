"""Load tests: wrk benchmarks, Locust profiles and the baseline apps they compare with."""
