#!/bin/bash
# Evaluation in a fresh sandbox (grader.py fills in the files). First, with no repository code running: apply the
# model patch as swebench's harness does, undo what it did to the test files and the test infrastructure
# (guard.py), apply the test patch; these messages start with the grader's one-time $POLAR_TAG, and the grader
# reads them only up to the first that ends this part ("ready" or a failure), so nothing printed later can pass
# for them. Then the tests between SWE-bench's log markers, which only this script prints; the exit status is the
# test command's.
#  - a row with its own eval script (POLAR_ROW_EVAL): the script's setup part (environment, test files reset,
#    test patch) in this shell, as swebench runs it (set -uxo pipefail), then its test command in a child shell
#    with what the setup set exported, under the test timeout;
#  - otherwise: the instance's setup command, then its test command on the test files.
# What runs before the start marker cannot print a marker: every ">>>>>" in its output is defused.
# Repository code writes to a file, printed afterwards: a process it leaves behind cannot hold this command's
# output open (docker exec waits for that) and turn a finished run into a timeout.
exec 2>&1
set -uo pipefail
cd "$POLAR_WORKSPACE"
eval_dir=/polar/eval

say() { echo "$POLAR_TAG $*"; }
defuse() { sed 's/>>>>>/>>>>|/g'; }

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
if [ "${POLAR_GUARD:-on}" = off ]; then scope=(--tests-only); fi
"$py" -I -S "$eval_dir/guard.py" revert "$state" --tag "$POLAR_TAG" --test-files "$eval_dir/test_files.txt" \
  "${scope[@]}"
case $? in
  0) ;;
  2) exit 0 ;;  # the patch wrote into .git: the guard said so
  *) say guard_failed; exit 0 ;;
esac
if [ -s "$eval_dir/test.patch" ] && ! git apply -v "$eval_dir/test.patch"; then say test_patch_failed; exit 0; fi
say ready

# Repository code from here on.
if [ -n "${POLAR_ROW_EVAL:-}" ]; then
  # Both parts in this shell (the setup's environment reaches the tests), each writing to a file printed after it.
  exec 3>&1
  out=$(mktemp)
  exec >"$out" 2>&1 </dev/null
  set -a  # what the setup assigns is exported: the tests run in a child shell, under the test timeout
  set -x
  # shellcheck disable=SC1091
  source "$eval_dir/row_setup.sh"
  set +x +a
  exec 1>&3 2>&3
  defuse <"$out"
  echo ">>>>> Start Test Output"
  out=$(mktemp)  # a new file: a process the setup left behind still holds the old one
  exec >"$out" 2>&1 </dev/null
  timeout -k 5 "$POLAR_TEST_TIMEOUT" bash -uxo pipefail "$eval_dir/test.sh"
  rc=$?
  exec 1>&3 2>&3
  cat "$out"
else
  if [ -s "$eval_dir/setup.sh" ]; then captured bash "$eval_dir/setup.sh" | defuse; fi
  echo ">>>>> Start Test Output"
  captured timeout -k 5 "$POLAR_TEST_TIMEOUT" bash "$eval_dir/test.sh"
  rc=$?
fi
echo ">>>>> End Test Output"
echo ">>>>> Test Exit Code: $rc"
exit "$rc"
