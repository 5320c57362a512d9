#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""st_eval.py -- evaluate a fedbox model file on Fashion-MNIST t10k with numpy.

An independent reference for fedbox's C code: it parses the safetensors
header itself, reads the IDX files with gzip, preprocesses pixels as
(pixel/255 - 0.2860)/0.3530 in float32, and runs the chain fc1..fcK of
nn.Linear layers with ReLU between them (a single fc1 is softmax regression).
It prints one JSON line:
  {"test_accuracy": ..., "test_loss": ..., "examples": 10000}

Usage: st_eval.py MODEL.safetensors [--data DIR]
Exit status 2 with a message on stderr for a bad model or data file.
"""
import argparse
import gzip
import json
import os
import re
import struct
import sys

import numpy as np

MEAN = np.float32(0.2860)
STD = np.float32(0.3530)


def fail(msg):
    print("st_eval: " + msg, file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e))
    if len(blob) < 8:
        fail("%s: shorter than 8 bytes" % path)
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        fail("%s: header length %d beyond the file" % (path, hlen))
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail("%s: bad header JSON: %s" % (path, e))
    if not isinstance(header, dict):
        fail("%s: header is not an object" % path)
    data = blob[8 + hlen:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        try:
            dtype, shape = info["dtype"], info["shape"]
            begin, end = info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            fail("%s: tensor %s lacks dtype/shape/data_offsets" %
                 (path, name))
        if dtype != "F32":
            fail("%s: tensor %s has dtype %s, expected F32" %
                 (path, name, dtype))
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != 4 * count:
            fail("%s: tensor %s has bad data_offsets" % (path, name))
        tensors[name] = np.frombuffer(data, dtype="<f4", count=count,
                                      offset=begin).reshape(shape)
    return tensors, meta


def layers_of(tensors, path):
    """Returns [(W, b), ...] for fc1, fc2, ... checked to chain."""
    idx = sorted(int(m.group(1)) for m in
                 (re.fullmatch(r"fc(\d+)\.weight", k) for k in tensors) if m)
    if not idx or idx != list(range(1, len(idx) + 1)):
        fail("%s: no fc1..fcK.weight chain" % path)
    out = []
    for i in idx:
        w = tensors["fc%d.weight" % i]
        b = tensors.get("fc%d.bias" % i)
        if w.ndim != 2 or b is None or b.shape != (w.shape[0],):
            fail("%s: fc%d has bad shapes" % (path, i))
        if out and out[-1][0].shape[0] != w.shape[1]:
            fail("%s: fc%d does not chain" % (path, i))
        out.append((w, b))
    return out


def read_idx(path, magic):
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        fail("cannot read %s: %s" % (path, e))
    if len(raw) < 8 or struct.unpack(">I", raw[:4])[0] != magic:
        fail("%s: not an IDX file" % path)
    ndim = magic & 0xff
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    body = raw[4 + 4 * ndim:]
    if len(body) != int(np.prod(dims)):
        fail("%s: truncated" % path)
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--data", default=os.environ.get(
        "FB_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    args = ap.parse_args()

    tensors, _ = read_safetensors(args.model)
    layers = layers_of(tensors, args.model)
    images = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"),
                      0x803)
    labels = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"),
                      0x801).astype(np.int64)
    n = images.shape[0]
    if labels.shape[0] != n:
        fail("image and label counts differ")
    x = images.reshape(n, -1).astype(np.float32)
    x = (x / np.float32(255) - MEAN) / STD
    if x.shape[1] != layers[0][0].shape[1]:
        fail("model takes %d features, images have %d" %
             (layers[0][0].shape[1], x.shape[1]))
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w.astype(np.float64).T + b.astype(np.float64)
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    if labels.max() >= h.shape[1]:
        fail("labels reach %d but the model has %d classes" %
             (labels.max(), h.shape[1]))
    m = h.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(h - m).sum(axis=1))
    loss = float(np.mean(lse - h[np.arange(n), labels]))
    acc = float(np.mean(h.argmax(axis=1) == labels))
    print(json.dumps({"test_accuracy": acc, "test_loss": loss,
                      "examples": int(n)}))


if __name__ == "__main__":
    main()
