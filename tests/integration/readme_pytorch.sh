# SPDX-License-Identifier: Apache-2.0
# The README's PyTorch snippet, extracted from README.md (so the two cannot
# drift) and run as written with Debian's python3-torch, against a model a
# real federation exported (hidden width 32, not the demo's 128: the
# snippet must read it from the file). Then the network it built is
# evaluated on the Fashion-MNIST test set: its accuracy must be the one
# metrics.jsonl reports for the last round.
source tests/integration/lib.sh
"$PY" -c 'import torch' 2>/dev/null ||
	skip "PyTorch is not installed for $PY (Debian's python3-torch; scripts/bootstrap installs it)"

port=$(free_port)
OUT=$T/runs/demo
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 2
  local_steps: 40
  batch_size: 32" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 2 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"

# The fenced block after the marker line.
awk '/^<!-- tests\/integration\/readme_pytorch.sh runs this block/ {m = 1; next}
     m == 1 && /^```python$/ {m = 2; next}
     m == 2 && /^```$/ {exit}
     m == 2 {print}' README.md >"$T/snippet.py"
[ "$(wc -l <"$T/snippet.py")" -ge 5 ] || fail "no snippet found in README.md"
grep -q 'runs/demo/model.safetensors' "$T/snippet.py" || fail "the snippet does not read runs/demo/model.safetensors"

(cd "$T" && PYTHONPATH="$ROOT/python" "$PY" snippet.py) >"$T/snippet.out" 2>&1 ||
	{ cat "$T/snippet.py" "$T/snippet.out"; fail "the README's snippet failed"; }
cat "$T/snippet.out"
grep -q 'x = (pixel / 255 - 0\.2860[0-9]*) / 0\.35299[0-9]*' "$T/snippet.out" || fail "no preprocessing line printed"
grep -Eq '^class [0-9]$' "$T/snippet.out" || fail "no class printed"

(cd "$T" && PYTHONPATH="$ROOT/python" "$PY" - "$T/snippet.py" "$OUT/metrics.jsonl" \
	"${FB_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}") <<'PYEOF' || fail "the snippet's network"
import gzip, json, sys
import numpy as np
import torch
snippet, metrics, data = sys.argv[1:]
ns = {}
exec(compile(open(snippet).read(), snippet, "exec"), ns)
net = ns["net"]
assert ns["hidden"] == 32 and ns["inputs"] == 784, (ns["hidden"], ns["inputs"])

def idx(path, offset):
    return np.frombuffer(gzip.open(path).read()[offset:], dtype=np.uint8)

x = idx(data + "/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)
y = idx(data + "/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)
x = (torch.from_numpy(x.astype(np.float32)) / 255 - 0.2860) / 0.3530
with torch.no_grad():
    acc = (net(x).argmax(1).numpy() == y).mean()
want = [json.loads(l) for l in open(metrics)][-1]["test_accuracy"]
print("PyTorch accuracy %.4f, metrics.jsonl %.4f" % (acc, want))
# float32 sums in another order may flip an example that sits on a tie
assert abs(acc - want) <= 3e-4, (acc, want)
PYEOF
echo PASS
