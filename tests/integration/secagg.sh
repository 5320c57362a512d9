# SPDX-License-Identifier: Apache-2.0
# Secure aggregation with real processes (issue 4):
#  1. equivalence: from the same model, a secure and a plain round of
#     scripts/fedbox-local (4 workers, same seeds, CPU) give models within
#     the documented quantisation bounds, for each of 3 rounds (16 KiB
#     chunks: each update goes up as 7 chunks, from a different first one);
#  2. privacy: the masked input a worker sends looks uniform and differs
#     from its encoded update; no sample count or weight of a single worker
#     reaches the coordinator's logs, metrics or round lines;
#  3. dropouts (SIGKILL): 5 workers, threshold 3; one killed after share
#     distribution and before its masked input, one after its input and
#     before unmasking: the round completes and equals the plain weighted
#     average of the included updates; then a round with fewer survivors
#     than the threshold is aborted with a clear message, the model
#     unchanged, and the next round (the workers killed after their
#     shares back in, under new keys: no public key repeats in any round)
#     equals the plain weighted average of all five. Part 3's rounds set
#     up in the round, which its kills are timed by; secagg_ahead.sh has
#     the same dropouts in rounds set up during the round before.
# SECAGG_DEVICE=cuda (tests/gpu/run-mask, on a GPU host): the workers of
# part 1 train and mask on their GPU, and say so in their logs;
# SECAGG_DATA: their Fashion-MNIST folder (default: Debian's).
source tests/integration/lib.sh
DEV=(${SECAGG_DEVICE:+--device "$SECAGG_DEVICE"}
	${SECAGG_DATA:+--data "$SECAGG_DATA"})
CHECK=("$PY" "$ROOT/tests/tools/secagg_check.py")
RULE=${SECAGG_RULE:-fedavg}
FL=("$ROOT/scripts/fedbox-local" --workers 4 --steps 25 --batch 32 --lr 0.05
	--hidden 32 --keys "$T/lkeys" --partition iid --rule "$RULE" --chunk 16KiB
	"${DEV[@]}")
ABOUND=()
# FedNova: twice the largest ||a||_1 of 25 momentum-0.9 steps, a safe
# upper bound on the coordinator's public bound (a looser bound only
# loosens the check).
[ "$RULE" = fednova ] && ABOUND=(--a-bound "$("$PY" -c \
	'print(2 * sum((1 - 0.9 ** s) / 0.1 for s in range(1, 26)))')")
export FEDBOX_BIN=$ROOT/$B

# ---- 1 and 2: equivalence and privacy ------------------------------------
for r in ${SECAGG_SKIP_EQUIV:+none} 1 2 3; do
	[ "$r" = none ] && break
	for mode in plain secure; do
		o=$T/$mode$r
		mkdir -p "$o"
		resume=()
		if [ "$r" -gt 1 ]; then
			# Both resume the plain run's checkpoint of round r - 1.
			cp -r "$T/plain$((r - 1))/checkpoint" "$o/"
			cp "$T/plain$((r - 1))/metrics.jsonl" "$o/"
			resume=(--resume)
		fi
		sa=off
		[ "$mode" = secure ] && sa=on
		"${FL[@]}" --rounds "$r" --out "$o" --port "$(free_port)" \
			--secure "$sa" --dump "$o/dump" "${resume[@]}" >"$o/fl.txt" 2>&1 ||
			{ cat "$o/fl.txt"; fail "fedbox-local ($mode, round $r) failed"; }
	done
	# The coordinator's own round lines (fedbox-local's stdout is a
	# tail -f of them, which may lag behind the exit).
	grep -qE "round +$r/$r .*acc" "$T/secure$r/rounds.txt" || {
		cat "$T/secure$r/fl.txt" "$T/secure$r/rounds.txt"
		tail -n 20 "$T/secure$r/coordinator.log"
		fail "round $r: no round line from the secure run"
	}
	"${CHECK[@]}" equiv "$T/plain$r/model.safetensors" \
		"$T/secure$r/model.safetensors" --round "$r" "${ABOUND[@]}" \
		--dump "$(printf "$T/plain$r/dump/worker-%d," 0 1 2 | sed 's/,$//'),$T/plain$r/dump/worker-3" ||
		fail "round $r: secure and plain disagree"
done
if [ "${SECAGG_DEVICE:-}" = cuda ] && [ -z "${SECAGG_SKIP_EQUIV:-}" ]; then
	for r in 1 2 3; do
		for i in 0 1 2 3; do
			grep -q "cuda: secure-aggregation masks on GPU" \
				"$T/secure$r/worker-$i.log" ||
				fail "round $r: worker-$i masked off its GPU"
		done
	done
	echo "every secure run's workers masked on their GPU"
fi
[ -n "${SECAGG_SKIP_EQUIV:-}" ] ||
	"${CHECK[@]}" privacy "$T/secure1/dump/worker-0" --round 1 ||
	fail "the masked input is not private"
