# SPDX-License-Identifier: Apache-2.0
# Heterogeneity-aware rounds with real processes: with a time budget a
# throttled (simulated slow) worker is assigned fewer steps than a fast one
# (with secure aggregation it fits fewer steps itself, at its own measured
# speed, which the coordinator never learns);
# a straggler past the deadline is dropped in `drop` mode and waited for in
# `wait` mode; with over-selection the round keeps the first finishers and
# cancels the rest; FedNova rounds report tau_eff and each worker's
# normaliser. Security off here; heterogeneity_secure.sh runs the same with
# encrypted sessions and secure aggregation (there the dropped straggler's
# masks are recovered, and no worker's normaliser is visible).
SECURE=${HET_SECURE:-0}
source tests/integration/lib.sh

run() { # NAME ROUND-YAML [THROTTLE-OF-W2]
	local name=$1 round=$2 t2=${3:-1} port
	port=$(free_port)
	OUT=$T/$name
	mkdir -p "$OUT"
	coord_yaml "$port" "$OUT" "$round" >"$OUT/c.yaml"
	start_coordinator "$OUT/c.yaml"
	for i in 0 1 2; do
		local extra=""
		[ "$i" = 2 ] && extra="  throttle: $t2"
		worker_yaml "$port" "$i" 3 "$extra" >"$OUT/w$i.yaml"
		start_worker "$OUT/w$i.yaml" "$name-w$i"
	done
	wait_exit "$CPID" 120 || fail "$name: coordinator exited with status $?"
	cp "$T/rounds.txt" "$OUT/rounds.txt"
	echo "== $name"
	cat "$OUT/rounds.txt"
}

check() { # NAME PYTHON
	"$PY" - "$T/$1/metrics.jsonl" <<PYEOF || fail "$1: $(cat "$T/$1/rounds.txt")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def ws(r): return {w["name"]: w for w in r["workers"]}
$2
PYEOF
}

run budget "  rounds: 3
  min_workers: 3
  local_work: time_budget
  time_budget: 500ms
  local_steps: 40
  batch_size: 32
aggregation:
  rule: fednova" 20
check budget '
import re
for r in rows[1:]:
    w = ws(r)
    assert r["tau_eff"] > 1, r
    if "secure_aggregation" in r:
        # the workers fit their own steps to the budget: the coordinator
        # shows neither steps nor speeds, nor a normaliser
        assert all(k not in x for x in w.values() for k in
                   ("a_norm", "assigned_steps", "steps", "steps_per_s")), w
        continue
    # 20x throttled; a busy machine compresses the gap, so only ask for
    # clearly fewer steps.
    assert w["w2"]["assigned_steps"] * 1.5 < w["w0"]["assigned_steps"], w
    assert all(x["a_norm"] > 0 for x in w.values()), w
if "secure_aggregation" in rows[-1]:
    # what each worker fitted, from its own log (its box, not the wire)
    own = {}
    for n in ("w0", "w2"):
        text = open(sys.argv[1].rsplit("/", 2)[0] + "/budget-%s.log" % n).read()
        own[n] = [int(x) for x in re.findall(
            r"round [23]: (\d+) steps fitted to the time budget", text)]
        assert len(own[n]) == 2, (n, own[n])
    assert all(a * 1.5 < b for a, b in zip(own["w2"], own["w0"])), own
    print("time budget: steps each worker fitted itself in rounds 2, 3", own)
else:
    print("time budget: round 3 assigned", {k: v["assigned_steps"] for k, v in ws(rows[-1]).items()})
'

run drop "  rounds: 2
  min_workers: 3
  min_updates: 2
  local_steps: 40
  batch_size: 32
  deadline: 2s
  stragglers: drop" 200
check drop '
for r in rows:
    w = ws(r)
    assert r["participants"] == 2 and w["w2"]["status"] == "failed", r
    assert r["seconds"] < 6, r
    assert r.get("secure_aggregation", {"included": 2})["included"] == 2, r
print("drop: rounds closed at the deadline without w2:", [r["seconds"] for r in rows])
'

run wait "  rounds: 2
  min_workers: 3
  local_steps: 20
  batch_size: 32
  deadline: 500ms
  stragglers: wait" 200
check wait '
for r in rows:
    w = ws(r)
    assert r["participants"] == 3 and w["w2"]["status"] == "done", r
    assert r.get("secure_aggregation", {"included": 3})["included"] == 3, r
    assert not w["w2"]["made_deadline"] and w["w0"]["made_deadline"], w
    assert r["seconds"] > 0.5, r
print("wait: rounds waited for w2:", [r["seconds"] for r in rows])
'

run over "  rounds: 3
  min_workers: 3
  workers_per_round: 2
  over_select: 1
  local_steps: 40
  batch_size: 32" 30
check over '
for r in rows:
    st = sorted(w["status"] for w in r["workers"])
    assert r["participants"] == 2 and st == ["done", "done", "failed"], r
    assert ws(r).get("w2", {"status": "failed"})["status"] == "failed", r
print("over-selection: 3 started, the first 2 kept, each round")
'
[ "$SECURE" = 1 ] && echo "(with encrypted sessions and secure aggregation)"
echo PASS
