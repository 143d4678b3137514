#!/bin/bash
set -uxo pipefail
git checkout HEAD tests/test_bucket.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_bucket.py b/tests/test_bucket.py
index 8a31a86..d540f81 100644
--- a/tests/test_bucket.py
+++ b/tests/test_bucket.py
@@ -28,3 +28,20 @@ def test_refill_is_capped_at_capacity():
 def test_invalid_rate():
     with pytest.raises(ValueError):
         TokenBucket(rate=0)
+
+
+def test_less_than_one_token_per_second():
+    clock = ManualClock()
+    bucket = TokenBucket(rate=1, per=60, clock=clock)
+    assert bucket.try_acquire()
+    clock.advance(59)
+    assert not bucket.try_acquire()
+    clock.advance(2)
+    assert bucket.try_acquire()
+
+
+def test_wait_time_with_fractional_rate():
+    clock = ManualClock()
+    bucket = TokenBucket(rate=3, per=2, clock=clock)
+    assert bucket.try_acquire(3)
+    assert bucket.wait_time() == pytest.approx(2 / 3)

EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA -p no:cacheprovider tests/test_bucket.py tests/test_keyed.py
: '>>>>> End Test Output'
git checkout HEAD tests/test_bucket.py
