# SPDX-License-Identifier: Apache-2.0
# round.mode: async with real processes over encrypted, signed sessions: 4
# workers, w3 throttled (simulated 4x slower), w2 killed with SIGKILL in
# the middle of its first task. The run still makes its 8 server steps of
# buffer_size 2: nobody waits for w2, whose task is simply gone; the
# throttled worker's updates come in trained from older versions, with
# their staleness and staleness weight in metrics.jsonl. A time budget
# gives each task its steps from the worker's measured speed; the
# Prometheus endpoint (metrics.listen), scraped while it runs, shows the
# model version, the updates applied and dropped, and their staleness as
# metrics.jsonl has them up to that version. Then a run
# whose coordinator is killed with SIGKILL after its third step resumes
# (--resume) with an empty buffer and makes the rest of its steps from the
# checkpoint's version; and async with secure aggregation and a buffer of
# 1 (a secure cohort needs 2 members) is refused at load, naming both keys
# (tests/integration/async_secure.sh runs secure async).
SECURE=1
SECAGG=0
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  mode: async
  buffer_size: 2
  max_staleness: 6
  rounds: 8
  min_workers: 4
  min_updates: 1
  local_steps: 30
  local_work: time_budget
  time_budget: 400ms
  min_steps: 5
  batch_size: 32
  deadline: 30s
  wait_for_workers: 30s" >"$T/c.yaml"
mport=$(free_port)
printf 'metrics:\n  listen: 127.0.0.1:%s\n' "$mport" >>"$T/c.yaml"
start_coordinator "$T/c.yaml"
# The Prometheus endpoint, scraped while the run lasts: the last scrape
# is checked against metrics.jsonl below.
scrape_start "$mport" "$T/scrape.txt"
for i in 0 1 3; do
	extra=""
	[ "$i" = 3 ] && extra="  throttle: 4"
	worker_yaml "$port" "$i" 4 "$extra" >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
# w2 is slowed down so much that it is surely mid-task when killed.
worker_yaml "$port" 2 4 "  throttle: 400" >"$T/w2.yaml"
start_worker "$T/w2.yaml" w2
victim=$WPID
wait_for "$T/w2.log" "trainer: " 30
sleep 0.5
kill -KILL "$victim"
echo "killed w2 (pid $victim) while it trained its first task"
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
grep -q "worker w2 lost" "$T/coord.log" || fail "w2's loss was not noticed"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "async metrics are wrong"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8, len(rows)
stale = {}
for k, r in enumerate(rows, 1):
    assert r["mode"] == "async" and r["status"] == "ok", r
    assert r["round"] == k and r["version"] == k, r
    assert r["participants"] == len(r["workers"]) >= 2, r
    for w in r["workers"]:
        assert w["name"] != "w2", r  # killed before it finished a task
        s = w["staleness"]
        assert s == (k - 1) - w["trained_from"], (k, w)
        assert 0 <= s <= 6, w
        assert abs(w["staleness_weight"] - 1 / math.sqrt(1 + s)) < 1e-5, w
        assert w["steps"] >= 5, w
        stale.setdefault(w["name"], []).append(s)
    assert 0 < r["step_scale"] <= 1, r
assert set(stale) <= {"w0", "w1", "w3"}, stale
assert "w3" in stale, "the throttled worker never got an update in"
assert max(stale["w3"]) >= 1, stale  # slower: trained from older models
assert rows[-1]["test_accuracy"] is not None
print("8 steps; staleness per worker:", stale)
PYEOF
wait "$SCRAPER" || true
async_endpoint_check "$T/scrape.txt" "$OUT/metrics.jsonl" ||
	fail "the async metrics endpoint is wrong"
# The coordinator killed after step 3 and resumed: the steps go on from
# the checkpoint's version, with fresh tasks (the old ones are lost).
port=$(free_port)
OUT=$T/resumed
coord_yaml "$port" "$OUT" "  mode: async
  buffer_size: 2
  rounds: 6
  min_workers: 2
  local_steps: 20
  batch_size: 32
  wait_for_workers: 30s" >"$T/c2.yaml"
start_coordinator "$T/c2.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 4 "  throttle: 3" >"$T/r$i.yaml"
	start_worker "$T/r$i.yaml" "r$i"
done
for ((k = 0; k < 600; k++)); do
	[ "$(cat "$OUT/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
	sleep 0.1
done
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null || true
before=$(wc -l <"$OUT/metrics.jsonl")
echo "killed the coordinator after $before steps"
"$B/fedbox-coordinator" --config "$T/c2.yaml" --resume >"$T/rounds2.txt" \
	2>"$T/coord2.log" &
CPID=$!
PIDS+=("$CPID")
wait_exit "$CPID" 120 || fail "resumed coordinator exited with status $?"
cat "$T/rounds2.txt"
"$PY" - "$OUT/metrics.jsonl" "$before" <<'PYEOF' || fail "the resumed async run is wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
before = int(sys.argv[2])
last = {r["round"]: r for r in rows}
assert sorted(last) == list(range(1, 7)), sorted(last)
for k in range(before + 1, 7):
    r = last[k]
    assert r["status"] == "ok" and r["version"] == k, r
    for w in r["workers"]:
        # a task of the resumed run: trained from its first version on
        assert w["trained_from"] >= before, (k, w)
print("resumed after step %d; steps %d-6 from version %d on" %
      (before, before + 1, before))
PYEOF
# async + secure aggregation with buffer_size 1: refused at load, naming
# both keys
SECAGG=1 coord_yaml "$port" "$T/refused" "  mode: async
  buffer_size: 1" >"$T/r.yaml"
st=0
"$B/fedbox-coordinator" --config "$T/r.yaml" >/dev/null 2>"$T/refused.log" || st=$?
[ "$st" = 2 ] || fail "secure async with buffer_size 1: exit $st, not 2"
grep "round.buffer_size" "$T/refused.log" |
	grep -q "secure_aggregation.enabled" ||
	fail "the refusal does not name both keys: $(cat "$T/refused.log")"
echo PASS
