# SPDX-License-Identifier: Apache-2.0
# fedbox-provision for 1 coordinator and 3 workers gives kits that run a
# secure federation as they are: each kit is copied to its own "host" (a
# folder of its own and a network namespace of its own, on one bridge),
# each program starts from / with the kit's config, and 3 rounds commit
# with every worker in each, by secure aggregation. Needs root (ip netns);
# skipped where namespaces cannot be made.
source tests/integration/lib.sh

[ "$(id -u)" = 0 ] || skip "needs root for ip netns (CI runs as root)"
command -v ip >/dev/null || skip "no ip (iproute2)"
tag=fbp$$
NS=()
netns_cleanup() {
	local n
	for n in "${NS[@]}"; do
		ip netns del "$n" 2>/dev/null || true
	done
}
trap 'cleanup; netns_cleanup' EXIT
ip netns add "$tag-hub" 2>"$T/netns.err" ||
	skip "ip netns add is not permitted here: $(cat "$T/netns.err")"
NS+=("$tag-hub")

# The network: a bridge in the coordinator's namespace, one veth to each
# worker's namespace, 10.77.0.0/24 (only inside namespaces made here).
hub=$tag-hub
ip -n "$hub" link set lo up
ip -n "$hub" link add br0 type bridge
ip -n "$hub" addr add 10.77.0.1/24 dev br0
ip -n "$hub" link set br0 up
for i in 0 1 2; do
	ns=$tag-w$i
	ip netns add "$ns"
	NS+=("$ns")
	ip -n "$ns" link set lo up
	ip link add "$tag-v$i" type veth peer name eth0 netns "$ns"
	ip link set "$tag-v$i" netns "$hub"
	ip -n "$hub" link set "$tag-v$i" master br0 up
	ip -n "$ns" addr add "10.77.0.$((i + 2))/24" dev eth0
	ip -n "$ns" link set eth0 up
done
port=$(free_port)
cat >"$T/hosts.txt" <<EOF
# one coordinator and three boxes
coordinator hub 10.77.0.1:$port
worker box-0 10.77.0.2
worker box-1 10.77.0.3
worker box-2 10.77.0.4
set coordinator round.rounds 3
set coordinator round.local_steps 40
set coordinator round.batch_size 32
set coordinator model.hidden [32]
set coordinator transport.heartbeat 200ms
set coordinator transport.liveness_timeout 5s
set workers train.device cpu
set workers data.partition iid
EOF
scripts/fedbox-provision --keygen "$B/fedbox-keygen" -o "$T/kits" \
	"$T/hosts.txt" || fail "fedbox-provision failed"

# What each site gets.
for k in hub/coordinator.yaml hub/keys/coordinator.key hub/keys/allowlist \
    hub/README.md box-1/worker.yaml box-1/keys/box-1.key \
    box-1/keys/coordinator.pub box-1/keys/peers box-1/README.md; do
	[ -f "$T/kits/$k" ] || fail "kit file $k is missing"
done
[ "$(stat -c %a "$T/kits/box-1/keys/box-1.key")" = 600 ] ||
	fail "box-1's secret key is mode $(stat -c %a "$T/kits/box-1/keys/box-1.key")"
[ ! -e "$T/kits/box-1/keys/box-0.key" ] && [ ! -e "$T/kits/hub/keys/box-0.key" ] ||
	fail "a worker's secret key is in another site's kit"
[ "$(wc -l <"$T/kits/hub/keys/allowlist")" = 3 ] || fail "allowlist should list 3 workers"
grep -q "^coordinator: tcp://10.77.0.1:$port$" "$T/kits/box-2/worker.yaml" ||
	fail "box-2's config lacks the coordinator's address"
grep -q "^name: box-2$" "$T/kits/box-2/worker.yaml" || fail "box-2's config lacks its name"
grep -q "^  index: 2$" "$T/kits/box-2/worker.yaml" || fail "box-2's data.index is not 2"
cmp -s "$T/kits/hub/keys/coordinator.pub" "$T/kits/box-0/keys/coordinator.pub" ||
	fail "box-0 pins another coordinator key"

# Copy each kit to its host (a separate folder), then run every program in
# its namespace from / so that only the config's folder places its files.
for h in hub box-0 box-1 box-2; do
	mkdir -p "$T/host-$h/etc"
	cp -a "$T/kits/$h" "$T/host-$h/etc/fedbox"
done
bin=$ROOT/$B
(cd / && exec ip netns exec "$hub" "$bin/fedbox-coordinator" \
	--config "$T/host-hub/etc/fedbox/coordinator.yaml") \
	>"$T/rounds.txt" 2>"$T/coord.log" &
CPID=$!
PIDS+=("$CPID")
wait_for "$T/coord.log" "listening on" 20
for i in 0 1 2; do
	(cd / && exec ip netns exec "$tag-w$i" "$bin/fedbox-worker" \
		--config "$T/host-box-$i/etc/fedbox/worker.yaml") \
		>"$T/box-$i.log" 2>&1 &
	PIDS+=("$!")
done
wait_exit "$CPID" 180 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
OUT=$T/host-hub/etc/fedbox/output
[ -f "$OUT/model.safetensors" ] || fail "no model in the kit's output folder"
[ "$(wc -l <"$OUT/metrics.jsonl")" = 3 ] || fail "metrics.jsonl should have 3 rounds"
for r in 1 2 3; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r status)"
	[ "$(metric $r participants)" = 3 ] ||
		fail "round $r had $(metric $r participants) participants"
done
grep -q "secure sessions on: .*, 3 workers on the allowlist" "$T/coord.log" ||
	fail "the coordinator did not run secure sessions with the kit's allowlist"
grep -q "secure aggregation on" "$T/coord.log" ||
	fail "the coordinator did not run secure aggregation"
for i in 0 1 2; do
	grep -q "worker box-$i admitted (id $i, index $i" "$T/coord.log" ||
		fail "box-$i was not admitted under its name and index"
	grep -q "connecting to tcp://10.77.0.1:$port as box-$i" "$T/box-$i.log" ||
		fail "box-$i did not dial the address from its kit"
done
echo "3 rounds committed by hub and box-0..2 in 4 namespaces, accuracy $(metric 3 test_accuracy)"
echo PASS
