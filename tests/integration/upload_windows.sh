# SPDX-License-Identifier: Apache-2.0
# A secure update over many encrypted-chunk windows (worker/upload.c):
# 3 workers, an MLP of 25,450 parameters in 4 KiB chunks, so each update
# goes up as 25 chunks (26 with secure aggregation's extras), more than
# the 16 slots of one window of encrypted chunks, from a different first
# chunk per worker. Four runs of scripts/fedbox-local, 2 rounds each:
#  - secure aggregation, chunks masked in batches on the worker's pool
#    straight into their slots and encrypted there in parts, gives bitwise
#    the model of the same run with the debug dumps on (each chunk masked
#    alone, in order);
#  - plain aggregation in encrypted sessions (chunks encrypted in parts
#    from the update itself) gives bitwise the model of a run without
#    security.
# Every round commits with all 3 workers (the coordinator verifies every
# chunk's MAC and the signed trailer).
source tests/integration/lib.sh
export FEDBOX_BIN=$ROOT/$B
FL=("$ROOT/scripts/fedbox-local" --workers 3 --rounds 2 --steps 10
	--batch 32 --hidden 32 --partition iid --chunk 4KiB --keys "$T/keys"
	--log-level debug)

run() { # NAME ARGS...
	local name=$1
	shift
	"${FL[@]}" --out "$T/$name" --port "$(free_port)" "$@" \
		>"$T/$name.txt" 2>&1 ||
		{ cat "$T/$name.txt"; fail "fedbox-local ($name) failed"; }
	"$PY" - "$T/$name/metrics.jsonl" <<'PYEOF' ||
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["round"] for r in rows] == [1, 2], rows
for r in rows:
    assert r["status"] == "ok" and r["participants"] == 3, r
PYEOF
		fail "$name: the rounds did not commit with 3 workers"
}

same_model() { # A B
	PYTHONPATH=$ROOT/python "$PY" - "$T/$1/model.safetensors" \
		"$T/$2/model.safetensors" <<'PYEOF'
import sys
import numpy as np
from fedbox.safetensors import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
bad = [k for k in a if np.asarray(a[k]).tobytes() != np.asarray(b[k]).tobytes()]
assert not bad, "tensors differ: %s" % bad
PYEOF
}

run dump --secure on --dump "$T/dump/updates"
run batch --secure on
run enc --secure off
run bare --insecure
for name in dump batch; do
	grep -q "round 2: update sent (26 chunks)" "$T/$name/worker-0.log" ||
		fail "$name: w0 did not send its update as 26 chunks"
done
grep -q "round 2: update sent (25 chunks)" "$T/enc/worker-0.log" ||
	fail "enc: w0 did not send its update as 25 chunks"
same_model dump batch ||
	fail "secure aggregation: batched masking changed the model"
same_model enc bare ||
	fail "plain aggregation: the encrypted upload changed the model"
echo "26-chunk masked and 25-chunk encrypted updates: models bitwise the same"
