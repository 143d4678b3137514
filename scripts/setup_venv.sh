#!/usr/bin/env bash
# The project venv (.venv): the package in editable mode with its dev extras. Rebuilt when pyproject.toml changes.
# uv installs it (pip only bootstraps uv): uv links the wheels from its cache where pip copies and byte-compiles the
# venv's ~1.8 GB, so a clean clone's venv takes ~20 s instead of ~130 s. Its cache is the one NeMo Gym's server venv
# builds use ($POLAR_CACHE/uv).
set -euo pipefail
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
export UV_CACHE_DIR=${UV_CACHE_DIR:-${POLAR_CACHE:-$HOME/.cache/nemo_polar}/uv}
stamp=$VENV/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  echo "venv: $VENV (cached)"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet uv
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -e '.[dev]'
touch "$stamp"
echo "venv: $VENV"
