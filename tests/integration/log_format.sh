# SPDX-License-Identifier: Apache-2.0
# --log-file and --log-format on both programs: a federation whose
# coordinator and one worker log JSON lines to files and another worker
# text; every JSON line parses (Python's json) with exactly time (ISO 8601
# UTC), level, program and message; nothing goes to stderr; bad options
# and an unwritable log file exit 2 and say why; a config error with a log
# file lands in the file and stderr points there.
source tests/integration/lib.sh
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 2
  local_steps: 20
  batch_size: 32" >"$T/c.yaml"
"$B/fedbox-coordinator" --config "$T/c.yaml" --log-file "$T/coord.jsonl" \
	--log-format json >"$T/rounds.txt" 2>"$T/coord.stderr" &
CPID=$!
PIDS+=("$CPID")
worker_yaml "$port" 0 2 >"$T/w0.yaml"
worker_yaml "$port" 1 2 >"$T/w1.yaml"
"$B/fedbox-worker" --config "$T/w0.yaml" --log-format json \
	--log-file "$T/w0.jsonl" >"$T/w0.stderr" 2>&1 &
W0=$!
PIDS+=("$W0")
"$B/fedbox-worker" --log-file "$T/w1.log" --config "$T/w1.yaml" \
	>"$T/w1.stderr" 2>&1 &
W1=$!
PIDS+=("$W1")
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
wait_exit "$W0" 20 || fail "worker 0 exited with status $?"
wait_exit "$W1" 20 || fail "worker 1 exited with status $?"
grep -Eq "round +2/2" "$T/rounds.txt" || fail "the federation did not finish"
for f in coord.stderr w0.stderr w1.stderr; do
	[ ! -s "$T/$f" ] || { cat "$T/$f"; fail "$f is not empty: the log went to stderr"; }
done

"$PY" - "$T/coord.jsonl" coordinator "listening on" \
	"$T/w0.jsonl" "worker[w0]" "admitted as worker" <<'PYEOF' || fail "JSON log lines"
import datetime, json, re, sys
args = sys.argv[1:]
for path, prog, needle in zip(args[0::3], args[1::3], args[2::3]):
    lines = open(path, encoding="utf-8").read().splitlines()
    assert len(lines) >= 3, (path, len(lines))
    seen = False
    for n, line in enumerate(lines, 1):
        d = json.loads(line)
        assert list(d) == ["time", "level", "program", "message"], (path, n, d)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["time"]), d
        datetime.datetime.strptime(d["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert d["level"] in ("debug", "info", "warn", "error"), d
        assert d["program"] == prog, (d["program"], prog)
        assert isinstance(d["message"], str) and d["message"], d
        seen = seen or needle in d["message"]
    assert seen, (path, "no line with", needle)
    print("ok:", path, len(lines), "JSON lines")
PYEOF
grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{3}Z worker\[w1\] INFO " \
	"$T/w1.log" || { cat "$T/w1.log"; fail "text log lines in w1.log"; }
! grep -vEq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{3}Z worker\[w1\] (DEBUG|INFO|WARN|ERROR) " \
	"$T/w1.log" || fail "a line of w1.log is not a text log line"
echo "ok: text log in w1.log ($(wc -l <"$T/w1.log") lines)"

expect2() { # DESCRIPTION STDERR-PATTERN COMMAND...
	local what=$1 pat=$2 st=0
	shift 2
	timeout 20 "$@" >"$T/out.txt" 2>"$T/err.txt" || st=$?
	[ "$st" -eq 2 ] || { cat "$T/out.txt" "$T/err.txt"; fail "$what: exit $st, expected 2"; }
	grep -qE -- "$pat" "$T/err.txt" || { cat "$T/err.txt"; fail "$what: stderr lacks '$pat'"; }
	echo "ok: $what: $(grep -E -- "$pat" "$T/err.txt" | head -1)"
}
for bin in fedbox-coordinator fedbox-worker; do
	cfg=$T/c.yaml
	[ $bin = fedbox-worker ] && cfg=$T/w0.yaml
	expect2 "$bin --log-format yaml" "--log-format yaml: text or json" \
		"$B/$bin" --config "$cfg" --log-format yaml
	expect2 "$bin --log-file in a missing folder" \
		"cannot open the log file $T/none/x.log: No such file or directory" \
		"$B/$bin" --config "$cfg" --log-file "$T/none/x.log"
	printf 'round:\n  rounds: 0\n' >"$T/bad.yaml"
	[ $bin = fedbox-worker ] && printf 'coordinator: tcp://127.0.0.1:1\nname: [x\n' >"$T/bad.yaml"
	expect2 "$bin config error with a log file" \
		"$bin: bad config $T/bad.yaml \(the reason is in $T/bad.jsonl\)" \
		"$B/$bin" --config "$T/bad.yaml" --log-file "$T/bad.jsonl" --log-format json
	"$PY" -c '
import json, sys
d = [json.loads(l) for l in open(sys.argv[1])][-1]
assert d["level"] == "error" and "bad.yaml:2:" in d["message"], d
print("ok: the reason, in the log file:", d["message"])' "$T/bad.jsonl" ||
		fail "$bin: the config error is not in the log file"
done
echo PASS