# No single worker's sample count or weight reaches the coordinator.
for i in ${SECAGG_SKIP_EQUIV:+none} 0 1 2 3; do
	[ "$i" = none ] && break
	n=$(sed -n 's/.*shard [0-9]* of [0-9]* ([a-z]*): \([0-9]*\) examples.*/\1/p' "$T/secure1/worker-$i.log")
	[ -n "$n" ] || fail "no shard size in worker-$i.log"
	wt=$("$PY" -c "import json; print(json.load(open('$T/secure1/dump/worker-$i/round-1.json'))['weight'])")
	for r in 1 2 3; do
		for f in coordinator.log metrics.jsonl rounds.txt; do
			# secure r's metrics.jsonl begins with the r - 1 lines of
			# the plain run it resumed from, whose per-worker
			# train_seconds (%.3f) may read 0.015 by chance: only its
			# own round's line is the secure run's
			if { if [ "$f" = metrics.jsonl ]; then
				tail -n 1 "$T/secure$r/$f"
			else
				cat "$T/secure$r/$f"
			fi; } | grep -qwF -e "$n" -e "$wt"; then
				fail "worker-$i's sample count $n or weight $wt is in secure$r/$f"
			fi
		done
	done
	# The same check finds it where aggregation is plain.
	grep -qwF "$n" "$T/plain1/coordinator.log" ||
		fail "the leak check cannot see worker-$i's count in a plain run"
done
[ -n "${SECAGG_SKIP_EQUIV:-}" ] ||
	echo "no sample count or weight of a single worker in the secure runs' logs"

if [ -n "${SECAGG_ONLY_EQUIV:-}" ]; then
	echo PASS
	exit 0
fi

# ---- 3: dropouts with SIGKILL, and a round below the threshold ------------
port=$(free_port)
OUT=$T/drop
secagg_drop_coordinator "$port" "$OUT" "  setup_ahead: false
"
start_w() { secagg_drop_worker "$port" "$@"; } # INDEX THROTTLE [TAG]
start_w 0 100 # A: slow, killed after share distribution, before its input
start_w 1 1   # B: fast, killed after its input, before unmasking
for i in 2 3 4; do start_w "$i" 60; done

wait_for "$T/rounds.txt" "round +1/4 .*acc" 90
cp "$OUT/model.safetensors" "$T/m1.safetensors"
wait_for "$T/coord.log" "round 2: shares relayed to 5 workers" 60
kill -KILL "${WP[0]}"
echo "round 2: killed w0 after share distribution, before its masked input"
wait_for "$T/coord.log" "round 2: signed update from w1 complete" 60
kill -KILL "${WP[1]}"
echo "round 2: killed w1 after its masked input, before unmasking"
grep -q "round 2: unmasked" "$T/coord.log" &&
	fail "unmasking started before w1 was killed: the test lost its race"
wait_for "$T/rounds.txt" "round +2/4 .*down" 60
grep -qE "round +2/4 .*acc" "$T/rounds.txt" || fail "round 2 did not complete"
cp "$OUT/model.safetensors" "$T/m2.safetensors"
"${CHECK[@]}" average "$T/m2.safetensors" "$T/m1.safetensors" --round 2 --n 5 \
	--dump "$T/dump/w1,$T/dump/w2,$T/dump/w3,$T/dump/w4" ||
	fail "round 2 is not the weighted average of the 4 included updates"

# Round 3: w0 and w1 come back; three workers die after the shares went
# out, leaving 2 masked inputs for a threshold of 3.
start_w 0 1 b
start_w 1 1 b
wait_for "$T/coord.log" "round 3: shares relayed to 5 workers" 60
kill -KILL "${WP[2]}" "${WP[3]}" "${WP[4]}"
echo "round 3: killed w2, w3, w4 after share distribution"
wait_for "$T/rounds.txt" "round +3/4 .*down.*" 60
grep -qF "ABORTED (model unchanged): only 2 masked inputs complete, below the secure-aggregation threshold of 3" \
	"$T/rounds.txt" || fail "round 3 was not aborted below the threshold"
grep -q "round 3 aborted: only 2 masked inputs complete" "$T/coord.log" ||
	fail "no clear message in the coordinator's log"
cmp -s "$OUT/model.safetensors" "$T/m2.safetensors" ||
	fail "the aborted round changed the model"
for i in 2 3 4; do start_w "$i" 1 b; done
wait_exit "$CPID" 90 || fail "coordinator exited with status $?"
cat "$T/rounds.txt"
"$PY" - "$OUT/metrics.jsonl" <<'PYEOF' || fail "metrics of the dropout rounds are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["status"] for r in rows] == ["ok", "ok", "aborted", "ok"], rows
sa = rows[1]["secure_aggregation"]
assert sa["workers"] == 5 and sa["threshold"] == 3, sa
assert sa["included"] == 4 and sa["revealed"] == 3, sa
assert "below the secure-aggregation threshold" in rows[2]["reason"], rows[2]
assert rows[3]["secure_aggregation"]["included"] == 5, rows[3]
print("round 2: 4 of 5 inputs, unmasked with 3 survivors' shares; "
      "round 3 aborted; round 4 ok")
PYEOF
# Round 4: w0, whose round-2 mask key the coordinator reconstructed, is
# back in with fresh keys and the sum is the plain weighted average of
# all five (round 3 left the model as round 2 made it).
"${CHECK[@]}" average "$OUT/model.safetensors" "$T/m2.safetensors" --round 4 \
	--n 5 --dump "$T/dump/w0,$T/dump/w1,$T/dump/w2,$T/dump/w3,$T/dump/w4" ||
	fail "round 4 is not the weighted average of the 5 updates"
# No s key of any worker comes back in another round or for another
# worker (every round's pairwise masks come from fresh keys); each
# process keeps one c key, its session's.
k2=$(secagg_keys "$T/w0.log" 2)
k4=$(secagg_keys "$T/w0b.log" 4)
[ -n "$k2" ] && [ -n "$k4" ] || fail "no key record of w0 in rounds 2 and 4"
[ "$k2" != "$k4" ] || fail "w0 came back in round 4 with its round-2 keys"
secagg_key_lifetimes 15
echo "round 4: w0 back under new keys, the average of all 5; no s key repeats, one c key a process"
echo PASS
