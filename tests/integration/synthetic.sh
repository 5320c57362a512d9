# SPDX-License-Identifier: Apache-2.0
# A synthetic model (the benchmarks' model: a flat vector that reads no
# data). A worker left on its default data is told at once, by name, what
# to set, and exits; with data.dataset: none, secure sessions and
# aggregation and every other default, 2 rounds commit.
source tests/integration/lib.sh

make_keys 2
# run DATA-YAML: a coordinator and 2 workers with that data section.
run() {
	port=$(free_port)
	OUT=$T/out.$RANDOM
	{
		coord_security
		cat <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $OUT
model: {arch: synthetic, synthetic_params: 1000000}
round: {rounds: 2, min_workers: 2}
YAML
	} >"$T/coord.yaml"
	start_coordinator "$T/coord.yaml"
	for i in 0 1; do
		{
			worker_security "$i"
			cat <<YAML
coordinator: tcp://127.0.0.1:$port
name: w$i
data: {$1index: $i, workers: 2}
YAML
		} >"$T/w$i.yaml"
		start_worker "$T/w$i.yaml" "w$i"
		W[$i]=$WPID
	done
}

W=()
run ""
for i in 0 1; do
	st=0
	wait_exit "${W[$i]}" 15 || st=$?
	[ "$st" -ne 0 ] || fail "w$i took a synthetic model with data loaded"
	grep -q "set data.dataset: none" "$T/w$i.log" ||
		fail "w$i did not say what to set"
done
kill "$CPID"
wait_exit "$CPID" 10 || true

run "dataset: none, "
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
for r in 1 2; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r reason)"
	[ "$(metric $r participants)" = 2 ] || fail "round $r lacks a worker"
done
echo "refused with a clear fix on data; 2 secure rounds without it"
