# SPDX-License-Identifier: Apache-2.0
# The coordinator's Prometheus endpoint (metrics.listen) under a real
# Prometheus server (Debian's prometheus, started here on a free port and
# stopped by PID), scraping a live federation. After its third round one
# worker is stopped (SIGSTOP), so the fourth round waits and the values
# hold still; Prometheus's query API (/api/v1/query) must then return the
# round count, the accuracy, the byte totals, the rounds by status and
# each worker's speed that metrics.jsonl shows (none: this federation
# aggregates securely, and its workers keep their speed). promtool lints the
# exposition, and every query of the Grafana dashboard
# (deploy/grafana/fedbox.json) must run. Then an asynchronous federation
# under a Prometheus of its own: its model version, updates and the
# dashboard's async panels.
source tests/integration/lib.sh
command -v prometheus >/dev/null ||
	skip "prometheus is not installed (scripts/bootstrap installs it)"

port=$(free_port)
mport=$(free_port)
OUT=$T/out
coord_security >"$T/c.yaml"
cat >>"$T/c.yaml" <<YAML
listen: tcp://127.0.0.1:$port
output_dir: $OUT
seed: 7
model:
  arch: mlp
  hidden: [32]
round:
  rounds: 4
  min_workers: 2
  local_steps: 300
  batch_size: 32
  deadline: 2m
evaluation:
  every: 1
transport:
  heartbeat: 200ms
  liveness_timeout: 2m
metrics:
  listen: 127.0.0.1:$mport
YAML
# start_prometheus NAME TARGET-PORT: a Prometheus server scraping
# 127.0.0.1:TARGET-PORT every second, its files $T/NAME.*; its query port
# in pport, its PID in PPID_.
start_prometheus() {
	pport=$(free_port)
	cat >"$T/$1.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fedbox
    static_configs:
      - targets: ["127.0.0.1:$2"]
YAML
	prometheus --config.file="$T/$1.yml" --storage.tsdb.path="$T/$1.tsdb" \
		--web.listen-address="127.0.0.1:$pport" --log.level=warn \
		>"$T/$1.log" 2>&1 &
	PPID_=$!
	PIDS+=("$PPID_")
}

# prom_py ARGS...: the Python on stdin, run with ARGS, after `base`, the
# Prometheus at pport, and query(Q) of its API (the result list; status
# checked).
prom_py() {
	{
		cat <<PYEOF
import json, urllib.parse, urllib.request
base = "http://127.0.0.1:$pport"
def query(q):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        d = json.load(r)
    assert d["status"] == "success", (q, d)
    return d["data"]["result"]
PYEOF
		cat
	} | "$PY" - "$@"
}

# --- 3. Prometheus scraping it
start_prometheus prometheus "$mport"

start_coordinator "$T/c.yaml"
wait_for "$T/coord.log" "Prometheus endpoint at http://127.0.0.1:$mport/metrics" 30
for i in 0 1; do
	worker_yaml "$port" "$i" 2 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
	eval "W$i=$WPID"
done
# Round 4 starts the moment round 3's line is written and w1 trains it
# in about 0.15 s: the stop must come well inside that, or w1's update is
# in and round 4 waits in its unmask instead of training.
for ((i = 0; i < 12000; i++)); do
	[ "$(wc -l <"$OUT/metrics.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
	sleep 0.01
done
kill -STOP "$W1"
[ "$(wc -l <"$OUT/metrics.jsonl")" -eq 3 ] ||
	fail "wanted the federation held after its third round: $(wc -l <"$OUT/metrics.jsonl") lines"

# promtool's linter on the text as served.
"$PY" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1]).read().decode())' \
	"$mport" >"$T/metrics.txt"
if command -v promtool >/dev/null; then
	promtool check metrics <"$T/metrics.txt" >"$T/promtool.txt" 2>&1 ||
		{ cat "$T/promtool.txt"; fail "promtool check metrics"; }
	echo "ok: promtool check metrics: clean"
fi

prom_py "$OUT/metrics.jsonl" deploy/grafana/fedbox.json <<'PYEOF' || fail "Prometheus queries"
import math, sys, time
metrics, dashboard = sys.argv[1:]

def value(q):
    res = query(q)
    assert len(res) == 1, (q, res)
    return float(res[0]["value"][1])

