#!/usr/bin/env bash
# The Python environment the bundled SWE-style tasks run their tests in: the system Python 3 (visible inside
# every sandbox under /usr) plus a pinned pytest. Mounted read-only into agent and evaluation sandboxes.
set -euo pipefail
env_dir="${POLAR_CACHE:-$HOME/.cache/nemo_polar}/envs/py3-pytest"
pytest_version="9.0.2"
if [ -x "$env_dir/bin/python" ] && "$env_dir/bin/python" -c "import pytest, sys; sys.exit(pytest.__version__ != '$pytest_version')"; then
  echo "task env: $env_dir (cached)"
  exit 0
fi
rm -rf "$env_dir"
/usr/bin/python3 -m venv "$env_dir"
"$env_dir/bin/pip" install --quiet --disable-pip-version-check "pytest==$pytest_version"
echo "task env: $env_dir"
