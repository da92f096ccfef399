#!/usr/bin/env bash
# Where an uncontended acquire + release cycle's cost goes, counted rather than timed (see
# benches/cycle_instructions.rs): for quorumlock, the raw floor and rslock, with 1 task and
# with 16 tasks sharing one client,
#   * user-space instructions per cycle (valgrind --tool=callgrind),
#   * system calls per cycle, by name (`perf trace -s` when it works, else `strace -f`;
#     the redis-server child processes and their threads are left out; strace stops the
#     process at every call, which changes how requests of concurrent tasks batch, so
#     prefer perf),
# each as (count at LONG cycles - count at SHORT cycles) / (LONG - SHORT), which cancels
# start-up and shut-down. Then quorumlock's top functions by inclusive instructions per
# cycle (callgrind_annotate of both runs, subtracted). Writes
# bench-out/cycle-instructions.json; the callgrind and strace files stay in
# bench-out/cycle/.
#
# Usage: scripts/bench-cycle-instructions.sh [SHORT LONG]   (default 400 2000; multiples of 16)
#        QL_IMPLS="quorumlock floor" QL_TASK_COUNTS="1" QL_SKIP_STRACE=1 ... to do less.
set -euo pipefail
cd "$(dirname "$0")/.."
short=${1:-400}
long=${2:-2000}
impls=${QL_IMPLS:-quorumlock floor rslock}
task_counts=${QL_TASK_COUNTS:-1 16}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
tracer=strace
if [ -z "${QL_STRACE:-}" ] && perf trace -s -o /dev/null true >/dev/null 2>&1; then tracer=perf; fi
[ "$tracer" = perf ] || command -v strace >/dev/null || [ -n "${QL_SKIP_STRACE:-}" ] ||
  { echo "neither perf trace nor strace works: apt-get install strace (or QL_SKIP_STRACE=1)" >&2; exit 1; }
out=bench-out/cycle
mkdir -p "$out"

bin=$(cargo bench --bench cycle_instructions --no-run 2>&1 |
  sed -n 's/.*Executable benches\/cycle_instructions\.rs (\(.*\))/\1/p' | tail -1)
[ -n "$bin" ] || { echo "could not build the bench" >&2; exit 1; }

run_callgrind() { # impl tasks cycles -> callgrind file
  local f="$out/cg-$1-$2-$3.out"
  QL_IMPL=$1 QL_TASKS=$2 QL_CYCLES=$3 valgrind --tool=callgrind --callgrind-out-file="$f" \
    "$bin" >/dev/null 2>"$out/last.log" || { cat "$out/last.log" >&2; exit 1; }
  echo "$f"
}
run_strace() { # impl tasks cycles -> trace file
  local f="$out/$tracer-$1-$2-$3.txt"
  if [ "$tracer" = perf ]; then
    QL_IMPL=$1 QL_TASKS=$2 QL_CYCLES=$3 perf trace -s -o "$f" "$bin" >/dev/null 2>"$out/last.log"
  else
    QL_IMPL=$1 QL_TASKS=$2 QL_CYCLES=$3 strace -f -qq -o "$f" "$bin" >/dev/null 2>"$out/last.log"
  fi || { cat "$out/last.log" >&2; exit 1; }
  echo "$f"
}

echo "counting (slow under valgrind) ..." >&2
files=()
for impl in $impls; do
  for t in $task_counts; do
    a=$(run_callgrind "$impl" "$t" "$short")
    b=$(run_callgrind "$impl" "$t" "$long")
    files+=("cg:$impl:$t:$a:$b")
    if [ -z "${QL_SKIP_STRACE:-}" ]; then
      a=$(run_strace "$impl" "$t" "$short")
      b=$(run_strace "$impl" "$t" "$long")
      files+=("st:$impl:$t:$a:$b")
    fi
  done
done

python3 - "$short" "$long" "${files[@]}" <<'PY'
import json, re, subprocess, sys
from collections import Counter, defaultdict

short, long = int(sys.argv[1]), int(sys.argv[2])
n = long - short

def summary(path):
    for line in open(path):
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"no summary in {path}")

def inclusive(path):
    """function -> inclusive instructions (callgrind_annotate --inclusive=yes)."""
    txt = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=99.9", path],
                         capture_output=True, text=True, check=True).stdout
    out = {}
    for line in txt.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if m and ":" in m.group(2):
            fn = m.group(2).split(":", 1)[1].strip()
            fn = re.sub(r"\s*\[[^\]]*\]$", "", fn)
            out[fn] = out.get(fn, 0) + int(m.group(1).replace(",", ""))
    return out