lines = [json.loads(l) for l in open(metrics) if l.strip()]
last = lines[-1]
t0 = time.time()
while True:
    try:
        # a scrape after the third round was recorded
        if query('up{job="fedbox"} == 1') and \
                query('fedbox_rounds_total{status="ok"} == %d' % len(lines)):
            break
    except OSError:
        pass  # not listening yet
    assert time.time() - t0 < 60, "no scrape of round 3 within 60 s"
    time.sleep(0.3)
print("ok: Prometheus scraped round %d after %.1f s" % (len(lines), time.time() - t0))

checks = [
    ("fedbox_round", last["round"] + 1),  # the fourth, held
    ("fedbox_rounds_planned", 4),
    ("fedbox_test_accuracy", last["test_accuracy"]),
    ("fedbox_test_loss", last["test_loss"]),
    ('fedbox_rounds_total{status="ok"}',
     sum(1 for d in lines if d["status"] == "ok")),
    ("fedbox_upload_bytes_total", sum(d["bytes_up"] for d in lines)),
    ("fedbox_download_bytes_total", sum(d["bytes_down"] for d in lines)),
    ("fedbox_round_duration_seconds_count", len(lines)),
    ("fedbox_round_duration_seconds_sum", sum(d["seconds"] for d in lines)),
    ('sum(fedbox_rejected_messages_total)',
     sum(sum(d["rejected"].values()) for d in lines)),
    ('fedbox_round_phase{phase="train"}', 1),
    ('fedbox_workers{state="live"}', 2),
]
for w in last["workers"]:
    if "steps_per_s" in w:  # plain rounds only: a secure worker keeps it
        checks.append(('fedbox_worker_steps_per_second{worker="%s"}'
                       % w["name"], w["steps_per_s"]))
    else:
        assert query('fedbox_worker_steps_per_second{worker="%s"}'
                     % w["name"]) == [], "a secure worker's speed is shown"
    if "steps" in w:
        checks.append(('fedbox_worker_steps_total{worker="%s"}' % w["name"],
                       sum(x["steps"] for d in lines for x in d["workers"]
                           if x["name"] == w["name"])))
# metrics.jsonl prints accuracy and loss with 6 decimals, seconds and
# speeds with 3
tol = {"fedbox_test_accuracy": 5e-7, "fedbox_test_loss": 5e-7,
       "fedbox_round_duration_seconds_sum": 5e-4 * len(lines)}
for q, want in checks:
    got = value(q)
    t = 5e-4 if q.startswith("fedbox_worker_steps_per_second") else \
        tol.get(q, 1e-12)
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=t), (q, got, want)
    print("ok: %s = %s (metrics.jsonl: %s)" % (q, got, want))
# federated evaluation (workers on their own validation data): no worker
# here has any, so its gauges have no series rather than a made-up value
assert query("fedbox_federated_accuracy") == [], "unset gauge has a series"
assert query("fedbox_federated_loss") == [], "unset gauge has a series"

# Every query of the Grafana dashboard runs, with its variables filled in,
# and gives a series once rates have two scrapes to work with; only the
# series never set stay empty (no federated evaluation here; no steps under
# secure aggregation).
while value("count_over_time(fedbox_round[1m])") < 3:
    assert time.time() - t0 < 60, "fewer than 3 scrapes within 60 s"
    time.sleep(0.3)
unset = ["fedbox_federated_accuracy", "fedbox_federated_loss",
         "fedbox_async_"]  # a synchronous run
if not any("steps" in w for w in last["workers"]):
    unset.append("fedbox_worker_steps_total")
if not any("steps_per_s" in w for w in last["workers"]):
    unset.append("fedbox_worker_steps_per_second")
dash = json.load(open(dashboard))
n = 0
for p in dash["panels"]:
    for t in p.get("targets", []):
        q = (t["expr"].replace("$__rate_interval", "1m")
             .replace("$instance", ".*"))
        res = query(q)
        n += 1
        print("ok: dashboard %r: %s -> %d series" % (p["title"], t["refId"], len(res)))
        if not any(u in q for u in unset):
            assert res, ("no series", p["title"], q)
assert n >= 10, n
for v in dash["templating"]["list"]:
    if v["type"] == "query":
        q = v["query"]["query"]
        assert q.startswith("label_values(fedbox_round, "), q
        url = base + "/api/v1/label/instance/values?" + urllib.parse.urlencode(
            {"match[]": "fedbox_round"})
        with urllib.request.urlopen(url, timeout=5) as r:
            vals = json.load(r)["data"]
        assert len(vals) == 1, vals
