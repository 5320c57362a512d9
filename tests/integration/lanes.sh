# SPDX-License-Identifier: Apache-2.0
# Lanes: a coordinator with two ZeroMQ I/O threads listens on two ports and
# sends every other new worker to the second. Checked as a user would see
# it: the workers started all at once, before the coordinator listens (the
# start that used to put most connections on one I/O thread), are split
# 2 + 2; every round has all four; both I/O threads carry bytes, each at
# least 3/8 of their CPU time (read from /proc while the run goes; three
# uploads of four on one thread, as seen without lanes, gives 3/4 : 1/4). Then the
# secure path (the handshake is what gets redirected), a lane port that is
# taken (a clear error naming it), lanes that exceed the I/O threads, and a
# worker sent to a lane port where nobody answers: it goes back to the
# listen port and asks to stay there.
source tests/integration/lib.sh

# thread_ticks PID NAME: utime + stime of PID's thread called NAME.
thread_ticks() {
	local t
	for t in /proc/"$1"/task/*; do
		if [ "$(cat "$t/comm" 2>/dev/null)" = "$2" ]; then
			awk '{print $14 + $15}' "$t/stat" 2>/dev/null && return
		fi
	done
	echo 0
}

# --- 1. plain sessions, synthetic rounds: placement is the coordinator's
SECURE=0 SECAGG=0
port=$(free_port)
OUT=$T/plain
mkdir -p "$OUT"
coord_security >"$T/plain.yaml"
cat >>"$T/plain.yaml" <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $OUT
model: {arch: synthetic, synthetic_params: 20000000}
round: {rounds: 3, min_workers: 4, min_updates: 4, deadline: 2m,
        wait_for_workers: 1m}
evaluation: {every: 0}
transport: {io_threads: 2, liveness_timeout: 1m, send_timeout: 2m}
YAML
for i in 0 1 2 3; do
	{
		worker_security "$i"
		cat <<YAML
coordinator: tcp://127.0.0.1:$port
name: w$i
data: {dataset: none, index: $i, workers: 4}
train: {device: cpu}
transport: {send_timeout: 2m}
YAML
	} >"$T/pw$i.yaml"
	start_worker "$T/pw$i.yaml" "pw$i"
done
sleep 0.5 # the workers are retrying their connection
start_coordinator "$T/plain.yaml"
io0=0 io1=0
while kill -0 "$CPID" 2>/dev/null; do
	a=$(thread_ticks "$CPID" ZMQbg/IO/0)
	b=$(thread_ticks "$CPID" ZMQbg/IO/1)
	[ "$a" -gt 0 ] 2>/dev/null && io0=$a
	[ "$b" -gt 0 ] 2>/dev/null && io1=$b
	sleep 0.1
done
wait_exit "$CPID" 5 || fail "coordinator exited with status $?"
grep -q "2 lanes" "$T/coord.log" || fail "the coordinator did not report 2 lanes"
moved=$(grep -l "sends this worker to its lane 1" "$T"/pw*.log | wc -l)
[ "$moved" -eq 2 ] || fail "$moved of 4 workers went to lane 1, not 2"
for r in 1 2 3; do
	[ "$(metric $r participants)" = 4 ] || fail "round $r lacks participants"
done
echo "ZeroMQ I/O thread CPU ticks: IO/0 $io0, IO/1 $io1"
[ $((io0 + io1)) -ge 20 ] || fail "too few I/O ticks to judge ($io0 + $io1)"
[ $((io0 * 8)) -ge $((3 * (io0 + io1))) ] &&
	[ $((io1 * 8)) -ge $((3 * (io0 + io1))) ] ||
	fail "the I/O threads' shares are uneven: $io0 vs $io1 ticks"

# --- 2. secure sessions and aggregation: the handshake is redirected
SECURE=1 SECAGG=1
port=$(free_port)
OUT=$T/secure
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 3
  local_steps: 10
  batch_size: 32" >"$T/secure.yaml"
start_coordinator "$T/secure.yaml"
wait_for "$T/coord.log" "listening on " 30
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/sw$i.yaml"
	start_worker "$T/sw$i.yaml" "sw$i"
done
wait_exit "$CPID" 120 || fail "secure coordinator exited with status $?"
moved=$(grep -l "sends this worker to its lane 1" "$T"/sw*.log | wc -l)
[ "$moved" -eq 1 ] || fail "$moved of 3 secure workers went to lane 1, not 1"
[ "$(metric 2 participants)" = 3 ] || fail "secure round 2 lacks participants"

# --- 3. a lane's port taken: refused at start, naming it
port=$(free_port)
"$PY" -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]) + 1)); s.listen()
time.sleep(30)' "$port" &
PIDS+=($!)
sleep 0.3
coord_yaml "$port" "$T/taken" >"$T/taken.yaml"
st=0
"$B/fedbox-coordinator" --config "$T/taken.yaml" >/dev/null 2>"$T/taken.log" || st=$?
[ "$st" -ne 0 ] || fail "the coordinator started with its lane port taken"
grep -q "cannot listen on tcp://127.0.0.1:$((port + 1)) (lane 1 of 2)" \
	"$T/taken.log" || fail "no error naming the taken lane port"

# --- 4. more lanes than I/O threads: a config error (exit 2)
coord_yaml "$port" "$T/bad" >"$T/bad.yaml"
sed -i 's/^  io_threads: .*/  io_threads: 2\n  lanes: 3/' "$T/bad.yaml"
st=0
"$B/fedbox-coordinator" --config "$T/bad.yaml" >/dev/null 2>"$T/bad.log" || st=$?
[ "$st" -eq 2 ] || fail "lanes 3 with io_threads 2: exit $st, not 2"
grep -q "transport.lanes: 3 exceeds transport.io_threads (2)" "$T/bad.log" ||
	fail "no error naming transport.lanes"
# --- 5. a lane that does not answer: back to the listen port, to stay
SECURE=0 SECAGG=0
port=$(free_port)
dead=$(free_port)
"$PY" - "$port" "$dead" >"$T/fake.txt" 2>&1 <<'PYEOF' &
import sys, time, zmq
sys.path.insert(0, "tests/tools")
import fbwire
port, dead = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.bind("tcp://127.0.0.1:%d" % port)
lanes_seen = []
end = time.time() + 40
while time.time() < end:
    if not s.poll(200):
        continue
    peer, f0 = s.recv_multipart()[:2]
    top = fbwire.parse_top(f0)
    if not top or top[0] != fbwire.HELLO:
        continue
    lane = fbwire.fields(top[1]).get(8, [0])[0]
    lanes_seen.append(lane)
    if lane == 0 and len(lanes_seen) == 1:
        s.send_multipart([peer, fbwire.frame(fbwire.REDIRECT,
            fbwire.field_varint(1, 1) + fbwire.field_varint(2, dead))])
    elif lane == 0xFFFFFFFF:
        print("back on the listen port, staying: lanes seen", lanes_seen)
        sys.exit(0)
print("no hello asking to stay; lanes seen", lanes_seen)
sys.exit(1)
PYEOF
fpid=$!
PIDS+=("$fpid")
sleep 0.3
{
	worker_security 0
	printf 'coordinator: tcp://127.0.0.1:%s\nname: w0\n' "$port"
	printf 'data: {dataset: none, index: 0, workers: 1}\n'
	printf 'transport: {connect_timeout: 1m}\n'
} >"$T/lost.yaml"
start_worker "$T/lost.yaml" lost
wait "$fpid" || fail "fake coordinator: $(cat "$T/fake.txt")"
cat "$T/fake.txt"
grep -q "no answer on the coordinator's lane 1" "$T/lost.log" ||
	fail "the worker did not say why it left the lane"
echo "lanes: 2 + 2 workers, both I/O threads busy; secure redirect; errors; lost lane"
