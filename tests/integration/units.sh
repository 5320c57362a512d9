# SPDX-License-Identifier: Apache-2.0
# The systemd units (deploy/systemd) pass `systemd-analyze verify` without
# a warning, in a root that holds this system's units and our programs at
# their packaged paths (man pages are checked by tests/deploy/deb.sh, where
# the package is installed); they run as the fedbox system user, restart
# on failure, keep state in a StateDirectory and see the file system read
# only; `systemd-analyze security` rates each "OK" (exposure below 3).
source tests/integration/lib.sh
command -v systemd-analyze >/dev/null || skip "no systemd-analyze"
[ -d /lib/systemd/system ] || skip "no /lib/systemd/system to verify against"
R=$T/root
mkdir -p "$R/usr/bin" "$R/lib/systemd/system"
cp -a /lib/systemd/system/. "$R/lib/systemd/system/"
cp "$B/fedbox-coordinator" "$B/fedbox-worker" "$R/usr/bin/"
units=(fedbox-coordinator.service fedbox-worker.service fedbox-worker@.service)
for u in "${units[@]}"; do
	cp "deploy/systemd/$u" "$R/lib/systemd/system/"
	grep -q "^ProtectSystem=strict$" "deploy/systemd/$u" || fail "$u: no ProtectSystem=strict"
	grep -q "^Restart=on-failure$" "deploy/systemd/$u" || fail "$u: no Restart=on-failure"
	grep -q "^StateDirectory=" "deploy/systemd/$u" || fail "$u: no StateDirectory"
	grep -q "^User=fedbox$" "deploy/systemd/$u" || fail "$u: not the fedbox user"
done
check=(fedbox-coordinator.service fedbox-worker.service fedbox-worker@box-0.service)
st=0
(cd / && systemd-analyze verify --root="$R" --man=no "${check[@]}") >"$T/verify.out" 2>&1 || st=$?
[ "$st" = 0 ] && [ ! -s "$T/verify.out" ] ||
	fail "systemd-analyze verify (exit $st): $(cat "$T/verify.out")"
echo "systemd-analyze verify: ${check[*]}: no warnings"
# A unit with a mistake is caught, so the silence above means something.
sed 's/^ProtectSystem=strict$/ProtectSystem=strickt/' deploy/systemd/fedbox-coordinator.service \
	>"$R/lib/systemd/system/fedbox-coordinator.service"
(cd / && systemd-analyze verify --root="$R" --man=no fedbox-coordinator.service) >"$T/bad.out" 2>&1 || true
grep -q "strickt" "$T/bad.out" || fail "a misspelt value went unnoticed: $(cat "$T/bad.out")"
cp deploy/systemd/fedbox-coordinator.service "$R/lib/systemd/system/"
for u in "${check[@]}"; do
	line=$(cd / && systemd-analyze security --offline=yes --root="$R" "$u" 2>&1 | tail -1)
	echo "$line"
	level=$(sed -n 's/.*exposure level for [^:]*: \([0-9.]*\) .*/\1/p' <<<"$line")
	[ -n "$level" ] || fail "$u: no exposure level: $line"
	"$PY" -c "import sys; sys.exit(0 if $level < 3 else 1)" ||
		fail "$u: exposure $level (want < 3)"
done
echo PASS
