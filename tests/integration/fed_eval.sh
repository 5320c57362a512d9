# SPDX-License-Identifier: Apache-2.0
# Federated evaluation with real processes: examples/tabular's three
# hospitals, each holding a third of the held-out test.csv as its
# validation file (--valid-test). The federated evaluation of round r is
# of the model round r started from, which the coordinator evaluated
# centrally on the whole test.csv at the end of round r - 1; so:
#  1. plain rounds: each round's "fed_eval" (3 workers, 113 examples) has
#     the accuracy and loss of the previous round's central evaluation,
#     within 1e-4 (float rounding; the files print 6 decimals);
#  2. secure rounds: the same from the masked sums alone, and no worker's
#     own count appears in metrics.jsonl;
#  3. the round line shows "fed NN.NN%";
#  4. the final evaluation-only round (evaluation.federated_final) gives
#     the final model's federated evaluation, equal to the last round's
#     central one and to the independent numpy evaluation (evaluate.py) of
#     the exported model, which the final round did not change.
source tests/integration/lib.sh
RUN=("$ROOT/examples/tabular/run")
export FB_BUILD=$ROOT/$B

check() { # DIR MODE
	"$PY" - "$1/metrics.jsonl" "$2" "$(tail -n 1 "$1.txt")" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
mode = sys.argv[2]
ind = json.loads(sys.argv[3])
assert len(lines) == 5, "%d metrics lines" % len(lines)
assert [l.get("final", False) for l in lines] == [False] * 4 + [True]
assert lines[4]["round"] == 5 and lines[4]["status"] == "ok", lines[4]
assert lines[4]["test_accuracy"] is None and lines[4]["train_loss"] is None
for prev, cur in zip(lines, lines[1:]):
    fe = cur.get("fed_eval")
    assert fe is not None, "round %d has no fed_eval" % cur["round"]
    assert fe["workers"] == 3 and fe["examples"] == 113, fe
    da = abs(fe["accuracy"] - prev["test_accuracy"])
    dl = abs(fe["loss"] - prev["test_loss"])
    print("%s round %d: federated %.6f (loss %.6f), central of round %d "
          "%.6f (loss %.6f)" % (mode, cur["round"], fe["accuracy"],
          fe["loss"], prev["round"], prev["test_accuracy"],
          prev["test_loss"]))
    assert da < 1e-4, "accuracy differs by %g" % da
    assert dl < 1e-4, "loss differs by %g" % dl
fin = lines[4]["fed_eval"]["accuracy"]
print("%s final: federated %.6f, numpy evaluation of the exported model "
      "%.6f on %d" % (mode, fin, ind["test_accuracy"], ind["examples"]))
assert ind["examples"] == 113
assert abs(fin - ind["test_accuracy"]) < 1e-4
if mode == "secure":
    for l in lines:
        for w in l["workers"]:
            assert "examples" not in json.dumps(w), w
PY
}

"${RUN[@]}" --out "$T/plain" --port "$(free_port)" --rounds 4 --plain \
	--valid-test >"$T/plain.txt" 2>&1 ||
	{ cat "$T/plain.txt"; fail "the plain run failed"; }
check "$T/plain" plain || fail "plain: federated and central evaluations differ"
grep -qE "^round +2/4 .* fed +[0-9]+\.[0-9]{2}%" "$T/plain/rounds.txt" ||
	{ cat "$T/plain/rounds.txt"; fail "no fed NN.NN% in the round line"; }

"${RUN[@]}" --out "$T/secure" --port "$(free_port)" --rounds 4 \
	--valid-test >"$T/secure.txt" 2>&1 ||
	{ cat "$T/secure.txt"; fail "the secure run failed"; }
check "$T/secure" secure || fail "secure: federated and central evaluations differ"
grep -E "^round +4/4|^final" "$T/secure/rounds.txt"