print("ok: %d dashboard queries ran" % n)
PYEOF
kill -CONT "$W1"
kill -TERM "$CPID"
wait_exit "$CPID" 20 || fail "coordinator exited with status $? on SIGTERM"
kill -TERM "$PPID_"
wait_exit "$PPID_" 20 || true

# --- 4. round.mode async (secure aggregation off) under its own Prometheus:
# after its fourth step both workers are stopped, so the steps come to
# rest (a step whose updates were already at the coordinator may still
# land, later on a loaded machine); once they have, the model version
# must be the steps metrics.jsonl has, the applied updates theirs, and
# every async query of the dashboard must give a series.
port=$(free_port)
mport=$(free_port)
pport=$(free_port)
OUT=$T/async
SECAGG=0 coord_yaml "$port" "$OUT" "  mode: async
  buffer_size: 2
  rounds: 500
  min_workers: 2
  local_steps: 20
  batch_size: 32" >"$T/a.yaml"
printf 'metrics:\n  listen: 127.0.0.1:%s\n' "$mport" >>"$T/a.yaml"
start_prometheus prometheus-async "$mport"
start_coordinator "$T/a.yaml"
for i in 0 1; do
	SECAGG=0 worker_yaml "$port" "$i" 2 >"$T/a$i.yaml"
	start_worker "$T/a$i.yaml" "a$i"
	eval "A$i=$WPID"
done
for ((i = 0; i < 6000; i++)); do
	[ "$(cat "$OUT/metrics.jsonl" 2>/dev/null | wc -l)" -ge 4 ] && break
	sleep 0.01
done
kill -STOP "$A0" "$A1"
prom_py "$OUT/metrics.jsonl" deploy/grafana/fedbox.json <<'PYEOF' || fail "async on Prometheus"
import sys, time
metrics, dashboard = sys.argv[1:]
def steps():
    return [json.loads(l) for l in open(metrics) if l.strip()]
# At rest: the last scrape is of the step metrics.jsonl ends with, and
# the file has not grown while Prometheus was asked.
t0 = time.time()
why = "nothing scraped"
while True:
    try:
        lines = steps()
        applied = sum(len(r["workers"]) for r in lines)
        got = {q: query(q) for q in (
            "fedbox_model_version",
            "count_over_time(fedbox_model_version[1m])",
            'fedbox_async_updates_total{outcome="applied"}',
            "fedbox_async_update_staleness_count")}
        vals = {q: [float(r["value"][1]) for r in res] for q, res in got.items()}
        want = {"fedbox_model_version": [len(lines)],
                'fedbox_async_updates_total{outcome="applied"}': [applied],
                "fedbox_async_update_staleness_count": [applied]}
        scrapes = vals["count_over_time(fedbox_model_version[1m])"]
        if all(vals[q] == w for q, w in want.items()) and scrapes and \
                scrapes[0] >= 3 and len(steps()) == len(lines):
            break
        why = "at step %d (%d applied): %r" % (len(lines), applied, vals)
    except OSError as e:
        why = "Prometheus: %s" % e  # not listening yet
    assert time.time() - t0 < 60, "no scrape matched metrics.jsonl in 60 s; " + why
    time.sleep(0.3)
assert len(lines) >= 4, len(lines)
n = 0
for p in json.load(open(dashboard))["panels"]:
    for t in p.get("targets", []):
        if "fedbox_async_" not in t["expr"]:
            continue
        q = (t["expr"].replace("$__rate_interval", "1m")
             .replace("$instance", ".*"))
        res = query(q)
        assert res, ("no series", p["title"], q)
        n += 1
        print("ok: dashboard %r: %s -> %d series" % (p["title"], t["refId"], len(res)))
assert n >= 3, n
print("ok: async at step %d, %d updates applied, on Prometheus" % (len(lines), applied))
PYEOF
kill -CONT "$A0" "$A1"
kill -TERM "$CPID"
wait_exit "$CPID" 20 || fail "async coordinator exited with status $? on SIGTERM"
kill -TERM "$PPID_"
wait_exit "$PPID_" 20 || true
echo PASS
