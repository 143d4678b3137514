#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_compare.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_compare.py b/tests/test_compare.py
index f84cd67..1dc378c 100644
--- a/tests/test_compare.py
+++ b/tests/test_compare.py
@@ -9,3 +9,13 @@ def test_core_parts_compare_numerically():
 def test_prerelease_identifiers():
     ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11"]
     assert [str(v) for v in sort_versions(reversed(ordered))] == ordered
+
+
+def test_release_follows_its_prereleases():
+    assert compare("1.0.0-rc.1", "1.0.0") == -1
+    assert compare("1.0.0", "1.0.0-rc.1") == 1
+
+
+def test_sort_puts_release_after_prereleases():
+    versions = ["1.0.0", "1.0.0-rc.1", "0.9.0", "1.0.0-beta"]
+    assert [str(v) for v in sort_versions(versions)] == ["0.9.0", "1.0.0-beta", "1.0.0-rc.1", "1.0.0"]

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_compare.py tests/test_version.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_compare.py
