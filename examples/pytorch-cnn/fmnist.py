# SPDX-License-Identifier: Apache-2.0
"""fmnist.py -- Fashion-MNIST's IDX files (gzip'd or plain) as numpy arrays,
preprocessed like the fedbox worker does: (pixel / 255 - 0.2860) / 0.3530,
784 float32 features per image, labels uint8."""
import gzip
import os

import numpy as np

from model import MEAN, STD

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def _open(path):
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def load(folder=DEFAULT_DIR, split="train"):
    """(x [n, 784] float32, y [n] uint8) of split "train" or "t10k"."""
    with _open(os.path.join(folder, "%s-images-idx3-ubyte" % split)) as f:
        head = np.frombuffer(f.read(16), ">u4")
        if head[0] != 2051:
            raise ValueError("%s: not an IDX3 image file" % folder)
        n, rows, cols = (int(v) for v in head[1:])
        px = np.frombuffer(f.read(n * rows * cols), np.uint8)
    with _open(os.path.join(folder, "%s-labels-idx1-ubyte" % split)) as f:
        head = np.frombuffer(f.read(8), ">u4")
        if head[0] != 2049 or int(head[1]) != n:
            raise ValueError("%s: labels do not match the images" % folder)
        y = np.frombuffer(f.read(n), np.uint8)
    x = ((px.astype(np.float32) / 255.0 - MEAN) / STD).reshape(n, rows * cols)
    return x, y
