# The two commands of the README: `make demo` and `make test`.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint services-start services-stop benchmarks

setup:
	deploy/setup.sh

demo: setup
	$(BIN)/python -m tests.site.demo

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

services-start: setup
	$(BIN)/fleetcrawl services start

services-stop: setup
	$(BIN)/fleetcrawl services stop
