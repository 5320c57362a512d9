# SPDX-License-Identifier: Apache-2.0
# transport.model_cache: seal_on_fetch with real processes, forced on a
# small model (auto would keep its ciphertext): each model chunk is sealed
# again when a worker fetches it, from a transport.fetch_memory of 4
# chunks of 4113 bytes (so 3 workers share them, one chunk each at a time,
# their fetch windows waiting on the budget). Three runs, each of which must complete:
#  1. secure aggregation, 3 workers, 3 rounds: every worker verifies the
#     chunks against the signed trailer (a bad chunk fails its round);
#  2. plain aggregation over encrypted sessions, against the same run with
#     model_cache keep: the same seeds give the same test accuracy;
#  3. round.mode async over encrypted sessions, one worker throttled, so
#     fetches are under way while the server steps: every step commits
#     and no chunk fails its check;
#  4. a worker stopped mid-download (below).
source tests/integration/lib.sh

# seal_conf CACHE: transport lines for the config made on stdin.
seal_conf() {
	sed "/^transport:/a\\
  chunk_size: 4KiB\\
  model_cache: $1\\
  fetch_memory: 16452"
}

# run_fed NAME CACHE SECAGG WORKERS ROUND-LINES [WORKER-3-EXTRA]
run_fed() {
	local name=$1 cache=$2 sa=$3 n=$4 round=$5 slow=${6:-} port i extra
	port=$(free_port)
	mkdir -p "$T/$name"
	SECAGG=$sa coord_yaml "$port" "$T/$name/out" "$round" |
		seal_conf "$cache" >"$T/$name/c.yaml"
	start_coordinator "$T/$name/c.yaml"
	for ((i = 0; i < n; i++)); do
		extra=""
		[ "$i" = $((n - 1)) ] && extra=$slow
		SECAGG=$sa worker_yaml "$port" "$i" "$n" "$extra" >"$T/$name/w$i.yaml"
		start_worker "$T/$name/w$i.yaml" "$name-w$i"
	done
	wait_exit "$CPID" 180 || {
		tail -n 30 "$T/coord.log"
		fail "$name: coordinator exited with status $?"
	}
	cp "$T/coord.log" "$T/$name/coord.log"
	cp "$T/rounds.txt" "$T/$name/rounds.txt"
	for ((i = 0; i < n; i++)); do
		if grep -E "failed its check|out of order|wrong size" \
			"$T/$name-w$i.log"; then
			fail "$name: worker w$i refused a model chunk"
		fi
	done
}

# check_rows NAME ROUNDS: every round of NAME's metrics committed.
check_rows() {
	"$PY" - "$T/$1/out/metrics.jsonl" "$2" <<'PYEOF' || fail "$1: metrics are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
assert len(rows) == n, (len(rows), n)
for k, r in enumerate(rows, 1):
    assert r["round"] == k and r["status"] == "ok", r
assert rows[-1]["test_accuracy"] is not None and rows[-1]["test_accuracy"] > 0.5, rows[-1]
print(sys.argv[1].split("/")[-3], "accuracy", rows[-1]["test_accuracy"])
PYEOF
}

# ---- 1: secure aggregation -------------------------------------------------
run_fed secagg seal_on_fetch 1 3 "  rounds: 3
  min_workers: 3
  local_steps: 20
  batch_size: 32
  deadline: 60s"
grep -q "each chunk sealed when it is fetched" "$T/secagg/coord.log" ||
	fail "secagg: the coordinator did not seal on fetch"
grep -q "4 buffers of 4113 bytes, on the seal threads" "$T/secagg/coord.log" ||
	fail "secagg: not 4 buffers on the seal threads: $(grep 'sealed when' "$T/secagg/coord.log")"
check_rows secagg 3

# ---- 2: plain aggregation, encrypted, against keep ------------------------
for cache in seal_on_fetch keep; do
	FB_INGEST_THREADS=0 run_fed "plain-$cache" "$cache" 0 3 "  rounds: 2
  min_workers: 3
  local_steps: 20
  batch_size: 32
  deadline: 60s"
	check_rows "plain-$cache" 2
done
if grep -q "sealed when it is fetched" "$T/plain-keep/coord.log"; then
	fail "model_cache keep sealed on fetch"
