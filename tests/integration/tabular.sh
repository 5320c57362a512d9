# SPDX-License-Identifier: Apache-2.0
# examples/tabular with real processes: three hospitals' CSV files of the
# Wisconsin breast-cancer data, each worker reading only its own file.
#  1. 20 secure rounds reach >= 95% on the held-out test.csv, by the
#     coordinator's evaluation and by an independent numpy evaluation of
#     the exported model, which reads the normalisation from the model's
#     own metadata; the two agree;
#  2. from the same start, one plain and one secure round give models
#     within the documented quantisation bounds;
#  3. a hospital whose CSV has a NaN stops with file:line:column, trains
#     nothing, and the coordinator gets no update from it.
source tests/integration/lib.sh
CHECK=("$PY" "$ROOT/tests/tools/secagg_check.py")
RUN=("$ROOT/examples/tabular/run")
export FB_BUILD=$ROOT/$B

# ---- 1 -----------------------------------------------------------------
"${RUN[@]}" --out "$T/full" --port "$(free_port)" >"$T/full.txt" 2>&1 ||
	{ cat "$T/full.txt"; fail "the example failed"; }
line=$(grep -E "^round +20/20" "$T/full/rounds.txt") ||
	{ cat "$T/full.txt"; fail "no round 20 line"; }
acc=$(sed -n 's/.*acc *\([0-9.]*\)%.*/\1/p' <<<"$line")
ind=$(tail -n 1 "$T/full.txt")
"$PY" - "$acc" "$ind" <<'PY' || fail "accuracy below 95% or evaluations disagree"
import json, sys
coord = float(sys.argv[1]) / 100
ind = json.loads(sys.argv[2])
print("coordinator %.4f, numpy %.4f on %d held-out tumours" %
      (coord, ind["test_accuracy"], ind["examples"]))
assert ind["examples"] == 113
assert abs(coord - ind["test_accuracy"]) < 1e-3
assert ind["test_accuracy"] >= 0.95
PY

# ---- 2 -----------------------------------------------------------------
"${RUN[@]}" --out "$T/plain" --port "$(free_port)" --rounds 1 --plain \
	--dump "$T/dump" >"$T/plain.txt" 2>&1 ||
	{ cat "$T/plain.txt"; fail "plain round failed"; }
"${RUN[@]}" --out "$T/secure" --port "$(free_port)" --rounds 1 \
	>"$T/secure.txt" 2>&1 || { cat "$T/secure.txt"; fail "secure round failed"; }
"${CHECK[@]}" equiv "$T/plain/model.safetensors" "$T/secure/model.safetensors" \
	--round 1 --max-samples 1000 \
	--dump "$T/dump/hospital-0,$T/dump/hospital-1,$T/dump/hospital-2" ||
	fail "plain and secure rounds disagree beyond the quantisation bound"

# ---- 3 -----------------------------------------------------------------
# The worker reads its data before it connects: a bad file stops it there.
mkdir -p "$T/bad/data"
cp "$T/full/data/norm.csv" "$T/full/data/hospital-1-valid.csv" "$T/bad/data/"
sed '5s/^[^,]*,/NaN,/' "$T/full/data/hospital-1.csv" >"$T/bad/data/hospital-1.csv"
cp -r "$T/full/keys" "$T/bad/"
sed "s|127.0.0.1:[0-9]*|127.0.0.1:$(free_port)|" "$T/full/worker-1.yaml" \
	>"$T/bad/worker-1.yaml"
st=0
(cd "$T/bad" && timeout 20 "$ROOT/$B/fedbox-worker" --config worker-1.yaml) \
	>"$T/bad.log" 2>&1 || st=$?
[ "$st" -eq 1 ] || { cat "$T/bad.log"; fail "worker with a NaN exited $st, expected 1"; }
grep -q 'data/hospital-1.csv:5:1: column "radius_mean": NaN' "$T/bad.log" ||
	{ cat "$T/bad.log"; fail "no file:line:column for the NaN"; }
! grep -q "connecting to" "$T/bad.log" ||
	{ cat "$T/bad.log"; fail "the worker connected with bad data"; }
echo "bad data: $(grep -o 'data/hospital-1.csv:5:1.*' "$T/bad.log" | head -1)"
