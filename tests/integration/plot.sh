# SPDX-License-Identifier: Apache-2.0
# scripts/fedbox-plot on a real run's metrics.jsonl: both PNG files are
# written, decode, have the expected size and are not blank; the summary
# matches metrics.jsonl (rounds, first and last accuracy, workers, steps);
# wall time comes from elapsed_s, else time, else the cumulative seconds;
# bad input exits 2 naming the line and writes no file, an unwritable
# folder exits 1.
source tests/integration/lib.sh
SECAGG=0 # plain rounds: the workers' steps are reported
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

PLOT=scripts/fedbox-plot
"$PLOT" "$OUT/metrics.jsonl" >"$T/plot.txt" 2>&1 || { cat "$T/plot.txt"; fail "fedbox-plot failed"; }
cat "$T/plot.txt"
"$PY" - "$OUT" "$T/plot.txt" <<'PYEOF' || fail "plots"
import json, struct, sys
import matplotlib.image as mpimg
out, summary = sys.argv[1:]
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
text = open(summary).read()
want = "%s/accuracy.png: 3 rounds (0 failed), test accuracy %.2f%% -> %.2f%%, wall time from time" % (
    out, 100 * lines[0]["test_accuracy"], 100 * lines[-1]["test_accuracy"])
assert want in text, (want, text)
assert "%s/workers.png: 2 workers, steps done" % out in text, text
for name, size in (("accuracy.png", (800, 512)), ("workers.png", (800, 288))):
    data = open("%s/%s" % (out, name), "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", name
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == size, (name, w, h)
    img = mpimg.imread("%s/%s" % (out, name))
    ink = (img[:, :, :3].mean(axis=2) < 0.9).mean()
    assert 0.01 < ink < 0.5, (name, ink)
    # The first curve's colour (matplotlib's C0): the data were drawn.
    c0 = (abs(img[:, :, :3] - [0.122, 0.467, 0.706]).max(axis=2) < 0.1).mean()
    assert c0 > 0.0008, (name, c0)  # a legend swatch alone is ~0.01%
    print("ok: %s %dx%d, %.1f%% ink, %.2f%% first curve" % (name, w, h, 100 * ink, 100 * c0))

# The same rounds without their timestamps (older runs), with other ones,
# and with elapsed_s too.
with open(out + "/untimed.jsonl", "w") as f:
    for d in lines:
        f.write(json.dumps({k: v for k, v in d.items() if k != "time"}) + "\n")
with open(out + "/timed.jsonl", "w") as f:
    for i, d in enumerate(lines):
        d["time"] = "2026-12-01T10:00:%02d.500Z" % (10 + 5 * i)
        f.write(json.dumps(d) + "\n")
with open(out + "/elapsed.jsonl", "w") as f:
    for i, d in enumerate(lines):
        d["elapsed_s"] = 3.0 + i
        f.write(json.dumps(d) + "\n")
with open(out + "/secure.jsonl", "w") as f:
    for d in lines:
        for w in d["workers"]:
            w.pop("steps", None)
            w.pop("assigned_steps", None)
            w.pop("steps_per_s", None)
            w.pop("train_seconds", None)
        f.write(json.dumps(d) + "\n")
PYEOF
for v in untimed:seconds timed:time elapsed:elapsed_s; do
	"$PLOT" "$OUT/${v%%:*}.jsonl" --out "$T/${v%%:*}" >"$T/p.txt" 2>&1 || { cat "$T/p.txt"; fail "fedbox-plot ${v%%:*}"; }
	grep -q "wall time from ${v#*:}$" "$T/p.txt" || { cat "$T/p.txt"; fail "wall time not from ${v#*:}"; }
	echo "ok: wall time from ${v#*:}"
done
"$PLOT" "$OUT/secure.jsonl" --out "$T/secure" >"$T/p.txt" 2>&1 || fail "fedbox-plot secure"
grep -q "2 workers, steps not reported, speeds not reported$" "$T/p.txt" || { cat "$T/p.txt"; fail "steps and speeds under secure aggregation"; }
echo "ok: no steps or speeds (secure aggregation) said so"

expect_bad() { # WHAT STATUS PATTERN FILE [ARGS...]
	local what=$1 want=$2 pat=$3 st=0
	shift 3
	rm -rf "$T/bad-out"
	timeout 60 "$PLOT" "$@" >"$T/p.txt" 2>&1 || st=$?
	[ "$st" -eq "$want" ] || { cat "$T/p.txt"; fail "$what: exit $st, expected $want"; }
	grep -qF -- "$pat" "$T/p.txt" || { cat "$T/p.txt"; fail "$what: no '$pat'"; }
	echo "ok: $what: $(cat "$T/p.txt")"
}
head -1 "$OUT/metrics.jsonl" >"$T/bad1.jsonl"
echo '{"round": 2, "seconds": ' >>"$T/bad1.jsonl"
expect_bad "a line that is not JSON" 2 "bad1.jsonl:2: not JSON" "$T/bad1.jsonl" --out "$T/bad-out"
[ ! -e "$T/bad-out" ] || fail "bad input left an output folder"
: >"$T/empty.jsonl"
expect_bad "an empty file" 2 "empty.jsonl: no rounds in the file" "$T/empty.jsonl" --out "$T/bad-out"
expect_bad "a missing file" 2 "nope.jsonl: No such file or directory" "$T/nope.jsonl" --out "$T/bad-out"
echo '{"round": 1, "seconds": 1, "time": "yesterday"}' >"$T/bad2.jsonl"
expect_bad "a bad time" 2 "bad2.jsonl:1: \"time\" is not an ISO 8601 time" "$T/bad2.jsonl" --out "$T/bad-out"
echo '{"round": 1, "seconds": "1.5"}' >"$T/bad3.jsonl"
expect_bad "seconds as a string" 2 "bad3.jsonl:1: \"seconds\" is not a number" "$T/bad3.jsonl" --out "$T/bad-out"
: >"$T/a-file"
expect_bad "an output folder that is a file" 1 "cannot write the plots in $T/a-file" "$OUT/metrics.jsonl" --out "$T/a-file"
ls "$OUT"/.fedbox-plot.* 2>/dev/null && fail "a temporary file was left behind"
echo PASS
