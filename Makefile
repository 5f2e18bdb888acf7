# Quickstart: `make run` serves the gateway, `make test` runs the whole suite.
# Each sets up what it needs: the virtualenv, the install, Redis and PostgreSQL.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# One virtualenv, two stamps: `make run` installs what serving needs
# (SERVING); the test and benchmark targets install the dev and bench extras
# too, in one resolution (STAMP: all of it; the test suite runs Locust and
# loadtests/ too). Not named BASE: `make ab BASE=<rev>` takes that name.
SERVING := $(VENV)/.serving
STAMP   := $(VENV)/.installed
# Every install takes its versions from the lock (uv's resolution of pyproject.toml,
# every extra, for Python 3.11): CI, the image and `make run` get the same set.
# `make lock` refreshes it after pyproject.toml changes, keeping the versions that
# still fit; `make lock LOCK_ARGS=--upgrade` moves every package to its newest.
LOCK    := requirements.lock
UV      := uv==0.13.9
# `make run`'s admin token and admission secret, unless the environment sets them.
GATEWAY_ADMIN_TOKEN ?= dev-admin-token
GATEWAY_ADMISSION_SECRET ?= dev-admission-secret
GATEWAY_PAYMENT_TOKEN ?= dev-payment-token
# make run publishes the order events to the RabbitMQ services.sh made sure of
# (not exported: the tests choose their own broker, vhost and exchange).
GATEWAY_EVENTS_AMQP_URL ?= amqp://guest:guest@127.0.0.1:5672/

export GATEWAY_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/flashsale
export GATEWAY_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: run test check lint typecheck pytest services bench locust chaos audit clean compare ab lock

$(SERVING): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c $(LOCK) -e .
	touch $@

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev,bench]'
	touch $(SERVING) $@

lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(UV)
	$(BIN)/uv pip compile -q pyproject.toml --all-extras --python-version 3.11 \
		--custom-compile-command 'make lock' $(LOCK_ARGS) -o $(LOCK)

services:
	@bash scripts/services.sh

# Every feature out of the box: admin routes, and waiting rooms (their tokens
# are signed with the dev admission secret). Set either variable to override it.
run: $(SERVING) services
	@echo "admin token:      $(GATEWAY_ADMIN_TOKEN)  (Authorization: Bearer $(GATEWAY_ADMIN_TOKEN))"
	@echo "admission secret: $(GATEWAY_ADMISSION_SECRET)  (signs waiting-room admission tokens; dev only)"
	@echo "payment token:    $(GATEWAY_PAYMENT_TOKEN)  (pay and cancel orders: Authorization: Bearer $(GATEWAY_PAYMENT_TOKEN))"
	@echo "waiting-room page: http://127.0.0.1:$${GATEWAY_PORT:-8080}/wait/demo?user_id=alice"
	@echo "order events:     Redis stream flashsale:events; RabbitMQ exchange flashsale.events at $(GATEWAY_EVENTS_AMQP_URL); a webhook with GATEWAY_WEBHOOK_URL and GATEWAY_WEBHOOK_SECRET (docs/events.md)"
	$(BIN)/flashsale-gateway migrate
	GATEWAY_ADMIN_TOKEN='$(GATEWAY_ADMIN_TOKEN)' GATEWAY_ADMISSION_SECRET='$(GATEWAY_ADMISSION_SECRET)' \
		GATEWAY_PAYMENT_TOKEN='$(GATEWAY_PAYMENT_TOKEN)' GATEWAY_EVENTS_AMQP_URL='$(GATEWAY_EVENTS_AMQP_URL)' \
		exec $(BIN)/flashsale-gateway serve --demo

lint: $(STAMP)
	$(BIN)/ruff check gateway tests loadtests testkit
	$(BIN)/ruff format --check gateway tests loadtests testkit
	@bash scripts/module_size.sh

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite starts Python processes by the hundred (gateways, writers, commands,
# pytest runs of its own). Where the environment sets PYTHONDONTWRITEBYTECODE
# (this machine's image does), every one of them compiled the project's modules
# again, and each pytest process rewrote every test module's asserts: the tests
# write their bytecode (to the ignored __pycache__ folders) and read it after.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/pytest

# One worker more than cores, a test file each at a time (a file's servers and
# module fixtures stay in one process): the suite mostly waits, on servers,
# faults and leases, so a third worker fills two cores' idle time (2 cores:
# 8:07 with two workers, 6:59 with three, the cores then 85 % busy). A fourth
# gained 10-20 s, but with a core burned the contract's two runs then took 97 s
# of the 115 their budget allows (tests/e2e/contract.py).
# The 15 slowest tests are printed at the end, for whoever speeds it up next.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
pytest: $(STAMP) services
	$(PYTEST) -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=15

test: lint typecheck pytest

# The inner loop: lint, types and the unit tests (no servers needed).
check: lint typecheck
	$(PYTEST) -q -p no:cacheprovider tests/unit loadtests/tests/unit

chaos: $(STAMP) services
	$(PYTEST) -q -p no:cacheprovider tests/chaos

audit: $(SERVING) services
	$(BIN)/flashsale-gateway audit $(if $(SKU),--sku $(SKU))

# The wrk bench, then the whole stack on one core, relay on and off (issue 42;
# BENCH_STACK=0 skips it). BENCH_QUICK=1: 2 rounds of 3 s each, to check it fast.
bench: $(STAMP) services
	@bash scripts/bench_tools.sh
	$(BIN)/python -m loadtests.bench
	test "$${BENCH_STACK:-1}" = 0 || $(BIN)/python -m loadtests.bench_stack

# This checkout against another revision, round by round: make ab BASE=<rev>
# (AB_ARGS: --paths sold_out,in_stock --rounds 8 --seconds 2).
ab: $(STAMP) services
	@bash scripts/bench_tools.sh
	$(BIN)/python -m loadtests.bench_ab --base $(BASE) $(AB_ARGS)

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
