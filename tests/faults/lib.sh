# SPDX-License-Identifier: Apache-2.0
# lib.sh -- helpers for the fault tests, on top of the integration tests'
# (tests/integration/lib.sh): network namespaces joined by veth pairs
# (each process its own address; ip link down is a partition; tc tbf a
# slow link), tmpfs mounts, and tests/faults/netem.py for delay and loss.
# Everything made here is removed on exit: namespaces by name, mounts by
# path, processes by PID. Needs root and iproute2 (the test skips
# otherwise). FB_FAULTS_FULL=1 runs the long variants (make test-faults).
source tests/integration/lib.sh
FULL=${FB_FAULTS_FULL:-0}
NETEM=tests/faults/netem.py
NSES=()
MOUNTS=()
# Namespaces are named after this test's PID: runs side by side do not
# meet, and a crashed run's leftovers are recognisable (fbf<PID>...).
NSP="fbf$$"

fault_cleanup() {
	local p m n
	for p in "${PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	for m in "${MOUNTS[@]}"; do
		umount -l "$m" 2>/dev/null || true
	done
	for n in "${NSES[@]}"; do
		ip netns del "$n" 2>/dev/null || true
	done
	cleanup
}
trap fault_cleanup EXIT

need_root_net() {
	[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
	command -v ip >/dev/null || skip "needs ip (iproute2)"
	ip netns add "${NSP}probe" 2>/dev/null ||
		skip "cannot make network namespaces here"
	ip netns del "${NSP}probe"
}

# ns_new NAME: a namespace ${NSP}NAME with loopback up; prints its name.
ns_new() {
	local n="${NSP}$1"
	ip netns add "$n"
	NSES+=("$n")
	ip -n "$n" link set lo up
	echo "$n"
}

# ns_link NS_A IP_A NS_B IP_B DEV: a veth pair DEV-a in NS_A (IP_A/24) and
# DEV-b in NS_B (IP_B/24), both up.
ns_link() {
	local a=$1 ipa=$2 b=$3 ipb=$4 dev=$5
	ip link add "$dev-a" netns "$a" type veth peer name "$dev-b" netns "$b"
	ip -n "$a" addr add "$ipa/24" dev "$dev-a"
	ip -n "$b" addr add "$ipb/24" dev "$dev-b"
	ip -n "$a" link set "$dev-a" up
	ip -n "$b" link set "$dev-b" up
}

# ns_rate NS DEV RATE: tc tbf on DEV's egress in NS (e.g. 256kbit).
ns_rate() {
	ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$3" \
		burst 4kb latency 400ms
}

# in_ns NS CMD...: CMD inside namespace NS (its PID is the command's: ip
# netns exec execs it).
in_ns() {
	local n=$1
	shift
	ip netns exec "$n" "$@"
}

# start_coordinator_in NS CONFIG [ARGS]: as start_coordinator, in NS.
start_coordinator_in() {
	local n=$1 cfg=$2
	shift 2
	ip netns exec "$n" "$B/fedbox-coordinator" --config "$cfg" "$@" \
		>>"$T/rounds.txt" 2>>"$T/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
}

# start_worker_in NS CONFIG NAME: as start_worker, in NS.
start_worker_in() {
	ip netns exec "$1" "$B/fedbox-worker" --config "$2" >"$T/$3.log" 2>&1 &
	WPID=$!
	PIDS+=("$WPID")
}

# tmpfs_at DIR SIZE: a tmpfs of SIZE (e.g. 4m) mounted at DIR.
tmpfs_at() {
	mkdir -p "$1"
	mount -t tmpfs -o "size=$2,mode=0755" tmpfs "$1" ||
		skip "cannot mount a tmpfs here"
	MOUNTS+=("$1")
}

# count_rounds STATUS: rounds of metrics.jsonl ($OUT) with that status.
count_rounds() {
	[ -f "$OUT/metrics.jsonl" ] || { echo 0; return; }
	grep -c "\"status\": \"$1\"" "$OUT/metrics.jsonl" || true
}

# check_rounds N PARTICIPANTS: metrics.jsonl has rounds 1..N, every one
# committed, each with PARTICIPANTS participants.
check_rounds() {
	"$PY" - "$OUT/metrics.jsonl" "$1" "$2" <<'PYEOF' || fail "rounds are not as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n, k = int(sys.argv[2]), int(sys.argv[3])
assert [r["round"] for r in rows] == list(range(1, n + 1)), \
    [r["round"] for r in rows]
for r in rows:
    assert r["status"] == "ok" and r["participants"] == k, \
        (r["round"], r["status"], r["participants"], r.get("reason"))
print("%d rounds, each committed with %d workers" % (n, k))
PYEOF
}

# cut_relay_start BYTES: for a worker cut off mid-upload. Sets $T/c.yaml
# to one lane (the relay must stay in the cut worker's path), 16 KiB
# chunks and the debug lines that say which updates came in whole;
# starts netem.py's relay from $rport to the coordinator's $port, which
# resets its first connection once BYTES went up (sets RELAY); then the
# coordinator, and waits for both.
cut_relay_start() {
	sed -i 's/^  io_threads: .*/&\n  lanes: 1\n  chunk_size: 16KiB/' "$T/c.yaml"
	echo "log_level: debug" >>"$T/c.yaml"
	"$PY" "$NETEM" relay "$rport" 127.0.0.1 "$port" --cut-after "$1" \
		>"$T/relay.out" 2>"$T/relay.log" &
	PIDS+=("$!")
	RELAY=$!
	wait_for "$T/relay.out" "^ready" 10
	start_coordinator "$T/c.yaml"
	wait_for "$T/coord.log" "listening on" 20
}
