# SPDX-License-Identifier: Apache-2.0
# Issue 20.6: a REJECT in clear, forged by someone on the path, does not
# stop a worker whose coordinator has authenticated itself. Worker w1 talks
# to the coordinator through a relay (tests/tools/inject_reject.py) that
# slips six forged REJECTs into its live secure session, one every 0.5 s,
# while rounds run; w1 ignores them (logged, rate-limited), keeps training
# and finishes every round. Before a session exists a refusal in clear is
# still how a coordinator turns an unknown key away: the same forgery,
# injected ahead of the coordinator's first message to w2, ends w2 with
# the forged reason, which shows that the injection reaches the worker.
source tests/integration/lib.sh
make_keys 3
port=$(free_port)
OUT=$T/out
# One I/O thread, so one lane: no Redirect takes w1 past the relay.
FB_IO_THREADS=1 coord_yaml "$port" "$OUT" "  rounds: 4
  min_workers: 2
  min_updates: 2
  local_steps: 60
  batch_size: 32
  deadline: 60s" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20

# Before the session: the forged refusal ends the worker.
bport=$(free_port)
"$PY" tests/tools/inject_reject.py "$bport" "$port" before \
	--reason "forged before the session" >"$T/before.txt" 2>&1 &
PIDS+=("$!")
sleep 0.5
worker_yaml "$bport" 2 3 >"$T/w2.yaml"
start_worker "$T/w2.yaml" w2
st=0
wait_exit "$WPID" 30 || st=$?
[ "$st" = 1 ] || fail "w2 exited with $st after a refusal before its session"
grep -q "refused this worker: forged before the session" "$T/w2.log" ||
	fail "w2 did not take the refusal: $(tail -3 "$T/w2.log")"
grep -q "^injected 1 " "$T/before.txt" || fail "nothing injected before the session"
echo "before the session: $(grep -m1 'refused' "$T/w2.log" | sed 's/.*ERROR //')"

# In the session: the forged refusals change nothing.
sport=$(free_port)
"$PY" tests/tools/inject_reject.py "$sport" "$port" session --after 3 \
	--count 6 --every 0.5 --reason "forged in the session" >"$T/session.txt" 2>&1 &
PIDS+=("$!")
sleep 0.5
worker_yaml "$port" 0 3 >"$T/w0.yaml"
start_worker "$T/w0.yaml" w0
w0=$WPID
# w1 slowed down (simulation), so that the injections land mid-round
worker_yaml "$sport" 1 3 "  throttle: 100" >"$T/w1.yaml"
start_worker "$T/w1.yaml" w1
w1=$WPID
wait_exit "$CPID" 180 || fail "coordinator exited with status $?"
wait_exit "$w0" 20 || fail "w0 exited with status $?"
wait_exit "$w1" 20 || fail "w1 exited with status $?"
cat "$T/rounds.txt"
cat "$T/session.txt"
grep -q "^injected 6 " "$T/session.txt" || fail "fewer than 6 refusals injected"
grep -q "refused this worker" "$T/w1.log" && fail "w1 took a forged refusal"
noted=$(grep -c "ignored a refusal in clear ('forged in the session')" "$T/w1.log" || true)
[ "$noted" -ge 1 ] || fail "w1 did not note the forged refusals"
[ "$noted" -lt 6 ] || fail "w1 noted each of the $noted refusals: not rate-limited"
first=$(grep -n "ignored a refusal in clear" "$T/w1.log" | head -1 | cut -d: -f1)
after=$(tail -n +"$first" "$T/w1.log" | grep -c "sending masked update" || true)
[ "$after" -ge 1 ] || fail "w1 trained no round after the first injection"
for r in 1 2 3 4; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r status)"
	[ "$(metric $r participants)" = 2 ] || fail "round $r lacks participants"
done
echo "w1 noted the forged refusals $noted time(s), trained $after round(s) after the first, and finished all 4"
echo PASS
