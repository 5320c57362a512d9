# SPDX-License-Identifier: Apache-2.0
# configs/README.md documents every key with the default the code uses, and
# the example configs load.
source tests/integration/lib.sh
for bin in fedbox-coordinator fedbox-worker; do
	"$B/$bin" --config-reference >"$T/ref.md"
	n=0
	while IFS= read -r line; do
		case "$line" in '| `'*) ;; *) continue ;; esac
		grep -qF -- "$line" configs/README.md ||
			fail "configs/README.md is stale (run scripts/gen-config-docs): missing $line"
		n=$((n + 1))
	done <"$T/ref.md"
	[ "$n" -gt 10 ] || fail "$bin printed only $n keys"
	echo "$bin: $n keys documented"
done
# The examples are valid: loading them gets past config checks. The
# coordinator is pointed at a port of ours; --config-reference does not
# load, so start it and stop it once it listens. Its allowlist has the 4
# boxes its round.min_workers needs (fewer is refused at start).
port=$(free_port)
mkdir -p "$T/keys"
"$B/fedbox-keygen" -o "$T/keys/coordinator" >/dev/null
for i in 0 1 2 3; do
	"$B/fedbox-keygen" -o "$T/keys/box-$i" -C "box-$i" >>"$T/keys/allowlist"
done
sed -e "s|tcp://0.0.0.0:5555|tcp://127.0.0.1:$port|" -e "s|runs/example|$T/ex|" \
	-e "s|keys/|$T/keys/|" configs/coordinator.yaml >"$T/c.yaml"
start_coordinator "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
# transport.io_threads is not in the example: auto, 2 from 8 CPUs on.
io=1
[ "$(nproc)" -ge 8 ] && io=2
grep -Eq "listening on \S+ \($io ZeroMQ I/O threads?\)" "$T/coord.log" ||
	fail "expected $io I/O thread(s) on $(nproc) CPUs: $(grep 'listening on' "$T/coord.log")"
kill -TERM "$CPID"
wait_exit "$CPID" 10 || fail "example coordinator config: exit $?"
sed -e "s|5555|$port|" -e "s|keys/|$T/keys/|" configs/worker.yaml >"$T/w.yaml"
"$B/fedbox-worker" --config "$T/w.yaml" --help >/dev/null || fail "worker --help"
timeout 8 "$B/fedbox-worker" --config "$T/w.yaml" >"$T/w.log" 2>&1 || true
grep -q "connecting to" "$T/w.log" || fail "example worker config did not load: $(cat "$T/w.log")"
echo PASS
