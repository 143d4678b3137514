#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 987d881d0cafd43ba0e403e4c9cd4b45e25e022f
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout 987d881d0cafd43ba0e403e4c9cd4b45e25e022f tests/test_more.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_more.py b/tests/test_more.py
index 15efdaf..2f3fb59 100644
--- a/tests/test_more.py
+++ b/tests/test_more.py
@@ -3347,6 +3347,10 @@ class SeekableTest(PeekableMixinTests, TestCase):
         self.assertEqual(next(s), '2')
         s.relative_seek(-2)
         self.assertEqual(next(s), '1')
+        s.relative_seek(-2)
+        self.assertEqual(
+            next(s), '0'
+        )  # Seek relative to current position within the cache
         s.relative_seek(-10)  # Lower bound
         self.assertEqual(next(s), '0')
         s.relative_seek(10)  # Lower bound

EOF_114329324912
: '>>>>> Start Test Output'
pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_more.py
: '>>>>> End Test Output'
git checkout 987d881d0cafd43ba0e403e4c9cd4b45e25e022f tests/test_more.py
