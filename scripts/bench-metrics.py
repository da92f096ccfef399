#!/usr/bin/env python3
"""The cost of the `metrics` feature on the uncontended acquire + release cycle (Python
standard library only).

Builds the `lock` benchmark twice, without and with the feature, then runs its `metrics`
section alternately with each build (the order flips every pair, so a drift in the
machine's load hits both alike), PAIRS pairs in all. Each run starts its own 5 local
`redis-server` nodes, warms up, runs a Criterion group, then 3 timed rounds of 3000 cycles
per variant:

* `metrics-off`: built without the feature (no metric code at all);
* `metrics-recording`: built with it, recording into a Prometheus recorder (buckets as the
  operations guide recommends);
* `metrics-noop`: built with it, the recorder switched off (the facade's no-op handles),
  interleaved round by round with `metrics-recording` in the same process.

Prints, per variant, the median of the per-round p50 and mean latencies and of the
client process's CPU time per cycle (all its threads: the Tokio workers also spin while
they wait) over every run, with their spread (min–max and the middle half), the ratios to
`metrics-off`, and two paired ratios: each metrics run against the neighbouring run without
the feature, and recording against no-op within each metrics run (the most precise: same
process, same nodes, rounds interleaved). Writes them to bench-out/metrics-cost.json.

On a shared, loaded machine consecutive processes differ by ±25 % in wall time, far more
than the effect measured: compare medians over many pairs, and trust the same-process
ratio most. `QL_NO_RECORDER=1` makes the metrics build run without any recorder installed
(every call goes to the facade's no-op).

Usage: scripts/bench-metrics.py [PAIRS]   (default 6)
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time

FEATURES = {"off": [], "on": ["--features", "metrics"]}
OUT = "bench-out/metrics-cost"


def build(features):
    print(f"building the lock benchmark with {' '.join(features) or 'no features'} ...", flush=True)
    r = subprocess.run(
        ["cargo", "bench", *features, "--bench", "lock", "--no-run"],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        sys.exit(r.stderr)
    m = re.search(r"Executable benches/lock\.rs \(([^)]+)\)", r.stderr)
    if not m:
        sys.exit("no benchmark executable in cargo's output:\n" + r.stderr)
    return m.group(1)


def run(binary, tag):
    path = os.path.join(OUT, f"{tag}.jsonl")
    env = dict(os.environ, QL_SUMMARY=path)
    t = time.monotonic()
    r = subprocess.run([binary, "metrics", "--bench"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{tag} failed:\n{r.stdout}\n{r.stderr}")
    for line in r.stdout.splitlines():
        if line.startswith("[metrics]"):
            print(f"  {tag}: {line}")
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("section") in ("metrics", "meta"):
                row["run"] = tag
                rows.append(row)
    print(f"  {tag}: {time.monotonic() - t:.0f} s", flush=True)
    return rows


def spread(v):
    v = sorted(v)
    q = statistics.quantiles(v, n=4) if len(v) >= 4 else [v[0], statistics.median(v), v[-1]]
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "q1": q[0], "q3": q[2],
            "n": len(v)}


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    os.makedirs(OUT, exist_ok=True)
    bins = {k: build(f) for k, f in FEATURES.items()}
    rows = []
    for i in range(pairs):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        for k in order:
            rows += run(bins[k], f"{k}-{i}")
    loads = [r["loadavg_start"] for r in rows if r.get("section") == "meta"]
    per = {}
    run_p50 = {}
    for r in rows:
        if r.get("section") != "metrics":
            continue
        d = per.setdefault(r["impl"], {"p50": [], "mean": [], "cpu": []})
        d["p50"] += r["rounds_p50_us"]
        d["mean"] += r["rounds_mean_us"]
        d["cpu"] += r.get("rounds_cpu_us", [])
        run_p50[(r["run"], r["impl"])] = r["p50_us"]
    result = {"pairs": pairs, "loadavg_at_run_starts": loads, "variants": {}}
    base = statistics.median(per["metrics-off"]["p50"])
    base_mean = statistics.median(per["metrics-off"]["mean"])
    base_cpu = statistics.median(per["metrics-off"]["cpu"]) if per["metrics-off"]["cpu"] else None
    print(f"\n{pairs} pairs of runs, 3 rounds × 3000 cycles per variant per run; µs per cycle")
    print(f"load average at the start of each run: {', '.join(l.split()[0] for l in loads)}")
    for name in ("metrics-off", "metrics-noop", "metrics-recording"):
        if name not in per:
            continue
        p, m = spread(per[name]["p50"]), spread(per[name]["mean"])
        result["variants"][name] = {"p50_us": p, "mean_us": m,
                                    "p50_vs_off": p["median"] / base,
                                    "mean_vs_off": m["median"] / base_mean}
        print(f"{name:<18} p50 {p['median']:7.1f} (min {p['min']:.1f}, middle half "
              f"{p['q1']:.1f}–{p['q3']:.1f}, max {p['max']:.1f}; {p['n']} rounds)  "
              f"mean {m['median']:7.1f} (middle half {m['q1']:.1f}–{m['q3']:.1f})  "
              f"p50 ×{p['median'] / base:.3f}, mean ×{m['median'] / base_mean:.3f} vs off")
        if per[name]["cpu"] and base_cpu:
            c = spread(per[name]["cpu"])
            result["variants"][name]["cpu_us_per_cycle"] = c
            result["variants"][name]["cpu_vs_off"] = c["median"] / base_cpu
            print(f"{'':<18} client CPU per cycle {c['median']:6.1f} µs (middle half "
                  f"{c['q1']:.1f}–{c['q3']:.1f}) ×{c['median'] / base_cpu:.3f} vs off")
    # Paired: each run of the metrics build against the neighbouring run without it.
    ratios = []
    for i in range(pairs):
        off = run_p50.get((f"off-{i}", "metrics-off"))
        on = run_p50.get((f"on-{i}", "metrics-recording"))
        if off and on:
            ratios.append(on / off)
    if ratios:
        s = spread(ratios)
        result["paired_recording_vs_off_p50"] = s
        print(f"paired runs, recording / off (run p50s): median ×{s['median']:.3f}, "
              f"range ×{s['min']:.3f}–×{s['max']:.3f}")
    noop_pairs = []
    for i in range(pairs):
        rec = run_p50.get((f"on-{i}", "metrics-recording"))
        noop = run_p50.get((f"on-{i}", "metrics-noop"))
        if rec and noop:
            noop_pairs.append(rec / noop)
    if noop_pairs:
        s = spread(noop_pairs)
        result["same_process_recording_vs_noop_p50"] = s
        print(f"same process, recording / no-op (run p50s): median ×{s['median']:.3f}, "
              f"range ×{s['min']:.3f}–×{s['max']:.3f}")
    with open("bench-out/metrics-cost.json", "w") as f:
        json.dump(result, f, indent=1)
    print("wrote bench-out/metrics-cost.json")


if __name__ == "__main__":
    main()