fi
"$PY" - "$T/plain-seal_on_fetch/out/metrics.jsonl" \
	"$T/plain-keep/out/metrics.jsonl" <<'PYEOF' || fail "seal_on_fetch and keep trained differently"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
for x, y in zip(a, b):
    # the same model reached every worker: the same training, up to the
    # order in which the updates were added
    assert abs(x["test_accuracy"] - y["test_accuracy"]) < 0.01, (x, y)
print("seal_on_fetch and keep: the same accuracy per round")
PYEOF

# ---- 3: async, fetches under way while the server steps -------------------
run_fed async seal_on_fetch 0 3 "  mode: async
  buffer_size: 2
  max_staleness: 8
  rounds: 6
  min_workers: 3
  min_updates: 1
  local_steps: 20
  batch_size: 32
  deadline: 30s
  wait_for_workers: 30s" "  throttle: 4"
check_rows async 6

# ---- 4: a worker that stops reading mid-download ----------------------------
# Plain aggregation over encrypted sessions (secure aggregation would keep
# masked uploads apart at this size), a 3e7-parameter synthetic model
# (114 MiB, 1 MiB chunks), 3 workers that do not train, fetch_memory 8 MiB (a share of 2 chunks each). w2 is
# stopped (SIGSTOP) once it starts fetching: the others still get the
# model and the round commits without it (lost: no heartbeats), and the
# coordinator's peak RSS stays under 2.75x the model (model, sum, buffers
# and the process's own; the kept ciphertext would make it 3.4x). Round 2 waits for a third
# worker: the run is stopped once round 1 is in.
port=$(free_port)
mkdir -p "$T/stall"
SECAGG=0 coord_security >"$T/stall/c.yaml"
cat >>"$T/stall/c.yaml" <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $T/stall/out
model:
  arch: synthetic
  synthetic_params: 30000000
round:
  rounds: 2
  min_workers: 3
  min_updates: 2
  deadline: 60s
transport:
  heartbeat: 200ms
  liveness_timeout: 2s
  model_cache: seal_on_fetch
  fetch_memory: 8MiB
YAML
start_coordinator "$T/stall/c.yaml"
for i in 0 1 2; do
	{
		SECAGG=0 worker_security "$i"
		cat <<YAML
coordinator: tcp://127.0.0.1:$port
name: w$i
log_level: debug
data:
  dataset: none
  index: $i
  workers: 3
YAML
	} >"$T/stall/w$i.yaml"
	start_worker "$T/stall/w$i.yaml" "stall-w$i"
	[ "$i" = 2 ] && stalled=$WPID
done
wait_for "$T/stall-w2.log" "fetching the model" 60
kill -STOP "$stalled"
echo "stopped w2 (pid $stalled) as it began to fetch the model"
wait_for "$T/rounds.txt" "round +1/2" 120
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$CPID/status")
kill -KILL "$stalled"
# round 2 would wait for a third worker: stop the run here
kill -TERM "$CPID"
wait_exit "$CPID" 30 || true
grep -q "worker w2 lost" "$T/coord.log" || fail "stall: w2's loss was not noticed"
# (a sanitizer's shadow memory is in the RSS: not checked there)
case $B in *san-*) hwm=0 ;; esac
"$PY" - "$T/stall/out/metrics.jsonl" "$hwm" <<'PYEOF' || fail "stall: wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[0]["round"] == 1 and rows[0]["status"] == "ok", rows[0]
names = sorted(w["name"] for w in rows[0]["workers"])
assert names == ["w0", "w1"], names
model = 30000000 * 4
x = int(sys.argv[2]) * 1024 / model
# 2.4x here: model, sum, 8 MiB of buffers and the process's ~40 MiB of
# its own, which is 0.35x of so small a model; the kept ciphertext would
# add a whole model's worth (3.4x)
assert x < 2.75, "coordinator peak RSS %.2fx the model" % x
print("stalled fetcher: round 1 without it, coordinator peak %s" %
      ("%.2fx the model" % x if x > 0 else "not measured (sanitizer)"))
PYEOF
echo "seal_on_fetch: secure, plain, async and stalled-fetcher runs complete"
