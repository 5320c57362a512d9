#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""prepare.py -- the Wisconsin breast-cancer data as three hospitals' CSV files.

Reads the copy of the data set that Debian's python3-sklearn ships
(sklearn/datasets/data/breast_cancer.csv: 569 tumours, 30 numeric features,
class 0 = malignant, 1 = benign), found on disk, never downloaded, and
writes into OUTDIR:

  test.csv                 113 tumours held out for the coordinator's
                           evaluation (20%, stratified by class)
  hospital-N.csv           N = 0, 1, 2: each hospital's training rows
                           (unequal sizes: 50%, 30% and 20% of the rest)
  hospital-N-valid.csv     each hospital's own validation rows (15% of its
                           share), for data.valid
  norm.csv                 the per-feature mean and standard deviation that
                           the federation agrees to normalise with
                           (data.normalize: file); computed here from the
                           three hospitals' training rows

Every file has a header row: the 30 feature names, then "diagnosis"
(0 malignant, 1 benign). The split is fixed (seed 2024), so every run gets
the same files.

Usage: prepare.py OUTDIR [--source PATH]
"""
import argparse
import importlib.util
import os
import sys

import numpy as np

SEED = 2024
PARTS = (0.5, 0.3, 0.2)
TEST_SHARE = 0.2
VALID_SHARE = 0.15
MEASURES = ("radius", "texture", "perimeter", "area", "smoothness",
            "compactness", "concavity", "concave_points", "symmetry",
            "fractal_dimension")
# The bundled file's column order: the 10 means, their standard errors,
# then the worst values (sklearn's feature_names, in snake_case).
NAMES = ([m + "_mean" for m in MEASURES] + [m + "_se" for m in MEASURES] +
         [m + "_worst" for m in MEASURES])


def fail(msg):
    print("prepare.py: " + msg, file=sys.stderr)
    sys.exit(2)


def find_source():
    spec = importlib.util.find_spec("sklearn")
    dirs = []
    if spec is not None and spec.submodule_search_locations:
        dirs += list(spec.submodule_search_locations)
    dirs.append("/usr/lib/python3/dist-packages/sklearn")
    for d in dirs:
        p = os.path.join(d, "datasets", "data", "breast_cancer.csv")
        if os.path.exists(p):
            return p
    fail("breast_cancer.csv not found: install Debian's python3-sklearn "
         "(scripts/bootstrap does)")


def load(path):
    with open(path) as f:
        first = f.readline().strip().split(",")
        rows = np.loadtxt(f, delimiter=",", dtype=np.float64)
    count, feats = int(first[0]), int(first[1])
    if rows.shape != (count, feats + 1) or feats != len(NAMES):
        fail("%s: expected %d rows of %d features and a target, got %s" %
             (path, count, feats, rows.shape))
    return rows[:, :feats], rows[:, feats].astype(np.int64)


def write_csv(path, x, y):
    with open(path, "w") as f:
        f.write(",".join(NAMES + ["diagnosis"]) + "\n")
        for row, label in zip(x, y):
            # repr of a float64 round-trips; the source has <= 4 digits
            f.write(",".join(repr(float(v)) for v in row) +
                    ",%d\n" % label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--source", help="breast_cancer.csv (default: the "
                    "copy inside python3-sklearn)")
    a = ap.parse_args()
    x, y = load(a.source or find_source())
    rng = np.random.default_rng(SEED)
    os.makedirs(a.outdir, exist_ok=True)

    # Stratified held-out test set: 20% of each class.
    test, rest = [], []
    for c in (0, 1):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(TEST_SHARE * len(idx)))
        test += list(idx[:k])
        rest += list(idx[k:])
    test = np.sort(test)
    rest = rng.permutation(rest)
    write_csv(os.path.join(a.outdir, "test.csv"), x[test], y[test])

    cuts = np.cumsum([int(round(p * len(rest))) for p in PARTS[:-1]])
    train_rows = []
    for n, part in enumerate(np.split(rest, cuts)):
        k = int(round(VALID_SHARE * len(part)))
        valid, train = np.sort(part[:k]), np.sort(part[k:])
        write_csv(os.path.join(a.outdir, "hospital-%d.csv" % n), x[train],
                  y[train])
        write_csv(os.path.join(a.outdir, "hospital-%d-valid.csv" % n),
                  x[valid], y[valid])
        train_rows += list(train)
        print("hospital-%d: %d training rows (%d malignant), %d validation"
              % (n, len(train), int((y[train] == 0).sum()), len(valid)))

    # The agreed normalisation: float32 constants, as fedbox applies them.
    xt = x[np.sort(train_rows)]
    mean = xt.mean(axis=0).astype(np.float32)
    std = xt.std(axis=0).astype(np.float32)
    with open(os.path.join(a.outdir, "norm.csv"), "w") as f:
        f.write(",".join(["stat"] + NAMES) + "\n")
        f.write(",".join(["mean"] + ["%.9g" % v for v in mean]) + "\n")
        f.write(",".join(["std"] + ["%.9g" % v for v in std]) + "\n")
    print("test: %d rows (%d malignant); norm.csv from %d training rows" %
          (len(test), int((y[test] == 0).sum()), len(train_rows)))


if __name__ == "__main__":
    main()
