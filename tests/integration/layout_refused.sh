# SPDX-License-Identifier: Apache-2.0
# A model known by its layout alone, and a worker whose model differs.
# The coordinator reads a small PyTorch model (Linear, BatchNorm1d, a lone
# parameter `temperature`) from the file `python -m fedbox init` wrote
# (model.arch: init), with no model code; the BatchNorm running
# statistics are in the file and federated, num_batches_tracked is not. Four workers with
# PyTorch trainer processes (tests/tools/layout_trainer.py), secure
# aggregation on:
#   w0, w1: the same model, train.init their own copy of its file;
#   w2: a model whose `temperature` is [2], not [1], and train.init its
#       own file: it refuses the run at the welcome, naming that tensor on
#       each side, exits with status 2, and the coordinator logs why;
#   w3: the same other model without train.init: admitted, its trainer's
#       load_into raises LayoutError naming the tensor, each round.
# Both rounds commit with w0 and w1, and the exported model holds the
# layout's tensors. Skipped where the Python has no torch.
source tests/integration/lib.sh
"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (Debian: python3-torch)"
make_keys 4
port=$(free_port)
OUT=$T/out

mkdir -p "$T/a" "$T/b"
for side in a b; do
	width=1
	[ "$side" = b ] && width=2
	cat >"$T/$side/net.py" <<PYEOF
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 10)
        self.temperature = nn.Parameter(torch.ones($width))

    def forward(self, x):
        h = torch.relu(self.bn(self.fc1(x)))
        return self.fc2(h) / self.temperature.mean()
PYEOF
	PYTHONPATH=$ROOT/python "$PY" -m fedbox init "$T/$side/net.py:Net" \
		-o "$T/$side/model.init.safetensors" --seed 5 >"$T/$side/init.txt" ||
		fail "fedbox init of model $side failed"
done
cat "$T/a/init.txt"
cp "$T/a/model.init.safetensors" "$T/coord.init.safetensors"

coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 3
  min_updates: 2
  local_steps: 4
  batch_size: 16
  lr: 0.05
  deadline: 60s
  wait_for_workers: 90s" >"$T/c.yaml"
# The model: its layout and initial values, from the file.
sed -i "s|^  arch: mlp|  arch: init\n  init: $T/coord.init.safetensors|; /^  hidden: \[32\]/d" "$T/c.yaml"
printf 'evaluation:\n  every: 0\n' >>"$T/c.yaml"
start_coordinator "$T/c.yaml"

trainer() { # SIDE [INIT]
	echo "  command: [$PY, $ROOT/tests/tools/layout_trainer.py, $T/$1/net.py]
  env: [PYTHONPATH=$ROOT/python]
  share_shard: true
  start_timeout: 90s${2:+
  init: $2}"
}
cp "$T/a/model.init.safetensors" "$T/w0.init"
cp "$T/a/model.init.safetensors" "$T/w1.init"
worker_yaml "$port" 0 4 "$(trainer a "$T/w0.init")" >"$T/w0.yaml"
worker_yaml "$port" 1 4 "$(trainer a "$T/w1.init")" >"$T/w1.yaml"
worker_yaml "$port" 2 4 "$(trainer b "$T/b/model.init.safetensors")" >"$T/w2.yaml"
worker_yaml "$port" 3 4 "$(trainer b)" >"$T/w3.yaml"
declare -A WP
# w2 first, alone: admitted, it counts towards round.min_workers until it
# refuses, so with the others connected a round could start with it and
# without w0 or w1; and once w0, w1 and w3 are in, the two short rounds
# can end before a slow w2 (under the sanitizers) is even welcomed. Alone
# it is below min_workers: no round starts until it is gone.
start_worker "$T/w2.yaml" w2
WP[2]=$WPID

# w2 refuses at its welcome, before any round, and ends with status 2.
st=0
wait_exit "${WP[2]}" 60 || st=$?
[ "$st" -eq 2 ] || { tail -n 20 "$T/w2.log"; fail "w2 exited with status $st, want 2"; }
want='refusing the coordinator.s run: tensor 0 is "temperature" \[1\] F32 in the coordinator.s model but "temperature" \[2\] F32 in this worker.s'
grep -Eq "$want" "$T/w2.log" || { cat "$T/w2.log"; fail "w2: no line matching: $want"; }
grep -q "train.init $T/b/model.init.safetensors describes another model" "$T/w2.log" ||
	fail "w2: the log does not name its train.init file"
grep -q 'round 1' "$T/w2.log" && fail "w2 took part in a round"
echo "w2: $(grep -Eo "$want" "$T/w2.log")"
for i in 0 1 3; do
	start_worker "$T/w$i.yaml" "w$i"
	WP[$i]=$WPID
done

wait_exit "$CPID" 240 || { tail -n 30 "$T/coord.log"; fail "coordinator exited with status $?"; }
cat "$T/rounds.txt"
for i in 0 1 3; do
	wait_exit "${WP[$i]}" 30 || fail "worker w$i exited with status $?"
done
# The coordinator saw the refusal, with its reason, and forgot w2.
grep -Eq 'worker w2 refuses this run: its model.s layout differs: tensor 0 is "temperature" \[1\] F32' "$T/coord.log" ||
	{ cat "$T/coord.log"; fail "the coordinator did not log w2's refusal"; }
grep -q 'worker w2 removed: refused the run' "$T/coord.log" ||
	fail "the coordinator did not forget w2"
grep -q 'model init 784-16-10 (12795 params)' "$T/coord.log" ||
	fail "the coordinator did not read the model from its file"
# w3, without train.init, was admitted; its trainer refused the layout.
want3="round 1: the trainer failed: fedbox.client.LayoutError: tensor 'temperature' is \[1\] in the federation's model but \[2\] in yours"
grep -Eq "$want3" "$T/w3.log" || { tail -n 20 "$T/w3.log"; fail "w3: no line matching: $want3"; }
echo "w3: $(grep -Eo "$want3" "$T/w3.log" | head -1)"

"$PY" - "$OUT" <<'PYEOF' || fail "rounds or the exported model are wrong"
import json, sys
sys.path.insert(0, "python")
from fedbox import safetensors
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
assert len(rows) == 2, rows
for r in rows:
    assert r["status"] == "ok", r
    assert r["participants"] == 2, r
sd = safetensors.load_numpy(out + "/model.safetensors")
init = safetensors.load_numpy(sys.argv[1] + "/../coord.init.safetensors")
# the rule: float buffers in the layout, integer ones left to each box
assert "bn.running_var" in init and "bn.num_batches_tracked" not in init
assert sorted(sd) == sorted(init), (sorted(sd), sorted(init))
assert "bn.running_mean" in sd and "bn.num_batches_tracked" not in sd
assert sd["temperature"].shape == (1,)
# training moved the parameters and the averaged running statistics
assert abs(sd["fc1.weight"] - init["fc1.weight"]).max() > 0
assert abs(sd["bn.running_mean"] - init["bn.running_mean"]).max() > 0
print("2 rounds of 2 workers; model.safetensors: %d tensors of the layout"
      % len(sd))
PYEOF
echo PASS
