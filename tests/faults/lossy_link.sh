# SPDX-License-Identifier: Apache-2.0
# Delay and loss through our own userspace emulator (tests/faults/netem.py
# tun: this kernel has no netem): two of three workers in a network
# namespace whose only way to the coordinator's is a pair of TUN devices
# that hold every packet 100 ms (+ up to 20 ms jitter) each way and drop
# 5% of them (200 ms and 10% with FB_FAULTS_FULL=1). TCP retransmits;
# every round commits with all three workers, and nobody is dropped.
source tests/faults/lib.sh
need_root_net
[ -c /dev/net/tun ] || skip "needs /dev/net/tun"
if [ "$FULL" = 1 ]; then
	delay=200 loss=0.10 rounds=4
else
	delay=100 loss=0.05 rounds=3
fi
make_keys 3
nc=$(ns_new c)
ns=$(ns_new s)
"$PY" "$NETEM" tun "$nc" 10.83.0.1 "$ns" 10.83.0.2 --delay "$delay" \
	--jitter 20 --loss "$loss" >"$T/netem.out" 2>"$T/netem.log" &
PIDS+=("$!")
wait_for "$T/netem.out" "^ready" 10
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: $rounds
  min_workers: 3
  local_steps: 20
  deadline: 120s" >"$T/c.yaml"
sed -i "s|listen: tcp://127.0.0.1:$port|listen: tcp://0.0.0.0:$port|" "$T/c.yaml"
start_coordinator_in "$nc" "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
worker_yaml "$port" 0 3 >"$T/w0.yaml"
start_worker_in "$nc" "$T/w0.yaml" w0
for i in 1 2; do
	worker_yaml "$port" "$i" 3 |
		sed "s|tcp://127.0.0.1:$port|tcp://10.83.0.1:$port|" >"$T/w$i.yaml"
	start_worker_in "$ns" "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 300 || fail "coordinator exited with $?"
cat "$T/rounds.txt"
check_rounds "$rounds" 3
! grep -q "lost:" "$T/coord.log" || fail "a worker was dropped: $(grep 'lost:' "$T/coord.log" | head -2)"
kill -TERM "${PIDS[0]}" 2>/dev/null || true
sleep 0.5
cat "$T/netem.log"
echo PASS
