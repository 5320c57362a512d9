# SPDX-License-Identifier: Apache-2.0
# A coordinator that lies about the terms that weigh each input, on live
# processes: the test build tests/fedbox-coordinator-liar (FB_TEST_LIE=
# terms) tells two workers of three (threshold 2) a max_samples 1000
# times the round's, as if to weigh their inputs down and read the
# third's nearly alone in the sum. The terms are bound into the share
# keys, so the third's shares and theirs open on neither side: it leaves
# the round before any masked input of it goes, and no sum holds it.
# Round 2 is honest (the liar lies once): all three are in its sum.
source tests/integration/lib.sh
make_keys 3
port=$(free_port)
OUT=$T/out
mkdir -p "$OUT"
SA_YAML="  threshold: 2
  unmask_timeout: 5s
" coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 3
  local_steps: 10
  batch_size: 32
debug:
  wire_log: $OUT/wire.jsonl" >"$T/c.yaml"
start_liar terms "$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 90 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
for i in 1 2; do
	grep "test liar: round 1: w$i is told max_samples" "$T/coord.log" ||
		fail "the liar did not lie to w$i"
done
# w0 opens neither neighbour's shares, and leaves before its input goes
refused="do not open (authentication failed): it was told other round terms"
[ "$(grep -c "round 1: the shares of the neighbour in slot [12] $refused" \
	"$T/w0.log")" = 2 ] || fail "w0 did not refuse both neighbours' shares"
grep "round 1: too few neighbours shared .*; leaving the round" "$T/w0.log" ||
	fail "w0 did not leave round 1"
for i in 1 2; do
	grep "round 1: the shares of the neighbour in slot 0 $refused" \
		"$T/w$i.log" ||
		fail "w$i opened the share of a worker told other terms"
done
"$PY" - "$OUT" <<'PYEOF' || fail "an input told other terms was summed"
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/wire.jsonl")]
ids = {r["name"]: r["sender"] for r in rows if r["type"] == "hello"}
ups = sorted({r["sender"] for r in rows if r["type"].startswith("update")
              and r["round"] == 1})
print("round 1: uploads from", ups, "(w0 is %d)" % ids["w0"])
assert ups == sorted([ids["w1"], ids["w2"]]), ups
m = [json.loads(l) for l in open(out + "/metrics.jsonl")]
print("metrics:", [(r["round"], r["status"], r["secure_aggregation"]["included"])
                   for r in m])
# round 1 gives no sum: w0 is not in it, and the two told 1000 times
# the max_samples are never released as a sum of their own
assert m[0]["status"] == "aborted", m[0]
w0 = [w for w in m[0]["workers"] if w["name"] == "w0"][0]
assert w0["status"] == "failed" and "too few neighbours" in w0["reason"], w0
assert m[1]["status"] == "ok" and m[1]["participants"] == 3, m[1]
assert m[1]["secure_aggregation"]["included"] == 3, m[1]
PYEOF
echo PASS
