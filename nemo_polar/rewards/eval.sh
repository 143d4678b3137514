#!/bin/bash
# Evaluation in a fresh sandbox: apply the model patch, put the test patch over pristine test files, run the
# tests between the markers swebench's log parser expects. Placeholders are filled in by grader.py.
exec 2>&1
set -uo pipefail
cd "$POLAR_WORKSPACE"
if ! git apply -v /polar/eval/model.patch; then
  if ! patch --batch --fuzz=5 -p1 -i /polar/eval/model.patch; then
    echo "polar: model patch does not apply"
    echo ">>>>> Patch Apply Failed"
    exit 0
  fi
fi
# Whatever the agent did to the files the test patch touches is undone first.
while IFS= read -r f; do
  [ -z "$f" ] && continue
  if git cat-file -e HEAD:"$f" 2>/dev/null; then git checkout -q HEAD -- "$f"; else rm -rf -- "$f"; fi
done < /polar/eval/test_files.txt
if [ -s /polar/eval/test.patch ] && ! git apply -v /polar/eval/test.patch; then
  echo "polar: test patch does not apply"
  echo ">>>>> Patch Apply Failed"
  exit 0
fi
if [ -s /polar/eval/setup.sh ]; then bash /polar/eval/setup.sh; fi
echo ">>>>> Start Test Output"
timeout -k 5 "$POLAR_TEST_TIMEOUT" bash /polar/eval/test.sh
rc=$?
echo ">>>>> End Test Output"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo ">>>>> Tests Timed Out"; fi
echo ">>>>> Test Exit Code: $rc"
