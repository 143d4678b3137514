#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_profiles.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_profiles.py b/tests/test_profiles.py
index 51b38ec..c78a4ef 100644
--- a/tests/test_profiles.py
+++ b/tests/test_profiles.py
@@ -19,3 +19,13 @@ def test_profiles_lists_default_and_named():
 
 def test_get_profile_inherits_default():
     assert get_profile(parse(CONFIG), "dev") == {"region": "eu-central-1", "output": "json"}
+
+
+def test_profile_names_are_kept_whole():
+    config = parse("[profile prod]\nregion = us-west-2\n[profile europe]\nregion = eu-west-1\n")
+    assert sorted(profiles(config)) == ["europe", "prod"]
+
+
+def test_get_profile_by_full_name():
+    config = parse(CONFIG + "\n[profile prod]\nregion = us-west-2\n")
+    assert get_profile(config, "prod") == {"region": "us-west-2", "output": "json"}

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_profiles.py tests/test_parser.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_profiles.py
