# SPDX-License-Identifier: Apache-2.0
# bench/zmq_raw, the yardstick of bench/round_overhead, moves the bytes it
# says it moves, and its zero-copy update source sends the same bytes as
# the zmq_send path. It applies the fedbox programs' allocator setting
# unless told --malloc default, and says which in its summary.
source tests/integration/lib.sh
raw="$B/bench/zmq_raw"
[ -x "$raw" ] || fail "$raw is not built"
for src in update copy hot; do
	"$raw" --senders 2 --bytes 3000000 --reps 2 --warmup 1 --source "$src" \
		>"$T/$src.out" 2>&1 || fail "zmq_raw --source $src: exit $?: $(cat "$T/$src.out")"
	last=$(tail -1 "$T/$src.out")
	case "$last" in
	*'"bytes": 6000000,'*'"source": "'"$src"'", "malloc": "tuned"'*) ;;
	*) fail "zmq_raw --source $src: unexpected summary: $last" ;;
	esac
	grep -c '^rep [12]: 6000000 bytes from 2 senders' "$T/$src.out" |
		grep -qx 2 || fail "zmq_raw --source $src: not 2 timed reps of 6000000 bytes"
	sed -n 's/.*"checksum": \([0-9]*\)}$/\1/p' "$T/$src.out" >"$T/$src.sum"
done
cmp -s "$T/update.sum" "$T/copy.sum" ||
	fail "update and copy sources sent different bytes ($(cat "$T/update.sum") vs $(cat "$T/copy.sum"))"
! cmp -s "$T/update.sum" "$T/hot.sum" ||
	fail "hot source (one buffer resent) has the update source's checksum"
"$raw" --senders 2 --bytes 3000000 --reps 2 --warmup 1 --malloc default \
	>"$T/default.out" 2>&1 || fail "zmq_raw --malloc default: exit $?: $(cat "$T/default.out")"
case "$(tail -1 "$T/default.out")" in
*'"source": "update", "malloc": "default"'*) ;;
*) fail "zmq_raw --malloc default: unexpected summary: $(tail -1 "$T/default.out")" ;;
esac
sed -n 's/.*"checksum": \([0-9]*\)}$/\1/p' "$T/default.out" >"$T/default.sum"
cmp -s "$T/update.sum" "$T/default.sum" ||
	fail "--malloc default sent different bytes from the tuned run"
if "$raw" --senders 2 --bytes 1000 --malloc jemalloc >"$T/badm.out" 2>&1; then
	fail "zmq_raw accepted --malloc jemalloc"
fi
grep -q "malloc: 'jemalloc' is not tuned or default" "$T/badm.out" ||
	fail "no clear error for a bad --malloc: $(cat "$T/badm.out")"
if "$raw" --senders 2 --bytes 1000 --source cold >"$T/bad.out" 2>&1; then
	fail "zmq_raw accepted --source cold"
fi
grep -q "source: 'cold' is not update, copy or hot" "$T/bad.out" ||
	fail "no clear error for a bad --source: $(cat "$T/bad.out")"
echo PASS
