# cdc-sync developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SOAK_ARGS ?= --changes 100000
BENCH_ARGS ?=
PGSYNC_ARGS ?=
DOCUMENTS_ARGS ?=

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

bootstrap: ## install Debian packages the local stack needs (postgresql, redis-server, JDK 17) when root
	@bash infra/bootstrap.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: bootstrap $(STAMP) ## bootstrap + virtualenv with the project and its dev/test/local extras

demo: install ## run the demo: local stack, demo schema, capture, sync, mixed workload, report
	$(BIN)/cdc-sync demo

test: install ## run every test: unit, integration and end-to-end on the local stack
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: install ## unit tests only (no services)
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

lint: install ## ruff + mypy + import contracts (layers only point down)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy benchmarks
	PYTHONPATH=sync_jobs:connectors:infra $(BIN)/lint-imports

bench: install ## benchmarks: Kafka source read rate, end-to-end (BENCH_ARGS, e.g. --quick), nested documents beside pgsync (DOCUMENTS_ARGS), search frozen (FREEZE_ARGS)
	@echo "== benchmarks/bench_kafka_source.py"
	$(BIN)/python benchmarks/bench_kafka_source.py
	@echo "== benchmarks/bench_e2e.py $(BENCH_ARGS)"
	PYTHONPATH=. $(BIN)/python benchmarks/bench_e2e.py $(BENCH_ARGS)
	@echo "== benchmarks/bench_documents.py $(DOCUMENTS_ARGS)"
	PYTHONPATH=. $(BIN)/python benchmarks/bench_documents.py $(DOCUMENTS_ARGS)
	@echo "== benchmarks/bench_freeze.py $(FREEZE_ARGS)"
	PYTHONPATH=. $(BIN)/python benchmarks/bench_freeze.py $(FREEZE_ARGS)

bench-pgsync: install ## cdc-sync beside pgsync (own venv in .cdc-sync): same rows, workload, probes; ratios (PGSYNC_ARGS)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_pgsync.py $(PGSYNC_ARGS)

bench-freeze: install ## search frozen 60 s at 20 changes/s: Redis and Delta p50/p99 beside the same without a freeze (FREEZE_ARGS)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_freeze.py $(FREEZE_ARGS)

bench-documents: install ## nested documents (shop_order_documents) beside pgsync's nested schema: build, freshness, fan-out, Postgres load (DOCUMENTS_ARGS)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_documents.py $(DOCUMENTS_ARGS)

soak: install ## adversarial soak: ~100k changes; job, capture and Connect worker kill -9, capture restart, search freeze, cache loss (SOAK_ARGS)
	PYTHONPATH=sync_jobs:connectors:infra:. $(BIN)/python -m tests.adversarial.soak $(SOAK_ARGS)

stack-up: install ## start the local stack (Postgres, broker, search, Redis) on loopback ports
	$(BIN)/cdc-sync stack up

stack-down: ## stop exactly what stack-up started
	$(BIN)/cdc-sync stack down

clean: ## remove the virtualenv and local state
	rm -rf $(VENV) .cdc-sync .pytest_cache .mypy_cache .ruff_cache

.PHONY: help bootstrap install demo test test-unit lint bench bench-pgsync bench-freeze bench-documents soak stack-up stack-down clean
