#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_reader.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_reader.py b/tests/test_reader.py
index 50f02bc..963f5d6 100644
--- a/tests/test_reader.py
+++ b/tests/test_reader.py
@@ -17,3 +17,11 @@ def test_read_records(tmp_path):
     path = tmp_path / "people.csv"
     path.write_text("name,city\nZoë,Málaga\n\nBo,Oslo\n", encoding="utf-8")
     assert read_records(path) == [{"name": "Zoë", "city": "Málaga"}, {"name": "Bo", "city": "Oslo"}]
+
+
+def test_read_records_with_byte_order_mark(tmp_path):
+    path = tmp_path / "export.csv"
+    path.write_bytes(b"\xef\xbb\xbfid,name\r\n1,Ann\r\n2,Ben\r\n")
+    records = read_records(path)
+    assert list(records[0]) == ["id", "name"]
+    assert [record["id"] for record in records] == ["1", "2"]

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_reader.py tests/test_convert.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_reader.py
