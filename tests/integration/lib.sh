# SPDX-License-Identifier: Apache-2.0
# lib.sh -- helpers for integration tests: temp folder, free ports, real
# processes started in the background and always killed by PID on exit.
set -euo pipefail
ROOT=$(pwd)
B=${FB_BUILD:-build}
PY=${PYTHON:-/usr/bin/python3}
T=$(mktemp -d "${TMPDIR:-/tmp}/fbit.XXXXXX")
PIDS=()
SECURE=${SECURE:-1} # tests run with encrypted, signed sessions by default
SECAGG=${SECAGG:-$SECURE} # and secure aggregation, unless told otherwise
KEYS=$T/keys

cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	if [ -z "${FB_KEEP:-}" ]; then
		rm -rf "$T"
	else
		echo "kept $T"
	fi
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	for f in "$T"/*.log "$T"/rounds.txt; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
	done
	exit 1
}

skip() {
	echo "SKIP: $*"
	exit 77
}

# free_port: a port P with P..P+3 free (a coordinator with lanes listens on
# P and the next lanes - 1 ports).
free_port() {
	"$PY" -c '
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    held = [s]
    try:
        for q in range(p + 1, p + 4):
            t = socket.socket(); t.bind(("127.0.0.1", q)); held.append(t)
    except OSError:
        continue
    finally:
        for h in held: h.close()
    print(p); break
else:
    raise SystemExit("no free run of 4 ports")
'
}

# wait_for FILE PATTERN SECONDS: waits until FILE has a line matching PATTERN.
wait_for() {
	local file=$1 pat=$2 secs=$3 i
	for ((i = 0; i < secs * 10; i++)); do
		grep -qE -- "$pat" "$file" 2>/dev/null && return 0
		sleep 0.1
	done
	fail "timed out after ${secs}s waiting for '$pat' in $file"
}

# make_keys N: coordinator and worker identities w0..w(N-1), allowlist.
make_keys() {
	local n=$1 i
	mkdir -p "$KEYS"
	[ -f "$KEYS/coordinator.key" ] ||
		"$B/fedbox-keygen" -o "$KEYS/coordinator" -C coordinator >/dev/null
	: >"$KEYS/allowlist"
	for ((i = 0; i < n; i++)); do
		[ -f "$KEYS/w$i.key" ] ||
			"$B/fedbox-keygen" -o "$KEYS/w$i" -C "w$i" >/dev/null
		cat "$KEYS/w$i.pub" >>"$KEYS/allowlist"
	done
}

coord_security() {
	if [ "$SECURE" = 1 ]; then
		[ -f "$KEYS/allowlist" ] || make_keys 8
		printf 'security:\n  key: %s\n  allowlist: %s\n' \
			"$KEYS/coordinator.key" "$KEYS/allowlist"
	else
		printf 'security:\n  enabled: false\n'
	fi
	if [ "$SECAGG" = 1 ]; then
		printf 'secure_aggregation:\n  enabled: true\n%s' "${SA_YAML:-}"
	else
		printf 'secure_aggregation:\n  enabled: false\n'
	fi
}

worker_security() { # INDEX
	if [ "$SECURE" = 1 ]; then
		[ -f "$KEYS/allowlist" ] || make_keys 8
		printf 'security:\n  key: %s\n  coordinator_key: %s\n' \
			"$KEYS/w$1.key" "$KEYS/coordinator.pub"
	else
		printf 'security:\n  enabled: false\n'
	fi
	if [ "$SECAGG" = 1 ]; then
		printf '  secure_aggregation: required\n'
	else
		printf '  secure_aggregation: optional\n'
	fi
	printf '%s' "${WK_SECURITY:-}" # more security keys, e.g. a floor
}

# coord_yaml PORT OUT [ROUND-YAML-LINES]: a coordinator config for tests.
# Updates go through 2 ingest threads (FB_INGEST_THREADS), so the threaded
# path runs here even where `auto` would pick none (2 CPUs), unless the
# extra lines bring their own aggregation section; the socket has 2 ZeroMQ
# I/O threads (FB_IO_THREADS; scripts/fedbox-local keeps the default, auto).
coord_yaml() {
	local port=$1 out=$2 extra=${3:-}
	local agg="aggregation:
  ingest_threads: ${FB_INGEST_THREADS:-2}"
	case $extra in *aggregation:*) agg="" ;; esac # theirs (default auto)
	coord_security
	cat <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $out
seed: 7
model:
  arch: mlp
  hidden: [32]
round:
${extra:-  rounds: 3}
${agg}
transport:
  heartbeat: 200ms
  liveness_timeout: 3s
  io_threads: ${FB_IO_THREADS:-2}
YAML
}

# worker_yaml PORT INDEX COUNT [TRAIN-YAML-LINES]
worker_yaml() {
	local port=$1 i=$2 n=$3 extra=${4:-}
	worker_security "$i"
	cat <<YAML
coordinator: tcp://127.0.0.1:$port
name: w$i
data:
  partition: iid
  index: $i
  workers: $n
  seed: 7
train:
  device: cpu
${extra}
YAML
}

# start_coordinator CONFIG: sets CPID; round lines in $T/rounds.txt.
start_coordinator() {
	"$B/fedbox-coordinator" --config "$1" >"$T/rounds.txt" 2>"$T/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
}

# start_liar LIE CONFIG: the coordinator's lying test build (make
# build-all; coordinator/secagg.c's FB_TEST_LIAR) telling LIE
# (FB_TEST_LIE), as start_coordinator starts the real one.
start_liar() {
	local liar=$B/tests/fedbox-coordinator-liar
	[ -x "$liar" ] || fail "no $liar (make build-all builds it)"
	FB_TEST_LIE=$1 "$liar" --config "$2" >"$T/rounds.txt" \
		2>"$T/coord.log" &
	CPID=$!
	PIDS+=("$CPID")
}

# start_worker CONFIG NAME: sets WPID; log in $T/NAME.log.
start_worker() {
	"$B/fedbox-worker" --config "$1" >"$T/$2.log" 2>&1 &
	WPID=$!
	PIDS+=("$WPID")
}

# wait_exit PID SECONDS: waits for PID to exit, returns its status.
wait_exit() {
	local pid=$1 secs=$2 i
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && fail "process $pid still running after ${secs}s"
	local st=0
	wait "$pid" || st=$?
	return "$st"
}

# same_tensors A B: whether two safetensors files hold the same tensor
# bytes (their headers' metadata may differ); prints how many.
same_tensors() {
	"$PY" - "$1" "$2" <<'PYEOF'
import struct, sys
def tensors(p):
    d = open(p, "rb").read()
    n = struct.unpack("<Q", d[:8])[0]
    return d[8 + n:]
a, b = (tensors(p) for p in sys.argv[1:3])
if a != b:
    sys.exit("tensor bytes differ")
print("models identical: %d bytes of tensors" % len(a))
PYEOF
}

# metric ROUND KEY: prints a key of metrics.jsonl's line for ROUND.
metric() {
	"$PY" - "$OUT/metrics.jsonl" "$1" "$2" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["round"] == int(sys.argv[2]):
        v = d
        for k in sys.argv[3].split("."):
            v = v[k]
        print(v)
        break
PYEOF
}

# ---- round.mode async on the Prometheus endpoint (async*.sh) ----
# scrape_start PORT FILE: scrapes http://127.0.0.1:PORT/metrics every 50
# ms in the background into FILE (each copy whole, by rename) until the
# endpoint goes away after a first scrape (150 s at most); its PID in
# SCRAPER.
scrape_start() {
	"$PY" - "$1" "$2" <<'PYEOF' &
import os, sys, time, urllib.request
port, out = sys.argv[1:]
ok, t0 = 0, time.time()
while time.time() - t0 < 150:
    try:
        with urllib.request.urlopen(
                "http://127.0.0.1:%s/metrics" % port, timeout=2) as r:
            body = r.read()
        with open(out + ".tmp", "wb") as f:
            f.write(body)
        os.replace(out + ".tmp", out)
        ok += 1
    except OSError:
        if ok:
            break  # the coordinator is gone
    time.sleep(0.05)
PYEOF
	SCRAPER=$!
	PIDS+=("$SCRAPER")
}

# async_endpoint_check SCRAPE METRICS [secure]: the endpoint's async series
# at its last scrape (model version V) are those of metrics.jsonl's first
# V steps: the updates applied, dropped and superseded, each applied
# update's staleness in the histogram, and (secure) the failed cohorts'
# counter, at least the failures those steps' lines count.
async_endpoint_check() {
	"$PY" - "$@" <<'PYEOF'
import json, re, sys
text = open(sys.argv[1]).read()
rows = [json.loads(l) for l in open(sys.argv[2])]
secure = sys.argv[3:] == ["secure"]
def val(name):
    m = re.search("^%s (\\S+)$" % re.escape(name), text, re.M)
    assert m, (name, text)
    return float(m.group(1))
v = int(val("fedbox_model_version"))
assert 1 <= v <= len(rows), v
seen = rows[:v]
assert [r["version"] for r in seen] == list(range(1, v + 1)), seen
assert all(r["status"] == "ok" for r in seen), seen
st = [w["staleness"] for r in seen for w in r["workers"]]
want = {
    'fedbox_async_updates_total{outcome="applied"}': len(st),
    'fedbox_async_updates_total{outcome="dropped_stale"}':
        sum(r["dropped_stale"] for r in seen),
    'fedbox_async_updates_total{outcome="superseded"}':
        sum(r["superseded"] for r in seen),
    "fedbox_async_update_staleness_count": len(st),
    "fedbox_async_update_staleness_sum": sum(st),
    'fedbox_async_update_staleness_bucket{le="0"}': sum(s <= 0 for s in st),
    'fedbox_async_update_staleness_bucket{le="1"}': sum(s <= 1 for s in st),
    'fedbox_async_update_staleness_bucket{le="4"}': sum(s <= 4 for s in st),
}
for k, w in want.items():
    assert val(k) == w, (k, val(k), w)
if secure:
    failed = val("fedbox_async_cohorts_failed_total")
    assert failed >= sum(r["cohorts_failed"] for r in seen), failed
else:
    assert "fedbox_async_cohorts_failed_total" not in text
print("endpoint at version %d: %d updates applied, staleness sum %d" %
      (v, len(st), sum(st)))
PYEOF
}

# ---- secure aggregation with dropouts (secagg.sh part 3, secagg_ahead.sh) ----
# secagg_drop_coordinator PORT OUT [SA-LINES]: 5 workers, threshold 3 (and
# SA-LINES), 4 rounds of an MLP with 64 hidden units, the log at debug;
# started. secagg_drop_worker PORT INDEX THROTTLE [TAG]: worker INDEX of 5
# ("wINDEXTAG"), its updates dumped to $T/dump/wINDEX, its log at debug;
# its PID in WP[INDEX].
secagg_drop_coordinator() {
	SA_YAML="  threshold: 3
${3:-}" coord_yaml "$1" "$2" "  rounds: 4
  min_workers: 5
  local_steps: 30
  batch_size: 64
  lr: 0.05
  deadline: 60s
  wait_for_workers: 30s" >"$T/c.yaml"
	sed -i 's/^  hidden: \[32\]/  hidden: [64]/' "$T/c.yaml"
	echo "log_level: debug" >>"$T/c.yaml"
	start_coordinator "$T/c.yaml"
}

secagg_drop_worker() {
	local y=$T/w$2${4:-}.yaml
	worker_yaml "$1" "$2" 5 "  throttle: $3" >"$y"
	printf 'debug:\n  dump_updates: %s\n' "$T/dump/w$2" >>"$y"
	echo "log_level: debug" >>"$y"
	mkdir -p "$T/dump/w$2"
	start_worker "$y" "w$2${4:-}"
	WP[$2]=$WPID
}

# secagg_keys LOG ROUND: that round's "c_pk X.., s_pk Y.." in a worker's log.
secagg_keys() {
	sed -n "s/.*round $2: secure-aggregation keys of this round: //p" "$1"
}

# secagg_key_lifetimes MIN: the workers' logs ($T/w[0-4].log and
# $T/w[0-4]b.log, one a process) hold at least MIN rounds' key records;
# no s_pk comes back in another round or for another worker (each round's
# pairwise-mask keys are fresh), and each process advertises one c_pk,
# its session's, which no other process shares (a restart makes a new
# one).
secagg_key_lifetimes() {
	local f c all dup
	: >"$T/c_keys"
	for f in "$T"/w[0-4].log "$T"/w[0-4]b.log; do
		[ -f "$f" ] || continue
		c=$(sed -n 's/.*secure-aggregation keys of this round: c_pk \([0-9a-f.]*\),.*/\1/p' "$f" | sort -u)
		[ -n "$c" ] || continue
		[ "$(echo "$c" | wc -l)" -eq 1 ] ||
			fail "$f: more than one session c_pk: $(echo $c)"
		echo "$c" >>"$T/c_keys"
	done
	dup=$(sort "$T/c_keys" | uniq -d)
	[ -z "$dup" ] || fail "two worker processes advertised one c_pk: $dup"
	all=$(cat "$T"/w[0-4].log "$T"/w[0-4]b.log |
		sed -n 's/.*secure-aggregation keys of this round: .*s_pk \([0-9a-f.]*\).*/\1/p')
	[ "$(echo "$all" | wc -l)" -ge "$1" ] ||
		fail "too few key records: $(echo "$all" | wc -l)"
	dup=$(echo "$all" | sort | uniq -d)
	[ -z "$dup" ] || fail "an s_pk came back: $dup"
}
