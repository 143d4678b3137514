#!/bin/bash
# Evaluation in a fresh sandbox (grader.py fills in the files). First, with no repository code running: apply the
# model patch as swebench's harness does, undo what it did to the test files and the test infrastructure
# (guard.py), apply the test patch; these messages start with the grader's one-time $POLAR_TAG, and the grader
# reads them only up to the first that ends this part ("ready" or a failure), so nothing printed later can pass
# for them. Then the tests between SWE-bench's log markers, which only this script prints; the exit status is the
# test command's.
#  - a row with its own eval script (POLAR_ROW_EVAL): the script's setup part (environment, test files reset,
#    test patch) in this shell, as swebench runs it (set -uxo pipefail), then its test command in a subshell of
#    it (the same variables, exported or not, and functions), in a process group of its own under the test timeout;
#  - otherwise: the instance's setup command, then its test command on the test files.
# The grader's variables (POLAR_*) leave the environment first: no process started here inherits them, so the
# code under test sees the environment swebench's harness gives it, nothing of ours.
# What runs before the start marker cannot print a marker: every ">>>>>" in its output is defused.
# Repository code writes to a file, printed afterwards: a process it leaves behind cannot hold this command's
# output open (docker exec waits for that) and turn a finished run into a timeout.
exec 2>&1
set -uo pipefail
__polar_tag=$POLAR_TAG __polar_timeout=$POLAR_TEST_TIMEOUT __polar_row=${POLAR_ROW_EVAL:-}
__polar_guard=${POLAR_GUARD:-on} __polar_workspace=$POLAR_WORKSPACE
unset POLAR_TAG POLAR_TEST_TIMEOUT POLAR_ROW_EVAL POLAR_GUARD POLAR_WORKSPACE
cd "$__polar_workspace"
eval_dir=/polar/eval

say() { echo "$__polar_tag $*"; }
__polar_defuse() { sed 's/>>>>>/>>>>|/g'; }

captured() {
  local out rc
  out=$(mktemp)
  "$@" >"$out" 2>&1 </dev/null
  rc=$?
  cat "$out"
  return "$rc"
}

# The guard needs a Python 3 (standard library only); SWE-bench images may have it only in conda.
py=""
for candidate in python3 /opt/miniconda3/bin/python3 /opt/miniconda3/envs/testbed/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1; then py=$candidate; break; fi
done
if [ -z "$py" ]; then echo "no python3 in the evaluation sandbox"; say snapshot_failed; exit 0; fi

state=$(mktemp -d)
if ! "$py" -I "$eval_dir/guard.py" snapshot "$state"; then say snapshot_failed; exit 0; fi
# swebench's order (run_evaluation.GIT_APPLY_CMDS): each on a pristine tree, then the reverse check.
applied=""
first=1
while IFS= read -r cmd; do
  if [ -z "$first" ]; then git checkout -- . >/dev/null 2>&1; git clean -fd >/dev/null 2>&1; fi
  first=""
  if $cmd "$eval_dir/model.patch"; then applied=1; break; fi
done <"$eval_dir/apply_cmds.txt"
if [ -z "$applied" ] && git apply --check --reverse "$eval_dir/model.patch" 2>/dev/null; then applied=1; fi
if [ -z "$applied" ]; then say model_patch_failed; exit 0; fi
scope=(--targets "$eval_dir/targets.txt" --test-command "$eval_dir/test.sh")
if [ "$__polar_guard" = off ]; then scope=(--tests-only); fi
"$py" -I -S "$eval_dir/guard.py" revert "$state" --tag "$__polar_tag" --test-files "$eval_dir/test_files.txt" \
  "${scope[@]}"
case $? in
  0) ;;
  2) exit 0 ;;  # the patch wrote into .git: the guard said so
  *) say guard_failed; exit 0 ;;
esac
if [ -s "$eval_dir/test.patch" ] && ! git apply -v "$eval_dir/test.patch"; then say test_patch_failed; exit 0; fi
say ready

# Repository code from here on.
# __polar_run_tests SCRIPT: source it in a subshell with a process group of its own, killed whole at the test timeout
# (exit status 124 then, as timeout(1) gives).
__polar_run_tests() {
  local tests watchdog flag rc
  flag=$(mktemp -u)
  set -m
  (__polar_script=$1; set --; set -uxo pipefail; source "$__polar_script") &
  tests=$!
  (sleep "$__polar_timeout"; touch "$flag"; kill -TERM -- -"$tests"; sleep 5; kill -KILL -- -"$tests") >/dev/null 2>&1 &
  watchdog=$!
  wait "$tests"
  rc=$?
  kill -KILL -- -"$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  set +m
  if [ -e "$flag" ]; then rc=124; rm -f "$flag"; fi
  return "$rc"
}
if [ -n "$__polar_row" ]; then
  # Both parts in this shell (the setup's variables reach the tests), each writing to a file printed after it.
  exec 3>&1
  out=$(mktemp)
  exec >"$out" 2>&1 </dev/null
  set -x
  # shellcheck disable=SC1091
  source "$eval_dir/row_setup.sh"
  set +x
  exec 1>&3 2>&3
  __polar_defuse <"$out"
  echo ">>>>> Start Test Output"
  out=$(mktemp)  # a new file: a process the setup left behind still holds the old one
  exec >"$out" 2>&1 </dev/null
  __polar_run_tests "$eval_dir/test.sh"
  rc=$?
  exec 1>&3 2>&3
  cat "$out"
else
  if [ -s "$eval_dir/setup.sh" ]; then captured bash "$eval_dir/setup.sh" | __polar_defuse; fi
  echo ">>>>> Start Test Output"
  captured timeout -k 5 "$__polar_timeout" bash "$eval_dir/test.sh"
  rc=$?
fi
echo ">>>>> End Test Output"
echo ">>>>> Test Exit Code: $rc"
exit "$rc"
