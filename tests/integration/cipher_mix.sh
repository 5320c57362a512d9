# SPDX-License-Identifier: Apache-2.0
# The bulk ChaCha20 passes (model and update chunks, the masks) run on
# libcrypto, and FEDBOX_CIPHER=libsodium puts a process on libsodium's;
# the bytes must be the same either way. A secure federation (encrypted,
# signed sessions, secure aggregation) of 3 workers runs twice with the
# same seeds: every process on libcrypto, then the coordinator and two
# workers on libsodium and one on libcrypto. Both runs commit every round
# with all workers, each process says which library it used, and the two
# models are bitwise identical.
source tests/integration/lib.sh
[ "$SECAGG" = 1 ] || skip "secure aggregation off (SECAGG=0)"

run() { # DIR COORDINATOR-CIPHER WORKER-CIPHERS...
	local dir=$1 cc=$2 port i=0
	shift 2
	port=$(free_port)
	mkdir -p "$dir"
	coord_yaml "$port" "$dir" "  rounds: 3
  min_workers: 3
  local_steps: 30
  batch_size: 32" >"$dir/c.yaml"
	FEDBOX_CIPHER=$cc "$B/fedbox-coordinator" --config "$dir/c.yaml" \
		>"$dir/rounds.txt" 2>"$dir/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
	for wc in "$@"; do
		worker_yaml "$port" "$i" 3 >"$dir/w$i.yaml"
		FEDBOX_CIPHER=$wc "$B/fedbox-worker" --config "$dir/w$i.yaml" \
			>"$dir/w$i.log" 2>&1 &
		PIDS+=("$!")
		i=$((i + 1))
	done
	wait_exit "$CPID" 120 || {
		tail -5 "$dir"/*.log
		fail "coordinator ($cc) exited with status $?"
	}
}

said() { # LOG LIBRARY
	grep -qE "ciphers: $2(\)|$)" "$1" || fail "$1 does not say it used $2 alone"
}

run "$T/a" default default default default
run "$T/b" libsodium libsodium default libsodium
said "$T/a/coord.log" libcrypto
said "$T/b/coord.log" libsodium
for i in 0 1 2; do said "$T/a/w$i.log" libcrypto; done
said "$T/b/w0.log" libsodium
said "$T/b/w1.log" libcrypto
said "$T/b/w2.log" libsodium
for r in a b; do
	"$PY" - "$T/$r/metrics.jsonl" <<'PYEOF' || fail "run $r: a round did not commit with every worker"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, len(rows)
for r in rows:
    assert r["status"] == "ok" and r["participants"] == 3, r
    assert "secure_aggregation" in r, r
PYEOF
done
same_tensors "$T/a/model.safetensors" "$T/b/model.safetensors" ||
	fail "the models differ between the runs"
echo PASS
