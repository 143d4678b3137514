#!/usr/bin/env bash
# step.sh NAME COMMAND...: one setup step, named and timed. Its output (pip, npm, apt...) goes to
# $POLAR_CACHE/logs/setup/NAME.log; one line is printed: the step's name, its own last line (which says "(cached)"
# when there was nothing to do) and how long it took. On failure: the log's tail and its path.
set -uo pipefail
name=$1
shift
logs=${POLAR_CACHE:-$HOME/.cache/nemo_polar}/logs/setup
mkdir -p "$logs"
log=$logs/$name.log
start=$EPOCHREALTIME
# A file, not a pipe: a daemon a step starts (dockerd) keeps its descriptors, and must not hold this step open.
"$@" >"$log" 2>&1 </dev/null
rc=$?
took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
said=$(grep -v '^WARNING: \|^ *$' "$log" | tail -n 1)
if [ "$rc" -ne 0 ]; then
  tail -n 30 "$log" >&2
  printf '%-12s FAILED after %s s (exit %s); log: %s\n' "$name" "$took" "$rc" "$log" >&2
  exit "$rc"
fi
printf '%-12s %6s s  %s\n' "$name" "$took" "${said:-done}"
