# SPDX-License-Identifier: Apache-2.0
# Identities: fedbox-keygen writes a 0600 secret key and a one-line public
# key, refuses to overwrite; both programs refuse a secret key file that
# group or others can read, saying how to fix it (exit 2); a worker whose
# pinned coordinator key is wrong never joins.
source tests/integration/lib.sh
cd "$T"
"$ROOT/$B/fedbox-keygen" -o alice -C alice-box >pub.txt || fail "keygen failed"
[ "$(stat -c %a alice.key)" = 600 ] || fail "secret key mode is $(stat -c %a alice.key)"
grep -qE '^fedbox-ed25519 [A-Za-z0-9+/]{43}= alice-box$' alice.pub || fail "bad pub line: $(cat alice.pub)"
cmp -s pub.txt alice.pub || fail "printed line differs from alice.pub"
[ "$("$ROOT/$B/fedbox-keygen" --pub alice.key)" = "$(cat alice.pub)" ] || fail "--pub differs"
if "$ROOT/$B/fedbox-keygen" -o alice >/dev/null 2>err.txt; then
	fail "keygen overwrote an existing key"
fi
echo "keygen refuses to overwrite: $(head -1 err.txt)"
cd "$ROOT"
# two on the allowlist: a secure round needs two workers, and a config
# whose min_workers the allowlist cannot meet is refused at start
make_keys 2
port=$(free_port)
coord_yaml "$port" "$T/out" >"$T/c.yaml"
worker_yaml "$port" 0 1 >"$T/w.yaml"

chmod 644 "$KEYS/w0.key"
st=0
"$B/fedbox-worker" --config "$T/w.yaml" >"$T/w.out" 2>&1 || st=$?
[ "$st" = 2 ] || fail "worker with a world-readable key: exit $st"
grep -q "chmod 600" "$T/w.out" || fail "no fix in the message: $(cat "$T/w.out")"
echo "worker: $(grep -m1 chmod "$T/w.out" | sed 's/.*ERROR //')"
chmod 600 "$KEYS/w0.key"

chmod 640 "$KEYS/coordinator.key"
st=0
"$B/fedbox-coordinator" --config "$T/c.yaml" >"$T/c.out" 2>&1 || st=$?
[ "$st" = 2 ] || fail "coordinator with a group-readable key: exit $st"
grep -q "chmod 600" "$T/c.out" || fail "no fix in the message: $(cat "$T/c.out")"
echo "coordinator: $(grep -m1 chmod "$T/c.out" | sed 's/.*ERROR //')"
chmod 600 "$KEYS/coordinator.key"

# A worker pinning the wrong coordinator key: refuses the reply, never joins.
"$B/fedbox-keygen" -o "$KEYS/fake" >/dev/null
sed -e "s|coordinator.pub|fake.pub|" -e "s|^  connect_timeout.*||" "$T/w.yaml" >"$T/w-fake.yaml"
printf 'transport:\n  connect_timeout: 3s\n' >>"$T/w-fake.yaml"
start_coordinator "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
st=0
"$B/fedbox-worker" --config "$T/w-fake.yaml" >"$T/wf.out" 2>&1 || st=$?
[ "$st" = 1 ] || fail "worker with the wrong pinned key: exit $st"
grep -q "not the one in security.coordinator_key" "$T/wf.out" ||
	fail "unclear: $(tail -3 "$T/wf.out")"
echo "wrong pinned key: $(grep -m1 'refused' "$T/wf.out" | sed 's/.*WARN //')"
echo PASS
