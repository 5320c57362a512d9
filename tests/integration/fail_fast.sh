# SPDX-License-Identifier: Apache-2.0
# Failing fast and honestly ("Why" points 9 and 10 of issue 22):
#   - configs that can never commit a round are refused at start (exit 2,
#     before anything is listened on or written): round.min_workers, a
#     secure-aggregation threshold or round.min_updates above the
#     allowlist's size, a threshold above round.workers_per_round,
#     round.min_updates above transport.max_workers in plain mode;
#   - a run in which no round committed exits 1, says so, and writes no
#     model file;
#   - a worker killed with SIGKILL is dropped as soon as its connection
#     closes, long before its liveness timeout (60 s here).
source tests/integration/lib.sh
make_keys 3
head -n 2 "$KEYS/allowlist" >"$KEYS/allow2"

# expect_refused WHAT PATTERN CONFIG: exit 2 naming the cause, nothing
# made in the output folder.
expect_refused() {
	local what=$1 pat=$2 cfg=$3 st=0
	timeout 20 "$B/fedbox-coordinator" --config "$cfg" >"$T/out.txt" 2>&1 ||
		st=$?
	[ "$st" -eq 2 ] || { cat "$T/out.txt"; fail "$what: exit $st, expected 2"; }
	grep -qE -- "$pat" "$T/out.txt" ||
		{ cat "$T/out.txt"; fail "$what: no '$pat' in the log"; }
	! grep -q "listening on" "$T/out.txt" || fail "$what: it listened first"
	[ ! -e "$T/never" ] || fail "$what: it made $T/never"
	echo "ok: $what"
}

port=$(free_port)
secure_cfg() { # ROUND-LINES SA-LINES
	cat <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $T/never
model: {arch: mlp, hidden: [8]}
evaluation: {every: 0}
round:
$1
security:
  key: $KEYS/coordinator.key
  allowlist: $KEYS/allow2
secure_aggregation:
  enabled: true
$2
YAML
}
secure_cfg "  min_workers: 3" "" >"$T/c1.yaml"
expect_refused "min_workers above the allowlist" \
	"round.min_workers \(3\) exceeds the 2 workers on the allowlist" \
	"$T/c1.yaml"
secure_cfg "  min_workers: 2" "  threshold: 3" >"$T/c2.yaml"
expect_refused "a threshold above the allowlist" \
	"secure_aggregation.threshold \(3\) exceeds the 2 workers" "$T/c2.yaml"
secure_cfg "  min_workers: 2
  workers_per_round: 4
  min_updates: 3" "" >"$T/c3.yaml"
expect_refused "min_updates above the allowlist" \
	"round.min_updates \(3\) exceeds the 2 workers on the allowlist" \
	"$T/c3.yaml"
sed -e "s|$KEYS/allow2|$KEYS/allowlist|" "$T/c2.yaml" |
	sed -e 's/  min_workers: 2/  min_workers: 2\n  workers_per_round: 2/' \
		>"$T/c4.yaml"
expect_refused "a threshold above workers_per_round" \
	"secure_aggregation.threshold \(3\) exceeds round.workers_per_round \(2\)" \
	"$T/c4.yaml"
cat >"$T/c5.yaml" <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $T/never
model: {arch: mlp, hidden: [8]}
evaluation: {every: 0}
round: {min_workers: 2, workers_per_round: 8, min_updates: 5}
transport: {max_workers: 4}
security: {enabled: false}
secure_aggregation: {enabled: false}
YAML
expect_refused "plain min_updates above max_workers" \
	"round.min_updates \(5\) exceeds the 4 workers transport.max_workers" \
	"$T/c5.yaml"

# No round commits: w1 trains 1000 times slower than the deadline lets it,
# and every round needs both updates.
SECURE=0 SECAGG=0
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 2
  min_updates: 2
  local_steps: 20
  deadline: 3s" >"$T/c.yaml"
printf 'evaluation:\n  every: 0\n' >>"$T/c.yaml"
start_coordinator "$T/c.yaml"
worker_yaml "$port" 0 2 >"$T/w0.yaml"
start_worker "$T/w0.yaml" w0
worker_yaml "$port" 1 2 "  throttle: 1000" >"$T/w1.yaml"
start_worker "$T/w1.yaml" w1
st=0
wait_exit "$CPID" 60 || st=$?
[ "$st" -eq 1 ] || fail "a run with no committed round exited $st, not 1"
grep -q "none of the 2 rounds committed" "$T/coord.log" ||
	fail "the coordinator did not say that no round committed"
[ ! -e "$OUT/model.safetensors" ] ||
	fail "a model file was written though no round committed"
[ "$(grep -c '"status": "failed"' "$OUT/metrics.jsonl")" -eq 2 ] ||
	fail "metrics.jsonl does not record 2 failed rounds"
echo "ok: no round committed: exit 1, no model file"

# A worker killed mid-round is dropped when its connection closes, not
# after its 60 s liveness timeout.
port=$(free_port)
OUT=$T/out2
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 3
  min_updates: 2
  local_steps: 20
  deadline: 60s" >"$T/k.yaml"
sed -i 's/liveness_timeout: 3s/liveness_timeout: 60s/' "$T/k.yaml"
printf 'evaluation:\n  every: 0\n' >>"$T/k.yaml"
start_coordinator "$T/k.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 3 >"$T/kw$i.yaml"
	start_worker "$T/kw$i.yaml" "kw$i"
done
worker_yaml "$port" 2 3 "  throttle: 200" >"$T/kw2.yaml"
start_worker "$T/kw2.yaml" kw2
victim=$WPID
wait_for "$T/kw2.log" "trainer: " 30
sleep 0.5
t0=$("$PY" -c 'import time; print(time.time())')
kill -KILL "$victim"
wait_for "$T/coord.log" "worker w2 lost: its connection closed" 10
t1=$("$PY" -c 'import time; print(time.time())')
"$PY" -c "import sys; d = $t1 - $t0; print('dropped %.2fs after the kill' % d); sys.exit(d > 3)" ||
	fail "the killed worker was not dropped at once"
wait_for "$T/rounds.txt" "round +1/2" 60
grep -q "round   1/2  workers 2/3" "$T/rounds.txt" ||
	fail "round 1 did not commit with the 2 others: $(cat "$T/rounds.txt")"
echo "ok: a killed worker is dropped at once; the round commits without it"
echo PASS
