# SPDX-License-Identifier: Apache-2.0
# lib.sh -- helpers for the heavy deploy checks, over the integration
# tests' lib.sh (temp folder, free ports, processes killed by PID): a
# debootstrap minbase bookworm tree, made once and kept as a tarball in
# the cache folder, and chroots whose mounts are undone before the temp
# folder is removed.
source tests/integration/lib.sh
CACHE=${FB_DEPLOY_CACHE:-$ROOT/build/deploy-cache}
MOUNTS=()

deploy_cleanup() {
	local i
	for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
		umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null || true
	done
	for i in "${MOUNTS[@]}"; do
		if mountpoint -q "$i" 2>/dev/null; then
			echo "still mounted: $i; leaving $T in place" >&2
			FB_KEEP=1
		fi
	done
	cleanup
}
trap deploy_cleanup EXIT

need_root() {
	[ "$(id -u)" = 0 ] || skip "needs root ($1)"
}

# debian_mirror: the Debian archive this host's apt uses for bookworm, or
# nothing (debootstrap's own default).
debian_mirror() {
	apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
		awk '$2 == "bookworm" && $1 ~ /debian\/?$/ { print $1; exit }'
}

# minbase_tarball: prints the path of a minbase bookworm tarball, making it
# with debootstrap the first time (a few minutes; needs the archive).
minbase_tarball() {
	local tar=$CACHE/bookworm-minbase.tar
	if [ ! -s "$tar" ]; then
		command -v debootstrap >/dev/null ||
			skip "no debootstrap (scripts/bootstrap deploy installs it)"
		mkdir -p "$CACHE"
		rm -rf "$CACHE/minbase.tmp"
		echo "debootstrap --variant=minbase bookworm (once; cached in $tar)" >&2
		debootstrap --variant=minbase bookworm "$CACHE/minbase.tmp" \
			$(debian_mirror) >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -5 "$CACHE/debootstrap.log" >&2; fail "debootstrap failed"; }
		tar -C "$CACHE/minbase.tmp" -cf "$tar.tmp" . &&
			mv "$tar.tmp" "$tar"
		rm -rf "$CACHE/minbase.tmp"
	fi
	echo "$tar"
}

# new_chroot DIR: a fresh minbase tree in DIR with /proc mounted (undone on
# exit) and this host's resolver, so apt inside reaches the archive.
new_chroot() {
	local dir=$1 tar
	tar=$(minbase_tarball)
	mkdir -p "$dir"
	tar -C "$dir" -xf "$tar"
	cp /etc/resolv.conf "$dir/etc/resolv.conf"
	mount -t proc proc "$dir/proc"
	MOUNTS+=("$dir/proc")
}

# src_tree DIR: this checkout's files (tracked and new, not ignored) in DIR.
src_tree() {
	mkdir -p "$1"
	git ls-files -co --exclude-standard | grep -v '/node_modules/' |
		tar -cf - -T - | tar -xf - -C "$1"
}
