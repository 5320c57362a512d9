# SPDX-License-Identifier: Apache-2.0
# Bad configs and bad usage exit 2 with file:line:column and the key's name;
# --help and --version exit 0.
source tests/integration/lib.sh

expect2() { # DESCRIPTION PATTERN COMMAND...
	local what=$1 pat=$2
	shift 2
	local st=0
	"$@" >"$T/out.txt" 2>&1 || st=$?
	[ "$st" -eq 2 ] || { cat "$T/out.txt"; fail "$what: exit $st, expected 2"; }
	grep -qE -- "$pat" "$T/out.txt" || { cat "$T/out.txt"; fail "$what: message lacks '$pat'"; }
	echo "ok: $what: $(grep -E -- "$pat" "$T/out.txt" | head -1 | sed 's/.*ERROR //')"
}

for bin in fedbox-coordinator fedbox-worker; do
	"$B/$bin" --help | grep -q "usage: $bin" || fail "$bin --help"
	"$B/$bin" --version | grep -qE "$bin [0-9]+\." || fail "$bin --version"
	expect2 "$bin without --config" "--config FILE is required" "$B/$bin"
	expect2 "$bin with an unknown option" "usage" "$B/$bin" --frobnicate
	expect2 "$bin with a missing file" "nope.yaml" "$B/$bin" --config "$T/nope.yaml"
done

cat >"$T/c1.yaml" <<'YAML'
listen: tcp://127.0.0.1:1
round:
  rounds: 3
  deadlin: 30s
YAML
expect2 "unknown key" "c1.yaml:4:3: round.deadlin" "$B/fedbox-coordinator" --config "$T/c1.yaml"

cat >"$T/c2.yaml" <<'YAML'
round:
  rounds: many
YAML
expect2 "bad value" "c2.yaml:2:11: round.rounds" "$B/fedbox-coordinator" --config "$T/c2.yaml"

cat >"$T/c3.yaml" <<'YAML'
round:
  deadline: 30 parsecs
YAML
expect2 "bad unit" "c3.yaml:2:13: round.deadline" "$B/fedbox-coordinator" --config "$T/c3.yaml"

cat >"$T/c4.yaml" <<'YAML'
transport:
  chunk_size: 4 bananas
YAML
expect2 "bad size unit" "c4.yaml:2:15: transport.chunk_size" "$B/fedbox-coordinator" --config "$T/c4.yaml"

cat >"$T/c5.yaml" <<'YAML'
round:
  rounds: 0
YAML
expect2 "out of range" "c5.yaml:2:11: round.rounds" "$B/fedbox-coordinator" --config "$T/c5.yaml"

cat >"$T/w1.yaml" <<'YAML'
coordinator: tcp://127.0.0.1:1
name: w
data:
  partition: dirchlet
YAML
expect2 "bad enum" "w1.yaml:4:14: data.partition" "$B/fedbox-worker" --config "$T/w1.yaml"

cat >"$T/w2.yaml" <<'YAML'
name: w
YAML
expect2 "required key missing" "coordinator" "$B/fedbox-worker" --config "$T/w2.yaml"

cat >"$T/w3.yaml" <<'YAML'
coordinator: tcp://127.0.0.1:1
name: w
transport:
  send_timeout: 30
YAML
expect2 "duration without unit" "w3.yaml:4:17: transport.send_timeout" "$B/fedbox-worker" --config "$T/w3.yaml"

cat >"$T/w4.yaml" <<'YAML'
coordinator: tcp://127.0.0.1:1
name: [w
YAML
expect2 "YAML syntax error" "w4.yaml:[0-9]+:[0-9]+" "$B/fedbox-worker" --config "$T/w4.yaml"

cat >"$T/c6.yaml" <<'YAML'
security:
  enabled: false
YAML
expect2 "secure aggregation without security" \
	"secure_aggregation.enabled needs security.enabled" \
	"$B/fedbox-coordinator" --config "$T/c6.yaml"

cat >"$T/c7.yaml" <<'YAML'
secure_aggregation:
  threshold: most
YAML
expect2 "threshold neither auto nor a number" \
	"c7.yaml:2:14: secure_aggregation.threshold: 'most' is neither auto nor a whole decimal number" \
	"$B/fedbox-coordinator" --config "$T/c7.yaml"

cat >"$T/c8.yaml" <<'YAML'
secure_aggregation:
  neighbours: 0
YAML
expect2 "zero neighbours" "c8.yaml:2:15: secure_aggregation.neighbours" \
	"$B/fedbox-coordinator" --config "$T/c8.yaml"

cat >"$T/w5.yaml" <<'YAML'
coordinator: tcp://127.0.0.1:1
name: w
security:
  enabled: false
YAML
expect2 "worker requiring secure aggregation without security" \
	"security.secure_aggregation: required needs security.enabled" \
	"$B/fedbox-worker" --config "$T/w5.yaml"
echo PASS
