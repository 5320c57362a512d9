# SPDX-License-Identifier: Apache-2.0
# bench/zmq_raw, the yardstick of bench/round_overhead, moves the bytes it
# says it moves, and its zero-copy update source sends the same bytes as
# the zmq_send path.
source tests/integration/lib.sh
raw="$B/bench/zmq_raw"
[ -x "$raw" ] || fail "$raw is not built"
for src in update copy hot; do
	"$raw" --senders 2 --bytes 3000000 --reps 2 --warmup 1 --source "$src" \
		>"$T/$src.out" 2>&1 || fail "zmq_raw --source $src: exit $?: $(cat "$T/$src.out")"
	last=$(tail -1 "$T/$src.out")
	case "$last" in
	*'"bytes": 6000000,'*'"source": "'"$src"'"'*) ;;
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
if "$raw" --senders 2 --bytes 1000 --source cold >"$T/bad.out" 2>&1; then
	fail "zmq_raw accepted --source cold"
fi
grep -q "source: 'cold' is not update, copy or hot" "$T/bad.out" ||
	fail "no clear error for a bad --source: $(cat "$T/bad.out")"
echo PASS
