#!/usr/bin/env bash
# A newcomer's first run, measured: a fresh clone of this repository's HEAD and no cache of any kind (the project's
# POLAR_CACHE, pip's, npm's and uv's caches all new and empty), then `make demo`. System packages already installed
# stay installed (on a fresh machine apt adds bubblewrap and socat: ~10 s). Prints the wall time last.
# Usage: scripts/first_run.sh [WORKDIR]   (default: a new directory under $TMPDIR; removed unless KEEP=1)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-$(mktemp -d "${TMPDIR:-/tmp}/polar-first-run.XXXXXX")}
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
git clone -q "$ROOT" "$work/nemo_polar"
export POLAR_CACHE=$work/cache PIP_CACHE_DIR=$work/pip-cache npm_config_cache=$work/npm-cache UV_CACHE_DIR=$work/uv-cache
start=$EPOCHREALTIME
(cd "$work/nemo_polar" && make demo)
took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
echo "first run: make demo from a fresh clone with empty caches on $(nproc) cores: $((took / 60)) min $((took % 60)) s"
