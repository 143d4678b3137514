#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff ae76206be70dd3f54622dbe5a41db268a8408fb2
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout ae76206be70dd3f54622dbe5a41db268a8408fb2 sympy/core/tests/test_basic.py
git apply -v - <<'EOF_114329324912'
diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py
index faa27b9f22..09947a0b1c 100644
--- a/sympy/core/tests/test_basic.py
+++ b/sympy/core/tests/test_basic.py
@@ -34,6 +34,12 @@ def test_structure():
     assert bool(b1)
 
 
+def test_immutable():
+    assert not hasattr(b1, '__dict__')
+    with raises(AttributeError):
+        b1.x = 1
+
+
 def test_equality():
     instances = [b1, b2, b3, b21, Basic(b1, b1, b1), Basic]
     for i, b_i in enumerate(instances):

EOF_114329324912
: '>>>>> Start Test Output'
PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose sympy/core/tests/test_basic.py
: '>>>>> End Test Output'
git checkout ae76206be70dd3f54622dbe5a41db268a8408fb2 sympy/core/tests/test_basic.py
