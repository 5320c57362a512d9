#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""shamir_vectors.py -- known answers for crypto/shamir.c.

An independent reference in Python big integers, written from the
definition of Shamir sharing, not from shamir.c:

* field GF(p), p = 2^61 - 1; a 32-byte secret is 5 limbs: limb l < 4 is
  bytes [7l, 7l + 7) little-endian, limb 4 is bytes 28..31;
* limb l is shared with the polynomial f_l(x) = secret_l + sum_{d=1}^{t-1}
  c[l * (t - 1) + d - 1] x^d, evaluated (plain powers, no Horner) at the
  given points x;
* reconstruction is Lagrange interpolation at 0 with pow(a, p - 2, p)
  inverses over the given subset of shares.

Run from the repository root:  /usr/bin/python3 tests/gen/shamir_vectors.py
It rewrites tests/vectors/shamir.txt (deterministic: fixed seed).

Format (one record per line, hex numbers without 0x):
  case T SECRET                 64 hex digits
  points X1,X2,...              the evaluation points, decimal
  coefs C...                    (T-1)*5 field elements, layout as above
  share X Y0 Y1 Y2 Y3 Y4        the expected share at X
  combine X1,X2,.. SECRET       these shares (by x) reconstruct SECRET
  corrupt X1,X2,.. XC ok SECRET   share XC with y0 += 1 (mod p); the
  corrupt X1,X2,.. XC eauth       first T shares interpolate to SECRET, or
                                  to limbs out of range (shamir.c: EAUTH)
  end
"""
import os
import random

P = (1 << 61) - 1
LIMBS = 5


def limbs_of(secret):
    out = []
    for l in range(LIMBS):
        nb = 7 if l < LIMBS - 1 else 4
        out.append(int.from_bytes(secret[7 * l:7 * l + nb], "little"))
    return out


def bytes_of(limbs):
    b = b""
    for l, v in enumerate(limbs):
        nb = 7 if l < LIMBS - 1 else 4
        b += v.to_bytes(nb, "little")
    return b


def in_range(limbs):
    return all(v < (1 << 56) for v in limbs[:4]) and limbs[4] < (1 << 32)


def evaluate(secret_limbs, coefs, t, x):
    ys = []
    for l in range(LIMBS):
        y = secret_limbs[l]
        for d in range(1, t):
            y += coefs[l * (t - 1) + d - 1] * pow(x, d, P)
        ys.append(y % P)
    return ys


def interpolate0(points):
    """points: list of (x, [y0..y4]); Lagrange at 0."""
    out = [0] * LIMBS
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, (xm, _) in enumerate(points):
            if m != j:
                num = num * (-xm) % P
                den = den * (xj - xm) % P
        lam = num * pow(den, P - 2, P) % P
        for l in range(LIMBS):
            out[l] = (out[l] + lam * yj[l]) % P
    return out


def main():
    import argparse
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    rng = random.Random(20261201)
    cases = [
        (3, [1, 2, 3, 4, 5], None),
        (2, [3, 7, 12], None),
        (5, list(range(1, 9)), None),
        (1, [1, 2], None),
        (4, [2, 5, 9, 17, 33, 64], "max"),
        (3, [1, 2, 3, 4, 5], "zero"),
        (7, [1, 3, 4, 6, 8, 11, 13, 20, 21, 30], None),
    ]
    lines = []
    for t, xs, kind in cases:
        if kind == "max":
            secret = b"\xff" * 32
            coefs = [P - 1] * ((t - 1) * LIMBS)
        elif kind == "zero":
            secret = b"\x00" * 32
            coefs = [rng.randrange(P) for _ in range((t - 1) * LIMBS)]
        else:
            secret = bytes(rng.randrange(256) for _ in range(32))
            coefs = [rng.randrange(P) for _ in range((t - 1) * LIMBS)]
        sl = limbs_of(secret)
        assert bytes_of(sl) == secret
        shares = {x: evaluate(sl, coefs, t, x) for x in xs}
        lines.append("case %d %s" % (t, secret.hex()))
        lines.append("points " + ",".join(str(x) for x in xs))
        lines.append("coefs " + " ".join("%x" % c for c in coefs)
                     if coefs else "coefs")
        for x in xs:
            lines.append("share %d %s" % (x, " ".join(
                "%x" % y for y in shares[x])))
        # Reconstruction from several subsets of size t and t + 1.
        for size in (t, min(t + 1, len(xs)), len(xs)):
            for _ in range(2):
                sub = rng.sample(xs, size)
                got = interpolate0([(x, shares[x]) for x in sub[:t]])
                assert bytes_of(got) == secret
                lines.append("combine %s %s" % (
                    ",".join(str(x) for x in sub), secret.hex()))
        # One corrupted share among exactly t.
        if t >= 2:
            for _ in range(3):
                sub = rng.sample(xs, t)
                xc = rng.choice(sub)
                pts = []
                for x in sub:
                    y = list(shares[x])
                    if x == xc:
                        y[0] = (y[0] + 1) % P
                    pts.append((x, y))
                got = interpolate0(pts)
                assert got != sl
                if in_range(got):
                    verdict = "ok " + bytes_of(got).hex()
                else:
                    verdict = "eauth"
                lines.append("corrupt %s %d %s" % (
                    ",".join(str(x) for x in sub), xc, verdict))
        lines.append("end")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "vectors", "shamir.txt")
    with open(path, "w") as f:
        f.write("# generated by tests/gen/shamir_vectors.py; do not edit\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
