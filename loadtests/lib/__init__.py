"""The load tests' library: targets and their harness, wrk and the open-loop driver, the
benches' and the comparison's parts. Commands are the modules of ``loadtests/``."""
