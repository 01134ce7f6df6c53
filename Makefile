# cronstream — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INFRA_RECORD := $(VENV)/.infra-started-by-make

.DEFAULT_GOAL := help
.PHONY: help install dev test test-unit test-integration test-e2e bench lint schemas infra-up infra-down clean chaos chaos-short

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(BIN)/cronstream: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	@touch $@

install: $(BIN)/cronstream ## Create the virtualenv and install cronstream with its test tools

dev: install ## Run everything: Kafka, PostgreSQL, all services, the examples and a live view
	$(BIN)/cronstream dev

infra-up: install ## Start the local Kafka broker and PostgreSQL (if nothing answers)
	$(BIN)/cronstream infra up

infra-down: install ## Stop what `infra up` started
	$(BIN)/cronstream infra down

test: install ## The whole suite (unit, integration, e2e) against real Kafka and PostgreSQL
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; \
	$(BIN)/pytest tests/unit -q || status=$$?; \
	if [ $$status -eq 0 ]; then $(BIN)/pytest tests/integration tests/e2e -q || status=$$?; fi; \
	$(BIN)/cronstream infra down --recorded $(INFRA_RECORD); \
	exit $$status

test-unit: install ## Unit tests only (no servers)
	$(BIN)/pytest tests/unit -q

test-integration: install ## Integration and e2e tests (servers must be up: make infra-up)
	$(BIN)/pytest tests/integration tests/e2e -q

bench: install ## Benchmarks (figures printed and written to bench/results/)
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; $(BIN)/python -m bench.run_all || status=$$?; \
	$(BIN)/cronstream infra down --recorded $(INFRA_RECORD); exit $$status

lint: install ## ruff and mypy
	$(BIN)/ruff check cronstream shared services tests bench
	$(BIN)/mypy cronstream shared services

schemas: install ## Regenerate the JSON Schemas in schemas/ from the models
	$(BIN)/python -m cronstream.shared.schemagen schemas

clean: ## Remove the virtualenv and caches (not the infra data)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

CHAOS_RUNS ?= 5

chaos: install ## The chaos suite (own servers; faults under load), $(CHAOS_RUNS) runs in a row: fails on any failure
	@since=$$(date -u +%Y-%m-%dT%H:%M:%S); status=0; \
	for run in $$(seq 1 $(CHAOS_RUNS)); do \
		echo "=== chaos run $$run of $(CHAOS_RUNS)"; \
		$(BIN)/pytest tests/chaos -m chaos -p no:cacheprovider -q -rA || { status=1; break; }; \
	done; \
	$(BIN)/python -m tests.chaos.summary --since $$since; exit $$status

chaos-short: install ## The short form of the chaos suite: a few faults, short windows (~5 min)
	@since=$$(date -u +%Y-%m-%dT%H:%M:%S); status=0; \
	CRONSTREAM_CHAOS_SHORT=1 $(BIN)/pytest tests/chaos -m chaos_short -p no:cacheprovider -q -rA \
		|| status=$$?; \
	$(BIN)/python -m tests.chaos.summary --since $$since; exit $$status
