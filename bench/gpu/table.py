# SPDX-License-Identifier: Apache-2.0
"""table.py BENCH_LOG [MACHINE_LOG] -- the ROW lines of fedbox_bench and
ddp_bench.py as one markdown table: samples/s side by side, the ratio,
scaling efficiency against 1 GPU, and NCCL bus bandwidth inside the step
against a bare all-reduce of the whole gradient in the same run."""
import re
import sys

SHAPES = {"a": "784-512-256-10", "b": "784-4096x3-10", "c": "784-8192x4-10"}


def parse(path):
    rows = {}
    for line in open(path):
        if not line.startswith("ROW "):
            continue
        kv = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
        key = (kv["row"], int(kv["gpus"]), kv["math"])
        rows.setdefault(key, {})[kv["fw"]] = kv
    return rows


def f(kv, k):
    try:
        return float(kv.get(k, "nan"))
    except ValueError:
        return float("nan")


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("bench_log", help="fedbox_bench and ddp_bench.py output")
    ap.add_argument("machine_log", nargs="?",
                    help="nvidia-smi output naming the GPUs")
    args = ap.parse_args()
    rows = parse(args.bench_log)
    if args.machine_log:
        for line in open(args.machine_log):
            if "NVIDIA" in line and "," in line:
                print(f"GPU: {line.strip()}  ")
        print()
    print("| row | shape | batch/GPU | GPUs | math | fedbox samples/s | "
          "DDP samples/s | fedbox/DDP | fedbox scaling | DDP scaling | "
          "in-step busbw GB/s (last GPU / mean) | bare busbw GB/s | "
          "in-step/bare (last GPU / mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows):
        name, g, math = key
        fx = rows[key].get("fedbox", {})
        tx = rows[key].get("torch", {})
        one = rows.get((name, 1, math), {})
        fs, ts = f(fx, "samples_s"), f(tx, "samples_s")
        f1 = f(one.get("fedbox", {}), "samples_s")
        t1 = f(one.get("torch", {}), "samples_s")
        ib, bb = f(fx, "instep_busbw"), f(fx, "bare_busbw")
        il = f(fx, "instep_last_busbw")
        err = fx.get("error", "").replace(" ", "_")
        if fx.get("graphs") == "off":
            err = f"{fs:.0f} (no graphs)"
        cell = lambda v, fmt: fmt.format(v) if v == v and v > 0 else "-"
        print(f"| {name} | {SHAPES[name]} | "
              f"{fx.get('batch_per_gpu', tx.get('batch_per_gpu', '?'))} | "
              f"{g} | {math} | {cell(fs, '{:.0f}') if not err else err} | "
              f"{cell(ts, '{:.0f}')} | {cell(fs / ts if ts else 0, '{:.2f}x')} | "
              f"{cell(fs / (g * f1) if f1 == f1 and f1 else 0, '{:.0%}')} | "
              f"{cell(ts / (g * t1) if t1 == t1 and t1 else 0, '{:.0%}')} | "
              f"{cell(il, '{:.0f}')} / {cell(ib, '{:.0f}')} | "
              f"{cell(bb, '{:.0f}')} | "
              f"{cell(il / bb if bb == bb and bb else 0, '{:.0%}')} / "
              f"{cell(ib / bb if bb == bb and bb else 0, '{:.0%}')} |")
    nooverlap(rows)


def nooverlap(rows):
    keys = [k for k in sorted(rows) if "fedbox-nooverlap" in rows[k]]
    if not keys:
        return
    print()
    print("Overlap of the gradient all-reduce with the backward pass "
          "(fp32; default = buckets of 16 MB issued as each layer's "
          "backward ends; off = one all-reduce after the backward):")
    print()
    print("| row | GPUs | samples/s overlap | samples/s off | "
          "in-step busbw overlap (last/mean) | in-step busbw off "
          "(last/mean) | bare busbw |")
    print("|---|---|---|---|---|---|---|")
    for k in keys:
        on, off = rows[k].get("fedbox", {}), rows[k]["fedbox-nooverlap"]
        print(f"| {k[0]} | {k[1]} | {f(on, 'samples_s'):.0f} | "
              f"{f(off, 'samples_s'):.0f} | "
              f"{f(on, 'instep_last_busbw'):.0f}/{f(on, 'instep_busbw'):.0f} | "
              f"{f(off, 'instep_last_busbw'):.0f}/{f(off, 'instep_busbw'):.0f} | "
              f"{f(off, 'bare_busbw'):.0f} |")


if __name__ == "__main__":
    main()
