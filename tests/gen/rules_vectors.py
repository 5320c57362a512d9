#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""rules_vectors.py -- known answers for aggregation/rules.c.

An independent reference written from the papers, not from rules.c:

* FedNova (Wang et al. 2020): the local step of worker i (PyTorch momentum
  rho, FedProx term mu/2 ||x - x_global||^2 of Li et al. 2020) is the linear
  map  (e, v) -> M (e, v) + g (-lr, 1)  on e = x - x_global and the velocity
  v, with M = [[1 - lr mu, -lr rho], [mu, rho]]. So x_global - x_local =
  lr * sum_s a_s g_s with a_s = -[M^(tau-1-s) (-lr, 1)]_0 / lr, computed
  here by matrix powers; ||a||_1 = sum |a_s|. Every simulated worker checks
  that identity against its recorded gradients (to 1e-9 relative).
  d_i = update_i / ||a_i||_1, tau_eff = sum p_i ||a_i||_1 / sum p_i.
* Server optimisers (Reddi et al. 2021, Algorithm 2, our D = -their D):
  sgd x -= lr D; avgm m = b1 m + D, x -= lr m; adam m = b1 m + (1-b1) D,
  v = b2 v + (1-b2) D^2, x -= lr m / (sqrt v + tau); yogi as adam with
  v = v - (1-b2) D^2 sign(v - D^2). m starts at 0, v at tau^2. D = scale *
  mean, scale = tau_eff for FedNova, 1 otherwise. The mean is per chunk over
  the updates that sent that chunk; a chunk nobody sent leaves x, m, v.
* The server learning rate's schedule (cosine annealing, Loshchilov and
  Hutter 2017, one cycle): round t = 1 .. R steps with
  lr_t = lr (f + (1 - f) (1 + cos(pi (t - 1) / R)) / 2), rounds past R with
  lr f; "none" keeps lr. Computed here with Python's math in float64 for
  the cases, and for the lrsched table in long double by Taylor series.

Workers really train: full-batch gradient descent on least squares
f_i(x) = ||A_i x - b_i||^2 / (2 n_i), with different optima per worker
(non-IID), different n_i and tau_i. All in float64; what a worker sends is
rounded to float32 (as the C worker would send it) and the reference then
uses exactly those float32 values; the model is kept in float64.

Run from the repository root:  /usr/bin/python3 tests/gen/rules_vectors.py
It rewrites tests/vectors/rules.txt (deterministic: fixed seeds).

Format (one record per line, fields separated by spaces):
  anorm TAU RHO LR MU NORM        ||a||_1 by the reference (long double)
  case NAME KIND NOVA             KIND sgd|avgm|adam|yogi; NOVA 0|1
  dims N CHUNK CLIP K ROUNDS
  lrsched DECAY LR F R T LR_T     the schedule alone (long double)
  server LR BETA1 BETA2 TAU
  schedule DECAY F R              DECAY none|cosine
  local LR MOMENTUM MU            the workers' local SGD
  model x_1 .. x_N                float32, the initial model
  round R
    lr LR_T                       the server lr of this round (1-based T)
    worker N_I TAU_I ANORM SENT   SENT: chunks 0 .. SENT-1 were sent
    weight P_I                    n_i / sum n (float64)
    update u_1 .. u_N             NOVA only: x_global - x_local (float32)
    send s_1 .. s_N               float32: d_i (NOVA) or the update
    (K worker blocks)
    taueff T                      1 when NOVA is 0
    expect x_1 .. x_N             float64 model after the round
  end
"""
import math
import os
import sys

import numpy as np

OUT = os.path.join("tests", "vectors", "rules.txt")


def fmt32(x):
    return repr(float(np.float32(x)))


def fmt64(x):
    return "%.17g" % float(x)


# ---- FedNova's a vector ----------------------------------------------------

def a_vector(tau, rho, lr, mu):
    """a_s, s = 0 .. tau-1, by matrix powers of the local step's map."""
    m = np.array([[1.0 - lr * mu, -lr * rho], [mu, rho]])
    b = np.array([-lr, 1.0])
    a = np.empty(tau)
    for s in range(tau):
        r = np.linalg.matrix_power(m, tau - 1 - s) @ b
        a[s] = -r[0] / lr
    return a


