# SPDX-License-Identifier: Apache-2.0
# A recorded handshake hello is not answered after the coordinator
# restarts. Worker w0 joins a secure federation through a tap that records
# its traffic (tests/tools/zmtp_tap.py), as an on-path eavesdropper would;
# the coordinator finishes its round and a new coordinator process starts
# on the same port with the same identity and allowlist. The captured
# messages in clear (w0's cookie request and its signed hello) are then
# replayed to it (tests/tools/replayer.py): the cookie request gets a
# cookie, as anyone's does, but the hello, whose cookie the old process
# made, gets no reply and is counted as a replay; fresh workers then join
# the new coordinator and its round commits.
source tests/integration/lib.sh
make_keys 2
port=$(free_port)
tport=$(free_port)

coordinator() { # OUT
	coord_yaml "$port" "$1" "  rounds: 1
  min_workers: 2
  local_steps: 10
  batch_size: 32" >"$1.yaml"
	# one listening port, so that the tapped worker stays behind the tap
	echo "  lanes: 1" >>"$1.yaml"
	start_coordinator "$1.yaml"
	wait_for "$T/coord.log" "listening on" 20
}

coordinator "$T/a"
"$PY" tests/tools/zmtp_tap.py "$tport" "$port" "$T/cap.jsonl" &
PIDS+=("$!")
sleep 0.5
worker_yaml "$tport" 0 2 >"$T/w0.yaml"
worker_yaml "$port" 1 2 >"$T/w1.yaml"
start_worker "$T/w0.yaml" w0
start_worker "$T/w1.yaml" w1
wait_exit "$CPID" 60 || fail "the first coordinator exited with status $?"
grep -qE "^round +1/1 .*acc" "$T/rounds.txt" || fail "no round before the restart"
"$PY" - "$T/cap.jsonl" <<'PYEOF' || fail "the tap recorded no signed hello"
import json, sys
sizes = []
for l in open(sys.argv[1]):
    d = json.loads(l)
    f = bytes.fromhex(d["frames"][0])
    if d["dir"] == "c2s" and f[:2] == b"FB" and not f[3] & 2:
        sizes.append(len(f))
# the 164-byte signed hello (after the empty cookie request)
assert sizes and max(sizes) > 164, sizes
print("captured in clear from w0: %d messages of %s bytes" % (len(sizes), sizes))
PYEOF

mv "$T/coord.log" "$T/coord-a.log"
coordinator "$T/b"
"$PY" tests/tools/replayer.py "tcp://127.0.0.1:$port" "$T/cap.jsonl" hello \
	>"$T/replay.txt" 2>&1 || { cat "$T/replay.txt"; fail "replayer failed"; }
cat "$T/replay.txt"
grep -qE "answers: [1-9][0-9]* cookies, 0 replies" "$T/replay.txt" ||
	fail "the recorded hello was answered (or the replayer heard nothing)"
wait_for "$T/coord.log" "handshake hello with a cookie this coordinator did not issue" 10
start_worker "$T/w0.yaml" w0b
sed -i "s|127.0.0.1:$tport|127.0.0.1:$port|" "$T/w0.yaml"
start_worker "$T/w1.yaml" w1b
wait_exit "$CPID" 60 || fail "the second coordinator exited with status $?"
"$PY" - "$T/b/metrics.jsonl" <<'PYEOF' || fail "the new coordinator's round is wrong"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][0]
assert r["status"] == "ok" and r["participants"] == 2, r
assert r["rejected"]["replay"] >= 1, r["rejected"]
print("after the restart: the replayed hello counted as a replay (%d), and "
      "fresh workers committed round 1" % r["rejected"]["replay"])
PYEOF
echo PASS
