# SPDX-License-Identifier: Apache-2.0
# make install lays out the standard tree (programs, CUDA backend in
# lib/fedbox/, man pages from --help, example configs, licence); the
# installed tree runs from anywhere it is moved to, the worker finding its
# CUDA backend in ../lib/fedbox/ (and naming both places when it is
# absent); fedbox-keygen makes the missing folders of its NAME, mode 0700.
SECAGG=0 # one worker: sessions are secure, rounds plain
source tests/integration/lib.sh
command -v help2man >/dev/null ||
	skip "no help2man (scripts/bootstrap install installs it)"

make --no-print-directory install BOOTSTRAP=0 ${SAN:+SAN=$SAN} \
	PREFIX=/usr/local DESTDIR="$T/root" >"$T/install.log" 2>&1 ||
	{ tail -20 "$T/install.log"; fail "make install failed"; }
P=$T/root/usr/local
for f in bin/fedbox-coordinator bin/fedbox-worker bin/fedbox-keygen \
    bin/fedbox-provision share/man/man1/fedbox-coordinator.1 \
    share/man/man1/fedbox-worker.1 share/man/man1/fedbox-keygen.1 \
    share/man/man1/fedbox-provision.1 share/doc/fedbox/LICENSE \
    share/doc/fedbox/examples/coordinator.yaml \
    share/doc/fedbox/examples/worker.yaml \
    share/doc/fedbox/examples/hosts.example \
    share/doc/fedbox/config-reference.md; do
	[ -f "$P/$f" ] || fail "make install did not install $f"
done
for p in fedbox-coordinator fedbox-worker fedbox-keygen fedbox-provision; do
	[ -x "$P/bin/$p" ] || fail "$p is not executable"
	grep -q '^\.SH NAME' "$P/share/man/man1/$p.1" || fail "$p.1 has no NAME section"
	grep -qF -- '\-\-help' "$P/share/man/man1/$p.1" || fail "$p.1 lacks the options from --help"
done
echo "installed: $(cd "$P" && find . -type f | wc -l) files under PREFIX"

# The licence is the Apache License 2.0 that every SPDX line names.
grep -q "Apache License" LICENSE && grep -q "Version 2.0, January 2004" LICENSE &&
	grep -q "END OF TERMS AND CONDITIONS" LICENSE || fail "LICENSE is not the Apache-2.0 text"
other=$(git grep -h -o -E 'SPDX-License-Identifier: [A-Za-z0-9.+-]+' -- ':!LICENSE' | sort -u |
	grep -v 'Apache-2.0$' || true)
[ -z "$other" ] || fail "SPDX lines other than Apache-2.0: $other"

# Moved elsewhere (a relocated PREFIX), the worker finds the CUDA backend
# in ../lib/fedbox/ seen from its bin/.
mv "$P" "$T/opt"
P=$T/opt
export -n FEDBOX_CUDA_LIB 2>/dev/null || true
unset FEDBOX_CUDA_LIB
make_keys 1
run_once() { # NAME: one 1-round federation of the installed programs
	local port
	port=$(free_port)
	coord_yaml "$port" "$T/out-$1" "  rounds: 1
  local_steps: 5" >"$T/c-$1.yaml"
	worker_yaml "$port" 0 1 | sed 's/device: cpu/device: auto/' >"$T/w-$1.yaml"
	(cd / && exec "$P/bin/fedbox-coordinator" --config "$T/c-$1.yaml") \
		>"$T/rounds-$1.txt" 2>"$T/coord-$1.log" &
	CPID=$!
	PIDS+=("$CPID")
	wait_for "$T/coord-$1.log" "listening on" 20
	(cd / && exec "$P/bin/fedbox-worker" --config "$T/w-$1.yaml") \
		>"$T/w-$1.log" 2>&1 &
	PIDS+=("$!")
	wait_exit "$CPID" 60 || fail "installed coordinator exited with status $?"
	grep -q "backend: " "$T/w-$1.log" || fail "worker named no backend: $(tail -3 "$T/w-$1.log")"
	echo "$1: $(grep -m1 -o 'backend: .*' "$T/w-$1.log")"
}
if [ -f "$P/lib/fedbox/libfedbox-cuda.so" ]; then
	run_once with-lib
	if grep -q "no CUDA backend library" "$T/w-with-lib.log"; then
		fail "the worker did not find lib/fedbox/libfedbox-cuda.so"
	fi
	# Found: it runs (a GPU here), finds no device, or cannot load CUDA's
	# runtime; each names what happened.
	grep -Eq "backend: (cuda|cpu \((no CUDA device|CUDA backend failed|cannot load the CUDA backend $P/bin/../lib/fedbox/))" "$T/w-with-lib.log" ||
		fail "unexpected backend line: $(grep backend: "$T/w-with-lib.log")"
	rm "$P/lib/fedbox/libfedbox-cuda.so"
else
	echo "no CUDA backend built (CUDA=0 or no nvcc): only its absence is checked"
fi
run_once without-lib
grep -qF "no CUDA backend library (looked for $P/bin/libfedbox-cuda.so and $P/bin/../lib/fedbox/libfedbox-cuda.so)" \
	"$T/w-without-lib.log" || fail "the fallback reason does not name both places"

# fedbox-keygen on a fresh host: the folders of NAME are made, mode 0700;
# a folder that exists keeps its mode.
mkdir -m 755 "$T/site"
"$P/bin/fedbox-keygen" -o "$T/site/keys/deep/coordinator" -C hub >/dev/null ||
	fail "fedbox-keygen into missing folders failed"
[ "$(stat -c %a "$T/site/keys")" = 700 ] && [ "$(stat -c %a "$T/site/keys/deep")" = 700 ] ||
	fail "made folders are not 0700: $(stat -c '%n %a' "$T/site/keys" "$T/site/keys/deep")"
[ "$(stat -c %a "$T/site")" = 755 ] || fail "an existing folder's mode changed"
[ "$(stat -c %a "$T/site/keys/deep/coordinator.key")" = 600 ] || fail "key not 0600"
: >"$T/site/file"
st=0
"$P/bin/fedbox-keygen" -o "$T/site/file/x" >/dev/null 2>"$T/kg.err" || st=$?
[ "$st" = 1 ] && grep -q "is not a folder\|Not a directory" "$T/kg.err" ||
	fail "keygen under a file: exit $st, $(cat "$T/kg.err")"
echo "keygen: $(cat "$T/kg.err")"
echo PASS
