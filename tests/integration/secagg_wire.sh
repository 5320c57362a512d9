# SPDX-License-Identifier: Apache-2.0
# What a secure-aggregation worker sends, read on the wire: the
# coordinator's debug.wire_log records every message it decoded from a
# worker (sealed ones opened), and in a secure federation (3 workers,
# FedNova, a 300 ms time budget, 3 rounds) no hello or update carries a
# speed, step count, training time, loss, normaliser or sample count:
# each is zero in every message, and the metrics show none either. The
# same federation without secure aggregation (workers set to optional)
# shows them, so the check sees what it checks for. In the secure run the
# workers fit their steps to the budget themselves, at their own speed.
source tests/integration/lib.sh
make_keys 3

run() { # NAME SECAGG(0|1)
	local name=$1 sa=$2 port
	port=$(free_port)
	OUT=$T/$name
	mkdir -p "$OUT"
	SECAGG=$sa coord_yaml "$port" "$OUT" "  rounds: 3
  min_workers: 3
  local_work: time_budget
  time_budget: 300ms
  local_steps: 20
  batch_size: 32
aggregation:
  rule: fednova
debug:
  wire_log: $OUT/wire.jsonl" >"$OUT/c.yaml"
	start_coordinator "$OUT/c.yaml"
	for i in 0 1 2; do
		SECAGG=$sa worker_yaml "$port" "$i" 3 >"$OUT/w$i.yaml"
		start_worker "$OUT/w$i.yaml" "$name-w$i"
	done
	wait_exit "$CPID" 120 || fail "$name: coordinator exited with status $?"
	cat "$T/rounds.txt"
}

run secure 1
run plain 0
"$PY" - "$T" <<'PYEOF' || fail "a secure worker's speed or count is on the wire"
import json, re, sys
t = sys.argv[1]
LEAKS = ("num_samples", "steps", "train_seconds", "steps_per_second",
         "train_loss", "a_norm")

def load(name):
    return [json.loads(l) for l in open("%s/%s/wire.jsonl" % (t, name))]

sec, plain = load("secure"), load("plain")
for name, rows in (("secure", sec), ("plain", plain)):
    kinds = {}
    for r in rows:
        kinds[r["type"]] = kinds.get(r["type"], 0) + 1
    print("%s: %d messages from the workers: %s" % (name, len(rows), kinds))
    # the check needs the messages it reads: 3 hellos, 9 updates
    assert kinds.get("hello", 0) >= 3 and kinds.get("update_begin", 0) >= 9, kinds
    assert all(r["sealed"] for r in rows if r["type"] != "handshake"), name

# secure: every speed and count field of every message is zero
bad = [(r["type"], k, r[k]) for r in sec for k in LEAKS if r.get(k, 0) != 0]
assert not bad, bad[:5]
assert any(r["type"] == "secagg" and r["phase"] == 7 for r in sec), \
    "no confirmation of the included set on the wire"
print("secure: no speed, steps, time, loss, normaliser or sample count in "
      "%d messages" % len(sec))

# plain (the control): the same fields carry the workers' values
ub = [r for r in plain if r["type"] == "update_begin"]
for k in ("num_samples", "steps", "train_seconds", "steps_per_second",
          "a_norm"):
    assert all(r[k] > 0 for r in ub), (k, ub[:2])
assert all(r["num_samples"] > 0 for r in plain if r["type"] == "hello")
print("plain: %d updates each show their speed, steps, time and count"
      % len(ub))

for name in ("secure", "plain"):
    rows = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (t, name))]
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows), rows
    for r in rows:
        for w in r["workers"]:
            shown = [k for k in ("steps", "steps_per_s", "train_seconds",
                                 "assigned_steps", "a_norm") if k in w]
            if name == "secure":
                assert not shown, (r["round"], w)
            else:
                assert len(shown) == 5, (r["round"], w)

# each secure worker fitted its own steps to the budget (rounds 2, 3)
for i in range(3):
    log = open("%s/secure-w%d.log" % (t, i)).read()
    fitted = re.findall(r"round [23]: (\d+) steps fitted to the time budget",
                        log)
    assert len(fitted) == 2, (i, fitted)
print("secure: each worker fitted its steps itself:",
      [re.findall(r"round [23]: (\d+) steps fitted",
                  open("%s/secure-w%d.log" % (t, i)).read()) for i in range(3)])
PYEOF
echo PASS
