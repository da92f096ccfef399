#!/usr/bin/env python3
"""Plots of the `lock` benchmark, as hand-written SVG (Python standard library only).

Reads bench-out/summary.jsonl (written by `cargo bench --bench lock`)
and writes:

* docs/img/latency_vs_n.svg: uncontended acquire+release p50 (and quorumlock p99)
  against the number of nodes N, for quorumlock, rslock and the raw floor;
* docs/img/contended_latency.svg: the distribution (CDF, log time axis) of the acquire
  latency of 16 contenders on one resource: quorumlock notify, quorumlock polling, rslock.

and, from bench-out/server_cost.jsonl (written by `cargo bench --bench server_cost`):

* docs/img/server_cost.svg: the Redis servers' CPU per operation of quorumlock and the
  floor, relative to rslock's in the same run, for each case of that benchmark.

Usage: scripts/plot-benchmarks.py [SUMMARY] [OUTDIR] [SERVER_COST]
"""

import json
import math
import os
import sys

COLORS = {
    "quorumlock": "#1f77b4",
    "quorumlock-notify": "#1f77b4",
    "quorumlock-poll": "#ff7f0e",
    "rslock": "#d62728",
    "rslock-20ms": "#9467bd",
    "floor": "#2ca02c",
}

W, H = 720, 440
ML, MR, MT, MB = 70, 180, 40, 55  # margins: left, right (legend), top, bottom


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self, title):
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="{W / 2 - MR / 2}" y="22" text-anchor="middle" font-size="15" '
            f'font-weight="bold">{esc(title)}</text>',
        ]

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, anchor="middle", **kw):
        extra = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in kw.items())
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{esc(s)}</text>')

    def line(self, x1, y1, x2, y2, color="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}" stroke-width="{width}"{d}/>'
        )

    def polyline(self, pts, color, width=2, dash=None, markers=False):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.add(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{width}"{d}/>')
        if markers:
            for x, y in pts:
                self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')

    def legend(self, entries):
        x0, y0 = W - MR + 15, MT + 10
        for i, (label, color, dash) in enumerate(entries):
            y = y0 + i * 20
            self.line(x0, y, x0 + 26, y, color, 2.5, dash)
            self.text(x0 + 32, y + 4, label, anchor="start")

    def save(self, path):
        self.add("</svg>")
        with open(path, "w") as f:
            f.write("\n".join(self.parts) + "\n")
        print(f"wrote {path}")


def nice_ticks(lo, hi, n=6):
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=mag * 10)
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            out.append(round(t, 10))
        t += step
    return out


def plot_latency_vs_n(rows, path):
    ns, series = [], {}
    for r in rows:
        sec = r.get("section", "")
        if sec.startswith("scaling_n"):
            n = int(sec[len("scaling_n"):])
            if n not in ns:
                ns.append(n)
            series.setdefault((r["impl"], "p50"), {})[n] = r["p50_us"]
            series.setdefault((r["impl"], "p99"), {})[n] = r["p99_us"]
    if not ns:
        print("no scaling rows; skipping latency_vs_n")
        return
    ns.sort()
    lines = [
        ("quorumlock", "p50", None),
        ("quorumlock", "p99", "6,4"),
        ("rslock", "p50", None),
        ("floor", "p50", None),
    ]
    ymax = max(
        v for imp, q, _ in lines for v in series.get((imp, q), {}).values()
    )
    yt = nice_ticks(0, ymax * 1.08)
    ytop = yt[-1] if yt[-1] >= ymax else ymax * 1.1
    pw, ph = W - ML - MR, H - MT - MB
    xmin, xmax = min(ns) - 0.5, max(ns) + 0.5

    def X(n):
        return ML + (n - xmin) / (xmax - xmin) * pw

    def Y(v):
        return MT + ph - v / ytop * ph

    svg = Svg("Uncontended acquire + release vs number of nodes N")
    for t in yt:
        svg.line(ML, Y(t), ML + pw, Y(t), "#ddd")
        svg.text(ML - 6, Y(t) + 4, f"{t:g}", anchor="end")
    for n in ns:
        svg.line(X(n), MT + ph, X(n), MT + ph + 5)
        svg.text(X(n), MT + ph + 18, str(n))
    svg.line(ML, MT + ph, ML + pw, MT + ph)
    svg.line(ML, MT, ML, MT + ph)
    svg.text(ML + pw / 2, H - 15, "nodes N (quorum N/2+1), 1 task, local redis-server processes")
    svg.add(
        f'<text x="18" y="{MT + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {MT + ph / 2})">latency (µs)</text>'
    )
    legend = []
    for imp, q, dash in lines:
        pts = series.get((imp, q))
        if not pts:
            continue
        xy = [(X(n), Y(pts[n])) for n in ns if n in pts]
        svg.polyline(xy, COLORS[imp], 2, dash, markers=True)
        legend.append((f"{imp} {q}", COLORS[imp], dash))
    svg.legend(legend)
    svg.save(path)


