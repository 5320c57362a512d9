#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""evaluate.py -- evaluate a fedbox model file on a CSV file with numpy.

An independent check of what the federation produced: it parses the
safetensors file itself, takes the input normalisation from the model's
own metadata ("fedbox.preprocessing": the feature names in order and the
per-feature mean and std that the workers used), or from --norm, reads the
CSV's columns by those names, and runs the chain fc1..fcK of nn.Linear
layers with ReLU between them in float64 on float32 inputs computed as
fedbox computes them: x = (v - mean) / std in float32. It prints one JSON
line:
  {"test_accuracy": ..., "test_loss": ..., "examples": N}

Usage: evaluate.py MODEL.safetensors TEST.csv [--label diagnosis]
                   [--norm norm.csv]
Exit status 2 with a message on stderr for a bad model, metadata or CSV.
"""
import argparse
import csv
import json
import re
import struct
import sys

import numpy as np


def fail(msg):
    print("evaluate.py: " + msg, file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e))
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            fail("%s: tensor %s is %s, expected F32" %
                 (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"]))
        if end - begin != 4 * count or end > len(data):
            fail("%s: tensor %s has bad offsets" % (path, name))
        tensors[name] = np.frombuffer(data, dtype="<f4", count=count,
                                      offset=begin).reshape(info["shape"])
    return tensors, meta


def layers_of(tensors):
    out = []
    k = 1
    while "fc%d.weight" % k in tensors:
        out.append((tensors["fc%d.weight" % k], tensors["fc%d.bias" % k]))
        k += 1
    if not out:
        fail("no fc1.weight in the model")
    return out


def floats(text, what):
    m = re.search(re.escape(what) + r" = \[([^\]]*)\]", text)
    if m is None:
        return None
    return np.array([np.float32(v) for v in m.group(1).split(",")],
                    dtype=np.float32)


def norm_from_metadata(meta):
    """(names, mean, std) from fedbox.preprocessing, as the workers used."""
    text = meta.get("fedbox.preprocessing")
    if text is None:
        fail("the model has no fedbox.preprocessing metadata; pass --norm")
    m = re.search(r"features \(((?:\"[^\"]*\"(?:, )?)+)\) in this order",
                  text)
    if m is None:
        fail("fedbox.preprocessing names no CSV feature columns: %s" %
             text[:200])
    names = re.findall(r"\"([^\"]*)\"", m.group(1))
    mean, std = floats(text, "mean"), floats(text, "std")
    if mean is None or std is None:
        s = re.search(r"x = \(v - ([^)]+)\) / (\S+) for every feature", text)
        if s is None:
            fail("fedbox.preprocessing has no constants: %s" % text[:200])
        mean = np.full(len(names), np.float32(s.group(1)), np.float32)
        std = np.full(len(names), np.float32(s.group(2)), np.float32)
    if len(mean) != len(names) or len(std) != len(names):
        fail("fedbox.preprocessing: %d names, %d means, %d stds" %
             (len(names), len(mean), len(std)))
    return names, mean, std


def norm_from_file(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    names = rows[0][1:]
    got = {r[0]: np.array([np.float32(v) for v in r[1:]], np.float32)
           for r in rows[1:]}
    return names, got["mean"], got["std"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("csv")
    ap.add_argument("--label", default="diagnosis")
    ap.add_argument("--norm", help="normalisation CSV instead of the "
                    "model's metadata")
    a = ap.parse_args()

    tensors, meta = read_safetensors(a.model)
    layers = layers_of(tensors)
    names, mean, std = (norm_from_file(a.norm) if a.norm else
                        norm_from_metadata(meta))
    with open(a.csv) as f:
        rows = list(csv.reader(f))
    header = rows[0]
    for n in names + [a.label]:
        if n not in header:
            fail("%s has no column %s" % (a.csv, n))
    cols = [header.index(n) for n in names]
    lab = header.index(a.label)
    v = np.array([[np.float32(r[c]) for c in cols] for r in rows[1:]],
                 dtype=np.float32)
    y = np.array([int(r[lab]) for r in rows[1:]], dtype=np.int64)
    x = (v - mean) / std  # float32, as fedbox
    if x.shape[1] != layers[0][0].shape[1]:
        fail("the model takes %d features, the CSV gives %d" %
             (layers[0][0].shape[1], x.shape[1]))
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w.astype(np.float64).T + b.astype(np.float64)
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    n = len(y)
    mx = h.max(axis=1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(h - mx).sum(axis=1))
    loss = float(np.mean(lse - h[np.arange(n), y]))
    acc = float(np.mean(h.argmax(axis=1) == y))
    print(json.dumps({"test_accuracy": acc, "test_loss": loss,
                      "examples": int(n)}))


if __name__ == "__main__":
    main()
