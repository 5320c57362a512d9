#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Independent checks of fedbox's secure aggregation, for the tests.

  secagg_check.py equiv PLAIN SECURE --dump DIR1,... --round R [--clip C]
      [--plain-clip C] [--max-samples M] [--a-bound A]
    The secure and plain runs of round R, both from the same model, must
    agree within the documented quantisation bounds of both encodings (the
    plain run's workers dumped their updates in DIR1, ...). With --a-bound
    (FedNova: at least the coordinator's public bound on ||a_i||_1), the
    bound covers the tau_eff scaling too.

  secagg_check.py average NEW PREV --dump DIR1,DIR2,... --round R --n N
      [--clip C] [--max-samples M]
    NEW must be PREV minus the weighted mean of exactly the updates dumped
    in DIR1, ... for round R (their weights from the dumps), within the
    secure encoding's bound; N is the number of workers in the round.

  secagg_check.py privacy DIR --round R
    The masked input a worker sent must look uniform (chi-square of its
    bytes), and differ from its encoded update, which must not look uniform.

Exits 1 with a message when a check fails.
"""
import json
import math
import struct
import sys

import numpy as np

BITS = 32
FP_MARGIN = 2.0 ** -40


def fail(msg):
    print("secagg_check: FAIL: " + msg)
    sys.exit(1)


def load_model(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = blob[8 + hlen:]
    parts = sorted(header.values(), key=lambda v: v["data_offsets"][0])
    vec = np.concatenate([np.frombuffer(
        data[p["data_offsets"][0]:p["data_offsets"][1]], dtype="<f4")
        for p in parts])
    return vec.astype(np.float64), meta


def scale(k, clip):
    """The largest power of two S with K (clip S + 1)(1 + margin) < 2^31
    (aggregation.h: fb_encoding_init with w_max = 1)."""
    e = 60
    while k * (clip * 2.0 ** e + 1.0) * (1 + FP_MARGIN) >= 2.0 ** (BITS - 1):
        e -= 1
    return 2.0 ** e


def secure_bound(k, clip, W, mean_abs):
    """Distance of the decoded weighted mean from the exact one: the sum is
    within B_q = K (1 + 2^-20) / S, the weight sum within B_w (clip 1)."""
    bq = k * (1 + 2.0 ** -20) / scale(k, clip)
    bw = k * (1 + 2.0 ** -20) / scale(k, 1.0)
    return (bq + mean_abs * bw) / (W - bw)


def f32_slack(*vecs):
    return 2.0 ** -23 * max(float(np.max(np.abs(v))) for v in vecs)


def cmd_equiv(argv):
    plain, secure = argv[0], argv[1]
    opts = parse_opts(argv[2:])
    rnd = int(opts["round"])
    clip = float(opts.get("clip", 4))
    pclip = float(opts.get("plain-clip", 16))
    maxs = float(opts.get("max-samples", 1e6))
    xs, n = [], []
    for d in opts["dump"].split(","):
        x, info = read_dump(d, rnd)
        xs.append(x)
        n.append(info["samples"])
    k = len(n)
    p, _ = load_model(plain)
    s, _ = load_model(secure)
    W = sum(n) / maxs
    mean_abs = np.abs(sum(ni * x for ni, x in zip(n, xs)) / sum(n))
    bound = secure_bound(k, clip, W, mean_abs) + k * pclip / 2.0 ** 30
    if "a-bound" in opts:
        # FedNova: the model moves by tau_eff * mean, tau_eff = sum n_i a_i
        # / sum n_i, decoded from the masked sums within b_tau.
        tau = sum(ni * a for ni, a in zip(n, anorm(opts))) / sum(n)
        bw = k * (1 + 2.0 ** -20) / scale(k, 1.0)
        b_tau = (k * (1 + 2.0 ** -20) / scale(k, float(opts["a-bound"])) +
                 tau * bw) / (W - bw)
        bound = tau * bound + mean_abs * b_tau
        mean_abs = tau * mean_abs
        print("equiv: FedNova tau_eff %.4g (bound on it %.3g)" % (tau, b_tau))
    bound = bound + f32_slack(p, s)
    diff = np.abs(p - s)
    worst = float(np.max(diff - bound))
    print("equiv: round %d, max |plain - secure| = %.3g, bound %.3g..%.3g, "
          "mean update up to %.3g" % (rnd, float(np.max(diff)),
                                      float(np.min(bound)),
                                      float(np.max(bound)),
                                      float(np.max(mean_abs))))
    if worst > 0:
        fail("secure and plain models differ beyond the bound")
    if float(np.max(mean_abs)) < 1e-4:
        fail("the round did not move the model: nothing was compared")


def anorm(opts):
    rnd = int(opts["round"])
    return [read_dump(d, rnd)[1]["a_norm"] for d in opts["dump"].split(",")]


def read_dump(d, rnd):
    with open("%s/round-%d.json" % (d, rnd)) as f:
        info = json.load(f)
    x = np.fromfile("%s/round-%d.update.f32" % (d, rnd), dtype="<f4")
    return x.astype(np.float64), info


def cmd_average(argv):
    new, prev = argv[0], argv[1]
    opts = parse_opts(argv[2:])
    rnd = int(opts["round"])
    k = int(opts["n"])
    clip = float(opts.get("clip", 4))
    xs, ws = [], []
    for d in opts["dump"].split(","):
        x, info = read_dump(d, rnd)
        if not info["secure"]:
            fail("%s: round %d was not securely aggregated" % (d, rnd))
        xs.append(np.clip(x, -clip, clip))
        ws.append(info["weight"])
    W = sum(ws)
    mean = sum(w * x for w, x in zip(ws, xs)) / W
    x1, _ = load_model(new)
    x0, _ = load_model(prev)
    expect = x0 - mean
    bound = secure_bound(k, clip, W, np.abs(mean)) + f32_slack(x1, x0)
    diff = np.abs(x1 - expect)
    print("average: %d updates, max |model - expected| = %.3g (bound "
          "%.3g); distance to the nearest other subset average %.3g" %
          (len(xs), float(np.max(diff)), float(np.max(bound)),
           other_subsets(x0, x1, xs, ws)))
    if float(np.max(diff - bound)) > 0:
        fail("the model is not the weighted average of the included "
             "updates")


def other_subsets(x0, x1, xs, ws):
    """How far the model is from the average over any other subset: shows
    that the check above tells the subsets apart."""
    best = math.inf
    m = len(xs)
    for mask in range(1, (1 << m) - 1):
        sel = [i for i in range(m) if mask >> i & 1]
        W = sum(ws[i] for i in sel)
        mean = sum(ws[i] * xs[i] for i in sel) / W
        best = min(best, float(np.max(np.abs(x1 - (x0 - mean)))))
    return best


def chi2_bytes(b):
    counts = np.bincount(np.frombuffer(b, dtype=np.uint8), minlength=256)
    e = len(b) / 256.0
    return float(np.sum((counts - e) ** 2 / e))


def cmd_privacy(argv):
    d = argv[0]
    opts = parse_opts(argv[1:])
    rnd = int(opts["round"])
    masked = open("%s/round-%d.masked.u32" % (d, rnd), "rb").read()
    encoded = open("%s/round-%d.encoded.u32" % (d, rnd), "rb").read()
    if len(masked) != len(encoded) or len(masked) < 4096:
        fail("dumps of unexpected size")
    # 255 degrees of freedom: mean 255, sd 22.6; 400 is p < 1e-10.
    cm, ce = chi2_bytes(masked), chi2_bytes(encoded)
    mw = np.frombuffer(masked, dtype="<u4")
    ew = np.frombuffer(encoded, dtype="<u4")
    same = float(np.mean(mw == ew))
    print("privacy: %d bytes; chi-square (255 dof) masked %.1f, encoded "
          "%.1f; words equal %.4f%%" % (len(masked), cm, ce, 100 * same))
    if cm > 400:
        fail("the masked input is not uniform-looking")
    if ce < 1000:
        fail("the encoded update looks uniform: the check cannot tell")
    if same > 0.001:
        fail("the masked input repeats the encoded update")


def parse_opts(argv):
    opts = {}
    i = 0
    while i < len(argv):
        if not argv[i].startswith("--") or i + 1 >= len(argv):
            fail("bad arguments: %s" % " ".join(argv))
        opts[argv[i][2:]] = argv[i + 1]
        i += 2
    return opts


def main():
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cmd = {"equiv": cmd_equiv, "average": cmd_average,
           "privacy": cmd_privacy}.get(sys.argv[1])
    if cmd is None:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cmd(sys.argv[2:])


if __name__ == "__main__":
    main()
