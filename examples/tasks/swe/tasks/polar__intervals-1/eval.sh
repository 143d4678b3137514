#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_ops.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_ops.py b/tests/test_ops.py
index 11025e8..1dc39c3 100644
--- a/tests/test_ops.py
+++ b/tests/test_ops.py
@@ -22,3 +22,12 @@ def test_gaps():
 def test_reversed_interval_is_rejected():
     with pytest.raises(ValueError):
         merge([(3, 1)])
+
+
+def test_merge_empty():
+    assert merge([]) == []
+
+
+def test_total_length_and_gaps_of_nothing():
+    assert total_length([]) == 0
+    assert gaps(iter([])) == []

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_ops.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_ops.py
