# Quickstart: `make run` serves the gateway, `make test` runs the whole suite.
# Each sets up what it needs: the virtualenv, the install, Redis and PostgreSQL.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEV_TOKEN ?= dev-admin-token

export GATEWAY_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/flashsale
export GATEWAY_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: run test check lint typecheck pytest services bench locust chaos audit clean compare ab

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

services:
	@bash scripts/services.sh

run: $(STAMP) services
	@echo "admin token: $(DEV_TOKEN)  (Authorization: Bearer $(DEV_TOKEN))"
	@echo "waiting-room page: http://127.0.0.1:$${GATEWAY_PORT:-8080}/wait/demo?user_id=alice"
	$(BIN)/flashsale-gateway migrate
	GATEWAY_ADMIN_TOKEN=$(DEV_TOKEN) $(BIN)/flashsale-gateway serve --demo

lint: $(STAMP)
	$(BIN)/ruff check gateway tests loadtests
	$(BIN)/ruff format --check gateway tests loadtests
	@bash scripts/module_size.sh

typecheck: $(STAMP)
	$(BIN)/mypy

# The 15 slowest tests are printed at the end, for whoever speeds the suite up next.
pytest: $(STAMP) services
	$(BIN)/pytest -q -p no:cacheprovider --durations=15

test: lint typecheck pytest

# The inner loop: lint, types and the unit tests (no servers needed).
check: lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

chaos: $(STAMP) services
	$(BIN)/pytest -q -p no:cacheprovider tests/chaos

audit: $(STAMP) services
	$(BIN)/flashsale-gateway audit $(if $(SKU),--sku $(SKU))

bench: $(STAMP) services
	@bash scripts/bench_tools.sh
	$(BIN)/python -m loadtests.bench

# This checkout against another revision, round by round: make ab BASE=<rev>
# (AB_ARGS: --paths sold_out,in_stock --rounds 8 --seconds 2).
ab: $(STAMP) services
	@bash scripts/bench_tools.sh
	$(BIN)/python -m loadtests.ab --base $(BASE) $(AB_ARGS)

locust: $(STAMP) services
	$(BIN)/python -m loadtests.locust_run

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
	git clean -fqX loadtests/results

# Every deduction strategy x lock family under the same wrk load and three faults
# (none, a stalled lock holder, a Redis failover / ZooKeeper session expiry);
# writes loadtests/results/compare.json and docs/strategies.md (+ .png).
compare: $(STAMP) services
	@bash scripts/bench_tools.sh
	$(BIN)/python -m loadtests.compare $(COMPARE_ARGS)
