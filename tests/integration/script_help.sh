# SPDX-License-Identifier: Apache-2.0
# Every script answers --help without side effects: each program under
# scripts/, bench/ (and bench/gpu/), tests/tools/, tests/gen/, tests/run,
# tests/fuzz/run and .ci/run (found by its #! line or its __main__, so a
# new script is covered too) exits 0 within 30 s, prints help naming
# itself on stdout, and leaves no file behind: not in the folder it ran
# in, not in its HOME or TMPDIR, and nothing new or changed in the tree.
# Library modules (no #!, no __main__) are not programs and are skipped.
source tests/integration/lib.sh

scripts=()
for f in scripts/* bench/* bench/gpu/* tests/tools/* tests/gen/* tests/run \
	tests/fuzz/run .ci/run; do
	[ -f "$f" ] || continue
	case $f in *.c | *.h | *.md | *.mk | *.svg | *.txt | *.json) continue ;; esac
	if head -1 "$f" | grep -q '^#!' || grep -q '__name__ == "__main__"' "$f"; then
		scripts+=("$f")
	fi
done
[ ${#scripts[@]} -ge 20 ] || fail "only ${#scripts[@]} scripts found"

stamp=$T/stamp
n=0
for f in "${scripts[@]}"; do
	box=$T/box
	rm -rf "$box"
	mkdir -p "$box/cwd" "$box/home" "$box/tmp"
	touch "$stamp"
	sleep 0.01 # a write after this has a later mtime than the stamp
	if [ -x "$f" ]; then
		cmd=("$ROOT/$f")
	elif head -1 "$f" | grep -q bash || [[ $f == *.sh ]]; then
		cmd=(bash "$ROOT/$f")
	else
		cmd=("$PY" "$ROOT/$f")
	fi
	st=0
	(cd "$box/cwd" && HOME=$box/home TMPDIR=$box/tmp timeout 30 "${cmd[@]}" --help \
		</dev/null >"$T/help.out" 2>"$T/help.err") || st=$?
	[ "$st" -eq 0 ] || { cat "$T/help.out" "$T/help.err"; fail "$f --help: exit $st"; }
	name=$(basename "$f" .py)
	grep -qF -- "$name" "$T/help.out" ||
		{ cat "$T/help.out"; fail "$f --help: no help naming $name on stdout"; }
	left=$(find "$box" -mindepth 2 | head -5)
	[ -z "$left" ] || fail "$f --help left files: $left"
	changed=$(find "$ROOT" -newer "$stamp" -not -path "$ROOT/.git/*" \
		-not -name __pycache__ -not -path '*/__pycache__/*' -print | head -5)
	[ -z "$changed" ] || fail "$f --help changed the tree: $changed"
	echo "ok: $f --help ($(wc -l <"$T/help.out") lines)"
	n=$((n + 1))
done
echo "ok: $n scripts"
echo PASS
