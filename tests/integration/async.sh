# SPDX-License-Identifier: Apache-2.0
# round.mode: async with real processes over encrypted, signed sessions: 4
# workers, w3 throttled (simulated 4x slower), w2 killed with SIGKILL in
# the middle of its first task. The run still makes its 8 server steps of
# buffer_size 2: nobody waits for w2, whose task is simply gone; the
# throttled worker's updates come in trained from older versions, with
# their staleness and staleness weight in metrics.jsonl. A time budget
# gives each task its steps from the worker's measured speed. Then async
# with secure aggregation is refused at load, naming both keys.
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
start_coordinator "$T/c.yaml"
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
# async + secure aggregation: refused at load, naming both keys
SECAGG=1 coord_yaml "$port" "$T/refused" "  mode: async" >"$T/r.yaml"
st=0
"$B/fedbox-coordinator" --config "$T/r.yaml" >/dev/null 2>"$T/refused.log" || st=$?
[ "$st" = 2 ] || fail "async with secure aggregation: exit $st, not 2"
grep -q "secure_aggregation.enabled: round.mode: async" "$T/refused.log" ||
	fail "the refusal does not name both keys: $(cat "$T/refused.log")"
echo PASS
