# SPDX-License-Identifier: Apache-2.0
# A full disk and a read-only disk under OUTPUT_DIR (issue 22: "a full disk
# keeps the previous model" must keep holding). OUTPUT_DIR is a 2 MiB tmpfs;
# once round 1 committed it is filled to the last byte (full) or mounted
# read-only over itself (ro). The coordinator cannot write round 2's
# checkpoint: it stops, non-zero, saying what it could not write and why
# (ENOSPC, EROFS); model.safetensors and the checkpoint are still round 1's,
# byte for byte, and no temporary file is left. With the room back,
# --resume (and the workers started again: the stopping coordinator ended
# the run for them) runs rounds 2 and 3 with all three workers.
source tests/faults/lib.sh
[ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs"
make_keys 3
port=$(free_port)
for mode in full ro; do
	OUT=$T/out-$mode
	tmpfs_at "$OUT" 2m
	coord_yaml "$port" "$OUT" "  rounds: 3
  min_workers: 3
  local_steps: 20" >"$T/c.yaml"
	: >"$T/rounds.txt"
	: >"$T/coord.log"
	start_coordinator "$T/c.yaml"
	for i in 0 1 2; do
		# slow training (simulation): a round lasts seconds, so the
		# disk goes between round 1's commit and round 2's
		worker_yaml "$port" "$i" 3 "  throttle: 50" >"$T/w$i.yaml"
		start_worker "$T/w$i.yaml" "w$i-$mode"
	done
	wait_for "$T/rounds.txt" "round +1/3" 60
	sum=$(sha256sum <"$OUT/model.safetensors")
	state=$(sha256sum <"$OUT/checkpoint/state")
	if [ "$mode" = full ]; then
		dd if=/dev/zero of="$OUT/fill" bs=4k 2>/dev/null || true
		[ "$(df --output=avail "$OUT" | tail -1)" -eq 0 ] ||
			fail "could not fill $OUT"
		why="No space left on device"
	else
		mount --bind "$OUT" "$OUT"
		MOUNTS+=("$OUT")
		mount -o remount,bind,ro "$OUT"
		why="Read-only file system"
	fi
	echo "$mode: round 1 committed, then the disk went $mode"
	rc=0
	wait_exit "$CPID" 60 || rc=$?
	[ "$rc" -ne 0 ] || fail "$mode: the coordinator exited 0"
	grep -q "round 2: cannot write the checkpoint" "$T/coord.log" ||
		fail "$mode: the coordinator did not say it could not checkpoint"
	grep -q "$why" "$T/coord.log" ||
		fail "$mode: the coordinator did not say why ($why)"
	grep "$why" "$T/coord.log" | head -1
	echo "$mode: the coordinator stopped with exit $rc"
	[ "$(sha256sum <"$OUT/model.safetensors")" = "$sum" ] ||
		fail "$mode: model.safetensors changed"
	[ "$(sha256sum <"$OUT/checkpoint/state")" = "$state" ] ||
		fail "$mode: the checkpoint changed"
	! ls "$OUT" "$OUT/checkpoint" | grep -q '\.tmp' ||
		fail "$mode: a temporary file was left: $(ls "$OUT" "$OUT/checkpoint")"
	[ "$(grep -c . "$OUT/metrics.jsonl")" = 1 ] ||
		fail "$mode: metrics.jsonl does not hold round 1 alone"
	echo "$mode: model.safetensors and the checkpoint are round 1's, whole"
	# the room back: the run goes on (the stopping coordinator ended the
	# run for its workers, which are started again)
	if [ "$mode" = full ]; then
		rm -f "$OUT/fill"
	else
		umount "$OUT"
	fi
	: >"$T/rounds.txt"
	"$B/fedbox-coordinator" --config "$T/c.yaml" --resume \
		>"$T/rounds.txt" 2>>"$T/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
	for i in 0 1 2; do
		start_worker "$T/w$i.yaml" "w$i-$mode-resumed"
	done
	wait_exit "$CPID" 120 || fail "$mode: the resumed coordinator exited with $?"
	cat "$T/rounds.txt"
	check_rounds 3 3
done
echo PASS
