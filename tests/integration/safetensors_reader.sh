# SPDX-License-Identifier: Apache-2.0
# python/fedbox/safetensors.py: a model exported by a real federation reads
# back bit for bit the same as with tests/tools/st_eval.py's own parser; a
# hand-made file of every dtype (values written with struct, not numpy)
# reads back exactly, as numpy arrays and as torch tensors; and each kind
# of malformed file raises SafetensorsError naming the file and the fault.
source tests/integration/lib.sh
SECAGG=0
port=$(free_port)
OUT=$T/out
coord_yaml "$port" "$OUT" "  rounds: 1
  min_workers: 1
  local_steps: 10" >"$T/c.yaml"
start_coordinator "$T/c.yaml"
worker_yaml "$port" 0 1 >"$T/w0.yaml"
start_worker "$T/w0.yaml" w0
wait_exit "$CPID" 120 || fail "coordinator exited with status $?"

PYTHONPATH="$ROOT/python:$ROOT/tests/tools" "$PY" - "$OUT/model.safetensors" "$T" <<'PYEOF' || fail "reader"
import json, math, struct, sys
import numpy as np
import st_eval
from fedbox.safetensors import SafetensorsError, load_file, load_numpy, metadata
model, tmp = sys.argv[1:]

# 1. The coordinator's own export, against an independent parser.
ref, ref_meta = st_eval.read_safetensors(model)
got = load_numpy(model)
assert sorted(got) == sorted(ref) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], sorted(got)
for k in ref:
    assert got[k].dtype == np.float32 and got[k].shape == ref[k].shape, k
    assert got[k].tobytes() == ref[k].tobytes(), k
    assert got[k].flags.writeable and got[k].flags.owndata, k
assert metadata(model) == ref_meta and ref_meta["fedbox.round"] == "1", ref_meta
print("ok: the exported model reads as st_eval reads it (%d tensors)" % len(got))

# 2. Every dtype, values packed by hand.
def write(path, tensors, meta=None, pad=0, header=None, tail=b""):
    hdr, data = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape,
                     "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = (header if header is not None else json.dumps(hdr)).encode() + b" " * pad
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data + tail)
    return path

cases = [
    ("f32", "F32", [2, 3], struct.pack("<6f", 1.5, -2.25, 0, 2.0**127, -2.0**-126, 7), np.float32,
     [1.5, -2.25, 0, 2.0**127, -2.0**-126, 7]),
    ("f64", "F64", [2], struct.pack("<2d", math.pi, -1e300), np.float64, [math.pi, -1e300]),
    ("f16", "F16", [3], struct.pack("<3e", 0.5, -2.0, 65504.0), np.float16, [0.5, -2.0, 65504.0]),
    ("bf16", "BF16", [3], struct.pack("<3H", 0x3fc0, 0xc040, 0x7f80), np.float32, [1.5, -3.0, math.inf]),
    ("i64", "I64", [2], struct.pack("<2q", -2**63, 2**63 - 1), np.int64, [-2**63, 2**63 - 1]),
    ("i32", "I32", [1, 2], struct.pack("<2i", -7, 2**31 - 1), np.int32, [-7, 2**31 - 1]),
    ("u16", "U16", [2], struct.pack("<2H", 0, 65535), np.uint16, [0, 65535]),
    ("i8", "I8", [2], struct.pack("<2b", -128, 127), np.int8, [-128, 127]),
    ("u8", "U8", [2, 2], bytes([0, 1, 254, 255]), np.uint8, [0, 1, 254, 255]),
    ("b", "BOOL", [3], bytes([1, 0, 1]), np.bool_, [True, False, True]),
    ("scalar", "F32", [], struct.pack("<f", 42), np.float32, [42]),
    ("empty", "F32", [0, 4], b"", np.float32, []),
]
path = write(tmp + "/all.safetensors", [c[:4] for c in cases], {"k": "v"}, pad=5)
arr = load_numpy(path)
for name, dtype, shape, raw, npd, want in cases:
    a = arr[name]
    assert a.dtype == npd and list(a.shape) == shape, (name, a.dtype, a.shape)
    assert [x.item() for x in a.reshape(-1)] == want, (name, a, want)
assert metadata(path) == {"k": "v"}
print("ok: %d dtypes and shapes read back exactly as numpy arrays" % len(cases))
import torch
tdt = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
       "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
       "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
