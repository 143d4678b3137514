#!/usr/bin/env bash
# make test's lane with two CPU-bound busy loops beside it (`make test-loaded`): no verdict may depend on how loaded the
# machine is. Arguments go to pytest (e.g. a file, -k, or -x); the loops are ended by their PIDs on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
pids=()
cleanup() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in 1 2; do
  python3 -c 'while True: pass' &
  pids+=($!)
done
echo "busy loops: ${pids[*]}"
.venv/bin/pytest -q -m "not full" "$@"  # a -m among the arguments wins
