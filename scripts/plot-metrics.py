#!/usr/bin/env python3
"""A picture of quorumlock's metrics from a real run, as hand-written SVG (Python standard
library only).

Runs `examples/metrics.rs` (feature `testkit,metrics`: a local 5-node cluster, a small
workload, node 0 paused with SIGSTOP for a while), scrapes its Prometheus endpoint once a
second, saves the scrapes (the series it plots) as JSON, and writes one SVG with four
panels over time:

* acquisitions per second, by outcome (rate of `quorumlock_acquire_total`);
* acquire latency p50 / p90 / p99 of acquired attempts, from the bucket deltas of
  `quorumlock_acquire_seconds` over 2-second windows (as `histogram_quantile` does);
* requests per second answered by each node (`quorumlock_node_request_seconds_count`,
  outcome granted or refused);
* requests per second that timed out or failed, by node.

Usage:
  scripts/plot-metrics.py [--seconds 40] [--port 9464] [--out docs/img/metrics.svg]
                          [--data bench-out/metrics-scrapes.json] [--from FILE]

`--from FILE` re-plots saved scrapes without running anything.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request

W = 780
PANEL_H = 190
ML, MR, MT, MB = 70, 200, 62, 48  # margins: left, right (legend), top, bottom
GAP = 44  # between panels

OUTCOME_COLORS = {
    "acquired": "#2ca02c",
    "held": "#1f77b4",
    "no_quorum": "#d62728",
    "no_validity_left": "#9467bd",
    "cancelled": "#8c564b",
    "abandoned": "#7f7f7f",
}
NODE_COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------------------------------
# The exposition format.


def parse_labels(s):
    out, i = {}, 0
    while i < len(s):
        eq = s.index("=", i)
        key = s[i:eq].strip().lstrip(",")
        assert s[eq + 1] == '"', s
        j, val = eq + 2, []
        while s[j] != '"':
            if s[j] == "\\":
                j += 1
                val.append("\n" if s[j] == "n" else s[j])
            else:
                val.append(s[j])
            j += 1
        out[key] = "".join(val)
        i = j + 1
        if i < len(s) and s[i] == ",":
            i += 1
    return out


def parse(text):
    """Exposition text -> list of (name, labels dict, value), quorumlock series only."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#") or not line.startswith("quorumlock_"):
            continue
        series, value = line.rsplit(" ", 1)
        if "{" in series:
            name, rest = series.split("{", 1)
            labels = parse_labels(rest.rstrip("}"))
        else:
            name, labels = series, {}
        out.append((name, labels, float(value)))
    return out


KEEP = (
    "quorumlock_acquire_total",
    "quorumlock_acquire_seconds_bucket",
    "quorumlock_node_request_seconds_count",
)


def reduce(samples):
    """Only the series the plot needs, summed over the labels it does not show."""
    out = {}
    for name, labels, v in samples:
        if name not in KEEP:
            continue
        if name == "quorumlock_acquire_total":
            key = f"acquire|{labels.get('outcome')}"
        elif name == "quorumlock_acquire_seconds_bucket":
            if labels.get("outcome") != "acquired":
                continue
            key = f"bucket|{labels.get('le')}"
        else:
            answered = labels.get("outcome") in ("granted", "refused")
            key = f"node|{labels.get('node')}|{'answered' if answered else 'failed'}"
        out[key] = out.get(key, 0.0) + v
    return out


# ---------------------------------------------------------------------------------------
# Running the example and scraping it.


def run(args):
    cmd = [
        "cargo", "run", "--quiet", "--release", "--features", "testkit,metrics",
        "--example", "metrics", "--",
        "--port", str(args.port), "--seconds", str(args.seconds), "--linger", "3",
        "--pause-at", str(args.pause_at), "--pause-for", str(args.pause_for),
    ]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    events = {}
    nodes = []

    def read():
        for line in proc.stdout:
            now = time.monotonic()
            sys.stdout.write("  example: " + line)
            if line.startswith("nodes: "):
                nodes.extend(line[len("nodes: "):].strip().split(","))
                events["start"] = now
            elif "node 0 paused" in line:
                events["paused"] = now
            elif "node 0 resumed" in line:
                events["resumed"] = now
            elif "workload done" in line:
                events["done"] = now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{args.port}/metrics"
    scrapes = []
    limit = time.monotonic() + args.seconds + 600  # a first build can take minutes
    next_at = time.monotonic()
    while proc.poll() is None and time.monotonic() < limit:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
            scrapes.append((time.monotonic(), reduce(parse(text))))
        except OSError:
            pass  # not listening yet, or gone
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.monotonic()))
    if proc.poll() is None:
        proc.kill()
        sys.exit("the example did not finish in time")
    reader.join(timeout=5)
    if proc.returncode != 0:
        sys.exit(f"the example failed with {proc.returncode}")
    t0 = events.get("start")
    if t0 is None:
        sys.exit("the example never printed its nodes")
    # Keep the last scrape before the workload started as the baseline.
    before = [s for s in scrapes if s[0] < t0]
    scrapes = before[-1:] + [s for s in scrapes if s[0] >= t0]
    data = {
        "nodes": nodes,
        "events": {k: round(v - t0, 3) for k, v in events.items()},
        "scrapes": [{"t": round(t - t0, 3), "v": v} for t, v in scrapes],
    }
    return data