if hasattr(torch, "uint16"):
    tdt["U16"] = torch.uint16
else:
    try:
        load_file(path)
    except TypeError as e:
        assert "dtype U16: this PyTorch" in str(e), e
        print("ok: U16 without torch.uint16: %s" % e)
    else:
        raise AssertionError("U16 loaded into a PyTorch without uint16")
    path = write(tmp + "/torch.safetensors",
                 [c[:4] for c in cases if c[1] in tdt])
ts = load_file(path)
for name, dtype, shape, raw, npd, want in cases:
    if dtype not in tdt:
        continue
    t = ts[name]
    assert t.dtype == tdt[dtype] and list(t.shape) == shape, (name, t.dtype)
    assert [x.item() for x in t.reshape(-1)] == want, (name, t, want)
print("ok: the same as torch tensors (%d dtypes)" % len(tdt))
assert load_numpy(write(tmp + "/none.safetensors", [])) == {}
assert metadata(tmp + "/none.safetensors") == {}

# 3. Malformed files.
f32 = struct.pack("<2f", 1, 2)
bad = [
    ("short", lambda p: open(p, "wb").write(b"\x01\x00"), "shorter than the 8-byte header length"),
    ("beyond", lambda p: open(p, "wb").write(struct.pack("<Q", 100) + b"{}"), "header length 100 runs past the end"),
    ("huge", lambda p: open(p, "wb").write(struct.pack("<Q", 2**40) + b"{}"), "is more than"),
    ("notjson", lambda p: write(p, [], header="{nope"), "header is not UTF-8 JSON"),
    ("notutf8", lambda p: open(p, "wb").write(struct.pack("<Q", 2) + b"\xff\xfe"), "header is not UTF-8 JSON"),
    ("array", lambda p: write(p, [], header="[1, 2]"), "header is not a JSON object"),
    ("dup", lambda p: write(p, [], header='{"a": {}, "a": {}}'), "header: key 'a' appears twice"),
    ("meta", lambda p: write(p, [], meta={"n": 1}), "__metadata__ is not an object of strings"),
    ("nodtype", lambda p: write(p, [], header='{"w": {"shape": [1], "data_offsets": [0, 4]}}'), "tensor 'w': entry lacks dtype"),
    ("dtype", lambda p: write(p, [("w", "F8_E4M3", [2], b"ab")]), "tensor 'w': dtype 'F8_E4M3' is not one of"),
    ("shape", lambda p: write(p, [("w", "F32", [-1], b"")]), "tensor 'w': shape [-1] is not a list of counts"),
    ("boolshape", lambda p: write(p, [("w", "F32", [True], b"")]), "is not a list of counts"),
    ("size", lambda p: write(p, [("w", "F32", [3], f32)]), "tensor 'w': data_offsets [0, 8] hold 8 bytes; shape [3] of F32 needs 12"),
    ("offsets", lambda p: write(p, [], header='{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}'), "data_offsets [4, 0] is not [begin, end]"),
    ("gap", lambda p: write(p, [], header='{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', tail=b"\0" * 8), "tensor 'w': data_offsets start at 4, where the data begin at 0"),
    ("overlap", lambda p: write(p, [], header='{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', tail=f32), "where the previous tensor ends at 8"),
    ("trailing", lambda p: write(p, [("w", "F32", [2], f32)], tail=b"xx"), "the tensors cover 8 bytes of data, the file holds 10"),
    ("truncated", lambda p: write(p, [], header='{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', tail=b"\0" * 4), "the tensors cover 8 bytes of data, the file holds 4"),
]
for name, make, msg in bad:
    p = "%s/bad-%s.safetensors" % (tmp, name)
    make(p)
    for fn in (load_numpy, load_file, metadata):
        try:
            fn(p)
        except SafetensorsError as e:
            said = str(e)
            assert said.startswith(p + ": "), (name, said)
            assert msg in said, (name, said, msg)
        else:
            raise AssertionError("%s: %s accepted it" % (name, fn.__name__))
    print("ok: %s: %s" % (name, said))
try:
    load_numpy(tmp + "/absent.safetensors")
except FileNotFoundError:
    print("ok: a missing file raises FileNotFoundError")
else:
    raise AssertionError("a missing file loaded")
PYEOF
echo PASS
