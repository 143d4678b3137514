# nemo_polar — the two commands a new user runs: `make demo` and `make test`.
# `make setup` is idempotent and cached: the project venv (.venv), the vLLM engine venv, the offline models and
# the pinned coding CLIs under $(POLAR_CACHE) (default ~/.cache/nemo_polar), and the sandbox tools (bwrap, socat).

PYTHON ?= python3
POLAR_CACHE ?= $(HOME)/.cache/nemo_polar
export POLAR_CACHE
VENV := .venv
BIN := $(VENV)/bin
ENGINE_PY = $(shell $(BIN)/python -c 'from nemo_polar.engine.launcher import engine_python; print(engine_python())')

.PHONY: setup venv engine models system harnesses test lint demo bench clean

setup: venv engine models system harnesses

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

engine:
	PYTHON=$(PYTHON) bash scripts/setup_engine.sh

models: venv engine
	$(ENGINE_PY) nemo_polar/engine/build_models.py --out $(POLAR_CACHE)/models

system:
	bash scripts/setup_system.sh

# The coding CLIs at their pinned versions, installed once into $(POLAR_CACHE)/harnesses (mounted read-only).
harnesses: venv
	$(BIN)/python -m nemo_polar.env.harness

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(BIN)/pytest -q

demo: setup
	$(BIN)/python examples/demo.py

bench: setup
	$(BIN)/python -m bench.proxy_overhead
	$(BIN)/python -m bench.stream_ttfb
	$(BIN)/python -m bench.merge

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
