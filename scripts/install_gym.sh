#!/usr/bin/env bash
# NeMo Gym into the project venv: install_gym.sh VERSION. Its metadata requires Python >=3.13.14, but the pure-Python
# wheel imports and serves fine on 3.11: the wheel is fetched as for 3.13.14 and installed without its dependencies
# (the one step that reads Requires-Python), then the requirements it declares are installed for this interpreter,
# scipy capped at the last release with cp311 wheels (newer ones build from source). Skipped once VERSION imports.
set -euo pipefail
VERSION=$1
BIN=${VENV:-.venv}/bin
CACHE=${POLAR_CACHE:-$HOME/.cache/nemo_polar}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE/uv}
if "$BIN/python" -c "import sys, nemo_gym; sys.exit(nemo_gym.__version__ != '$VERSION')" 2>/dev/null; then
  echo "nemo-gym $VERSION (cached)"
  exit 0
fi
wheel=$CACHE/wheels/nemo_gym-$VERSION-py3-none-any.whl
[ -f "$wheel" ] || "$BIN/pip" download --quiet --no-deps --only-binary=:all: --python-version 3.13.14 \
  -d "$CACHE/wheels" "nemo-gym==$VERSION"
uv=("$BIN/uv" pip install --quiet --python "$BIN/python")
"${uv[@]}" --no-deps --python-version 3.13.14 "$wheel"
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$BIN/python" - nemo-gym > "$requirements" <<'PY'
import sys
from importlib.metadata import requires

print("\n".join(r for r in requires(sys.argv[1]) or [] if "extra ==" not in r))
PY
"${uv[@]}" -r "$requirements" "scipy>=1.14.1,<1.17"
echo "nemo-gym $VERSION"
