# SPDX-License-Identifier: Apache-2.0
# The coordinator's checkpoint: a fedadam federation (encrypted sessions,
# plain aggregation, 2 of 3 workers sampled per round, so the RNG counts
# too) whose coordinator is killed with SIGKILL at random
# moments and resumed with --resume ends with bitwise the model of an
# uninterrupted run, and metrics.jsonl holds each round exactly once, as
# valid JSON, the same as the uninterrupted run's. Then what must be
# refused is: a fresh start on a folder holding a run, a second
# coordinator on the same folder, a corrupt checkpoint; and a killed
# run's temporary files are removed at the next start.
# FB_KILLS (default 4) is how many kills, FB_ROUNDS the rounds (8),
# FB_KILL_AFTER "MIN SPAN" a life's length in seconds, MIN + SPAN x
# uniform(0, 1) ("1 5"),
# FB_RULE the server rule (fedadam), FB_SECAGG=1 secure aggregation (the
# masks cancel exactly and the rounding is seeded, so that is bitwise too);
# tests/faults/chaos.sh runs them all with 50 kills.
SECURE=1
SECAGG=${FB_SECAGG:-0}
source tests/integration/lib.sh
port=$(free_port)
kills=${FB_KILLS:-4}
rounds=${FB_ROUNDS:-8}
read -r kill_min kill_span <<<"${FB_KILL_AFTER:-1 5}"
rule=${FB_RULE:-fedadam}
round_yaml="  rounds: $rounds
  min_workers: 3
  workers_per_round: 2
  min_updates: 2
  local_steps: 150
  batch_size: 32
  deadline: 60s
  wait_for_workers: 2m
  server_lr: ${FB_SERVER_LR:-0.001}
aggregation:
  rule: $rule
  ingest_threads: 1"

run_federation() { # OUT: an uninterrupted run
	coord_yaml "$port" "$1" "$round_yaml" >"$T/c.yaml"
	start_coordinator "$T/c.yaml"
	for i in 0 1 2; do
		worker_yaml "$port" "$i" 3 "  throttle: 1" >"$T/w$i.yaml"
		start_worker "$T/w$i.yaml" "ref-w$i"
	done
	wait_exit "$CPID" 240 || fail "reference run exited with $?"
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	PIDS=()
}

run_federation "$T/ref"
[ "$(wc -l <"$T/ref/metrics.jsonl")" -eq "$rounds" ] || fail "reference run incomplete"

# The interrupted run: workers stay up; the coordinator is killed and
# resumed until it finishes by itself.
OUT=$T/run
coord_yaml "$port" "$OUT" "$round_yaml" >"$T/c.yaml"
for i in 0 1 2; do
	start_worker "$T/w$i.yaml" "w$i"
done
life=0
while :; do
	life=$((life + 1))
	# as a supervisor would: resume once a checkpoint exists (a start
	# killed before it listened left none)
	start=""
	[ -f "$OUT/checkpoint/state" ] && start=--resume
	"$B/fedbox-coordinator" --config "$T/c.yaml" $start \
		>>"$T/rounds.txt" 2>>"$T/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
	if [ "$kills" -gt 0 ]; then
		# a random moment: 1 to 6 s into this life by default (workers
		# come back within the liveness timeout, 3 s, and a round takes
		# about 1 s)
		sleep "$("$PY" -c "import random; print($kill_min + $kill_span * random.random())")"
		if kill -KILL "$CPID" 2>/dev/null; then
			wait "$CPID" 2>/dev/null || true
			kills=$((kills - 1))
			echo "life $life: killed after round $(grep -c '"round"' "$OUT/metrics.jsonl" 2>/dev/null || echo 0) lines"
			continue
		fi
	fi
	st=0
	wait_exit "$CPID" 300 || st=$?
	[ "$st" -eq 0 ] || fail "life $life: coordinator exited with $st"
	break
done
echo "$life lives"
# a kill between a round's files and the state, or between the state and
# the previous files' removal, left files a later resume removed
n=$(ls "$OUT"/checkpoint/ | grep -cE '^(model-[0-9]+\.safetensors|opt-[0-9]+\.bin)$')
want=1
[ "$rule" = fedavg ] || want=2
[ "$n" -le "$want" ] || fail "$n model and optimiser files in checkpoint/: $(ls "$OUT/checkpoint")"
# (the tensors; the metadata has each run's own run id)
"$PY" - "$T/ref/model.safetensors" "$OUT/model.safetensors" <<'PYEOF' ||
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    return head, b[8 + n:]
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a[0] == b[0], "layouts differ"
assert a[1] == b[1], "tensor bytes differ"
PYEOF
	fail "the resumed run's model is not bitwise the uninterrupted run's"
"$PY" - "$T/ref/metrics.jsonl" "$OUT/metrics.jsonl" "$rounds" \
	"${FB_SERVER_LR:-0.001}" "$rule" <<'PYEOF' ||
import json, math, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
run = [json.loads(l) for l in open(sys.argv[2])]  # a torn line fails here
n = int(sys.argv[3])
assert [r["round"] for r in run] == list(range(1, n + 1)), [r["round"] for r in run]
for a, b in zip(ref, run):
    for k in ("status", "participants", "test_accuracy", "test_loss", "train_loss",
              "server_lr"):
        assert a[k] == b[k], (a["round"], k, a[k], b[k])
    names = lambda r: sorted(w["name"] for w in r["workers"])
    assert names(a) == names(b), (a["round"], names(a), names(b))
