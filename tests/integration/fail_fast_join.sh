# SPDX-License-Identifier: Apache-2.0
# Mistakes said at once, by name (issue: "fail fast and say why"), with
# secure sessions and aggregation on:
#  0. a worker whose coordinator address answers nothing says so, naming
#     the address, within 5 s of its first try (and keeps trying);
#  1. a worker started before its coordinator joins it cleanly: no
#     refusal, no "bad_signature", no warning about the handshake;
#  2. a second process with a worker's key (the same config started
#     twice) is refused within 5 s of its first try, with a message naming
#     the worker, exits 1, and the coordinator's log names both; the first
#     keeps its place and every round commits with it;
#  3. a worker whose data.index another worker holds is refused, both
#     named, exit 1.
source tests/integration/lib.sh

# ---- 0: a coordinator address where nothing answers -----------------------
make_keys 3
dead=$(free_port)
worker_yaml "$dead" 0 3 >"$T/w-dead.yaml"
start_worker "$T/w-dead.yaml" w-dead
WD=$WPID
# timed from its first try (loading its shard and keys comes before)
wait_for "$T/w-dead.log" "connecting to tcp://127.0.0.1:$dead" 30
t0=$(date +%s.%N)
wait_for "$T/w-dead.log" "no answer from the coordinator at tcp://127.0.0.1:$dead" 5
t1=$(date +%s.%N)
echo "unreachable address: named after $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s"
kill "$WD"
wait_exit "$WD" 10 || true

port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 3
  min_workers: 3
  local_steps: 3
  batch_size: 16
  wait_for_workers: 60s" >"$T/c.yaml"
for i in 0 1 2; do
	worker_yaml "$port" "$i" 3 >"$T/w$i.yaml"
done
# w2 with w0's data.index, for case 3
sed 's/^  index: 2$/  index: 0/' "$T/w2.yaml" >"$T/w2-index0.yaml"

# ---- 1: w0 first, the coordinator 3 s later ------------------------------
start_worker "$T/w0.yaml" w0
W0=$WPID
sleep 3
start_coordinator "$T/c.yaml"
wait_for "$T/w0.log" "admitted as worker" 20
! grep -Ei "refused|bad_signature|WARN .*handshake" "$T/w0.log" ||
	{ cat "$T/w0.log"; fail "w0 started first logged a refusal"; }

# ---- 2: the same config again, while w0 is connected ---------------------
start_worker "$T/w0.yaml" w0-again
DUP=$WPID
# timed from its first try, as in case 0: loading the 20000-example shard
# comes before and takes seconds of its own under the sanitizers
wait_for "$T/w0-again.log" "connecting to tcp://127.0.0.1:$port" 30
t0=$(date +%s.%N)
st=0
wait_exit "$DUP" 5 || st=$?
t1=$(date +%s.%N)
[ "$st" -eq 1 ] || { cat "$T/w0-again.log"; fail "the second w0 exited $st, expected 1"; }
grep -q "another process holds the key of worker 'w0'" "$T/w0-again.log" ||
	{ cat "$T/w0-again.log"; fail "the second w0 was not told why"; }
grep -q "two processes use the key of worker 'w0' (id 0).*the other ('w0') is refused" \
	"$T/coord.log" || { cat "$T/coord.log"; fail "the coordinator did not name the duplicate"; }
echo "duplicate key: refused in $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s"

# ---- 3: a taken data.index ------------------------------------------------
start_worker "$T/w2-index0.yaml" w2-index0
WX=$WPID
st=0
wait_exit "$WX" 10 || st=$?
[ "$st" -eq 1 ] || { cat "$T/w2-index0.log"; fail "w2 on index 0 exited $st, expected 1"; }
grep -q "data.index 0 of 3 is worker 'w0''s already" "$T/w2-index0.log" ||
	{ cat "$T/w2-index0.log"; fail "w2 was not told whose index it took"; }
grep -q "refused worker 'w2': data.index 0 of 3 is worker 'w0''s" \
	"$T/coord.log" || fail "the coordinator did not name both workers"

# ---- the federation itself, untouched by all of it -----------------------
for i in 1 2; do
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 90 || { cat "$T/coord.log"; fail "coordinator exited with status $?"; }
cat "$T/rounds.txt"
[ "$(grep -c 'workers 3/3' "$T/rounds.txt")" -eq 3 ] ||
	fail "not every round committed with all three workers"
! grep -q "silent\|reconnect" "$T/w0.log" ||
	{ cat "$T/w0.log"; fail "the first w0 lost its session to the duplicate"; }
wait_exit "$W0" 10 || fail "w0 exited with status $?"
echo "ok: a worker before its coordinator, a duplicate key, a taken index"
