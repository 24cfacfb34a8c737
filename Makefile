# The two commands of the README: `make demo` and `make test`.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast test-repeat lint services-start services-stop benchmarks

# The suite runs in parallel: most crawl tests wait on pages, leases and polls, not on the
# CPU; each worker has its own Redis, FerretDB and fork server (tests/conftest.py).
WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -n $(WORKERS) --dist worksteal

setup:
	deploy/setup.sh

demo: setup
	$(BIN)/python -m tests.site.demo

test: setup
	$(PYTEST)

# The edit loop: everything but the tests that start crawls, shops or scrapyd.
test-fast: setup
	$(PYTEST) -m "not crawl"

# On demand: the multi-node crawl tests where races live, 10 times each, failures per test.
test-repeat: setup
	$(BIN)/python -m tests.repeat --count 10

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

services-start: setup
	$(BIN)/fleetcrawl services start

services-stop: setup
	$(BIN)/fleetcrawl services stop
