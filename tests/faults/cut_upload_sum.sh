# SPDX-License-Identifier: Apache-2.0
# A masked upload cut off midway with secure_aggregation.max_uploads: 0,
# where masked chunks go straight into the sum: four workers, w3 slow
# (throttled) and reaching the coordinator through tests/faults/netem.py
# relay, which resets its connection once 160 KB went up: past round 1
# (a masked update is 102 KB, in 16 KiB chunks), in the middle of w3's
# round-2 update, after the three others' inputs are in the sum. The sum then holds part of w3's input, which can
# never be unmasked: the coordinator starts it again and asks w0-w2 for
# their inputs again; each sends the same masked input anew; w3 is a
# dropout, its masks recovered from the others' shares; round 2 commits
# with exactly w0-w2's updates (checked against their dumps by
# tests/tools/secagg_check.py, independently of the coordinator).
source tests/faults/lib.sh
make_keys 4
port=$(free_port)
rport=$(free_port)
OUT=$T/out
CHECK=("$PY" "$ROOT/tests/tools/secagg_check.py")
SA_YAML="  max_uploads: 0
" coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 4
  min_updates: 3
  local_steps: 20" >"$T/c.yaml"
grep -q "^  max_uploads: 0" "$T/c.yaml" || fail "no max_uploads: 0 in the config"
cut_relay_start 160000
for i in 0 1 2; do
	worker_yaml "$port" "$i" 4 >"$T/w$i.yaml"
	mkdir -p "$T/dump/w$i"
	printf 'debug:\n  dump_updates: %s\n' "$T/dump/w$i" >>"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
worker_yaml "$port" 3 4 "  throttle: 100" |
	sed "s|127.0.0.1:$port|127.0.0.1:$rport|" >"$T/w3.yaml"
start_worker "$T/w3.yaml" w3
# round 1's model, before round 2 (w3 trains for seconds) replaces it
wait_for "$T/rounds.txt" "round +1/2 .*acc" 60
cp "$OUT/model.safetensors" "$T/m1.safetensors"
wait_exit "$CPID" 120 || { cat "$T/coord.log"; fail "coordinator exited with $?"; }
cat "$T/rounds.txt"
grep -q "cut after 160000 bytes up" "$T/relay.log" ||
	fail "the relay never cut w3's connection"
grep -q "round 2: .*sending masked update" "$T/w3.log" ||
	fail "w3 did not send a masked update in round 2"
grep -q "round 2: w3 leaves the round: lost (connection closed)" \
	"$T/coord.log" || fail "the coordinator did not drop w3"
grep -q "round 2: a masked upload cut off midway was partly in the sum .*the sum starts again, and 3 workers send their masked input again" \
	"$T/coord.log" || { cat "$T/coord.log"; fail "the sum did not start again with w0-w2 asked"; }
for i in 0 1 2; do
	grep -q "round 2: the coordinator lost a cut-off upload inside its sum; sending our masked input again" \
		"$T/w$i.log" || { cat "$T/w$i.log"; fail "w$i was not asked for its input again"; }
	[ "$(grep -c "round 2: .*update from w$i complete" "$T/coord.log")" -eq 2 ] ||
		fail "w$i's input did not come in twice (before and after the restart)"
done
! grep -q "round 2: .*update from w3 complete" "$T/coord.log" ||
	fail "w3's update came in whole: the cut was not mid-upload"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "the round is not as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["round"] for r in rows] == [1, 2], rows
r1, r2 = rows
assert r1["status"] == "ok" and r1["participants"] == 4, r1
st = {w["name"]: w["status"] for w in r2["workers"]}
assert r2["status"] == "ok" and r2["participants"] == 3, \
    (r2["status"], r2["participants"], r2.get("reason"))
assert st.get("w3") != "done" and all(st[f"w{i}"] == "done" for i in range(3)), st
assert r2["secure_aggregation"]["included"] == 3, r2["secure_aggregation"]
assert r2["secure_aggregation"]["restarts"] == 1, r2["secure_aggregation"]
assert r1["secure_aggregation"]["restarts"] == 0, r1["secure_aggregation"]
print("round 1 with all 4; round 2 committed with w0-w2 (w3: %s)"
      % st.get("w3", "removed"))
PYEOF
"${CHECK[@]}" average "$OUT/model.safetensors" "$T/m1.safetensors" --round 2 \
	--n 4 --dump "$T/dump/w0,$T/dump/w1,$T/dump/w2" ||
	fail "the model is not the weighted average of w0-w2's updates"
kill -TERM "$RELAY" 2>/dev/null || true
echo PASS