SPAWN = re.compile(r"^(\d+)\s+(?:clone3?|fork|vfork)\(.*=\s*(\d+)\s*$")
RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (?:clone3?|fork|vfork) resumed>.*=\s*(\d+)\s*$")
CALL = re.compile(r"^(\d+)\s+(?:<\.\.\. )?([a-z_0-9]+)[( ]")

SERVER_THREADS = ("redis-server", "bio_", "jemalloc")

def perf_syscalls(path):
    """syscall name -> calls by the bench's threads (`perf trace -s`'s per-thread tables)."""
    calls, ours = Counter(), False
    for line in open(path, errors="replace"):
        m = re.match(r"^ (\S.*) \((\d+)\), \d+ events", line)
        if m:
            ours = not m.group(1).startswith(SERVER_THREADS)
            continue
        m = re.match(r"^\s+([a-z_0-9]+)\s+(\d+)\s+\d+\s", line)
        if ours and m:
            calls[m.group(1)] += int(m.group(2))
    return calls

def syscalls(path):
    """syscall name -> calls by the bench process (redis-server subtrees excluded)."""
    if "/perf-" in path:
        return perf_syscalls(path)
    parent, servers, calls = {}, set(), []
    for line in open(path, errors="replace"):
        m = SPAWN.match(line) or RESUMED.match(line)
        if m:
            parent[int(m.group(2))] = int(m.group(1))
        if 'execve("' in line and "redis-server" in line.split("execve(", 1)[1][:200]:
            servers.add(int(line.split()[0]))
        m = CALL.match(line)
        if m and "resumed>" not in line:
            calls.append((int(m.group(1)), m.group(2)))
    def is_server(pid):
        for _ in range(64):
            if pid in servers:
                return True
            if pid not in parent:
                return False
            pid = parent[pid]
        return False
    return Counter(name for pid, name in calls if not is_server(pid))

# The runtime's and the thread's own frames, which include everything.
SCAFFOLD = ("start_thread", "std::", "<std::", "core::ops::function", "tokio::runtime::",
            "<tokio::runtime::", "cycle_instructions::main")

results = defaultdict(dict)
profiles = {}
for spec in sys.argv[3:]:
    kind, impl, tasks, a, b = spec.split(":", 4)
    key = f"{impl} x{tasks}"
    if kind == "cg":
        results[key]["instructions"] = (summary(b) - summary(a)) // n
        if impl == "quorumlock":
            ia, ib = inclusive(a), inclusive(b)
            profiles[key] = sorted(((ib[f] - ia.get(f, 0)) / n, f) for f in ib)[::-1]
    else:
        ca, cb = syscalls(a), syscalls(b)
        per = {s: (cb[s] - ca.get(s, 0)) / n for s in cb}
        per = {s: round(v, 2) for s, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05}
        results[key]["syscalls"] = per
        results[key]["syscalls_total"] = round(sum(per.values()), 1)

print(f"\nper cycle (cycles {short} -> {long}, subtracted)")
for tasks in sorted({k.split(" x")[1] for k in results}, key=int):
    floor = results.get(f"floor x{tasks}", {})
    print(f"\n{tasks} task(s):")
    for key, r in results.items():
        if not key.endswith(f" x{tasks}"):
            continue
        ins = r.get("instructions")
        rel = f"  {ins / floor['instructions']:.2f}x floor" if ins and floor.get("instructions") else ""
        sc = r.get("syscalls_total")
        print(f"  {key.split(' x')[0]:<11} {ins:>9,} instructions{rel}" +
              (f"   {sc:>6} syscalls: " + ", ".join(f"{s} {v}" for s, v in r["syscalls"].items())
               if sc is not None else ""))
for key, prof in profiles.items():
    print(f"\nquorumlock, {key.split(' x')[1]} task(s): top inclusive functions, instructions per cycle")
    shown = 0
    for v, f in prof:
        if shown >= 45:
            break
        if f.startswith(SCAFFOLD):
            continue
        print(f"  {v:>10,.0f}  {f[:150]}")
        shown += 1
json.dump({"cycles": [short, long], "results": results,
           "quorumlock_inclusive_top": {k: [[round(v), f] for v, f in p[:80]] for k, p in profiles.items()}},
          open("bench-out/cycle-instructions.json", "w"), indent=1)
PY
