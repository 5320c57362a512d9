# SPDX-License-Identifier: Apache-2.0
# Secure rounds set up during the round before (issue 25;
# secure_aggregation.setup_ahead, the default), with real processes:
#  1. every round after the first whose workers were all there when the
#     round before set it up is taken as set up: no key advert in it
#     (metrics.jsonl says set_up_ahead, the coordinator's log has no
#     "key adverts relayed" of it);
#  2. dropouts: 5 workers, threshold 3. In round 2, set up during round
#     1, w0 is killed before its masked input and w1 after its input,
#     before unmasking: the round is unmasked with the 3 others' shares
#     and equals the plain weighted average of the 4 included updates
#     (w0's pair masks removed from its round-2 key, reconstructed);
#  3. rekeying after the reveal: w0 and w1 come back in new sessions, so
#     round 3 (whose setup made during round 2 lacks them) sets up in the
#     round with all five, and round 4 is set up ahead again; round 4 is
#     the plain weighted average of all five, and no public key of any
#     worker comes back in another round: w0's revealed round-2 key opens
#     nothing of rounds 3 and 4.
# secagg.sh part 3 runs the same kills with rounds set up in the round.
source tests/integration/lib.sh
CHECK=("$PY" "$ROOT/tests/tools/secagg_check.py")
port=$(free_port)
OUT=$T/drop
secagg_drop_coordinator "$port" "$OUT"
start_w() { secagg_drop_worker "$port" "$@"; } # INDEX THROTTLE [TAG]
start_w 0 100 # slow: killed in round 2 before its masked input
start_w 1 1   # fast: killed after its round-2 input, before unmasking
for i in 2 3 4; do start_w "$i" 60; done

wait_for "$T/rounds.txt" "round +1/4 .*acc" 90
cp "$OUT/model.safetensors" "$T/m1.safetensors"
wait_for "$T/coord.log" "round 2: secure aggregation set up ahead, 5 of 5" 30
kill -KILL "${WP[0]}"
echo "round 2 (set up during round 1): killed w0 before its masked input"
wait_for "$T/coord.log" "round 2: signed update from w1 complete" 60
kill -KILL "${WP[1]}"
echo "round 2: killed w1 after its masked input, before unmasking"
grep -q "round 2: unmasked" "$T/coord.log" &&
	fail "unmasking started before w1 was killed: the test lost its race"
wait_for "$T/rounds.txt" "round +2/4 .*down" 60
grep -qE "round +2/4 .*acc" "$T/rounds.txt" || fail "round 2 did not complete"
cp "$OUT/model.safetensors" "$T/m2.safetensors"
"${CHECK[@]}" average "$T/m2.safetensors" "$T/m1.safetensors" --round 2 --n 5 \
	--dump "$T/dump/w1,$T/dump/w2,$T/dump/w3,$T/dump/w4" ||
	fail "round 2 is not the weighted average of the 4 included updates"

# w0 and w1 come back in new sessions: round 3 sets up with all five.
start_w 0 1 b
start_w 1 1 b
wait_for "$T/rounds.txt" "round +3/4 .*acc" 90
cp "$OUT/model.safetensors" "$T/m3.safetensors"
wait_exit "$CPID" 90 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "metrics of the rounds are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["status"] for r in rows] == ["ok"] * 4, rows
sa = [r["secure_aggregation"] for r in rows]
assert [s["set_up_ahead"] for s in sa] == [False, True, False, True], sa
assert sa[1]["workers"] == 5 and sa[1]["threshold"] == 3, sa[1]
assert sa[1]["included"] == 4 and sa[1]["revealed"] == 3, sa[1]
assert sa[2]["included"] == 5 and sa[3]["included"] == 5, sa
print("round 2 (set up during round 1): 4 of 5 inputs, unmasked with 3 "
      "survivors' shares; round 3 set up in the round for the two back; "
      "round 4 set up ahead, all 5")
PYEOF
"$PY" - "$T/coord.log" <<'PYEOF' || fail "a round's keys went at the wrong time"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
def at(pattern):
    return [i for i, l in enumerate(lines) if re.search(pattern, l)]
for r in (2, 4):
    relayed = at(r"round %d: \d+ key adverts relayed" % r)
    taken = at(r"round %d: secure aggregation set up ahead" % r)
    began = at(r"round %d: idle -> " % r)
    # its adverts went once, before the round began, and it was taken
    assert len(relayed) == 1 and taken and began, (r, relayed, taken)
    assert relayed[0] < taken[0] and relayed[0] < began[0], (r, relayed,
                                                             taken, began)
why = at(r"round 3: its secure-aggregation setup made ahead leaves out")
relayed = at(r"round 3: \d+ key adverts relayed")
assert why and relayed and relayed[-1] > why[0], (why, relayed)
print("rounds 2 and 4: keys relayed during the round before; round 3 set "
      "up in the round, saying why")
PYEOF
"${CHECK[@]}" average "$OUT/model.safetensors" "$T/m3.safetensors" --round 4 \
	--n 5 --dump "$T/dump/w0,$T/dump/w1,$T/dump/w2,$T/dump/w3,$T/dump/w4" ||
	fail "round 4 is not the weighted average of the 5 updates"
k2=$(secagg_keys "$T/w0.log" 2)
k3=$(secagg_keys "$T/w0b.log" 3)
k4=$(secagg_keys "$T/w0b.log" 4)
[ -n "$k2" ] && [ -n "$k3" ] && [ -n "$k4" ] ||
	fail "no key record of w0 in rounds 2, 3 and 4"
secagg_key_lifetimes 15
echo "round 4: the average of all 5; w0 back under new keys; no s key repeats, one c key a process"
echo PASS
