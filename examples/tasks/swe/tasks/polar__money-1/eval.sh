#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_common_currencies.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_common_currencies.py b/tests/test_common_currencies.py
new file mode 100644
index 0000000..a1a945f
--- /dev/null
+++ b/tests/test_common_currencies.py
@@ -0,0 +1,10 @@
+from money import decimals, format_minor, to_minor
+
+
+def test_most_currencies_have_two_decimals():
+    assert decimals("usd") == 2
+    assert to_minor("12.345", "EUR") == 1235
+
+
+def test_format_dollars_and_cents():
+    assert format_minor(123456, "USD") == "1,234.56 USD"

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_common_currencies.py tests/test_amount.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_common_currencies.py
