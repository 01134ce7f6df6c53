# cronstream — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INFRA_RECORD := $(VENV)/.infra-started-by-make

.DEFAULT_GOAL := help
.PHONY: help install chromium promtool pyright tools dev test test-unit test-integration test-e2e test-image bench bench-side-by-side bench-shards lint schemas reference dashboards infra-up infra-down clean ui-screenshots chaos chaos-short

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(BIN)/cronstream: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# setuptools warns on every editable install that a folder of the package's name sits in
	@# the working directory: it does, by design; a newcomer's first screen says what runs.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[test,lint,deploy]'
	@touch $@

install: $(BIN)/cronstream ## Create the virtualenv and install cronstream with its test tools

# The browser tests drive Debian's Chromium (Playwright's own browser download does not
# work everywhere); installed once, a no-op when present.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium: ## Install Debian's Chromium for the browser tests (once)
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium for the browser tests"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# promtool (checks deploy/prometheus/): the one in PATH, else taken from Debian's
# `prometheus` package without installing it (no server is set up or started).
$(BIN)/promtool: | $(BIN)/cronstream
	@if command -v promtool >/dev/null; then ln -sf "$$(command -v promtool)" $@; else \
	  tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null && apt-get download prometheus >/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool $(CURDIR)/$@ && \
	  cd / && rm -rf $$tmp; fi
	@$@ --version | head -1

promtool: $(BIN)/promtool ## Fetch promtool (for the Prometheus rules' tests)

# pyright (what editors run; tests/integration/test_static_tools.py) from the npm registry,
# at this version, into the virtualenv: fetched here once, never by the tests.
PYRIGHT_VERSION := 1.1.390
PYRIGHT := $(VENV)/pyright/node_modules/.bin/pyright
$(PYRIGHT): | $(BIN)/cronstream
	@command -v npm >/dev/null || { echo "npm (Node.js) is missing: it installs pyright for the tests (apt-get install nodejs npm)" >&2; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/pyright pyright@$(PYRIGHT_VERSION)
	@$@ --version

pyright: $(PYRIGHT) ## Fetch pyright, at the pinned version (for the static tools' test)

# What the suite needs besides the servers (which `cronstream infra up` starts from Java,
# Maven and PostgreSQL's binaries, and says which is missing): installed where a package
# has it — Chromium and promtool from Debian's release, pyright at a pinned version from
# npm — else named with how to get it, before any test runs.
tools: chromium $(BIN)/promtool $(PYRIGHT) ## Install every tool `make test` needs, or say which is missing and how to get it
	@command -v kubectl >/dev/null || { echo "kubectl is missing: the manifests' tests render deploy/k8s with 'kubectl kustomize'; install kubectl 1.27 or later (Kubernetes' apt repository, or your cloud SDK's)" >&2; exit 1; }

dev: install ## Run everything: Kafka, PostgreSQL, all services, the examples and a live view
	$(BIN)/cronstream dev

infra-up: install ## Start the local Kafka broker and PostgreSQL (if nothing answers)
	$(BIN)/cronstream infra up

infra-down: install ## Stop what `infra up` started
	$(BIN)/cronstream infra down

test: install tools ## The whole suite (unit, integration, e2e, deploy, browser, security, short chaos) against real Kafka and PostgreSQL
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; \
	$(BIN)/pytest tests/unit -q || status=$$?; \
	if [ $$status -eq 0 ]; then $(BIN)/pytest tests/integration tests/e2e tests/deploy tests/browser tests/security -q --durations=25 || status=$$?; fi; \
	$(BIN)/cronstream infra down --recorded $(INFRA_RECORD); \
	if [ $$status -eq 0 ]; then $(MAKE) --no-print-directory chaos-short || status=$$?; fi; \
	exit $$status

test-unit: install ## Unit tests only (no servers)
	$(BIN)/pytest tests/unit -q

test-integration: install tools ## Integration, e2e, deploy, browser and security tests (servers must be up: make infra-up)
	$(BIN)/pytest tests/integration tests/e2e tests/deploy tests/browser tests/security -q

test-image: install ## Build the container image with buildah and run the end-to-end test from it (root)
	@command -v buildah >/dev/null && command -v debootstrap >/dev/null || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah debootstrap)
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; CRONSTREAM_TEST_IMAGE=1 $(BIN)/pytest tests/deploy/test_image.py -q -s || status=$$?; \
	$(BIN)/cronstream infra down --recorded $(INFRA_RECORD); exit $$status

ui-screenshots: install chromium ## Refresh the dashboard screenshots in docs/ui/ (servers must be up)
	CRONSTREAM_UI_SCREENSHOTS=1 $(BIN)/pytest tests/browser -q

bench: install ## Benchmarks (figures printed, written to bench/results/ and docs/benchmarks.md)
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; $(BIN)/python -m bench.run_all || status=$$?; $(BIN)/python -m bench.report; \
	$(BIN)/cronstream infra down --recorded $(INFRA_RECORD); exit $$status

bench-side-by-side: install ## This tree against BEFORE=<a checkout with its .venv>, cell by cell (docs/benchmarks.md)
	@test -n "$(BEFORE)" || { echo "BEFORE=<path of a checkout of the tree before, with its .venv>"; exit 2; }
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; BENCH_BEFORE_TREE=$(BEFORE) $(BIN)/python -m bench.side_by_side || status=$$?; \
	$(BIN)/python -m bench.report; $(BIN)/cronstream infra down --recorded $(INFRA_RECORD); exit $$status

bench-shards: install ## The clock in shards at 1M and 10M definitions (bench/shards.py; ~35 min)
	@$(BIN)/cronstream infra up --record $(INFRA_RECORD)
	@status=0; for n in 1000000 10000000; do BENCH_DEFINITIONS=$$n $(BIN)/python -m bench.shards || status=$$?; done; \
	$(BIN)/python -m bench.report; $(BIN)/cronstream infra down --recorded $(INFRA_RECORD); exit $$status

lint: install ## ruff and mypy
	$(BIN)/ruff check cronstream shared services tests bench examples deploy/grafana
	$(BIN)/mypy
	$(BIN)/mypy examples deploy/grafana/generate.py

schemas: install ## Regenerate the JSON Schemas in schemas/ from the models
	$(BIN)/python -m cronstream.shared.schemagen schemas

reference: install ## Regenerate the generated parts of docs/reference/ from the code
	$(BIN)/python -m cronstream.refgen docs/reference

dashboards: install ## Regenerate the Grafana dashboards in deploy/grafana/dashboards/
	$(BIN)/python deploy/grafana/generate.py

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
	CRONSTREAM_CHAOS_SHORT=1 $(BIN)/pytest tests/chaos -m chaos_short -p no:cacheprovider -q -rfE \
		|| status=$$?; \
	$(BIN)/python -m tests.chaos.summary --since $$since; exit $$status