def plot_contended(rows, path):
    samples = {}
    for r in rows:
        if r.get("section") == "contended_samples":
            samples[r["impl"]] = sorted(r["lat_us"])
    order = ["quorumlock-notify", "quorumlock-poll", "rslock", "rslock-20ms"]
    order = [o for o in order if samples.get(o)]
    if not order:
        print("no contended samples; skipping contended_latency")
        return
    lo = max(10.0, min(samples[o][0] for o in order))
    hi = max(samples[o][-1] for o in order)
    dlo = 10 ** math.floor(math.log10(lo))
    dhi = 10 ** math.ceil(math.log10(hi))
    pw, ph = W - ML - MR, H - MT - MB

    def X(v):
        v = max(v, dlo)
        return ML + (math.log10(v) - math.log10(dlo)) / (math.log10(dhi) - math.log10(dlo)) * pw

    def Y(p):
        return MT + ph - p * ph

    svg = Svg("16 contenders on one resource: acquire latency (CDF)")
    d = dlo
    while d <= dhi * 1.0001:
        svg.line(X(d), MT, X(d), MT + ph, "#ddd")
        label = f"{d / 1000:g} ms" if d >= 1000 else f"{d:g} µs"
        svg.text(X(d), MT + ph + 18, label)
        d *= 10
    for p in (0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0):
        svg.line(ML, Y(p), ML + pw, Y(p), "#eee" if p not in (0.5, 0.99) else "#bbb",
                 1, None if p not in (0.99,) else "3,3")
        svg.text(ML - 6, Y(p) + 4, f"{p:g}", anchor="end")
    svg.line(ML, MT + ph, ML + pw, MT + ph)
    svg.line(ML, MT, ML, MT + ph)
    svg.text(ML + pw / 2, H - 15, "time from lock() call to acquired (log scale)")
    svg.add(
        f'<text x="18" y="{MT + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {MT + ph / 2})">fraction of acquisitions</text>'
    )
    legend = []
    for o in order:
        v = samples[o]
        n = len(v)
        step = max(1, n // 600)
        pts = [(X(v[i]), Y((i + 1) / n)) for i in range(0, n, step)]
        pts.append((X(v[-1]), Y(1.0)))
        dash = "6,4" if o == "rslock-20ms" else None
        svg.polyline(pts, COLORS[o], 2, dash)
        p99 = v[min(n - 1, round((n - 1) * 0.99))]
        legend.append((f"{o} (p99 {p99 / 1000:.1f} ms)", COLORS[o], dash))
    svg.legend(legend)
    svg.save(path)


def plot_server_cost(rows, path):
    cost = {}
    cases = []
    for r in rows:
        if "case" not in r:
            continue
        key = (r["section"], r["case"])
        if key not in cases:
            cases.append(key)
        cost[(key, r["impl"])] = r["server_cpu_us_per_op"]
    cases = [c for c in cases if cost.get((c, "rslock"))]
    if not cases:
        print("no server-cost rows; skipping server_cost")
        return
    order = ["floor", "quorumlock"]
    pw, ph = W - ML - MR, H - MT - MB
    top = max(2.5, max(cost.get((c, o), 0) / cost[(c, "rslock")] for c in cases for o in order))
    top = math.ceil(top * 2) / 2

    def Y(v):
        return MT + ph - v / top * ph

    svg = Svg("Redis servers' CPU per operation, relative to rslock (same run)")
    t = 0.0
    while t <= top + 1e-9:
        svg.line(ML, Y(t), ML + pw, Y(t), "#ddd" if t not in (1.0, 2.0) else "#888", 1,
                 None if t != 2.0 else "4,3")
        svg.text(ML - 6, Y(t) + 4, f"{t:g}×", anchor="end")
        t += 0.5
    slot = pw / len(cases)
    bw = slot / (len(order) + 1.5)
    for k, c in enumerate(cases):
        x0 = ML + k * slot + bw * 0.75
        for j, o in enumerate(order):
            v = cost.get((c, o))
            if v is None:
                continue
            ratio = v / cost[(c, "rslock")]
            x = x0 + j * bw
            svg.add(
                f'<rect x="{x:.1f}" y="{Y(ratio):.1f}" width="{bw * 0.9:.1f}" '
                f'height="{Y(0) - Y(ratio):.1f}" fill="{COLORS[o]}"/>'
            )
            svg.text(x + bw * 0.45, Y(ratio) - 4, f"{ratio:.2f}", font_size="10")
        label = c[1].replace(", own resource", " own").replace(", new resource", " new")
        svg.text(ML + k * slot + slot / 2, MT + ph + 16, label, font_size="10")
        svg.text(ML + k * slot + slot / 2, MT + ph + 29, c[0], font_size="10")
    svg.line(ML, MT + ph, ML + pw, MT + ph)
    svg.line(ML, MT, ML, MT + ph)
    legend = [(o, COLORS[o], None) for o in order]
    legend.append(("rslock = 1×", "#888", None))
    legend.append(("target, contended", "#888", "4,3"))
    svg.legend(legend)
    svg.save(path)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "bench-out/summary.jsonl"
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/img"
    os.makedirs(out, exist_ok=True)
    with open(src) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    plot_latency_vs_n(rows, os.path.join(out, "latency_vs_n.svg"))
    plot_contended(rows, os.path.join(out, "contended_latency.svg"))
    cost_src = sys.argv[3] if len(sys.argv) > 3 else "bench-out/server_cost.jsonl"
    if os.path.exists(cost_src):
        with open(cost_src) as f:
            cost_rows = [json.loads(line) for line in f if line.strip()]
        plot_server_cost(cost_rows, os.path.join(out, "server_cost.svg"))
    else:
        print(f"no {cost_src}; skipping server_cost")


if __name__ == "__main__":
    main()
