# SPDX-License-Identifier: Apache-2.0
# A worker killed with SIGKILL in the middle of a round does not hang the
# coordinator: the round closes at its deadline with the updates it has
# (at least round.min_updates), the lost worker is noticed by liveness, and
# the next rounds proceed with the survivors.
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 3
  min_workers: 3
  min_updates: 2
  local_steps: 40
  batch_size: 32
  deadline: 6s
  wait_for_workers: 20s" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
# Worker 2 is slowed down (simulation) so that it is surely mid-training.
worker_yaml "$port" 2 3 "  throttle: 200" >"$T/w2.yaml"
start_worker "$T/w2.yaml" w2
victim=$WPID
wait_for "$T/w2.log" "trainer: " 30
sleep 0.5
kill -KILL "$victim"
echo "killed w2 (pid $victim) while it trained round 1"
start=$(date +%s)
# Rounds 2 and 3 need min_workers 3 live: start a replacement so the run can
# go on (the coordinator must have dropped w2 by liveness first).
wait_for "$T/coord.log" "worker w2 lost" 20
worker_yaml "$port" 2 3 >"$T/w2b.yaml"
start_worker "$T/w2b.yaml" w2b
wait_exit "$CPID" 60 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "rounds after the kill are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
r1 = rows[0]
assert r1["status"] == "ok" and r1["participants"] == 2, r1
assert r1["seconds"] < 12, r1
st = {w["name"]: w["status"] for w in r1["workers"]}
assert st.get("w2") in (None, "failed"), st
for r in rows[1:]:
    assert r["status"] == "ok" and r["participants"] == 3, r
print("round 1 closed with 2 updates in %.1fs; rounds 2-3 had 3" % r1["seconds"])
PYEOF
echo PASS
