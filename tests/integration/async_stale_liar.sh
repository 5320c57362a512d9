# SPDX-License-Identifier: Apache-2.0
# Secure async against a coordinator that lies about staleness, on live
# processes: the test build tests/fedbox-coordinator-liar (FB_TEST_LIE=
# staleness) credits the run's first upload round.max_staleness + 1 steps
# stale, as if to weigh that input below the bound its cohort was told.
# The worker must send no chunk of it and leave the cohort, saying why;
# the cohort (3 members, threshold 2) steps without it, and the run makes
# all its steps.
SECURE=1
SECAGG=1
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  mode: async
  buffer_size: 3
  max_staleness: 4
  rounds: 4
  min_workers: 3
  local_steps: 20
  batch_size: 32
  deadline: 30s" >"$T/c.yaml"
start_liar staleness "$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 90 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
lie=$(grep -o "test liar: w[0-9]'s upload is credited 5 steps stale" \
	"$T/coord.log") || fail "the liar did not lie"
echo "$lie"
told=$(echo "$lie" | sed "s/test liar: \(w[0-9]\)'s.*/\1/")
refusal="counts the update 5 steps stale, past the round's max_staleness (4)"
grep "$refusal.*; not sending it" "$T/$told.log" ||
	fail "$told did not refuse the credit"
"$PY" - "$OUT/metrics.jsonl" "$told" <<'PYEOF' || fail "the stale credit's input was used"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
told = sys.argv[2]
print([(r["round"], r["status"], r["members"],
        r["secure_aggregation"]["included"], [w["name"] for w in r["workers"]])
       for r in m])
assert [r["status"] for r in m] == ["ok"] * 4, m
# one cohort stepped without the lied-to member; every other had all
short = [r for r in m if r["secure_aggregation"]["included"] < r["members"]]
assert len(short) == 1, short
assert short[0]["secure_aggregation"]["included"] == 2, short[0]
assert told not in [w["name"] for w in short[0]["workers"]], short[0]
for r in m:
    for w in r["workers"]:
        assert w["input_staleness"] <= 4, (r["round"], w)
PYEOF
echo PASS
