# SPDX-License-Identifier: Apache-2.0
# A masked upload cut off midway (issue 22, acceptance 4): secure
# aggregation, four workers; w3 reaches the coordinator through
# tests/faults/netem.py relay, which resets its first connection once
# 60 KB went up: in the middle of its masked update (102 KB, 16 KiB
# chunks). w3 is then a dropout like any other: round 1 commits with the
# other three (w3's masks recovered from their shares), w3 joins again on
# a new connection, and round 2 runs with all four.
source tests/faults/lib.sh
make_keys 4
port=$(free_port)
rport=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 4
  min_updates: 3
  local_steps: 20" >"$T/c.yaml"
cut_relay_start 60000
for i in 0 1 2; do
	worker_yaml "$port" "$i" 4 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
worker_yaml "$port" 3 4 | sed "s|127.0.0.1:$port|127.0.0.1:$rport|" \
	>"$T/w3.yaml"
start_worker "$T/w3.yaml" w3
wait_exit "$CPID" 120 || fail "coordinator exited with $?"
cat "$T/rounds.txt"
grep -q "cut after 60000 bytes up" "$T/relay.log" ||
	fail "the relay never cut w3's connection"
grep -q "round 1: 20 steps.*sending masked update" "$T/w3.log" ||
	fail "w3 did not send a masked update in round 1"
grep -q "round 1: w3 leaves the round: lost (connection closed)" \
	"$T/coord.log" || fail "the coordinator did not drop w3 in round 1"
! grep -q "round 1: .*update from w3 complete" "$T/coord.log" ||
	fail "w3's round-1 update came in whole: the cut was not mid-upload"
grep -q "round 2: .*update from w3 complete" "$T/coord.log" ||
	fail "w3's round-2 update did not come in"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "the rounds are not as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["round"] for r in rows] == [1, 2], rows
r1, r2 = rows
st = {w["name"]: w["status"] for w in r1["workers"]}
assert r1["status"] == "ok" and r1["participants"] == 3, \
    (r1["status"], r1["participants"], r1.get("reason"))
assert st.get("w3") != "done" and all(st[f"w{i}"] == "done" for i in range(3)), st
assert r2["status"] == "ok" and r2["participants"] == 4, \
    (r2["status"], r2["participants"])
print("round 1 committed with 3 (w3: %s), round 2 with all 4"
      % st.get("w3", "removed"))
PYEOF
kill -TERM "$RELAY" 2>/dev/null || true
sleep 0.3
cat "$T/relay.log"
echo PASS
