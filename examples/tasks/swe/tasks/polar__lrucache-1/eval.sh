#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_cache.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cache.py b/tests/test_cache.py
index a83a298..5162b5b 100644
--- a/tests/test_cache.py
+++ b/tests/test_cache.py
@@ -21,3 +21,21 @@ def test_put_overwrites_and_counts_hits():
 def test_capacity_must_be_positive():
     with pytest.raises(ValueError):
         LRUCache(0)
+
+
+def test_put_evicts_least_recently_used_at_capacity():
+    cache = LRUCache(2)
+    for key in "abc":
+        cache.put(key, key.upper())
+    assert len(cache) == 2
+    assert cache.keys() == ["b", "c"]
+
+
+def test_get_protects_entry_from_eviction():
+    cache = LRUCache(2)
+    cache.put("a", 1)
+    cache.put("b", 2)
+    cache.get("a")
+    cache.put("c", 3)
+    assert "a" in cache
+    assert "b" not in cache

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_cache.py tests/test_memo.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_cache.py
