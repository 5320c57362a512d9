# SPDX-License-Identifier: Apache-2.0
# A secure worker masks through its trainer's mask_apply op when the
# backend has one (issue 25: a CUDA worker's masks on its GPU), checked
# where there is no GPU: tests/tools/mask_op_backend, loaded as the CUDA
# library through FEDBOX_CUDA_LIB, trains as the cpu backend does and
# computes fb_mask_apply behind the op.
#  1. A secure round of 3 workers on it (no dumps: the batch is masked on
#     the pool, its threads calling the op side by side) equals the plain
#     round of the same seeds within the quantisation bounds, and each
#     worker's log counts the op's calls and exactly P + FB_SECAGG_EXTRA
#     elements (its whole masked input, nothing masked twice or on the
#     host);
#  2. with the op flipping bit 31 of each call's first word, the round is
#     aborted for an impossible weight sum (the extras chunk's first word
#     is the weight): the op's words are the ones the worker sends.
source tests/integration/lib.sh
# the masked vector: the parameters, then the extra coordinates
extra=$(sed -n 's/^#define FB_SECAGG_EXTRA \([0-9]*\).*/\1/p' \
	"$ROOT/aggregation/aggregation.h")
[ -n "$extra" ] || fail "no FB_SECAGG_EXTRA in aggregation/aggregation.h"
lib=$T/libmaskop.so
cc -std=c11 -shared -fPIC -D_GNU_SOURCE -I. -I"$B" -o "$lib" \
	tests/tools/mask_op_backend/backend.c ||
	fail "cannot build the stand-in backend"
CHECK=("$PY" "$ROOT/tests/tools/secagg_check.py")
FL=("$ROOT/scripts/fedbox-local" --workers 3 --steps 10 --batch 32 --lr 0.05
	--hidden 16 --keys "$T/lkeys" --partition iid --chunk 16KiB
	--device cuda --rounds 1)
export FEDBOX_BIN=$ROOT/$B FEDBOX_CUDA_LIB=$lib

run() { # NAME SECURE [ENV...]
	local o=$T/$1 sa=$2
	shift 2
	mkdir -p "$o"
	dump=()
	[ "$sa" = off ] && dump=(--dump "$o/dump")
	env "$@" "${FL[@]}" --out "$o" --port "$(free_port)" --secure "$sa" \
		"${dump[@]}" >"$o/fl.txt" 2>&1
}

run plain off || { cat "$T/plain/fl.txt"; fail "the plain run failed"; }
run secure on || { cat "$T/secure/fl.txt"; fail "the secure run failed"; }
grep -qE "round +1/1 .*acc" "$T/secure/rounds.txt" ||
	fail "no round line from the secure run"
dumps=$(printf "$T/plain/dump/worker-%d," 0 1 2 | sed 's/,$//')
"${CHECK[@]}" equiv "$T/plain/model.safetensors" \
	"$T/secure/model.safetensors" --round 1 --dump "$dumps" ||
	fail "secure (masks through the op) and plain disagree"
p=$(($(stat -c %s "$T/plain/dump/worker-0/round-1.update.f32") / 4))
for i in 0 1 2; do
	log=$T/secure/worker-$i.log
	grep -q "backend: cuda (mask-op test backend" "$log" ||
		fail "worker-$i did not load the stand-in backend"
	grep -q "mask op: first call" "$log" ||
		fail "worker-$i did not mask through the op"
	line=$(grep -m1 "mask op: [0-9]* calls" "$log") ||
		fail "worker-$i logged no count of the op's calls"
	calls=$(sed 's/.*mask op: \([0-9]*\) calls.*/\1/' <<<"$line")
	elems=$(sed 's/.* \([0-9]*\) elements.*/\1/' <<<"$line")
	[ "$elems" -eq $((p + extra)) ] ||
		fail "worker-$i: the op masked $elems elements, not P + $extra"
	[ "$calls" -ge 2 ] || fail "worker-$i: $calls calls for $elems elements"
	echo "worker-$i: $calls calls of the op, $elems elements (P + $extra)"
done

# Every call's first word flipped, the extras chunk's (the weight) too:
# the coordinator sees an impossible weight sum and aborts the round.
if run flip on FB_MASK_OP_FLIP=1; then
	fail "the run with a flipping op committed its round"
fi
grep -q "round 1 aborted: the included workers' weights sum to zero or less" \
	"$T/flip/coordinator.log" || {
	tail -n 5 "$T/flip/coordinator.log"
	fail "the flipped words did not reach the coordinator"
}
[ ! -f "$T/flip/model.safetensors" ] ||
	fail "the aborted run wrote a model"
echo "with the op's output altered, the coordinator aborts the round"
echo PASS
