#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_paths.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_paths.py b/tests/test_paths.py
index eb55c57..75bbef0 100644
--- a/tests/test_paths.py
+++ b/tests/test_paths.py
@@ -17,3 +17,18 @@ def test_with_value_creates_levels():
 
 def test_flatten():
     assert flatten({"a": {"b": 1, "c": {}}, "d": 2}) == {"a.b": 1, "a.c": {}, "d": 2}
+
+
+def test_with_value_does_not_change_the_original():
+    defaults = {"server": {"tls": {"port": 443}}}
+    changed = with_value(defaults, "server.tls.port", 8443)
+    assert get_path(changed, "server.tls.port") == 8443
+    assert defaults == {"server": {"tls": {"port": 443}}}
+
+
+def test_derived_configs_are_independent():
+    base = {"log": {"level": "info"}}
+    staging = with_value(base, "log.file", "staging.log")
+    prod = with_value(base, "log.level", "warning")
+    assert staging["log"] == {"level": "info", "file": "staging.log"}
+    assert prod["log"] == {"level": "warning"}

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_paths.py tests/test_merge.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_paths.py
