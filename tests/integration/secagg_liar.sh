# SPDX-License-Identifier: Apache-2.0
# A coordinator that lies in secure aggregation's consistency check, on
# live processes: the test build tests/fedbox-coordinator-liar tells one
# worker of three (threshold 2) that another dropped, as if to get that
# worker's mask key from it while the other two reveal its self-mask
# seed, and relays the lied-to worker's confirmation of the false set as
# if it verified. The lied-to worker must hold too few confirmations of
# the set it signed, send a refusal and no unmasking shares; the two told
# the truth reveal and the round is unmasked without it. Round 2 is
# honest (the liar lies once): all three reveal, so the check can fail.
source tests/integration/lib.sh
make_keys 3
port=$(free_port)
OUT=$T/out
mkdir -p "$OUT"
SA_YAML="  threshold: 2
" coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 3
  local_steps: 10
  batch_size: 32
debug:
  wire_log: $OUT/wire.jsonl" >"$T/c.yaml"
start_liar included "$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 90 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
lie=$(grep -o "test liar: round 1: w[0-9] is told that w[0-9] dropped" \
	"$T/coord.log") || fail "the liar did not lie"
echo "$lie"
told=$(echo "$lie" | sed 's/.*: \(w[0-9]\) is told.*/\1/')
grep -q "relaying $told's confirmation of the false set" "$T/coord.log" ||
	fail "the liar did not relay $told's confirmation"
grep "round 1: .*not revealing our shares" "$T/$told.log" ||
	fail "$told did not refuse to reveal"
"$PY" - "$OUT" "$told" <<'PYEOF' || fail "the lie was not caught"
import json, sys
out, told = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(out + "/wire.jsonl")]
ids = {r["name"]: r["sender"] for r in rows if r["type"] == "hello"}
REVEAL, REFUSE = 6, 9
def senders(rnd, phase):
    return sorted(r["sender"] for r in rows if r["type"] == "secagg"
                  and r["round"] == rnd and r["phase"] == phase)
print("round 1: reveals from", senders(1, REVEAL), "refusals from",
      senders(1, REFUSE), "(%s is %d)" % (told, ids[told]))
assert senders(1, REFUSE) == [ids[told]], senders(1, REFUSE)
assert ids[told] not in senders(1, REVEAL)
assert len(senders(1, REVEAL)) == 2
assert senders(2, REVEAL) == sorted(ids.values()) and not senders(2, REFUSE)
m = [json.loads(l) for l in open(out + "/metrics.jsonl")]
sa = [r["secure_aggregation"] for r in m]
print("metrics:", [(r["round"], r["status"]) for r in m], sa)
assert [r["status"] for r in m] == ["ok", "ok"], m
assert (sa[0]["refused"], sa[0]["revealed"]) == (1, 2), sa[0]
assert (sa[1]["refused"], sa[1]["revealed"]) == (0, 3), sa[1]
PYEOF
echo PASS
