#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_match.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_match.py b/tests/test_match.py
index cbc5ce5..f4964c7 100644
--- a/tests/test_match.py
+++ b/tests/test_match.py
@@ -21,3 +21,12 @@ def test_character_classes():
 def test_filter_keeps_order_and_match_any():
     assert filter_paths(["b.py", "a.txt", "a.py"], "*.py") == ["b.py", "a.py"]
     assert match_any("docs/index.md", ["*.py", "docs/*"])
+
+
+def test_star_does_not_match_a_longer_name():
+    assert not match("setup.pyc", "*.py")
+    assert filter_paths(["a.py", "a.pyc", "a.py.bak"], "*.py") == ["a.py"]
+
+
+def test_star_does_not_descend_into_directories():
+    assert not match("src/pkg/mod.py", "src/*")

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_match.py tests/test_translate.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_match.py
