#!/usr/bin/env bash
# The `metrics` feature's cost in instructions per uncontended acquire + release cycle,
# counted by callgrind (independent of the machine's load; see
# benches/metrics_instructions.rs).
#
# Builds the bench twice (without and with `metrics`), runs each variant under
# `valgrind --tool=callgrind` at two cycle counts, and reports
#   (instructions at LONG cycles - instructions at SHORT cycles) / (LONG - SHORT)
# per variant: off (no metric code), on without a recorder, on recording into Prometheus,
# and the ratios to off. Writes bench-out/metrics-instructions.json.
#
# Usage: scripts/bench-metrics-instructions.sh [SHORT LONG]   (default 200 1200)
set -euo pipefail
cd "$(dirname "$0")/.."
short=${1:-200}
long=${2:-1200}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
mkdir -p bench-out/callgrind

build() { # features (none, or `metrics`) -> path of the bench executable
  cargo bench ${1:+--features "$1"} --bench metrics_instructions --no-run 2>&1 |
    sed -n 's/.*Executable benches\/metrics_instructions\.rs (\(.*\))/\1/p' | tail -1
}
off=$(build "")
on=$(build metrics)
[ -n "$off" ] && [ -n "$on" ] || { echo "could not build the bench" >&2; exit 1; }

count() { # binary recorder cycles -> instructions
  local out="bench-out/callgrind/$3-$2-$(basename "$1").out"
  QL_CYCLES=$3 QL_RECORDER=$2 valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$1" >/dev/null 2>bench-out/callgrind/last.log || { cat bench-out/callgrind/last.log >&2; exit 1; }
  sed -n 's/^summary: //p' "$out"
}
per_cycle() { # binary recorder -> instructions per cycle
  local a b
  a=$(count "$1" "$2" "$short")
  b=$(count "$1" "$2" "$long")
  echo $(( (b - a) / (long - short) ))
}
echo "counting (each run is slow under valgrind) ..." >&2
i_off=$(per_cycle "$off" none)
i_noop=$(per_cycle "$on" none)
i_rec=$(per_cycle "$on" prometheus)
python3 - "$i_off" "$i_noop" "$i_rec" "$short" "$long" <<'PY'
import json, sys
off, noop, rec, short, long = map(int, sys.argv[1:])
rows = {"metrics-off": off, "metrics-on-no-recorder": noop, "metrics-on-prometheus": rec}
for name, v in rows.items():
    print(f"{name:<26} {v:>9} instructions per cycle  {v / off:.4f}x off")
json.dump({"cycles": [short, long], "instructions_per_cycle": rows,
           "ratio_to_off": {k: round(v / off, 4) for k, v in rows.items()}},
          open("bench-out/metrics-instructions.json", "w"), indent=1)
PY
