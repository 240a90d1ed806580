# One command per task. Every target but gpu-check sets up what it needs from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints/ci.txt
CLIENTS := .venv-clients
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS)
ARGS ?=

.PHONY: help run test lint bench gpu-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip

# Stamps re-run the install whenever the project's dependencies change.
$(VENV)/.run-stamp: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[serve]'
	@touch $@

$(VENV)/.test-stamp: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test,lint]'
	@touch $@

$(VENV)/.bench-stamp: $(VENV)/.test-stamp
	$(PIP) -e '.[test,lint,peers]'
	@touch $@

run: $(VENV)/.run-stamp  ## the main job: serve the embedded demo model (seed-mlp) on 127.0.0.1:8000
	$(BIN)/torchplace serve $(ARGS)

test: $(VENV)/.test-stamp  ## run the whole test suite (KServe's and MLServer's clients in venvs of their own)
	@scripts/client-venvs $(CLIENTS)
	TORCHPLACE_KSERVE_PYTHON="$${TORCHPLACE_KSERVE_PYTHON:-$$(cat $(CLIENTS)/kserve.python 2>/dev/null)}" \
	TORCHPLACE_MLSERVER_PYTHON="$${TORCHPLACE_MLSERVER_PYTHON:-$$(cat $(CLIENTS)/mlserver.python 2>/dev/null)}" \
		$(BIN)/python -m pytest $(ARGS)

lint: $(VENV)/.test-stamp  ## ruff, mypy (strict on the package) and torchplace lint on the tree
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/torchplace lint .

bench: $(VENV)/.bench-stamp  ## run every benchmark in benchmarks/ side by side with its peers
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; } || \
		echo "wrk is missing: install it (Debian: apt-get install wrk) for benchmarks/serve_vs_peers.py"
	@failed=0; for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b $(ARGS) || failed=1; done; exit $$failed

gpu-check:  ## on a machine with a GPU, with its own python3 and CUDA torch: the cuda tests and the GPU benchmarks, summary in out/gpu-check
	PYTHON=$(PYTHON) scripts/gpu-check

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) $(CLIENTS) .pytest_cache .mypy_cache .ruff_cache
