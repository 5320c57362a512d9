# SPDX-License-Identifier: Apache-2.0
# Issue 20.7: a worker loads only the code its own config names. The
# coordinator runs a plug-in model from a library whose constructor writes
# the id of every process that loads it to $FB_PLUGIN_MARKER
# (tests/tools/marker_plugin). Its Welcome names that library's path, which
# on this host is loadable. A worker without train.plugin refuses the run
# with an error naming train.plugin (exit 2) and its marker file never
# appears: the path from the network was not dlopen()ed. Two workers whose
# train.plugin names the library load it (their markers appear) and train
# both rounds, which shows the library and the markers work.
source tests/integration/lib.sh
make_keys 3
lib=$T/model.so
cc -shared -fPIC -I. -o "$lib" examples/tiny/plugin.c \
	tests/tools/marker_plugin/marker.c -lm || fail "cannot build the plug-in"
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 2
  min_workers: 2
  min_updates: 2
  local_steps: 20
  batch_size: 32
  deadline: 60s" | sed "s|^  arch: mlp|  arch: plugin\n  plugin: $lib|" >"$T/c.yaml"
grep -q "plugin: $lib" "$T/c.yaml" || fail "no plug-in in the coordinator config"
# No central evaluation: the coordinator runs it on its loop, and with the
# plug-in's plain loops on a busy machine that can outlast the tests' 3 s
# liveness timeout (issue 19); this test is about what gets loaded.
printf 'evaluation:\n  every: 0\n' >>"$T/c.yaml"
FB_PLUGIN_MARKER=$T/coordinator.marker start_coordinator "$T/c.yaml"
wait_for "$T/coord.log" "listening on" 20
grep -qx "$CPID" "$T/coordinator.marker" ||
	fail "the coordinator did not load its plug-in (no marker)"

# w0 has no train.plugin: it refuses, naming the key, and loads nothing.
worker_yaml "$port" 0 3 >"$T/w0.yaml"
FB_PLUGIN_MARKER=$T/w0.marker start_worker "$T/w0.yaml" w0
st=0
wait_exit "$WPID" 30 || st=$?
[ "$st" = 2 ] || fail "the worker without train.plugin exited with $st, not 2"
grep -q "set train.plugin" "$T/w0.log" ||
	fail "the refusal does not name train.plugin: $(tail -3 "$T/w0.log")"
[ ! -e "$T/w0.marker" ] ||
	fail "the worker loaded the library the coordinator named (pid $(cat "$T/w0.marker"))"
echo "without train.plugin: $(grep -m1 'plug-in' "$T/w0.log" | sed 's/.*ERROR //')"

# The coordinator drops w0 (silent), then w1 and w2 name the library.
wait_for "$T/coord.log" "worker w0 (lost|removed)" 20
wpids=()
for i in 1 2; do
	worker_yaml "$port" "$i" 3 "  plugin: $lib" >"$T/w$i.yaml"
	FB_PLUGIN_MARKER=$T/w$i.marker start_worker "$T/w$i.yaml" "w$i"
	wpids+=("$WPID")
done
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"
for i in 1 2; do
	wait_exit "${wpids[$((i - 1))]}" 20 || fail "worker w$i exited with status $?"
	grep -qx "${wpids[$((i - 1))]}" "$T/w$i.marker" ||
		fail "worker w$i did not load its train.plugin"
done
cat "$T/rounds.txt"
for r in 1 2; do
	[ "$(metric $r status)" = ok ] || fail "round $r: $(metric $r status)"
	[ "$(metric $r participants)" = 2 ] || fail "round $r lacks participants"
done
[ ! -e "$T/w0.marker" ] || fail "w0's marker appeared late"
echo "w1 and w2 loaded train.plugin and trained 2 rounds; w0 loaded nothing"
echo PASS
