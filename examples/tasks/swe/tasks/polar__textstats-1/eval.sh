#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_stats.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_stats.py b/tests/test_stats.py
index fb2c372..36a7e73 100644
--- a/tests/test_stats.py
+++ b/tests/test_stats.py
@@ -20,3 +20,11 @@ def test_top_words_rejects_negative_n():
 def test_mean_word_length():
     assert mean_word_length("ab abcd") == 3.0
     assert mean_word_length("...") == 0.0
+
+
+def test_top_words_ties_are_alphabetical():
+    assert top_words("pear apple fig", 3) == [("apple", 1), ("fig", 1), ("pear", 1)]
+
+
+def test_top_words_cut_keeps_alphabetical_ties():
+    assert top_words("the dog and the cat", 2) == [("the", 2), ("and", 1)]

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_stats.py tests/test_tokenize.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_stats.py
