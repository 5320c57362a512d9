# SPDX-License-Identifier: Apache-2.0
"""PyTorch DDP peer of fedbox_bench: same rows, shapes, batch per GPU, dtype
policy, synthetic data (on the GPU, batches gathered by index each step) and
optimizer (SGD lr 1e-3, momentum 0.9), one process per GPU, NCCL backend.

    python3 ddp_bench.py --gpus N [--rows abc] [--math fp32,tf32] [--seconds S]

fp32 = allow_tf32 False (matmul and cuDNN); tf32 = allow_tf32 True. DDP with
its defaults (25 MB buckets, overlap with backward). No .item() per step:
the loss is accumulated on the device and read at the end, as fedbox does.
Prints one ROW line per (row, math) from rank 0.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

ROWS = {
    "a": ([512, 256], 256),
    "b": ([4096, 4096, 4096], 4096),
    "c": ([8192, 8192, 8192, 8192], 1024),
}


def make_model(hidden):
    layers, prev = [], 784
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    layers.append(nn.Linear(prev, 10))
    return nn.Sequential(*layers)


def run_row(rank, world, name, math, seconds):
    hidden, bpg = ROWS[name]
    tf32 = math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda", rank)
    torch.manual_seed(1)
    model = make_model(hidden).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    gb = bpg * world
    n = 4 * gb
    g = torch.Generator(device=dev)
    g.manual_seed(2 + rank)
    x_all = torch.rand(n, 784, device=dev, generator=g) * 2 - 1
    y_all = torch.randint(0, 10, (n,), device=dev, generator=g)
    perm = torch.randperm(n, device=dev, generator=g)
    loss_acc = torch.zeros((), device=dev)
    state = {"pos": 0}

    def step():
        p = state["pos"]
        if p + bpg > n:
            p = 0
        idx = perm[p:p + bpg]
        state["pos"] = p + bpg
        x = x_all.index_select(0, idx)
        y = y_all.index_select(0, idx)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_acc.add_(loss.detach())

    for _ in range(10):
        step()
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize(dev)
    per = (time.perf_counter() - t0) / 10
    steps = max(20, int(seconds / per))
    # All ranks must run the same number of steps.
    t = torch.tensor([steps], device=dev)
    dist.broadcast(t, 0)
    steps = int(t.item())
    dist.barrier()
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize(dev)
    el = time.perf_counter() - t0
    el_t = torch.tensor([el], device=dev)
    dist.all_reduce(el_t, op=dist.ReduceOp.MAX)
    el = float(el_t.item())
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"ROW fw=torch row={name} gpus={world} math={math} "
              f"batch_per_gpu={bpg} params={params} "
              f"samples_s={steps * gb / el:.1f} "
              f"step_ms={1e3 * el / steps:.4f} steps={steps} "
              f"loss={float(loss_acc.item()) / (steps + 20):.4f}",
              flush=True)
    del ddp, model, opt, x_all, y_all
    torch.cuda.empty_cache()


def worker(rank, world, args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    for name in args.rows:
        for math in args.math.split(","):
            run_row(rank, world, name, math, args.seconds)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--rows", default="abc")
    ap.add_argument("--math", default="fp32,tf32")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    if torch.cuda.device_count() < args.gpus:
        print(f"SKIP: ddp_bench --gpus {args.gpus}: "
              f"{torch.cuda.device_count()} visible")
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    mp.spawn(worker, args=(args.gpus, args), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    main()
