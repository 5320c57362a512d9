# SPDX-License-Identifier: Apache-2.0
# python/fedbox on its own (tests/tools/fedbox_py_test.py, unittest): the
# safetensors writer against the reader, `python -m fedbox init` and
# `layout` on the pytorch-cnn model, which tensors a model federates, the
# layout checks' messages, the wire format's checks, the evaluation
# report (task.report_eval, fedbox.evaluate), the torchrun mend.
# The torch parts are skipped where the Python has no torch.
source tests/integration/lib.sh
"$PY" -c 'import numpy' 2>/dev/null || skip "$PY has no numpy"
"$PY" tests/tools/fedbox_py_test.py 2>&1 | tee "$T/out.txt"
grep -q '^OK' "$T/out.txt" || fail "python/fedbox tests failed"
echo PASS
