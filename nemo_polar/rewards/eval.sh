#!/bin/bash
# Evaluation in a fresh sandbox (grader.py fills in the files). First, with no repository code running: apply the
# model patch, undo what it did to the test files and the test infrastructure (guard.py), apply the test patch;
# these messages start with the grader's one-time $POLAR_TAG, and the grader reads them only up to the first that
# ends this part ("ready" or a failure), so nothing printed later can pass for them. Then the setup command and
# the tests between SWE-bench's log markers; the exit status is the test command's.
# Repository code writes to a file, printed afterwards: a process it leaves behind cannot hold this command's
# output open (docker exec waits for that) and turn a finished run into a timeout.
exec 2>&1
set -uo pipefail
cd "$POLAR_WORKSPACE"
eval_dir=/polar/eval

say() { echo "$POLAR_TAG $*"; }

captured() {
  local out rc
  out=$(mktemp)
  "$@" >"$out" 2>&1 </dev/null
  rc=$?
  cat "$out"
  return "$rc"
}

state=$(mktemp -d)
if ! python3 -I "$eval_dir/guard.py" snapshot "$state"; then say snapshot_failed; exit 0; fi
if ! git apply -v "$eval_dir/model.patch"; then
  if ! patch --batch --fuzz=5 -p1 -i "$eval_dir/model.patch"; then say model_patch_failed; exit 0; fi
fi
scope=(--targets "$eval_dir/targets.txt" --test-command "$eval_dir/test.sh")
if [ "${POLAR_GUARD:-on}" = off ]; then scope=(--tests-only); fi
python3 -I -S "$eval_dir/guard.py" revert "$state" --tag "$POLAR_TAG" --test-files "$eval_dir/test_files.txt" \
  "${scope[@]}"
case $? in
  0) ;;
  2) exit 0 ;;  # the patch wrote into .git: the guard said so
  *) say guard_failed; exit 0 ;;
esac
if [ -s "$eval_dir/test.patch" ] && ! git apply -v "$eval_dir/test.patch"; then say test_patch_failed; exit 0; fi
say ready

# Repository code from here on. The setup command's output cannot pass for SWE-bench's markers either.
if [ -s "$eval_dir/setup.sh" ]; then captured bash "$eval_dir/setup.sh" | sed 's/^>>>>>/ &/'; fi
echo ">>>>> Start Test Output"
captured timeout -k 5 "$POLAR_TEST_TIMEOUT" bash "$eval_dir/test.sh"
rc=$?
echo ">>>>> End Test Output"
echo ">>>>> Test Exit Code: $rc"
exit "$rc"
