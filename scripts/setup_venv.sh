#!/usr/bin/env bash
# The project venv (.venv): the package in editable mode with its dev extras. Rebuilt when pyproject.toml changes.
set -euo pipefail
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp=$VENV/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  echo "venv: $VENV (cached)"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet -e '.[dev]'
touch "$stamp"
echo "venv: $VENV"
