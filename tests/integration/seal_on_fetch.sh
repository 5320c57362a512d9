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
#     and no chunk fails its check.
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
echo "seal_on_fetch: secure, plain and async runs complete"
