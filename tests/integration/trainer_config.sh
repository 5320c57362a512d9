# SPDX-License-Identifier: Apache-2.0
# Trainer-process settings that cannot work are refused when the worker
# starts (exit 2, naming the key): a program that is not there or cannot
# run, an empty argument, train.env entries that are not NAME=VALUE, and
# trainer-only keys without train.command. Trainers that never get going
# fail a round, not the worker: one that exits before it connects, and one
# that never connects (train.start_timeout); the worker stays up and says
# which, round after round. One slower to start than a round is not killed
# when the round is cancelled: it trains a later round.
source tests/integration/lib.sh

expect2() { # DESCRIPTION PATTERN CONFIG-TRAIN-LINES
	local what=$1 pat=$2 st=0
	worker_yaml 1 0 1 "$3" >"$T/bad.yaml"
	"$B/fedbox-worker" --config "$T/bad.yaml" >"$T/out.txt" 2>&1 || st=$?
	[ "$st" -eq 2 ] || { cat "$T/out.txt"; fail "$what: exit $st, expected 2"; }
	grep -qE -- "$pat" "$T/out.txt" || { cat "$T/out.txt"; fail "$what: message lacks '$pat'"; }
	echo "ok: $what: $(grep -E -- "$pat" "$T/out.txt" | head -1 | sed 's/.*ERROR //')"
}

expect2 "a program not in PATH" \
	'train.command: no-such-trainer-xyz is not found in PATH' \
	"  command: [no-such-trainer-xyz, train.py]"
printf 'print(1)\n' >"$T/plain.py"
chmod 644 "$T/plain.py"
expect2 "a path that is not executable" \
	"train.command: $T/plain.py is not an executable file" \
	"  command: [$T/plain.py]"
expect2 "a relative path resolved in train.workdir" \
	"train.command: $T/./nowhere/run.sh is not an executable file" \
	"  command: [./nowhere/run.sh]
  workdir: $T"
expect2 "an empty argument" 'train.command: entry 1 is empty' \
	"  command: [$PY, \"\"]"
expect2 "train.env without =" 'train.env: "PYTHONPATH" is not NAME=VALUE' \
	"  command: [$PY]
  env: [PYTHONPATH]"
expect2 "share_shard without a command" \
	'train.share_shard is for a trainer process: set train.command too' \
	"  share_shard: true"
expect2 "a bad timeout" 'train.task_timeout' \
	"  command: [$PY]
  task_timeout: 10"

# Trainers that never get going: the rounds fail, the worker stays.
SECAGG=0
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 2
  min_updates: 1
  local_steps: 3
  batch_size: 16
  deadline: 8s
  wait_for_workers: 30s" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
worker_yaml "$port" 0 2 "  command: [/bin/false]" >"$T/w0.yaml"
start_worker "$T/w0.yaml" w0
W0=$WPID
worker_yaml "$port" 1 2 "  command: [/bin/sleep, \"600\"]
  start_timeout: 2s" >"$T/w1.yaml"
start_worker "$T/w1.yaml" w1
W1=$WPID
st=0
wait_exit "$CPID" 60 || st=$?
# no round can commit: exit 1, and no model named
[ "$st" = 1 ] || fail "coordinator exited with status $st, not 1"
wait_exit "$W0" 20 || fail "w0 exited with status $?"
wait_exit "$W1" 20 || fail "w1 exited with status $?"
for r in 1 2; do
	grep -q "round $r: the trainer exited with status 1 before it connected" "$T/w0.log" ||
		fail "w0, round $r: no 'exited with status 1 before it connected'"
	grep -q "round $r: the trainer did not connect within 2s (train.start_timeout)" "$T/w1.log" ||
		fail "w1, round $r: no start timeout"
done
echo "w0: $(grep -m1 'before it connected' "$T/w0.log" | sed 's/.*ERROR //')"
echo "w1: $(grep -m1 'did not connect' "$T/w1.log" | sed 's/.*ERROR //')"

# A trainer slower to start than a round: the rounds it misses are
# cancelled, but it is not killed for it; it connects and trains the
# round after, started once.
port=$(free_port)
OUT=$T/slow
coord_yaml "$port" "$OUT" "  rounds: 4
  min_workers: 2
  min_updates: 1
  local_steps: 3
  batch_size: 16
  deadline: 3s
  wait_for_workers: 30s" >"$T/c2.yaml"
start_coordinator "$T/c2.yaml"
mkdir -p "$T/slowstate"
worker_yaml "$port" 0 2 "  command: [/bin/sh, -c, 'sleep 7; exec $PY $ROOT/tests/tools/fault_trainer.py good $T/slowstate']" >"$T/w3.yaml"
start_worker "$T/w3.yaml" w3
W3=$WPID
worker_yaml "$port" 1 2 >"$T/w4.yaml"
start_worker "$T/w4.yaml" w4
wait_exit "$CPID" 60 || fail "coordinator exited with status $?"
wait_exit "$W3" 20 || fail "w3 exited with status $?"
grep -q 'round 1 cancelled by the coordinator' "$T/w3.log" ||
	fail "w3: no round was cancelled while its trainer started"
[ "$(wc -l <"$T/slowstate/started")" = 1 ] ||
	fail "w3's trainer started $(wc -l <"$T/slowstate/started") times, want 1"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "w3 never trained"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
late = [r["round"] for r in rows if r["participants"] == 2]
assert late and late[-1] == rows[-1]["round"], [r["participants"] for r in rows]
print("slow trainer: in rounds", late, "of", len(rows), "(started once)")
PYEOF
echo PASS
