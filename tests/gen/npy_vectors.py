#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""npy_vectors.py -- .npy and .npz files written by numpy itself, for data/.

The reader in data/npy.c and data/npz.c is checked against files that numpy
wrote (its own headers, byte orders, Fortran order, format 2.0, np.savez's
stored zip entries and np.savez_compressed's deflated ones with zip64
extras), not against files our own code made. Values follow a pattern that
data_test.c recomputes and that every dtype holds exactly:

  features  x[i, j] = ((7 i + 3 j) % 11) - 5 + j / 8     (float32, float64)
            x[i, j] = (7 i + 3 j) % 256                  (uint8; the
                                                          trailing dims of
                                                          (5, 2, 2) flatten
                                                          row-major to j)
  labels    y[i] = i % 3;  regression targets t[i] = i / 4 - 1

Broken files (a wrong dtype or shape, NaN, a negative label) are numpy's
too, so that each refusal is of a real file.

Run from the repository root:  /usr/bin/python3 tests/gen/npy_vectors.py
It rewrites tests/vectors/npy/ (deterministic).
"""
import os

import numpy as np

OUT = "tests/vectors/npy"
N = 5


def feats(dim, dtype):
    i = np.arange(N)[:, None]
    j = np.arange(dim)[None, :]
    if np.dtype(dtype) == np.uint8:
        return ((7 * i + 3 * j) % 256).astype(dtype)
    return (((7 * i + 3 * j) % 11) - 5 + j / 8).astype(dtype)


def save(name, arr, **kw):
    with open(os.path.join(OUT, name), "wb") as f:
        np.lib.format.write_array(f, arr, **kw)


def main():
    import argparse
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    os.makedirs(OUT, exist_ok=True)
    labels = (np.arange(N) % 3)
    save("x_f4.npy", feats(3, np.float32))
    save("x_f8.npy", feats(3, np.float64))
    save("x_f4_big.npy", feats(3, ">f4"))
    save("x_f8_fortran.npy", np.asfortranarray(feats(3, np.float64)))
    save("x_f4_v2.npy", feats(3, np.float32), version=(2, 0))
    save("x_u1.npy", feats(4, np.uint8).reshape(N, 2, 2))
    save("y_i8.npy", labels.astype(np.int64))
    save("y_u1.npy", labels.astype(np.uint8))
    save("y_i2_big.npy", labels.astype(">i2"))
    save("y_i4_col.npy", labels.astype(np.int32).reshape(N, 1))
    save("y_f4_reg.npy", (np.arange(N) / 4 - 1).astype(np.float32))
    # refused
    save("x_i4.npy", feats(3, np.float32).astype(np.int32))
    save("x_1d.npy", feats(1, np.float32).reshape(N))
    save("x_c8.npy", feats(3, np.complex64))
    nan = feats(3, np.float32)
    nan[2, 1] = np.nan
    save("x_nan.npy", nan)
    save("y_2col.npy", np.stack([labels, labels], axis=1).astype(np.int64))
    save("y_f8.npy", labels.astype(np.float64))
    neg = labels.astype(np.int64)
    neg[3] = -1
    save("y_neg.npy", neg)
    save("y_four.npy", labels[:4].astype(np.int64))
    np.savez(os.path.join(OUT, "d_stored.npz"), x=feats(3, np.float32),
             y=labels.astype(np.int64))
    np.savez_compressed(os.path.join(OUT, "d_deflate.npz"),
                        features=feats(3, np.float64),
                        target=labels.astype(np.uint8))


if __name__ == "__main__":
    main()
