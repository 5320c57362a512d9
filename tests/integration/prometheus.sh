# SPDX-License-Identifier: Apache-2.0
# The coordinator's Prometheus endpoint (coordinator/metrics_http.c) under a
# real Prometheus server (Debian's prometheus, started here on a free port
# and stopped by PID). A real 3-round federation writes metrics.jsonl; each
# of its lines becomes the setter calls the coordinator's loop makes
# (tests/tools/metrics_feed serves the module with them); Prometheus
# scrapes it, and its query API (/api/v1/query) must return the round, the
# accuracy, the byte totals, the rounds by status and each worker's speed
# that metrics.jsonl shows. promtool lints the exposition, and every query
# of the Grafana dashboard (deploy/grafana/fedbox.json) must run.
source tests/integration/lib.sh
command -v prometheus >/dev/null ||
	skip "prometheus is not installed (scripts/bootstrap installs it)"
FEED=$B/tests/tools/metrics_feed
[ -x "$FEED" ] || fail "$FEED is not built"

# --- 1. a real federation's metrics.jsonl
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 3
  min_workers: 2
  local_steps: 20
  batch_size: 32" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
for i in 0 1; do
	worker_yaml "$port" "$i" 2 >"$T/w$i.yaml"
	start_worker "$T/w$i.yaml" "w$i"
done
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
[ "$(wc -l <"$OUT/metrics.jsonl")" -eq 3 ] || fail "metrics.jsonl should have 3 lines"

# --- 2. the loop's setter calls for each round, served by the module
"$PY" - "$OUT/metrics.jsonl" >"$T/feed.txt" <<'PYEOF'
import json, sys
slots = {}
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for d in lines:
    print("round", d["round"], len(lines), "training")
    print("bytes", d["bytes_up"], d["bytes_down"])
    for reason, n in d["rejected"].items():
        print("rejected", reason, n)
    states = {}
    for w in d["workers"]:
        slot = slots.setdefault(w["name"], len(slots))
        print("worker", slot, w["name"], w["steps_per_s"])
        if "steps" in w:
            print("steps", slot, w["steps"])
        states[w["status"]] = states.get(w["status"], 0) + 1
    for s, n in states.items():
        print("workers", s, n)
    acc = d["test_accuracy"]
    print("test", "nan" if acc is None else acc,
          "nan" if acc is None else d["test_loss"])
    tl = d.get("train_loss")
    print("federated nan", "nan" if tl is None else tl)
    print("round", d["round"], len(lines), "done")
    print("done", d["status"], d["seconds"])
PYEOF
"$FEED" --listen 127.0.0.1:0 <"$T/feed.txt" >"$T/feed.out" 2>"$T/feed.log" &
FPID=$!
PIDS+=("$FPID")
wait_for "$T/feed.out" "^applied [0-9]+ commands" 10
mport=$(sed -n 's/^listening on .* port \([0-9]*\)$/\1/p' "$T/feed.out")
[ -n "$mport" ] || fail "metrics_feed printed no port"

# promtool's linter on the text as served.
"$PY" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1]).read().decode())' \
	"$mport" >"$T/metrics.txt"
if command -v promtool >/dev/null; then
	promtool check metrics <"$T/metrics.txt" >"$T/promtool.txt" 2>&1 ||
		{ cat "$T/promtool.txt"; fail "promtool check metrics"; }
	echo "ok: promtool check metrics: clean"
fi

# --- 3. Prometheus scraping it
pport=$(free_port)
cat >"$T/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fedbox
    static_configs:
      - targets: ["127.0.0.1:$mport"]
YAML
prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
	--web.listen-address="127.0.0.1:$pport" --log.level=warn \
	>"$T/prometheus.log" 2>&1 &
PPID_=$!
PIDS+=("$PPID_")

"$PY" - "$pport" "$OUT/metrics.jsonl" deploy/grafana/fedbox.json <<'PYEOF' || fail "Prometheus queries"
import json, math, sys, time, urllib.parse, urllib.request
port, metrics, dashboard = sys.argv[1:]
base = "http://127.0.0.1:%s" % port

def query(q):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        d = json.load(r)
    assert d["status"] == "success", (q, d)
    return d["data"]["result"]

def value(q):
    res = query(q)
    assert len(res) == 1, (q, res)
    return float(res[0]["value"][1])

t0 = time.time()
while True:
    try:
        if query('up{job="fedbox"} == 1') and query("fedbox_round"):
            break
    except OSError:
        pass  # not listening yet
    assert time.time() - t0 < 60, "no scrape of fedbox within 60 s"
    time.sleep(0.3)
print("ok: Prometheus scraped the endpoint after %.1f s" % (time.time() - t0))

lines = [json.loads(l) for l in open(metrics) if l.strip()]
last = lines[-1]
checks = [
    ("fedbox_round", last["round"]),
    ("fedbox_rounds_planned", len(lines)),
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
    ('fedbox_round_phase{phase="done"}', 1),
    ('fedbox_round_phase{phase="training"}', 0),
]
if last.get("train_loss") is not None:
    checks.append(("fedbox_federated_loss", last["train_loss"]))
for w in last["workers"]:
    checks.append(('fedbox_worker_steps_per_second{worker="%s"}' % w["name"],
                   w["steps_per_s"]))
    if "steps" in w:
        checks.append(('fedbox_worker_steps_total{worker="%s"}' % w["name"],
                       sum(x["steps"] for d in lines for x in d["workers"]
                           if x["name"] == w["name"])))
for q, want in checks:
    got = value(q)
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (q, got, want)
    print("ok: %s = %s (metrics.jsonl: %s)" % (q, got, want))
assert query("fedbox_federated_accuracy") == [], "unset gauge has a series"

# Every query of the Grafana dashboard runs, with its variables filled in,
# and gives a series once rates have two scrapes to work with; only the
# series the feed never sets stay empty (no federated accuracy; no steps
# under secure aggregation).
while value("count_over_time(fedbox_round[1m])") < 3:
    assert time.time() - t0 < 60, "fewer than 3 scrapes within 60 s"
    time.sleep(0.3)
unset = ["fedbox_federated_accuracy"]
if not any("steps" in w for w in last["workers"]):
    unset.append("fedbox_worker_steps_total")
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
kill -TERM "$PPID_" "$FPID"
wait_exit "$FPID" 10 || fail "metrics_feed exited with status $? on SIGTERM"
wait_exit "$PPID_" 20 || true
echo PASS
