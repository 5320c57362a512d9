# SPDX-License-Identifier: Apache-2.0
# With security off, while rounds are in progress, a separate attacker program sends random
# bytes, random protobufs, truncated and multi-part garbage, a hello with the
# wrong protocol version, and (as an admitted peer) stale, missized,
# out-of-order and NaN update traffic. The coordinator drops all of it,
# counts it in metrics.jsonl, answers the version mismatch with a clear
# reject, and every round completes with the honest workers.
# Plain mode: the attacker's "mallory" peers must be admitted to reach the
# round-level checks (secure mode refuses them at the door: see
# tests/integration/secure_attacks.sh).
SECURE=0
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 6
  min_workers: 2
  min_updates: 2
  local_steps: 150
  batch_size: 32
  deadline: 60s" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1; do
	# w1 is slowed (simulation) so that rounds outlast the attacks even
	# on a fast, idle machine.
	worker_yaml "$port" "$i" 2 "$([ "$i" = 1 ] && echo "  throttle: 15")" >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
# Both honest workers first: in plain mode an attacker's hello is admitted
# like any other and would count towards round.min_workers.
wait_for "$T/coord.log" "worker w0 admitted" 60
wait_for "$T/coord.log" "worker w1 admitted" 60

"$PY" tests/tools/attacker.py "tcp://127.0.0.1:$port" version >"$T/version.txt" 2>&1 ||
	fail "version attack: $(cat "$T/version.txt")"
grep -q "protocol version 99 is not supported" "$T/version.txt" ||
	fail "reject reason unclear: $(cat "$T/version.txt")"
cat "$T/version.txt"

"$PY" tests/tools/attacker.py "tcp://127.0.0.1:$port" garbage --seconds 4 &
PIDS+=("$!")
gpid=$!
"$PY" tests/tools/attacker.py "tcp://127.0.0.1:$port" hostile --seconds 6 &
PIDS+=("$!")
hpid=$!
wait "$gpid" || fail "garbage attacker failed"
wait "$hpid" || fail "hostile attacker failed"

wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
[ "$(wc -l <"$OUT/metrics.jsonl")" -eq 6 ] || fail "expected 6 rounds in metrics"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "metrics do not show the expected rounds and rejections"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
total = {}
for r in rows:
    assert r["status"] == "ok", r
    done = [w["name"] for w in r["workers"] if w["status"] == "done"]
    assert sorted(done) == ["w0", "w1"], r["workers"]
    bad = [w for w in r["workers"] if w["name"].startswith("mallory")]
    assert all(w["status"] == "failed" for w in bad), bad
    for k, v in r["rejected"].items():
        total[k] = total.get(k, 0) + v
print("rejected over the run:", total)
assert total["malformed"] > 0 and total["unknown_peer"] > 0, total
assert total["version"] >= 1, total
for k in ("stale_round", "wrong_size", "non_finite", "out_of_order", "unexpected"):
    assert total[k] > 0, (k, total)
assert sum(total.values()) > 50, total
PYEOF
grep -q "dropped message (malformed)" "$T/coord.log" || fail "no log line for malformed frames"
echo PASS
