# SPDX-License-Identifier: Apache-2.0
# The Debian packages: dpkg-buildpackage -b builds fedbox (and fedbox-cuda
# where nvcc is found); both install with apt in a clean debootstrap
# minbase bookworm tree (their dependencies from the archive); there the
# installed fedbox-provision makes kits, laid out as the units expect, and
# the installed programs, run as the fedbox user with the units' ExecStart
# lines, hold a 2-worker secure federation that commits its rounds; the
# installed units
# pass systemd-analyze verify (man pages included) without a warning; and
# the package purges cleanly.
source tests/deploy/lib.sh
need_root "chroot, mount"
for t in dpkg-buildpackage dh help2man; do
	command -v "$t" >/dev/null || skip "no $t (scripts/bootstrap package installs it)"
done

# ---- build -------------------------------------------------------------------
src_tree "$T/src/fedbox-0.1.0"
(cd "$T/src/fedbox-0.1.0" && dpkg-buildpackage -b -us -uc -j2) \
	>"$T/dpkg-buildpackage.log" 2>&1 ||
	{ tail -30 "$T/dpkg-buildpackage.log"; fail "dpkg-buildpackage -b failed"; }
debs=("$T"/src/fedbox_*_amd64.deb)
[ -f "${debs[0]}" ] || fail "no fedbox .deb was built"
cuda_deb=$(ls "$T"/src/fedbox-cuda_*_amd64.deb 2>/dev/null || true)
if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
	[ -n "$cuda_deb" ] || fail "nvcc is here but no fedbox-cuda .deb was built"
	debs+=("$cuda_deb")
else
	[ -z "$cuda_deb" ] || fail "fedbox-cuda built without nvcc"
fi
for d in "${debs[@]}"; do
	echo "built $(basename "$d") ($(stat -c %s "$d") bytes): $(dpkg-deb -f "$d" Depends)"
done
dpkg-deb -c "${debs[0]}" >"$T/contents.txt"
grep -q 'lib/systemd/system/fedbox-coordinator.service' "$T/contents.txt" ||
	fail "the units are not in the package"

