# SPDX-License-Identifier: Apache-2.0
# Only the worker's own trainer may connect to the worker's trainer socket.
# The trainer (tests/tools/fault_trainer.py spy) leaks its socket path and
# its token to the test, as a careless script might, and holds off
# connecting until told. Meanwhile:
#   - the socket's folder is mode 0700 and ours, the socket 0600;
#   - a process of ours that is not the trainer or its descendant, holding
#     the right token, is refused (SO_PEERCRED), and the worker logs why;
#   - another user cannot even reach the socket (as root: setpriv to
#     nobody);
#   - a descendant of the trainer with the wrong token is refused.
# Then the trainer connects and trains both rounds, and once it is in, the
# socket is gone: nothing else can connect at all.
source tests/integration/lib.sh
SECAGG=0
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 1
  local_steps: 5
  batch_size: 16
  deadline: 90s
  wait_for_workers: 30s" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
mkdir -p "$T/state"
worker_yaml "$port" 0 1 "  command: [$PY, $ROOT/tests/tools/fault_trainer.py, spy, $T/state]
  start_timeout: 80s" >"$T/w0.yaml"
start_worker "$T/w0.yaml" w0
WP=$WPID
for ((i = 0; i < 600; i++)); do
	[ -f "$T/state/env" ] && [ -f "$T/state/descendant" ] && break
	sleep 0.1
done
[ -f "$T/state/descendant" ] || fail "the trainer never started"
sock=$(sed -n 1p "$T/state/env")
token=$(sed -n 2p "$T/state/env")
tpid=$(sed -n 3p "$T/state/env")
dir=$(dirname "$sock")
echo "trainer pid $tpid, socket $sock"

# The folder and the socket.
[ "$(stat -c '%a %u' "$dir")" = "700 $(id -u)" ] ||
	fail "folder $dir is $(stat -c '%a %u' "$dir"), want 700 $(id -u)"
[ "$(stat -c '%a' "$sock")" = 600 ] || fail "socket mode $(stat -c '%a' "$sock")"
echo "folder 0700 (uid $(id -u)), socket 0600"

# A descendant of the trainer, wrong token.
[ "$(head -1 "$T/state/descendant")" = 0 ] ||
	fail "the trainer's child with a wrong token was not refused: $(cat "$T/state/descendant")"
wait_for "$T/w0.log" "refused a connection from pid [0-9]+ \(uid [0-9]+\): it did not present the token" 10
echo "descendant, wrong token: $(sed -n 2p "$T/state/descendant")"

# Not a descendant, right token.
out=$("$PY" tests/tools/trainer_outsider.py "$sock" "$token") ||
	fail "an outsider with the token was not refused: $out"
opid=$(echo "$out" | sed -n 's/.*pid \([0-9]*\).*/\1/p')
wait_for "$T/w0.log" "refused a connection from pid $opid \(uid [0-9]+\): it is not the trainer's process or one of its descendants" 10
echo "outsider, right token: $out"

# Another user.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	# the checkout may sit where nobody cannot read (a clone in a
	# mktemp -d folder): the outsider and its package go to a public one
	pub=$(mktemp -d /tmp/fb-outsider.XXXXXX)
	mkdir -p "$pub/tests/tools" "$pub/python"
	cp tests/tools/trainer_outsider.py "$pub/tests/tools/"
	cp -r python/fedbox "$pub/python/"
	chmod -R a+rX "$pub"
	out=$(cd / && setpriv --reuid=65534 --regid=65534 --clear-groups \
		"$PY" "$pub/tests/tools/trainer_outsider.py" "$sock" "$token") &&
		st=0 || st=$?
	rm -rf "$pub"
	[ "$st" = 2 ] && [[ $out == *"Permission denied"* ]] ||
		fail "user nobody reached the socket: $out (exit $st)"
	echo "user nobody: $out"
else
	echo "another user: not tried (needs root and setpriv)"
fi

touch "$T/state/go"
wait_for "$T/w0.log" "trainer: pid $tpid connected" 30
[ ! -e "$sock" ] || fail "the socket is still there after the trainer connected"
out=$("$PY" tests/tools/trainer_outsider.py "$sock" "$token") && st=0 || st=$?
[ "$st" = 2 ] || fail "connected after the trainer was in: $out"
echo "after the trainer connected: $out"

wait_exit "$CPID" 60 || fail "coordinator exited with status $?"
wait_exit "$WP" 20 || fail "worker exited with status $?"
cat "$T/rounds.txt"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "rounds are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["status"], r["participants"]) for r in rows] == [("ok", 1)] * 2, rows
PYEOF
[ "$(grep -c 'refused a connection' "$T/w0.log")" = 2 ] ||
	fail "refusals logged: $(grep -c 'refused a connection' "$T/w0.log"), want 2"
echo PASS
