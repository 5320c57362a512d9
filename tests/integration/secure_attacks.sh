# SPDX-License-Identifier: Apache-2.0
# Encrypted, signed sessions under attack, with real processes on TCP
# loopback. Worker w2 talks to the coordinator through a tap that records
# its traffic, as an on-path eavesdropper would. While rounds are in
# progress, separate attacker programs: start a worker whose key is not on
# the allowlist (refused), a worker whose allowlisted key belongs to another
# name (refused), replay w2's captured messages (later round and same
# round), replay them with one bit flipped in the header, the ciphertext,
# the MAC, the payload chunks and the trailers, replay truncated payloads,
# replay w2's signed handshake hello as if they were w2, and send random
# bytes and random protobufs. Every round completes with all three honest
# workers, and the final model is bitwise the model of the same run without
# any attack.
source tests/integration/lib.sh
make_keys 4 # w0..w2 train; w3 is on the allowlist but stays away
"$B/fedbox-keygen" -o "$KEYS/stranger" -C w9 >/dev/null

run() { # OUT ATTACK(0|1)
	local out=$1 attack=$2 port tport
	port=$(free_port)
	OUT=$out
	mkdir -p "$out"
	coord_yaml "$port" "$out" "  rounds: 8
  min_workers: 3
  min_updates: 3
  local_steps: 60
  batch_size: 32
  deadline: 60s" >"$out/c.yaml"
	start_coordinator "$out/c.yaml"
	wait_for "$T/coord.log" "listening on" 20
	for i in 0 1 2; do
		wport=$port
		extra=""
		if [ "$i" = 2 ] && [ "$attack" = 1 ]; then
			# slow, so that the rounds outlast the attacks; the base
			# run needs no throttle (fixed steps: the model is the
			# same), and a throttle scales with the step's real time,
			# which a sanitizer build multiplies
			extra="  throttle: 100"
			tport=$(free_port)
			"$PY" tests/tools/zmtp_tap.py "$tport" "$port" "$T/cap.jsonl" &
			PIDS+=("$!")
			sleep 0.5
			wport=$tport
		fi
		worker_yaml "$wport" "$i" 3 "$extra" >"$out/w$i.yaml"
		start_worker "$out/w$i.yaml" "w$i"
	done
	if [ "$attack" = 1 ]; then
		attack_all "$port"
	fi
	wait_exit "$CPID" 180 || fail "coordinator exited with status $?"
	cp "$T/rounds.txt" "$out/rounds.txt"
	cp "$T/coord.log" "$out/coord.log"
}

attack_all() { # PORT
	local ep=tcp://127.0.0.1:$1
	wait_for "$T/rounds.txt" "round +1/" 60
	# A worker whose key is not on the allowlist.
	worker_yaml "$1" 0 3 >"$T/w9.yaml"
	sed -i -e "s|/w0.key|/stranger.key|" -e "s|^name: w0|name: w9|" "$T/w9.yaml"
	start_worker "$T/w9.yaml" w9
	stranger=$WPID
	# A worker with an allowlisted key (w3's) claiming to be w0.
	worker_yaml "$1" 0 3 >"$T/w3.yaml"
	sed -i -e "s|/w0.key|/w3.key|" "$T/w3.yaml"
	start_worker "$T/w3.yaml" w3
	impostor=$WPID
	wait_exit "$stranger" 30 && fail "the stranger worker was not refused"
	grep -q "not on this coordinator's allowlist" "$T/w9.log" ||
		fail "the stranger's refusal is unclear: $(tail -3 "$T/w9.log")"
	wait_exit "$impostor" 30 && fail "the impostor worker was not refused"
	grep -q "belongs to worker 'w3', not 'w0'" "$T/w3.log" ||
		fail "the impostor's refusal is unclear: $(tail -3 "$T/w3.log")"
	echo "stranger and impostor refused"
	for a in replay-recent replay flip-header flip-body flip-payload \
		flip-trailer truncate hello; do
		"$PY" tests/tools/replayer.py "$ep" "$T/cap.jsonl" "$a" >>"$T/attacks.txt" 2>&1 ||
			fail "replayer $a failed"
	done
	"$PY" tests/tools/attacker.py "$ep" garbage --seconds 2 >>"$T/attacks.txt" 2>&1 ||
		fail "garbage attacker failed"
	cat "$T/attacks.txt"
	grep -q "^round +8/" "$T/rounds.txt" &&
		echo "note: the run ended before the attacks did (busy machine)"
	return 0
}

run "$T/base" 0
run "$T/attacked" 1
cat "$T/attacked/rounds.txt"
"$PY" - "$T/base" "$T/attacked" <<'PYEOF' || fail "attacked run differs"
import json, struct, sys
base, att = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(att + "/metrics.jsonl")]
assert len(rows) == 8, len(rows)
total = {}
for r in rows:
    assert r["status"] == "ok" and r["participants"] == 3, r
    for k, v in r["rejected"].items():
        total[k] = total.get(k, 0) + v
print("rejected during the attacked run:", {k: v for k, v in total.items() if v})
for k in ("unknown_key", "wrong_identity", "replay", "bad_mac"):
    assert total[k] > 0, (k, total)
def tensors(p):
    d = open(p, "rb").read()
    n = struct.unpack("<Q", d[:8])[0]
    return d[8 + n:]
a = tensors(base + "/model.safetensors")
b = tensors(att + "/model.safetensors")
assert a == b, "the attacked run's model differs"
print("final model identical to the run without attacks (%d bytes)" % len(a))
PYEOF
echo PASS
