# SPDX-License-Identifier: Apache-2.0
"""train.py -- the pytorch-cnn example's trainer: a fedbox worker runs it
(train.command) and it does the worker's local training, round by round.

    python3 train.py [--data DIR] [--valid-of N [--valid-count K]]

In a simulation (scripts/fedbox-local --example pytorch-cnn) the worker
lends it its Dirichlet shard of Fashion-MNIST (client.shard). On a real
box it trains on the box's own copy instead: --data names a folder with
Fashion-MNIST's IDX files. Under torchrun (train.command: [torchrun,
--nproc-per-node, "N", train.py]) the box's GPUs train it together with
DistributedDataParallel; rank 0 talks to the worker.

Federated evaluation: with --valid-of N, the box with data index i (of N)
holds part i of the first K test images (K = --valid-count, all 10,000 by
default) as its validation set, and reports each round's global model on
it (task.report_eval) before training; the coordinator's sample-weighted
mean over the boxes is then the accuracy on those K images, which
evaluate.py can check independently. On a real box, evaluate on your own
validation data instead.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fedbox  # noqa: E402
import fmnist  # noqa: E402
from model import Net  # noqa: E402


def batches(n, task, rank, world):
    """Index batches for task.steps steps: a fresh permutation of the n
    examples per epoch, seeded by (seed, round, worker), each rank taking
    its share of every batch."""
    g = np.random.default_rng([task.seed, task.round, task.worker_index])
    order, at = g.permutation(n), 0
    per_rank = max(1, task.batch_size // world)
    for _ in range(task.steps):
        if at + task.batch_size > n:
            order, at = g.permutation(n), 0
        batch = order[at:at + task.batch_size]
        at += task.batch_size
        yield batch[rank * per_rank:(rank + 1) * per_rank]


def validation_part(args, index):
    """Part `index` of args.valid_of of the first args.valid_count test
    images, as (x, y) tensors."""
    x, y = fmnist.load(args.valid_data or args.data or fmnist.DEFAULT_DIR,
                       "t10k")
    k, n = args.valid_count, args.valid_of
    if not 0 <= index < n:
        raise SystemExit("train.py: data.index %d is not below --valid-of "
                         "%d" % (index, n))
    lo, hi = index * k // n, (index + 1) * k // n
    return (torch.from_numpy(x[lo:hi].copy()),
            torch.from_numpy(y[lo:hi].astype(np.int64)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="this box's Fashion-MNIST folder (when "
                   "the worker lends no shard)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1)")
    p.add_argument("--valid-of", type=int, default=0, metavar="N",
                   help="validate on part data.index of N of the test "
                   "images (0: no federated evaluation)")
    p.add_argument("--valid-count", type=int, default=10000, metavar="K",
                   help="the first K test images are split (default all)")
    p.add_argument("--valid-data", metavar="DIR",
                   help="the Fashion-MNIST folder whose test images are "
                   "split (default: --data, else Debian's)")
    args = p.parse_args()
    if args.valid_of < 0 or not 0 < args.valid_count <= 10000:
        p.error("--valid-of must be >= 0 and --valid-count in 1..10000")
    torch.set_num_threads(args.threads)

    client = fedbox.connect()
    device = client.device
    if client.world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
    if client.shard is not None:
        x, y = client.shard.torch()  # the worker's memory, no copy
    else:
        x, y = fmnist.load(args.data or fmnist.DEFAULT_DIR, "train")
        x, y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    x, y = x.to(device), y.to(device)

    torch.manual_seed(0)
    net = Net().to(device)
    model = net
    if client.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.type == "cuda" else None)

    valid = None
    for task in client.tasks():
        task.load_into(model)
        if args.valid_of > 0 and client.rank == 0:
            if valid is None:
                valid = validation_part(args, task.worker_index)
            # the global model, as received, on this box's validation part
            task.report_eval(**fedbox.evaluate(net, *valid))
        elif args.valid_of > 0:
            task.report_eval()  # rank 0 evaluates and reports
        if task.evaluate_only:  # the run's final evaluation: no training
            continue
        start = [t.detach().clone() for t in net.parameters()] \
            if task.prox_mu > 0 else None
        opt = torch.optim.SGD(model.parameters(), lr=task.lr,
                              momentum=task.momentum,
                              weight_decay=task.weight_decay)
        model.train()
        total, steps = 0.0, 0
        for idx in batches(len(y), task, client.rank, client.world):
            idx = torch.from_numpy(idx).to(device)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            if start is not None:  # FedProx
                loss = loss + task.prox_mu / 2 * sum(
                    ((w - w0) ** 2).sum()
                    for w, w0 in zip(net.parameters(), start))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss)
            steps += 1
        task.finish(net.state_dict(), samples=len(y), steps=steps,
                    loss=total / steps)


if __name__ == "__main__":
    main()
