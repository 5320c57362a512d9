# SPDX-License-Identifier: Apache-2.0
# The model download's window of chunk requests over a slow link (issue
# 25): w2 sits behind a 256 kbit/s link (tc tbf on both ends of its veth)
# and downloads the default model (784-128-10, 407 KB) in 4 KiB chunks,
# about 100 of them, with the default window (transport.fetch_window: 32
# requests ahead), so the window slides over the link about three times;
# w1, next to the coordinator, fetches one chunk at a time (window 1),
# w0 with the default. Secure sessions and secure aggregation,
# Fashion-MNIST. Every worker must have every round, the slow one with
# its whole model (every chunk, in order, verified) and nobody lost.
# 1 round (3 with FB_FAULTS_FULL=1).
source tests/faults/lib.sh
need_root_net
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
	skip "needs Debian's dataset-fashion-mnist"
rounds=$([ "$FULL" = 1 ] && echo 3 || echo 1)
make_keys 3
nc=$(ns_new c)
ns=$(ns_new s)
ns_link "$nc" 10.82.0.1 "$ns" 10.82.0.2 "f$$"
ns_rate "$nc" "f$$-a" 256kbit
ns_rate "$ns" "f$$-b" 256kbit
port=$(free_port)
OUT=$T/out
cat >"$T/c.yaml" <<YAML
listen: tcp://0.0.0.0:$port
output_dir: $OUT
round:
  rounds: $rounds
  min_workers: 3
transport:
  chunk_size: 4KiB
security:
  key: $KEYS/coordinator.key
  allowlist: $KEYS/allowlist
YAML
start_coordinator_in "$nc" "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
for i in 0 1 2; do
	host=127.0.0.1
	[ "$i" = 2 ] && host=10.82.0.1
	window=""
	[ "$i" = 1 ] && window="transport:
  fetch_window: 1"
	cat >"$T/w$i.yaml" <<YAML
coordinator: tcp://$host:$port
name: w$i
log_level: debug
data:
  index: $i
  workers: 3
security:
  key: $KEYS/w$i.key
  coordinator_key: $KEYS/coordinator.pub
$window
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
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "the workers' rounds are wrong"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    st = {w["name"]: w["status"] for w in r["workers"]}
    assert all(st.get("w%d" % i) == "done" for i in range(3)), (r["round"], st)
    print("round %d: %.1fs, all three done" % (r["round"], r["seconds"]))
PYEOF
# the model really came in many chunks, more than the window, and whole
n=$(sed -n 's/.*round 1: fetching the model (\([0-9]*\) chunks).*/\1/p' \
	"$T/w2.log" | head -1)
[ -n "$n" ] && [ "$n" -gt 64 ] ||
	fail "w2 fetched the model in '${n:-no}' chunks, not more than twice the window of 32"
for i in 0 1 2; do
	[ "$(grep -c "model received" "$T/w$i.log")" -eq "$rounds" ] ||
		fail "w$i did not receive the whole model in each of $rounds rounds"
done
grep -q "out of order\|rejected\|wrong size" "$T/w2.log" &&
	fail "w2 refused a model chunk: $(grep -h 'out of order\|rejected\|wrong size' "$T/w2.log" | head -2)"
grep -q "reconnect\|lost" "$T/w2.log" "$T/coord.log" &&
	fail "a side lost the other on the slow link: $(grep -h 'reconnect\|lost' "$T/w2.log" "$T/coord.log" | head -3)"
echo "w2 took its $n-chunk model over 256 kbit/s, 32 requests ahead, in all $rounds rounds (${secs}s)"
echo PASS
