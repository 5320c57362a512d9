#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chaos.sh -- the coordinator killed with SIGKILL at random moments, 50
# times per run, and resumed, for fedavg, fedavgm and fedadam, with plain
# and with secure aggregation (tests/integration/checkpoint.sh each time:
# the resumed model is bitwise an uninterrupted run's; metrics.jsonl holds
# every round once, untorn, the same as the uninterrupted run's).
#   FB_KILLS  kills per run (50)    FB_ROUNDS  rounds per run (250)
#   FB_KILL_AFTER  a life's length, "MIN SPAN" seconds ("0.5 2.5")
# A run passes only if all FB_KILLS kills landed before it finished: a life
# commits two or three rounds, so 250 rounds leave room for 50.
# make test-chaos runs it; it takes tens of minutes.
set -uo pipefail
case "${1:-}" in
-h | --help)
	sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
"") ;;
*)
	echo "chaos.sh: no arguments (see --help); got $1" >&2
	exit 2
	;;
esac
cd "$(dirname "$0")/../.."
export FB_BUILD=${FB_BUILD:-build}
export FB_KILLS=${FB_KILLS:-50} FB_ROUNDS=${FB_ROUNDS:-250}
export FB_KILL_AFTER=${FB_KILL_AFTER:-0.5 2.5}
passed=0 failed=0
for rule in fedavg fedavgm fedadam; do
	for sa in 0 1; do
		name="$rule, $([ "$sa" = 1 ] && echo secure || echo plain) aggregation"
		start=$(date +%s)
		log=/tmp/chaos-$rule-$sa.log
		if FB_RULE=$rule FB_SECAGG=$sa bash tests/integration/checkpoint.sh \
			>"$log" 2>&1; then
			killed=$(grep -c '^life [0-9]*: killed' "$log")
			if [ "$killed" -lt "$FB_KILLS" ]; then
				failed=$((failed + 1))
				echo "FAIL  $name: only $killed of $FB_KILLS kills before the run ended (raise FB_ROUNDS; log $log)"
				continue
			fi
			passed=$((passed + 1))
			echo "ok    $name: $killed kills, $(grep -o '[0-9]* lives' "$log" | tail -1), $(( $(date +%s) - start ))s"
		else
			failed=$((failed + 1))
			echo "FAIL  $name (log $log):"
			grep -E "FAIL|Error|assert" "$log" | head -5
		fi
	done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
