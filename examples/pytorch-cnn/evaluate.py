# SPDX-License-Identifier: Apache-2.0
"""evaluate.py -- an independent PyTorch evaluation of a model fedbox
exported: loads model.safetensors into model.py's Net and evaluates it on
Fashion-MNIST's test set (10,000 images). Prints one JSON line:
{"accuracy": ..., "loss": ..., "count": ...}.

    python3 evaluate.py runs/pytorch-cnn/model.safetensors [--data DIR]
                        [--count K]

--count K evaluates the first K test images only (what train.py's
--valid-count K splits among the workers).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import fmnist  # noqa: E402
from fedbox.safetensors import load_file  # noqa: E402
from model import Net  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="model.safetensors")
    p.add_argument("--data", default=fmnist.DEFAULT_DIR,
                   help="Fashion-MNIST folder (default: Debian's)")
    p.add_argument("--count", type=int, default=10000,
                   help="evaluate the first COUNT test images (default "
                   "all 10,000)")
    args = p.parse_args()
    if not 0 < args.count <= 10000:
        p.error("--count must be in 1..10000, not %d" % args.count)
    net = Net()
    net.load_state_dict(load_file(args.model))  # strict: every tensor
    net.eval()
    x, y = fmnist.load(args.data, "t10k")
    x, y = x[:args.count], y[:args.count]
    x, y = torch.from_numpy(x), torch.from_numpy(y.astype("int64"))
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            logits = net(x[i:i + 1000])
            loss += float(F.cross_entropy(logits, y[i:i + 1000],
                                          reduction="sum"))
            correct += int((logits.argmax(1) == y[i:i + 1000]).sum())
    print(json.dumps({"accuracy": correct / len(y), "loss": loss / len(y),
                      "count": len(y)}))


if __name__ == "__main__":
    main()
