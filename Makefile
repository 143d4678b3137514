# nemo_polar — the two commands a new user runs: `make demo` and `make test`.
# `make setup` is idempotent and cached: the project venv (.venv), the vLLM engine venv, the offline models and
# the pinned coding CLIs under $(POLAR_CACHE) (default ~/.cache/nemo_polar), and the sandbox tools (bwrap, socat).

PYTHON ?= python3
POLAR_CACHE ?= $(HOME)/.cache/nemo_polar
export POLAR_CACHE
VENV := .venv
BIN := $(VENV)/bin
ENGINE_PY = $(shell $(BIN)/python -c 'from nemo_polar.engine.launcher import engine_python; print(engine_python())')

.PHONY: setup venv engine models system harnesses task-env test lint demo bench clean

setup: venv engine models system harnesses task-env docker

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

# The docker runtime (bwrap is the default): docker.io, a dockerd with no bridge and no iptables rules, and the
# sandbox image built from a debootstrapped Debian, no registry needed. Idempotent; needs root the first time.
.PHONY: docker
docker:
	bash scripts/setup_docker.sh

# The coding CLIs at their pinned versions, installed once into $(POLAR_CACHE)/harnesses (mounted read-only).
harnesses: venv
	$(BIN)/python -m nemo_polar.env.harness

# The Python environment the bundled SWE-style tasks are tested in (system Python 3 + pinned pytest).
task-env:
	bash scripts/setup_task_env.sh

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
	$(BIN)/python -m bench.grade

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
