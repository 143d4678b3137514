#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_graph.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_graph.py b/tests/test_graph.py
index cd050a3..641ab9a 100644
--- a/tests/test_graph.py
+++ b/tests/test_graph.py
@@ -38,3 +38,23 @@ def test_duplicate_task_is_rejected():
     graph.add("a", [])
     with pytest.raises(ValueError):
         graph.add("a", [])
+
+
+def test_depend_changes_only_that_task():
+    graph = Graph()
+    graph.add("fetch")
+    graph.add("build")
+    graph.add("test")
+    graph.depend("test", "build")
+    assert graph.deps("fetch") == []
+    assert graph.deps("build") == []
+    assert execution_order(graph) == ["build", "fetch", "test"]
+
+
+def test_graphs_do_not_share_dependencies():
+    first = Graph()
+    first.add("a")
+    first.depend("a", "setup")
+    second = Graph()
+    second.add("a")
+    assert second.deps("a") == []

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_graph.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_graph.py