# ---------------------------------------------------------------------------------------
# Derived series.


def rates(scrapes, key):
    pts = []
    for a, b in zip(scrapes, scrapes[1:]):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        d = b["v"].get(key, 0.0) - a["v"].get(key, 0.0)
        pts.append(((a["t"] + b["t"]) / 2, max(0.0, d) / dt))
    return pts


def quantiles(scrapes, qs, window=2):
    """Per window: the quantiles of the acquired attempts' latency (ms), interpolated
    within buckets like Prometheus's histogram_quantile."""
    out = {q: [] for q in qs}
    for i in range(window, len(scrapes)):
        a, b = scrapes[i - window], scrapes[i]
        les = sorted(
            (float(k.split("|")[1]) if k.split("|")[1] != "+Inf" else math.inf, k)
            for k in b["v"]
            if k.startswith("bucket|")
        )
        deltas = [(le, b["v"][k] - a["v"].get(k, 0.0)) for le, k in les]
        if not deltas or deltas[-1][1] <= 0:
            continue
        total = deltas[-1][1]
        t = (a["t"] + b["t"]) / 2
        for q in qs:
            rank, prev_le, prev_c = q * total, 0.0, 0.0
            for le, c in deltas:
                if c >= rank:
                    if math.isinf(le):
                        v = prev_le
                    else:
                        frac = (rank - prev_c) / (c - prev_c) if c > prev_c else 1.0
                        v = prev_le + (le - prev_le) * frac
                    out[q].append((t, v * 1000.0))
                    break
                prev_le, prev_c = le, c
    return out


# ---------------------------------------------------------------------------------------
# Drawing.


def nice_ticks(lo, hi, n=5):
    span = hi - lo
    if span <= 0:
        return [lo, lo + 1]
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


class Svg:
    def __init__(self, title, height):
        self.h = height
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
            f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">',
            f'<rect width="{W}" height="{height}" fill="white"/>',
            f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="15" '
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

    def polyline(self, pts, color, width=1.8, dash=None):
        if len(pts) < 2:
            return
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.add(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{width}"{d}/>')

    def save(self, path):
        self.add("</svg>")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(self.parts) + "\n")
        print(f"wrote {path}")


def panel(svg, top, title, ylabel, series, tmax, events, log=False):
    """One panel: `series` is a list of (label, color, dash, [(t, v)])."""
    pw = W - ML - MR
    values = [v for _, _, _, pts in series for _, v in pts if v > 0 or not log]
    if log:
        lo = 10 ** math.floor(math.log10(min(values))) if values else 0.1
        hi = 10 ** math.ceil(math.log10(max(values))) if values else 10
        if hi <= lo:
            hi = lo * 10

        def Y(v):
            v = max(v, lo)
            return top + PANEL_H - (math.log10(v) - math.log10(lo)) / (
                math.log10(hi) - math.log10(lo)) * PANEL_H

        ticks = []
        d = lo
        while d <= hi * 1.0001:
            ticks.append(d)
            d *= 10
    else:
        vmax = max(values) if values else 1.0
        ticks = nice_ticks(0, vmax * 1.05)
        ytop = ticks[-1] if ticks[-1] >= vmax else vmax * 1.1

        def Y(v):
            return top + PANEL_H - v / ytop * PANEL_H

    def X(t):
        return ML + t / tmax * pw

    if "paused" in events:
        x1 = X(events["paused"])
        x2 = X(events.get("resumed", tmax))
        svg.add(f'<rect x="{x1:.1f}" y="{top}" width="{x2 - x1:.1f}" height="{PANEL_H}" '
                f'fill="#fbe3e3"/>')
        svg.text((x1 + x2) / 2, top + 14, "node 0 paused (SIGSTOP)", font_size="11",
                 fill="#a33")
    svg.text(ML, top - 8, title, anchor="start", font_weight="bold")
    for t in ticks:
        svg.line(ML, Y(t), ML + pw, Y(t), "#e4e4e4")
        svg.text(ML - 6, Y(t) + 4, f"{t:g}", anchor="end")
    for t in nice_ticks(0, tmax, 8):
        svg.line(X(t), top + PANEL_H, X(t), top + PANEL_H + 4)
        svg.text(X(t), top + PANEL_H + 16, f"{t:g}")
    svg.line(ML, top + PANEL_H, ML + pw, top + PANEL_H)
    svg.line(ML, top, ML, top + PANEL_H)
    svg.add(f'<text x="20" y="{top + PANEL_H / 2}" text-anchor="middle" font-size="11" '
            f'transform="rotate(-90 20 {top + PANEL_H / 2})">{esc(ylabel)}</text>')
    x0 = W - MR + 14
    for i, (label, color, dash, pts) in enumerate(series):
        svg.polyline([(X(t), Y(v)) for t, v in pts], color, 1.8, dash)
        y = top + 8 + i * 17
        svg.line(x0, y, x0 + 24, y, color, 2.5, dash)
        svg.text(x0 + 30, y + 4, label, anchor="start", font_size="11")


