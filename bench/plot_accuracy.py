#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""plot_accuracy -- test accuracy against cumulative wall-clock round seconds.

One line per policy and seed (same colour per policy, a different dash per
seed), written as a self-contained SVG by hand (no matplotlib needed).

Input: OUT/runs.json of bench/heterogeneity (--runs), or metrics.jsonl files
given as LABEL=PATH (--metrics A1=runs/x/metrics.jsonl ...; the policy is the
label's first character).
"""
import argparse
import json
import math
import sys

COLORS = {"A": "#d62728", "B": "#1f77b4", "C": "#2ca02c", "D": "#ff7f0e"}
OTHER = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
DASHES = ["", "6,3", "2,2", "8,3,2,3"]
NAMES = {"A": "A fixed 1 epoch + FedAvg", "B": "B time_budget + FedAvg",
         "C": "C time_budget + FedNova", "D": "D async + FedAvg"}


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def load(args):
    series = []  # (policy, seed label, [(t, acc)])
    if args.runs:
        with open(args.runs) as f:
            for r in json.load(f)["runs"]:
                series.append((r["policy"], str(r["seed"]), [tuple(p) for p in r["curve"]]))
    for item in args.metrics or []:
        label, path = item.split("=", 1)
        cum, pts = 0.0, []
        with open(path) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    cum += m.get("seconds", 0)
                    if args.budget and cum > args.budget:
                        break
                    pts.append((cum, m.get("test_accuracy", 0)))
        series.append((label[0], label[1:] or "1", pts))
    return series


def nice_step(span, n):
    raw = span / max(n, 1)
    p = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= raw:
            return m * p
    return 10 * p


def svg(series, args):
    W, H = 820, 500
    L, R, T, B = 70, 250, 40, 60
    pw, ph = W - L - R, H - T - B
    xmax = args.budget or max((p[0] for _, _, c in series for p in c), default=1)
    accs = [100 * a for _, _, c in series for _, a in c]
    ymin = math.floor(min(accs + [100 * args.target - 5]) / 5) * 5
    ymin = max(ymin, args.ymin) if args.ymin is not None else ymin
    ymax = math.ceil(max(accs + [100 * args.target + 2]) / 2) * 2
    X = lambda t: L + pw * t / xmax
    Y = lambda a: T + ph * (1 - (a - ymin) / (ymax - ymin))
    o = []
    o.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
             'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">' % (W, H, W, H))
    o.append('<rect width="100%" height="100%" fill="white"/>')
    o.append('<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>' % (L, esc(args.title)))
    xs = nice_step(xmax, 8)
    t = 0.0
    while t <= xmax + 1e-9:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (X(t), T, X(t), T + ph))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (X(t), T + ph + 16, t))
        t += xs
    ys = nice_step(ymax - ymin, 8)
    a = ymin
    while a <= ymax + 1e-9:
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, Y(a), L + pw, Y(a)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 6, Y(a) + 4, a))
        a += ys
    o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>' % (L, T, pw, ph))
    o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#000" stroke-dasharray="4,4"/>'
             % (L, Y(100 * args.target), L + pw, Y(100 * args.target)))
    o.append('<text x="%d" y="%.1f" text-anchor="end" font-size="11">%g%% target</text>'
             % (L + pw - 4, Y(100 * args.target) - 4, 100 * args.target))
    o.append('<text x="%.1f" y="%d" text-anchor="middle">cumulative round wall-clock (s)</text>'
             % (L + pw / 2, H - 18))
    o.append('<text transform="translate(18,%.1f) rotate(-90)" text-anchor="middle">test accuracy (%%)</text>'
             % (T + ph / 2))
    o.append('<defs><clipPath id="plot"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath></defs>'
             % (L, T, pw, ph))
    seeds = sorted({s for _, s, _ in series})
    pols = sorted({p for p, _, _ in series})
    color = {p: COLORS.get(p, OTHER[i % len(OTHER)]) for i, p in enumerate(pols)}
    for pol, seed, curve in series:
        if not curve:
            continue
        dash = DASHES[seeds.index(seed) % len(DASHES)]
        pts = " ".join("%.1f,%.1f" % (X(t), Y(100 * a)) for t, a in curve)
        o.append('<polyline clip-path="url(#plot)" points="%s" fill="none" stroke="%s" stroke-width="1.8"%s>'
                 '<title>%s seed %s</title></polyline>'
                 % (pts, color[pol], ' stroke-dasharray="%s"' % dash if dash else "", esc(pol), esc(seed)))
        for t, a in curve:
            o.append('<circle clip-path="url(#plot)" cx="%.1f" cy="%.1f" r="2" fill="%s"/>'
                     % (X(t), Y(100 * a), color[pol]))
    ly = T + 10
    lx = L + pw + 20
    for p in pols:
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                 % (lx, ly, lx + 28, ly, color[p]))
        o.append('<text x="%d" y="%d">%s</text>' % (lx + 34, ly + 4, esc(NAMES.get(p, p))))
        ly += 20
    ly += 10
    for i, s in enumerate(seeds):
        dash = DASHES[i % len(DASHES)]
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444" stroke-width="1.8"%s/>'
                 % (lx, ly, lx + 28, ly, ' stroke-dasharray="%s"' % dash if dash else ""))
        o.append('<text x="%d" y="%d">seed %s</text>' % (lx + 34, ly + 4, esc(s)))
        ly += 20
    for line in args.note or []:
        ly += 6
        o.append('<text x="%d" y="%d" font-size="10" fill="#555">%s</text>' % (lx, ly + 4, esc(line)))
        ly += 10
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", help="runs.json of bench/heterogeneity")
    ap.add_argument("--metrics", nargs="*", help="LABEL=metrics.jsonl ...")
    ap.add_argument("--target", type=float, default=0.84)
    ap.add_argument("--budget", type=float, default=0, help="x axis end, and the cut (s)")
    ap.add_argument("--ymin", type=float, default=None)
    ap.add_argument("--title", default="Fashion-MNIST, 4 workers, throttle 1,1,2,4 (simulated), Dirichlet 0.5")
    ap.add_argument("--note", nargs="*", default=["x: sum of round seconds", "(start-up not counted)"])
    ap.add_argument("-o", "--output", default="heterogeneity.svg")
    args = ap.parse_args()
    series = load(args)
    if not series:
        print("plot_accuracy: nothing to plot", file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        f.write(svg(series, args))
    print("plot_accuracy: wrote %s (%d lines)" % (args.output, len(series)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
