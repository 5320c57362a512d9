# SPDX-License-Identifier: Apache-2.0
# The coordinator down for a long time (issue 22, acceptance 2): killed
# with SIGKILL after round 2, started again with --resume after the
# outage; the workers (default transport settings: they wait forever,
# retrying with backoff and jitter) are still there, have said so at a
# slowing rate, and the next round runs with all of them. The outage is
# 15 s here and 10 minutes with FB_FAULTS_FULL=1 (FB_OUTAGE_S sets it).
source tests/faults/lib.sh
outage=${FB_OUTAGE_S:-$([ "$FULL" = 1 ] && echo 600 || echo 15)}
make_keys 3
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 4
  min_workers: 3
  local_steps: 20" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
	wpid[$i]=$WPID
done
wait_for "$T/rounds.txt" "round +2/4" 60
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null || true
echo "coordinator killed after round 2; down for ${outage}s"
sleep "$outage"
for i in 0 1 2; do
	kill -0 "${wpid[$i]}" 2>/dev/null ||
		fail "worker w$i gave up during the outage: $(tail -3 "$T/w$i.log")"
	grep -q "still trying" "$T/w$i.log" ||
		fail "worker w$i never said it was still trying"
done
# at a slowing rate: 10 s, 20 s, 40 s, ... after the loss, so a 10-minute
# outage writes about 6 lines per worker, not hundreds
notes=$(grep -c "still trying" "$T/w0.log")
"$PY" -c "import math, sys; n = $notes; top = math.log2($outage / 3.0 + 1) + 2; print('w0: %d \"still trying\" lines in %ds' % (n, $outage)); sys.exit(not 1 <= n <= top)" ||
	fail "the workers' notes do not slow down"
cp "$T/rounds.txt" "$T/rounds-1.txt"
: >"$T/rounds.txt"
start=$(date +%s)
"$B/fedbox-coordinator" --config "$T/c.yaml" --resume >"$T/rounds.txt" \
	2>>"$T/coord.log" &
CPID=$!
PIDS+=("$CPID")
wait_exit "$CPID" 120 || fail "the resumed coordinator exited with $?"
echo "resumed: rounds 3 and 4 in $(($(date +%s) - start))s"
cat "$T/rounds.txt"
check_rounds 4 3
echo PASS
