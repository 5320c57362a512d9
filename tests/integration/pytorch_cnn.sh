# SPDX-License-Identifier: Apache-2.0
# The pytorch-cnn example, short, as a user runs it (scripts/fedbox-local
# --example pytorch-cnn): 4 workers on Dirichlet(0.5) shards of
# Fashion-MNIST, secure aggregation on, each worker's training done by a
# PyTorch trainer process (examples/pytorch-cnn/train.py, python/fedbox);
# the coordinator knows the CNN only by the file `python -m fedbox init`
# wrote (model.arch: init).
# Two rounds of a few steps: every worker's update is in every round, the
# exported model loads strictly into the example's nn.Module and, in an
# independent PyTorch evaluation on the test set, is well above chance
# (10%). Then the same with torchrun: 2 workers whose trainers are 2
# DistributedDataParallel processes each (gloo on the CPU), rank 0 talking
# to the worker. Federated evaluation: the 4 workers hold parts of the
# first 1000 test images as validation data; the final model's federated
# evaluation (the evaluation-only final round) agrees with evaluate.py's
# on those 1000 within 0.2 points. Skipped where the Python has no torch.
source tests/integration/lib.sh
export FEDBOX_BIN=$ROOT/$B
"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (Debian: python3-torch)"

check_run() { # OUT WORKERS ROUNDS WORLD [VALID-COUNT]
	local out=$1 n=$2 rounds=$3 world=$4 valid=${5:-0}
	"$PY" - "$out" "$n" "$rounds" "$valid" <<'PYEOF' || fail "run in $out is wrong"
import json, sys
out, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
valid = int(sys.argv[4])
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
ev = json.load(open(out + "/evaluation.json"))
if valid:
    fin = rows.pop()
    assert fin.get("final") and fin["status"] == "ok", fin
    fe = fin["fed_eval"]
    assert fe["examples"] == valid and fe["workers"] == n, fe
    assert ev["count"] == valid, ev
    for r in rows:
        assert r["fed_eval"]["examples"] == valid, r
    d = abs(fe["accuracy"] - ev["accuracy"])
    print("final model: federated %.4f, independent %.4f on %d test "
          "images (difference %.2g)" % (fe["accuracy"], ev["accuracy"],
                                        valid, d))
    assert d <= 0.002, "federated and independent evaluations differ by %g" % d
assert len(rows) == rounds, rows
for r in rows:
    assert r["status"] == "ok" and r["participants"] == n, r
    assert r["secure_aggregation"]["included"] == n, r
    assert all(w["backend"].startswith("process: ") for w in r["workers"]), r
assert ev["count"] == (valid or 10000), ev
assert ev["accuracy"] > 0.2, "accuracy %.4f is not above chance" % ev["accuracy"]
print("rounds ok, %d of %d workers each; independent evaluation: %.2f%%" % (
    n, n, 100 * ev["accuracy"]))
PYEOF
	for ((i = 0; i < n; i++)); do
		grep -Eq "trainer: pid [0-9]+ connected \(world size $world\)" \
			"$out/worker-$i.log" || fail "worker-$i: no trainer of world size $world"
		grep -q "training failed" "$out/worker-$i.log" &&
			fail "worker-$i: a training failed"
	done
	return 0
}

start=$(date +%s)
scripts/fedbox-local --example pytorch-cnn --python "$PY" --workers 4 \
	--rounds 2 --steps 6 --batch 32 --lr 0.05 --alpha 0.5 --secure on \
	--valid-count 1000 --deadline 120s --port "$(free_port)" --out "$T/cnn" \
	>"$T/cnn.txt" 2>&1 || { st=$?; cat "$T/cnn.txt"; fail "fedbox-local exited with $st"; }
cat "$T/cnn.txt"
check_run "$T/cnn" 4 2 1 1000
# The coordinator knew the model from the file the run wrote with the
# model's own code (no plug-in), and each worker checked its own copy.
grep -q '^  arch: init$' "$T/cnn/configs/coordinator.yaml" ||
	fail "the coordinator's model is not read from an init file"
[ -f "$T/cnn/model.init.safetensors" ] || fail "no model.init.safetensors"
grep -q 'model init (857738 params)\|model init .*857738 params' "$T/cnn/coordinator.log" ||
	fail "the coordinator did not read the 857,738-parameter CNN from the file"
echo "4 workers: $(( $(date +%s) - start ))s"

start=$(date +%s)
scripts/fedbox-local --example pytorch-cnn --python "$PY" --workers 2 \
	--torchrun 2 --rounds 1 --steps 4 --batch 32 --lr 0.05 --secure on \
	--valid-count 0 \
	--deadline 120s --port "$(free_port)" --out "$T/ddp" \
	>"$T/ddp.txt" 2>&1 || { st=$?; cat "$T/ddp.txt"; tail -n 30 "$T"/ddp/worker-*.log; fail "fedbox-local --torchrun exited with $st"; }
cat "$T/ddp.txt"
check_run "$T/ddp" 2 1 2
echo "torchrun: $(( $(date +%s) - start ))s"
echo PASS