def plot(data, path):
    scrapes = data["scrapes"]
    events = data["events"]
    if len(scrapes) < 3:
        sys.exit("too few scrapes to plot")
    tmax = max(s["t"] for s in scrapes)
    nodes = data["nodes"]

    def node_index(label):
        # The label is the node's address as errors show it; match it to the URL list.
        for i, u in enumerate(nodes):
            if label.endswith(u.split("@")[-1].replace("redis://", "")):
                return i
        return len(nodes)

    n_panels = 4
    height = MT + n_panels * PANEL_H + (n_panels - 1) * GAP + MB
    svg = Svg("quorumlock metrics of a real run (examples/metrics.rs, scraped every second)",
              height)
    tops = [MT + i * (PANEL_H + GAP) for i in range(n_panels)]

    outcomes = sorted({k.split("|")[1] for s in scrapes for k in s["v"] if k.startswith("acquire|")},
                      key=lambda o: list(OUTCOME_COLORS).index(o) if o in OUTCOME_COLORS else 99)
    panel(svg, tops[0], "acquisition attempts per second, by outcome",
          "attempts / s",
          [(o, OUTCOME_COLORS.get(o, "#333"), None, rates(scrapes, f"acquire|{o}"))
           for o in outcomes], tmax, events)

    qs = quantiles(scrapes, (0.5, 0.9, 0.99))
    panel(svg, tops[1], "acquire latency of acquired attempts (2 s windows)", "ms (log)",
          [("p50", "#2ca02c", None, qs[0.5]), ("p90", "#ff7f0e", None, qs[0.9]),
           ("p99", "#d62728", None, qs[0.99])], tmax, events, log=True)

    labels = sorted({k.split("|")[1] for s in scrapes for k in s["v"] if k.startswith("node|")},
                    key=node_index)
    answered, failed = [], []
    for lab in labels:
        i = node_index(lab)
        color = NODE_COLORS[i % len(NODE_COLORS)]
        answered.append((f"node {i}", color, None, rates(scrapes, f"node|{lab}|answered")))
        failed.append((f"node {i}", color, None, rates(scrapes, f"node|{lab}|failed")))
    panel(svg, tops[2], "requests per second answered by each node (granted or refused)",
          "requests / s", answered, tmax, events)
    panel(svg, tops[3], "requests per second that timed out or failed, by node",
          "requests / s", failed, tmax, events)
    svg.text((W - MR + ML) / 2, height - 12, "seconds since the workload started")
    svg.save(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=40)
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--pause-at", type=int, default=15)
    p.add_argument("--pause-for", type=int, default=10)
    p.add_argument("--out", default="docs/img/metrics.svg")
    p.add_argument("--data", default="bench-out/metrics-scrapes.json")
    p.add_argument("--from", dest="source", help="plot saved scrapes instead of running")
    args = p.parse_args()
    if args.source:
        with open(args.source) as f:
            data = json.load(f)
    else:
        data = run(args)
        os.makedirs(os.path.dirname(args.data) or ".", exist_ok=True)
        with open(args.data, "w") as f:
            json.dump(data, f)
        print(f"wrote {args.data}")
    plot(data, args.out)


if __name__ == "__main__":
    main()