def a_norm_long(tau, rho, lr, mu):
    """||a||_1 in long double, by closed forms where they exist."""
    ld = np.longdouble
    t, rho, lr, mu = ld(tau), ld(rho), ld(lr), ld(mu)
    if rho == 0 and mu == 0:
        return t
    if mu == 0:
        return (t - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
    if rho == 0:
        q = lr * mu
        return (1 - (1 - q) ** tau) / q
    # both: sum |e_j| / lr over the impulse response, long double powers
    m = np.array([[1 - lr * mu, -lr * rho], [mu, rho]], dtype=ld)
    s = np.array([-lr, ld(1)], dtype=ld)
    total = ld(0)
    for _ in range(tau):
        total += abs(s[0]) / lr
        s = m @ s
    return total


# ---- the server learning rate's schedule --------------------------------------

def lr_at(decay, lr, f, rounds, t):
    """lr of round t (1-based; 0 reads as 1), in float64."""
    if decay == "none":
        return lr
    if t > rounds:
        return lr * f
    frac = max(t - 1, 0) / rounds
    return lr * (f + (1 - f) * (1 + math.cos(math.pi * frac)) / 2)


def lr_at_long(decay, lr, f, rounds, t):
    """The same in long double: (1 + cos(pi s)) / 2 = cos^2(pi s / 2) with
    s = (t - 1) / R, and cos(pi s / 2) = sin(pi (1 - s) / 2), by the sine's
    Taylor series on whichever angle is below pi / 4 (no cancellation)."""
    ld = np.longdouble
    if decay == "none":
        return ld(lr)
    t = max(t, 1)
    if t > rounds:
        return ld(lr) * ld(f)
    pi = ld(4) * np.arctan(ld(1))

    def sin_taylor(y):
        total, term = ld(0), y
        for k in range(1, 40):
            total += term
            term *= -y * y / ld((2 * k) * (2 * k + 1))
        return total

    a = pi * ld(t - 1) / ld(2 * rounds)           # cos(a) wanted
    b = pi * ld(rounds - t + 1) / ld(2 * rounds)  # a + b = pi / 2
    if a <= b:
        # cos(a) = 1 - 2 sin^2(a / 2)
        h = sin_taylor(a / 2)
        c = 1 - 2 * h * h
    else:
        c = sin_taylor(b)
    return ld(lr) * (ld(f) + (1 - ld(f)) * c * c)


def lrsched_lines(out):
    table = [("none", 0.5, 0.0, 1, 1), ("none", 0.5, 0.3, 40, 40),
             ("cosine", 1.0, 0.0, 1, 1), ("cosine", 1.0, 0.0, 1, 2),
             ("cosine", 1.0, 0.0, 40, 0), ("cosine", 1.0, 0.0, 40, 1),
             ("cosine", 1.0, 0.0, 40, 2), ("cosine", 1.0, 0.0, 40, 20),
             ("cosine", 1.0, 0.0, 40, 21), ("cosine", 1.0, 0.0, 40, 40),
             ("cosine", 1.0, 0.0, 40, 41), ("cosine", 0.01, 0.1, 40, 40),
             ("cosine", 0.01, 0.1, 40, 1000), ("cosine", 0.3, 1.0, 7, 4),
             ("cosine", 2.5, 0.25, 3, 2), ("cosine", 1.0, 0.0, 1000000,
                                            999999)]
    for decay, lr, f, rounds, t in table:
        want = lr_at_long(decay, lr, f, rounds, t)
        # the float64 textbook form agrees, up to its cancellation near
        # the end of a long schedule
        assert abs(float(want) - lr_at(decay, lr, f, rounds, t)) <= \
            1e-14 * lr
        out.append("lrsched %s %s %s %d %d %s" % (
            decay, fmt64(lr), fmt64(f), rounds, t, "%.20Lg" % want
            if hasattr(np, "longdouble") else fmt64(want)))


# ---- local training ----------------------------------------------------------

def local_train(x0, a_mat, b_vec, tau, lr, rho, mu):
    """tau steps of PyTorch SGD with momentum and a FedProx term; returns
    (x_global - x_local, the recorded loss gradients)."""
    n = a_mat.shape[0]
    x = x0.copy()
    v = np.zeros_like(x)
    grads = []
    for _ in range(tau):
        g = a_mat.T @ (a_mat @ x - b_vec) / n
        grads.append(g)
        v = rho * v + g + mu * (x - x0)
        x = x - lr * v
    return x0 - x, np.array(grads)


# ---- server ------------------------------------------------------------------

class Server:
    def __init__(self, kind, n, lr, b1, b2, tau):
        self.kind, self.lr, self.b1, self.b2, self.tau = kind, lr, b1, b2, tau
        self.m = np.zeros(n)
        self.v = np.full(n, tau * tau)
        self.min_margin = np.inf  # yogi: smallest |v - D^2| / max(v, D^2)

    def step(self, x, d, touched):
        for j in np.nonzero(touched)[0]:
            dj = d[j]
            if self.kind == "sgd":
                x[j] -= self.lr * dj
            elif self.kind == "avgm":
                self.m[j] = self.b1 * self.m[j] + dj
                x[j] -= self.lr * self.m[j]
            else:
                self.m[j] = self.b1 * self.m[j] + (1 - self.b1) * dj
                d2 = dj * dj
                if self.kind == "adam":
                    self.v[j] = self.b2 * self.v[j] + (1 - self.b2) * d2
                else:
                    gap = self.v[j] - d2
                    self.min_margin = min(self.min_margin,
                                          abs(gap) / max(self.v[j], d2))
                    self.v[j] = self.v[j] - (1 - self.b2) * d2 * np.sign(gap)
                x[j] -= self.lr * self.m[j] / (np.sqrt(self.v[j]) + self.tau)


def run_case(out, rng, name, kind, nova, n=23, chunk=8, clip=None, k=4,
             rounds=3, server=(1.0, 0.9, 0.99, 1e-3), local=(0.05, 0.0, 0.0),
             taus=None, partial=None, schedule=("none", 0.0, 1)):
    """partial: {round: {worker: chunks sent}}; others send every chunk."""
    partial = partial or {}
    if clip is None:
        clip = 1.0 if nova else 8.0  # d_i is an update / ||a||_1: small
    chunks = (n + chunk - 1) // chunk
    llr, rho, mu = local
    counts = rng.integers(20, 200, size=k)
    if taus is None:
        taus = rng.integers(2, 40, size=k)
    # Non-IID least squares: each worker its own optimum and features.
    data = []
    for i in range(k):
        a_mat = rng.normal(0.0, 1.0, size=(counts[i], n)) * \
            (0.5 + 0.5 * rng.random())
        opt = rng.normal(1.0 * i, 1.0, size=n)
        b_vec = a_mat @ opt + rng.normal(0, 0.1, size=counts[i])
        data.append((a_mat, b_vec))
    x = np.float32(rng.normal(0.0, 1.0, size=n)).astype(np.float64)
    srv = Server(kind, n, *server)
    out.append("case %s %s %d" % (name, kind, nova))
    out.append("dims %d %d %s %d %d" % (n, chunk, fmt64(clip), k, rounds))
    out.append("server " + " ".join(fmt64(v) for v in server))
    decay, lr_f, lr_rounds = schedule
    out.append("schedule %s %s %d" % (decay, fmt64(lr_f), lr_rounds))
    out.append("local " + " ".join(fmt64(v) for v in local))
    out.append("model " + " ".join(fmt32(v) for v in x))
    p = counts / counts.sum()
    for r in range(rounds):
        out.append("round %d" % r)
        srv.lr = lr_at(decay, server[0], lr_f, lr_rounds, r + 1)
        out.append("lr " + fmt64(srv.lr))
        sends = []
        sent = []
        norms = []
        for i in range(k):
            tau = int(taus[i])
            upd, grads = local_train(x, *data[i], tau, llr, rho, mu)
            a = a_vector(tau, rho, llr, mu)
            # the derivation, checked on real training
            recon = llr * (a @ grads)
            assert np.allclose(recon, upd, rtol=1e-9, atol=1e-12), name
            norm = float(np.sum(np.abs(a)))
            assert abs(norm - float(a_norm_long(tau, rho, llr, mu))) <= \
                1e-12 * norm
            upd32 = np.float32(upd)
            send = np.float32(upd32.astype(np.float64) / norm) if nova \
                else upd32
            c_sent = partial.get(r, {}).get(i, chunks)
            out.append("worker %d %d %s %d" % (counts[i], tau, fmt64(norm),
                                               c_sent))
            out.append("weight " + fmt64(p[i]))
            if nova:
                out.append("update " + " ".join(fmt32(v) for v in upd32))
            out.append("send " + " ".join(fmt32(v) for v in send))
            sends.append(send.astype(np.float64))
            sent.append(c_sent)
            norms.append(norm)
        tau_eff = float(np.dot(p, norms) / p.sum()) if nova else 1.0
        out.append("taueff " + fmt64(tau_eff))
        # per-chunk weighted mean of the clamped values, over the senders
        mean = np.zeros(n)
        touched = np.zeros(n, dtype=bool)
        for c in range(chunks):
            sl = slice(c * chunk, min(n, (c + 1) * chunk))
            who = [i for i in range(k) if sent[i] > c]
            if not who:
                continue
            w = sum(p[i] for i in who)
            mean[sl] = sum(p[i] * np.clip(sends[i][sl], -clip, clip)
                           for i in who) / w
            touched[sl] = True
        srv.step(x, tau_eff * mean, touched)
        out.append("expect " + " ".join(fmt64(v) for v in x))
    out.append("end")
    if kind == "yogi":
        # the C test's bound assumes no sign flip: keep well away from it
        assert srv.min_margin > 1e-4, (name, srv.min_margin)


def anorm_lines(out):
    table = [
        (1, 0.0, 0.1, 0.0), (37, 0.0, 0.1, 0.0),
        (1, 0.9, 0.05, 0.0), (10, 0.9, 0.05, 0.0), (250, 0.99, 0.01, 0.0),
        (3, 0.999, 0.01, 0.0), (5000, 0.5, 0.1, 0.0),
        (2000000, 0.9, 0.1, 0.0), (2000000, 0.99999, 0.1, 0.0),
        (1, 0.0, 0.1, 0.5), (20, 0.0, 0.05, 0.1), (1000, 0.0, 0.01, 1.0),
        (1, 0.9, 0.05, 0.1), (30, 0.9, 0.05, 0.1), (60, 0.9, 0.05, 0.5),
        (200, 0.5, 0.2, 2.0), (3000, 0.95, 0.01, 0.01),
    ]
    for tau, rho, lr, mu in table:
        norm = a_norm_long(tau, rho, lr, mu)
        if tau <= 200:
            a = a_vector(tau, rho, lr, mu)
            assert abs(float(np.sum(np.abs(a))) - float(norm)) <= \
                1e-11 * float(norm)
        out.append("anorm %d %s %s %s %s" % (tau, fmt64(rho), fmt64(lr),
                                             fmt64(mu), fmt64(norm)))


def main():
    import argparse
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    rng = np.random.default_rng(20240617)
    out = ["# aggregation rule known answers; generated by "
           "tests/gen/rules_vectors.py (numpy %s). Do not edit."
           % np.__version__]
    anorm_lines(out)
    lrsched_lines(out)
    sgd = (1.0, 0.9, 0.99, 1e-3)
    run_case(out, rng, "fedavg_sgd_workers", "sgd", 0)
    run_case(out, rng, "fednova_plain_sgd", "sgd", 1)
    run_case(out, rng, "fednova_momentum", "sgd", 1,
             local=(0.05, 0.9, 0.0))
    run_case(out, rng, "fednova_prox", "sgd", 1, local=(0.05, 0.0, 0.1))
    # lr mu = 0.025 > (1 - sqrt 0.9)^2: the response oscillates and some
    # a_s are negative for tau > ~20, so ||a||_1 != sum a_s.
    run_case(out, rng, "fednova_momentum_prox_oscillating", "sgd", 1,
             local=(0.05, 0.9, 0.5), taus=[8, 25, 45, 60])
    run_case(out, rng, "fedavgm", "avgm", 0, rounds=4,
             server=(0.5, 0.9, 0.99, 1e-3))
    run_case(out, rng, "fedadam", "adam", 0, rounds=5,
             server=(0.02, 0.9, 0.99, 1e-3))
    run_case(out, rng, "fedyogi", "yogi", 0, rounds=5,
             server=(0.02, 0.9, 0.99, 1e-3))
    run_case(out, rng, "fednova_momentum_prox_with_fedadam", "adam", 1,
             rounds=4, local=(0.05, 0.9, 0.05),
             server=(0.05, 0.9, 0.99, 1e-3))
    run_case(out, rng, "fednova_momentum_with_fedyogi", "yogi", 1,
             rounds=4, local=(0.02, 0.8, 0.0),
             server=(0.05, 0.5, 0.9, 1e-2))
    run_case(out, rng, "fedavgm_momentum_tiny_clip", "avgm", 0, rounds=3,
             clip=0.5, local=(0.05, 0.5, 0.0), server=sgd)
    # interrupted updates: worker 1 stops after chunk 0 in round 1; in round
    # 2 nobody sends the last chunk (x, m, v must stay there).
    run_case(out, rng, "fedadam_interrupted_and_empty_chunk", "adam", 1,
             rounds=4, local=(0.05, 0.9, 0.1),
             server=(0.05, 0.9, 0.99, 1e-3),
             partial={1: {1: 1}, 2: {0: 2, 1: 1, 2: 2, 3: 2}})
    # the server lr's cosine schedule: over the case's own rounds, and
    # shorter than the run (the last rounds keep lr f)
    run_case(out, rng, "fedavgm_cosine", "avgm", 0, rounds=6,
             server=(0.5, 0.9, 0.99, 1e-3), schedule=("cosine", 0.0, 6))
    run_case(out, rng, "fedadam_cosine_past_the_end", "adam", 0, rounds=6,
             server=(0.02, 0.9, 0.99, 1e-3), schedule=("cosine", 0.1, 4))
    run_case(out, rng, "fednova_momentum_fedyogi_cosine", "yogi", 1,
             rounds=5, local=(0.02, 0.8, 0.0),
             server=(0.05, 0.5, 0.9, 1e-2), schedule=("cosine", 0.2, 5))
    with open(OUT, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote %s" % OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