# ---- install in a clean minbase tree --------------------------------------------
R=$T/root
new_chroot "$R"
mkdir -p "$R/tmp/debs"
cp "${debs[@]}" "$R/tmp/debs/"
echo "minbase tree: $(chroot "$R" dpkg-query -W -f '${Package}\n' | wc -l) packages"
inr() { chroot "$R" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
inr apt-get update -qq >"$T/apt.log" 2>&1 || { tail "$T/apt.log"; fail "apt-get update in the chroot"; }
inside=()
for d in "${debs[@]}"; do
	inside+=("/tmp/debs/$(basename "$d")")
done
inr apt-get install -y -q --no-install-recommends "${inside[@]}" \
	dataset-fashion-mnist systemd man-db >>"$T/apt.log" 2>&1 ||
	{ tail -20 "$T/apt.log"; fail "apt-get install of the packages failed"; }
grep -E "^(Setting up|Unpacking) fedbox" "$T/apt.log" | sort -u
inr id fedbox || fail "no fedbox system user after install"
[ "$(inr stat -c '%a %G' /etc/fedbox)" = "750 fedbox" ] ||
	fail "/etc/fedbox is $(inr stat -c '%a %G' /etc/fedbox)"
for p in fedbox-coordinator fedbox-worker fedbox-keygen fedbox-provision; do
	inr "$p" --version >/dev/null || fail "installed $p does not run"
done

# ---- a federation of the installed programs, laid out as the units expect --
# Kits from the installed fedbox-provision: the coordinator's in
# /etc/fedbox/, the workers' in /etc/fedbox/box-N/ (fedbox-worker@box-N),
# keys owned by fedbox as the kits' READMEs say, output in /var/lib/fedbox
# (the coordinator unit's StateDirectory, made here as systemd would). Each
# program runs as the fedbox user with its unit's own ExecStart line.
port=$(free_port)
cat >"$R/srv/hosts.txt" <<HOSTS
coordinator hub 127.0.0.1:$port
worker box-0
worker box-1
set coordinator output_dir /var/lib/fedbox
set coordinator round.rounds 2
set coordinator round.local_steps 40
set coordinator model.hidden [32]
set coordinator transport.lanes 1
set workers train.device auto
HOSTS
inr fedbox-provision -o /srv/kits /srv/hosts.txt || fail "installed fedbox-provision failed"
inr sh -ec 'cp -a /srv/kits/hub/. /etc/fedbox/
	for w in box-0 box-1; do cp -a /srv/kits/$w /etc/fedbox/$w; done
	chown -R fedbox:fedbox /etc/fedbox/keys /etc/fedbox/box-0/keys /etc/fedbox/box-1/keys
	install -d -o fedbox -g fedbox -m 0750 /var/lib/fedbox' ||
	fail "laying out the kits failed"
exec_of() { # UNIT [INSTANCE]: the unit's ExecStart, %i replaced
	sed -n 's/^ExecStart=//p' "$R/lib/systemd/system/$1" | sed "s/%i/${2:-}/g"
}
as_fedbox() { inr setpriv --reuid=fedbox --regid=fedbox --init-groups "$@"; }
cmd=$(exec_of fedbox-coordinator.service)
echo "coordinator: $cmd"
as_fedbox sh -c "cd /var/lib/fedbox && exec $cmd" >"$T/rounds.txt" 2>"$T/coord.log" &
CPID=$!
PIDS+=("$CPID")
wait_for "$T/coord.log" "listening on" 20
for i in 0 1; do
	cmd=$(exec_of fedbox-worker@.service "box-$i")
	echo "box-$i: $cmd"
	as_fedbox sh -c "cd / && exec $cmd" >"$T/box-$i.log" 2>&1 &
	PIDS+=("$!")
done
wait_exit "$CPID" 120 || fail "the installed coordinator exited with status $?"
cat "$T/rounds.txt"
OUT=$R/var/lib/fedbox
for r in 1 2; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r status)"
	[ "$(metric $r participants)" = 2 ] || fail "round $r: $(metric $r participants) participants"
done
[ "$(inr stat -c %U /var/lib/fedbox/model.safetensors)" = fedbox ] ||
	fail "the model was not written by the fedbox user"
grep -q "secure aggregation on" "$T/coord.log" || fail "not a secure federation"
echo "box-0 $(grep -m1 -o 'backend: .*' "$T/box-0.log")"
if [ -n "$cuda_deb" ]; then
	# fedbox-cuda is found in /usr/lib/fedbox; without NVIDIA's runtime in
	# the tree it cannot load, and the worker says so and uses the CPU.
	grep -Eq "backend: (cuda|cpu \(cannot load the CUDA backend /usr/bin/../lib/fedbox/libfedbox-cuda.so)" \
		"$T/box-0.log" || fail "the worker did not use /usr/lib/fedbox/libfedbox-cuda.so"
fi

# ---- the installed units -------------------------------------------------------
units="fedbox-coordinator.service fedbox-worker.service fedbox-worker@box-0.service"
st=0
inr systemd-analyze verify $units >"$T/verify.out" 2>&1 || st=$?
[ "$st" = 0 ] && [ ! -s "$T/verify.out" ] ||
	fail "systemd-analyze verify in the tree (exit $st): $(cat "$T/verify.out")"
echo "systemd-analyze verify $units: exit 0, no output"

# ---- removal -------------------------------------------------------------------------
inr apt-get purge -y -q fedbox ${cuda_deb:+fedbox-cuda} >"$T/purge.log" 2>&1 ||
	{ tail "$T/purge.log"; fail "purge failed"; }
[ ! -e "$R/usr/bin/fedbox-worker" ] || fail "purge left /usr/bin/fedbox-worker"
echo "purged: $(grep -c '^Removing\|^Purging' "$T/purge.log") steps"
echo PASS
