#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_durations.py tests/test_words.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_durations.py b/tests/test_durations.py
index 6b5a61b..a52bcd1 100644
--- a/tests/test_durations.py
+++ b/tests/test_durations.py
@@ -4,3 +4,8 @@ from humanfmt import naturaldelta
 def test_naturaldelta_single_units():
     assert naturaldelta(1) == "1 second"
     assert naturaldelta(3600 + 60) == "1 hour and 1 minute"
+
+
+def test_naturaldelta_plural_units():
+    assert naturaldelta(3725) == "1 hour and 2 minutes"
+    assert naturaldelta(0) == "0 seconds"
diff --git a/tests/test_words.py b/tests/test_words.py
index 3a44794..e59acb0 100644
--- a/tests/test_words.py
+++ b/tests/test_words.py
@@ -15,3 +15,8 @@ def test_join_words():
     assert join_words([]) == ""
     assert join_words(["tea"]) == "tea"
     assert join_words(["tea", "milk", "sugar"], "or") == "tea, milk or sugar"
+
+
+def test_pluralize_many_includes_count():
+    assert pluralize(3, "file") == "3 files"
+    assert pluralize(0, "child", "children") == "0 children"

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_durations.py tests/test_words.py tests/test_sizes.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_durations.py tests/test_words.py
