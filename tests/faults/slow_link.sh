# SPDX-License-Identifier: Apache-2.0
# A worker behind a 256 kbit/s link (tc tbf on both ends of its veth)
# contributes to every round with the default settings (issue 22,
# acceptance 3): the default model (784-128-10, 407 KB) takes about 13 s
# each way, longer than the default 10 s liveness timeout for one chunk,
# so both sides must count the bytes moving, not whole messages. Two
# other workers sit next to the coordinator. Secure sessions and secure
# aggregation, Fashion-MNIST, defaults for everything else (deadline 5m,
# liveness 10s, chunk 1 MiB). 1 round (5 with FB_FAULTS_FULL=1).
source tests/faults/lib.sh
need_root_net
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
	skip "needs Debian's dataset-fashion-mnist"
rounds=$([ "$FULL" = 1 ] && echo 5 || echo 1)
make_keys 3
nc=$(ns_new c)
ns=$(ns_new s)
ns_link "$nc" 10.81.0.1 "$ns" 10.81.0.2 "v$$"
ns_rate "$nc" "v$$-a" 256kbit
ns_rate "$ns" "v$$-b" 256kbit
port=$(free_port)
OUT=$T/out
cat >"$T/c.yaml" <<YAML
listen: tcp://0.0.0.0:$port
output_dir: $OUT
round:
  rounds: $rounds
  min_workers: 3
security:
  key: $KEYS/coordinator.key
  allowlist: $KEYS/allowlist
YAML
start_coordinator_in "$nc" "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
for i in 0 1 2; do
	host=127.0.0.1
	[ "$i" = 2 ] && host=10.81.0.1
	cat >"$T/w$i.yaml" <<YAML
coordinator: tcp://$host:$port
name: w$i
data:
  index: $i
  workers: 3
security:
  key: $KEYS/w$i.key
  coordinator_key: $KEYS/coordinator.pub
YAML
	if [ "$i" = 2 ]; then
		start_worker_in "$ns" "$T/w$i.yaml" "w$i"
	else
		start_worker_in "$nc" "$T/w$i.yaml" "w$i"
	fi
done
start=$(date +%s)
wait_exit "$CPID" $((rounds * 150)) || fail "coordinator exited with $?"
secs=$(($(date +%s) - start))
cat "$T/rounds.txt"
check_rounds "$rounds" 3
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "the slow worker's rounds are wrong"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    st = {w["name"]: w["status"] for w in r["workers"]}
    assert st.get("w2") == "done", (r["round"], st)
    print("round %d: %.1fs, w2 done" % (r["round"], r["seconds"]))
PYEOF
grep -q "reconnect\|lost" "$T/w2.log" "$T/coord.log" &&
	fail "a side lost the other on the slow link: $(grep -h 'reconnect\|lost' "$T/w2.log" "$T/coord.log" | head -3)"
echo "the 256 kbit/s worker was in all $rounds rounds (${secs}s)"
echo PASS
