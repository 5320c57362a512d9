# SPDX-License-Identifier: Apache-2.0
# A worker with security.peers accepts secure-aggregation key adverts only
# from the identities listed there: here w2's list lacks w1, so w2 refuses
# w1's advert, its shares do not match the round's graph, the coordinator
# refuses them and w2 leaves the round; w0 and w1 (threshold 2) finish it.
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
make_keys 3
SA_YAML="  threshold: 2
" coord_yaml "$port" "$OUT" "  rounds: 1
  min_workers: 3
  local_steps: 10
  batch_size: 32" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	if [ "$i" = 2 ]; then
		grep -v " w1$" "$KEYS/allowlist" >"$T/peers-w2"
		sed -i "s|^  secure_aggregation: required|  secure_aggregation: required\n  peers: $T/peers-w2|" "$T/w$i.yaml"
	else
		sed -i "s|^  secure_aggregation: required|  secure_aggregation: required\n  peers: $KEYS/allowlist|" "$T/w$i.yaml"
	fi
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 60 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
grep -q "not in security.peers: refused" "$T/w2.log" ||
	fail "w2 did not refuse the advert of a key outside its peers"
grep -q "not in security.peers" "$T/w0.log" "$T/w1.log" &&
	fail "a worker refused a listed peer"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "round 1 is wrong"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][0]
w = {x["name"]: x for x in r["workers"]}
assert r["status"] == "ok" and r["secure_aggregation"]["included"] == 2, r
assert w["w2"]["status"] == "failed", w
print("w2 refused an unlisted key and left; w0 and w1 completed the round")
PYEOF
echo PASS
