# SPDX-License-Identifier: Apache-2.0
# A coordinator and 3 workers, 3 rounds over TCP loopback: accuracy rises,
# the outputs are complete, the exported model evaluates independently to
# the reported accuracy, and a second run with the workers started in the
# opposite order produces a bitwise-identical model (order independence).
source tests/integration/lib.sh

run_federation() { # DIR ORDER...
	local dir=$1
	shift
	local port
	port=$(free_port)
	mkdir -p "$dir"
	coord_yaml "$port" "$dir" "  rounds: 3
  min_workers: 3
  local_steps: 60
  batch_size: 32
  lr: 0.05" >"$dir/c.yaml"
	OUT=$dir
	start_coordinator "$dir/c.yaml"
	for i in "$@"; do
		worker_yaml "$port" "$i" 3 >"$dir/w$i.yaml"
		start_worker "$dir/w$i.yaml" "w$i"
		sleep 0.3
	done
	wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
}

run_federation "$T/a" 0 1 2
cp "$T/rounds.txt" "$T/a/rounds.txt"
cat "$T/a/rounds.txt"
OUT=$T/a
[ "$(wc -l <"$OUT/metrics.jsonl")" -eq 3 ] || fail "metrics.jsonl should have 3 lines"
for k in round participants test_accuracy test_loss seconds bytes_up bytes_down; do
	metric 3 "$k" >/dev/null || fail "metrics.jsonl lacks $k"
done
[ "$(metric 3 participants)" = 3 ] || fail "round 3 should have 3 participants"
a1=$(metric 1 test_accuracy)
a3=$(metric 3 test_accuracy)
"$PY" -c "import sys; sys.exit(0 if $a3 > $a1 + 0.02 else 1)" ||
	fail "accuracy did not rise: round 1 $a1, round 3 $a3"
echo "accuracy: round 1 $a1 -> round 3 $a3"

# The model file, read by an independent numpy implementation.
ev=$("$PY" tests/tools/st_eval.py "$OUT/model.safetensors") || fail "st_eval failed"
echo "independent evaluation: $ev"
"$PY" - "$ev" "$a3" <<'PYEOF' || fail "independent accuracy differs from metrics.jsonl"
import json, sys
ev = json.loads(sys.argv[1])
assert abs(ev["test_accuracy"] - float(sys.argv[2])) <= 0.002, (ev, sys.argv[2])
PYEOF
grep -q '"fedbox.preprocessing"' "$OUT/model.safetensors" ||
	fail "model metadata lacks the preprocessing"

# Same seeds, workers started in the opposite order: the same tensors.
run_federation "$T/b" 2 1 0
same_tensors "$T/a/model.safetensors" "$T/b/model.safetensors" ||
	fail "models differ between runs"
echo PASS
