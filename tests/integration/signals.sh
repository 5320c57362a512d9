# SPDX-License-Identifier: Apache-2.0
# SIGTERM and SIGINT stop the programs cleanly (exit 0) and promptly; a
# stopped coordinator tells its workers, which then exit 0 too; a round cut
# short leaves the last complete model file intact.
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 1000
  min_workers: 2
  local_steps: 30
  batch_size: 32" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 2 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
	eval "wp$i=$WPID"
done
wait_for "$T/rounds.txt" "round +3/" 60
kill -TERM "$CPID"
wait_exit "$CPID" 10 || fail "coordinator exit status $? after SIGTERM"
grep -q "stopped by signal" "$T/coord.log" || fail "no stop message"
wait_exit "$wp0" 10 || fail "worker 0 exit status $? after the coordinator stopped"
wait_exit "$wp1" 10 || fail "worker 1 exit status $? after the coordinator stopped"
ls "$OUT"/model.safetensors.tmp* 2>/dev/null && fail "a temporary model file was left behind"
"$PY" tests/tools/st_eval.py "$OUT/model.safetensors" >/dev/null || fail "model file unreadable"

# A worker interrupted while waiting for a coordinator exits 0.
worker_yaml "$(free_port)" 0 2 >"$T/lonely.yaml"
start_worker "$T/lonely.yaml" lonely
sleep 1
kill -INT "$WPID"
wait_exit "$WPID" 10 || fail "worker exit status $? after SIGINT"
echo PASS
