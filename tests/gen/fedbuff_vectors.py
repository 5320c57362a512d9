#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""fedbuff_vectors.py -- known answers for aggregation/staleness.c and the
asynchronous buffer the coordinator builds from it.

An independent reference written from the definitions (FedBuff, Nguyen et
al. 2022, with our sample weighting), not from staleness.c:

* staleness weight g(s) = (1 + s) ** -0.5;
* a buffer of K updates u_i (x_version - x_local of worker i, float32 as
  sent), n_i samples, staleness s_i, steps the model by
      D = sum_i n_i g(s_i) u_i / sum_i n_i,
  through the server rule (Reddi et al. 2021, our D = -their D): sgd
  x -= lr D; avgm m = b1 m + D, x -= lr m. The mixing weights are
  w_i = n_i g(s_i) / sum_j n_j g(s_j) and the step's scale
  sum_j n_j g(s_j) / sum_j n_j, so that D = scale * sum_i w_i u_i.
All in float64; updates are rounded to float32 first (as a worker sends
them) and the reference uses exactly those values.

Run from the repository root:  /usr/bin/python3 tests/gen/fedbuff_vectors.py
It rewrites tests/vectors/fedbuff.txt (deterministic: fixed seeds).

Format (one record per line, fields separated by spaces):
  gweight S G                      g(s)
  case NAME KIND                   KIND sgd|avgm
  dims N CHUNK CLIP BUFFERS
  server LR BETA1
  model x_1 .. x_N                 float32, the initial model
  buffer K
    upd N_I S_I W_I                W_I: its mixing weight (float64)
    send u_1 .. u_N                float32
    (K upd/send pairs)
    scale SCALE
    expect x_1 .. x_N              float64 model after the step
  end
"""
import os

import numpy as np

OUT = os.path.join("tests", "vectors", "fedbuff.txt")


def f32(v):
    return " ".join(repr(float(np.float32(x))) for x in v)


def f64(v):
    return " ".join("%.17g" % float(x) for x in v)


def g(s):
    return (1.0 + s) ** -0.5


def case(out, name, kind, rng, n, chunk, clip, buffers, lr, beta1):
    out.append("case %s %s" % (name, kind))
    out.append("dims %d %d %.17g %d" % (n, chunk, clip, len(buffers)))
    out.append("server %.17g %.17g" % (lr, beta1))
    x = rng.normal(0, 1, n).astype(np.float32)
    out.append("model " + f32(x))
    x = x.astype(np.float64)
    m = np.zeros(n)
    for buf in buffers:
        out.append("buffer %d" % len(buf))
        ns = np.array([b[0] for b in buf], dtype=np.float64)
        ss = np.array([b[1] for b in buf], dtype=np.float64)
        gs = np.array([g(s) for s in ss])
        mix = ns * gs / np.sum(ns * gs)
        scale = np.sum(ns * gs) / np.sum(ns)
        d = np.zeros(n)
        for (ni, si), wi in zip(buf, mix):
            u = rng.normal(0, 0.5, n).astype(np.float32)
            out.append("upd %d %d %.17g" % (ni, si, wi))
            out.append("send " + f32(u))
            d += ni * g(si) * u.astype(np.float64)
        d /= np.sum(ns)
        if kind == "sgd":
            x = x - lr * d
        else:
            m = beta1 * m + d
            x = x - lr * m
        out.append("scale %.17g" % scale)
        out.append("expect " + f64(x))
    out.append("end")


def main():
    rng = np.random.default_rng(26)
    out = []
    for s in (0, 1, 2, 3, 8, 15, 1000):
        out.append("gweight %d %.17g" % (s, g(s)))
    case(out, "fresh-is-fedavg", "sgd", rng, 37, 16, 4, [
        [(120, 0), (380, 0)]], 1.0, 0)
    case(out, "stale-shrinks-step", "sgd", rng, 50, 16, 4, [
        [(300, 0), (100, 3)],
        [(250, 1), (250, 2), (90, 0)]], 1.0, 0)
    case(out, "one-worker-twice", "sgd", rng, 20, 8, 4, [
        [(500, 0), (500, 1)]], 0.5, 0)
    case(out, "avgm-three-buffers", "avgm", rng, 41, 16, 4, [
        [(200, 0), (400, 1)],
        [(400, 0), (100, 4), (200, 2)],
        [(300, 8), (200, 0)]], 1.0, 0.9)
    with open(OUT, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