# the server optimisers anneal their lr by default (server_lr_decay auto:
# cosine over round.rounds), and a resumed coordinator goes on with it
lr, cosine = float(sys.argv[4]), sys.argv[5] not in ("fedavg", "fednova")
for r in run:
    if r["status"] != "ok":
        continue
    want = lr * (math.cos(math.pi / 2 * (r["round"] - 1) / n) ** 2 if cosine else 1)
    assert abs(r["server_lr"] - want) <= 1e-5 * want, (r["round"], r["server_lr"], want)
print("metrics: rounds 1..%d once each, the same as uninterrupted; server lr %s"
      % (n, "cosine" if cosine else "constant"))
PYEOF
	fail "metrics differ from the uninterrupted run"

# A fresh start on a folder that holds a run is refused (exit 2), and
# nothing in it changes.
before=$(md5sum "$OUT/metrics.jsonl" "$OUT/checkpoint/state")
st=0
"$B/fedbox-coordinator" --config "$T/c.yaml" >/dev/null 2>"$T/fresh.log" || st=$?
[ "$st" -eq 2 ] || fail "fresh start on a run: exit $st, want 2"
grep -q -- "--resume, or start over with --force" "$T/fresh.log" ||
	fail "fresh start: unclear message: $(cat "$T/fresh.log")"
[ "$(md5sum "$OUT/metrics.jsonl" "$OUT/checkpoint/state")" = "$before" ] ||
	fail "a refused start changed the folder"

# A second coordinator on the same folder is refused while one runs.
sed "s/rounds: $rounds/rounds: $((rounds + 2))/" "$T/c.yaml" >"$T/c2.yaml"
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >/dev/null 2>"$T/first.log" &
first=$!
PIDS+=("$first")
wait_for "$T/first.log" "listening on" 30
st=0
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >/dev/null 2>"$T/second.log" || st=$?
[ "$st" -eq 2 ] || fail "second coordinator: exit $st, want 2"
grep -q "in use by another fedbox-coordinator (pid $first)" "$T/second.log" ||
	fail "second coordinator: unclear message: $(cat "$T/second.log")"
kill -KILL "$first"
wait "$first" 2>/dev/null || true

# A killed run's temporary file goes at the next start; a corrupt
# checkpoint is refused with the reason.
touch "$OUT/checkpoint/model-99.safetensors.tmp.12345"
cp "$OUT/checkpoint/state" "$T/state.good"
"$PY" - "$OUT/checkpoint/state" <<'PYEOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[40] ^= 1
open(p, "wb").write(bytes(b))
PYEOF
st=0
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >/dev/null 2>"$T/corrupt.log" || st=$?
[ "$st" -ne 0 ] || fail "a corrupt checkpoint was accepted"
grep -q "checksum does not match: corrupt" "$T/corrupt.log" ||
	fail "corrupt state: unclear message: $(cat "$T/corrupt.log")"
cp "$T/state.good" "$OUT/checkpoint/state"
model=$(ls "$OUT"/checkpoint/model-*.safetensors)
cp "$model" "$T/model.good"
"$PY" - "$model" <<'PYEOF'
import os, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-5] ^= 0x40
os.unlink(p)  # the export is a hard link: corrupt only this copy
open(p, "wb").write(bytes(b))
PYEOF
st=0
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >/dev/null 2>"$T/corrupt2.log" || st=$?
[ "$st" -ne 0 ] || fail "a corrupt model file was accepted"
grep -q "do not match the checkpoint's checksum: corrupt" "$T/corrupt2.log" ||
	fail "corrupt model: unclear message: $(cat "$T/corrupt2.log")"
cp "$T/model.good" "$model"
# another round's model and optimiser files, as a kill can leave them
touch "$OUT/checkpoint/model-99999.safetensors" "$OUT/checkpoint/opt-99999.bin"
# with the good files it resumes, and the temporary and stale files go
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >/dev/null 2>"$T/resume.log" &
rp=$!
PIDS+=("$rp")
wait_for "$T/resume.log" "listening on" 30
grep -Eq "removed [0-9]+ temporary files?" "$T/resume.log" || fail "no temp file removed"
grep -Eq "removed 2 checkpoint files of rounds other than" "$T/resume.log" ||
	fail "stale round files: $(cat "$T/resume.log")"
[ ! -e "$OUT/checkpoint/model-99.safetensors.tmp.12345" ] || fail "temp file kept"
[ ! -e "$OUT/checkpoint/model-99999.safetensors" ] && [ ! -e "$OUT/checkpoint/opt-99999.bin" ] ||
	fail "stale round files kept"
[ -e "$model" ] || fail "the checkpoint's own model was removed"
kill -KILL "$rp"

# Killed before its first commit (only the round-0 checkpoint, and a rule
# with optimiser state): the resume starts from the initial state.
O0=$T/zero
coord_yaml "$port" "$O0" "$round_yaml" >"$T/c0.yaml"
"$B/fedbox-coordinator" --config "$T/c0.yaml" >/dev/null 2>"$T/zero1.log" &
zp=$!
PIDS+=("$zp")
wait_for "$T/zero1.log" "listening on" 30
[ -f "$O0/checkpoint/state" ] || fail "no round-0 checkpoint"
kill -KILL "$zp"
wait "$zp" 2>/dev/null || true
"$B/fedbox-coordinator" --config "$T/c0.yaml" --resume >/dev/null 2>"$T/zero2.log" &
zp=$!
PIDS+=("$zp")
wait_for "$T/zero2.log" "listening on|cannot resume|ERROR" 30
grep -q "listening on" "$T/zero2.log" ||
	fail "resume before the first commit: $(cat "$T/zero2.log")"
kill -KILL "$zp"
echo "ok: $life lives, bitwise model, refusals, a resume before any commit"
