# SPDX-License-Identifier: Apache-2.0
# Partitions heal (issue 22: "5 s and 60 s partitions heal" must keep
# holding): worker w2 in a network namespace of its own, its link cut
# (ip link set down) while it trains a round. Both sides give the other up
# after their liveness timeout (3 s here), the round goes on without w2,
# and once the link is back w2 joins again on a fresh connection and the
# rounds after run with all three. A 5 s partition here, 5 s and 60 s with
# FB_FAULTS_FULL=1.
source tests/faults/lib.sh
need_root_net
cuts=$([ "$FULL" = 1 ] && echo "5 60" || echo "5")
make_keys 3
nc=$(ns_new c)
ns=$(ns_new s)
dev="v$$"
ns_link "$nc" 10.82.0.1 "$ns" 10.82.0.2 "$dev"
port=$(free_port)
OUT=$T/out
ncuts=$(echo $cuts | wc -w)
rounds=$((2 * ncuts + 2))
# min_workers 3: the round after a cut waits for w2 to be back
coord_yaml "$port" "$OUT" "  rounds: $rounds
  min_workers: 3
  min_updates: 2
  local_steps: 30
  deadline: 30s" >"$T/c.yaml"
sed -i "s|listen: tcp://127.0.0.1:$port|listen: tcp://0.0.0.0:$port|" "$T/c.yaml"
start_coordinator_in "$nc" "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
for i in 0 1; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker_in "$nc" "$T/w$i.yaml" "w$i"
done
# w2 trains slowly (simulation): each of its rounds lasts seconds
worker_yaml "$port" 2 3 "  throttle: 100" |
	sed "s|tcp://127.0.0.1:$port|tcp://10.82.0.1:$port|" >"$T/w2.yaml"
start_worker_in "$ns" "$T/w2.yaml" w2
round=1
for secs in $cuts; do
	# cut w2 off while it trains the round after `round`
	wait_for "$T/rounds.txt" "round +$round/$rounds" 90
	admitted=$(grep -c 'admitted as worker' "$T/w2.log")
	ip -n "$ns" link set "$dev-b" down
	echo "partition of ${secs}s during round $((round + 1))"
	sleep "$secs"
	ip -n "$ns" link set "$dev-b" up
	healed=$(date +%s)
	for ((k = 0; k < 60; k++)); do
		[ "$(grep -c 'admitted as worker' "$T/w2.log")" -gt "$admitted" ] &&
			break
		sleep 1
	done
	[ "$(grep -c 'admitted as worker' "$T/w2.log")" -gt "$admitted" ] ||
		fail "w2 did not join again within 60 s of the heal"
	echo "w2 joined again $(($(date +%s) - healed))s after the heal"
	round=$((round + 2))
done
wait_exit "$CPID" 180 || fail "coordinator exited with $?"
cat "$T/rounds.txt"
"$PY" - "$OUT/metrics.jsonl" "$rounds" <<'PYEOF' || fail "rounds after the partitions are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
assert [r["round"] for r in rows] == list(range(1, n + 1)), rows
for r in rows:
    assert r["status"] == "ok", (r["round"], r["status"])
# every round but the partitioned ones ran with all three; those with
# at least the two others
for r in rows:
    cut = r["round"] % 2 == 0 and r["round"] < n
    assert r["participants"] >= (2 if cut else 3), \
        (r["round"], r["participants"])
print("%d rounds committed; all 3 workers in each but the partitioned"
      % len(rows))
PYEOF
grep -q "nothing from the coordinator for" "$T/w2.log" ||
	fail "w2 never noticed the partition"
echo PASS
