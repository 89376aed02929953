#!/usr/bin/env bash
# Replay speed of two or more builds of `kvroute`, measured in turns so every build sees the
# same spells of a shared machine: the whole conversation trace on 8 `mocker-poly` engines,
# RUNS runs per build, alternating; prints each build's median, min and max speed factor
# (simulated seconds over wall seconds).
#
#   bash bench/sim-speed-ab.sh RUNS POLICY BIN [BIN...]
#   bash bench/sim-speed-ab.sh 12 kv /tmp/kvroute-before target/release/kvroute
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 RUNS POLICY BIN [BIN...]" >&2
  exit 2
fi
runs=$1 policy=$2
shift 2
trace=${TRACE:-../shared/data/mooncake/conversation_trace.jsonl}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  for bin in "$@"; do
    "$bin" simulate --profile mocker-poly --workload "mooncake:$trace" --workers 8 \
      --policy "$policy" --json |
      sed -E 's/.*"sim_seconds":([0-9.e+-]+).*"wall_seconds":([0-9.e+-]+).*/\1 \2/' |
      awk -v b="$bin" '{ printf "%s %.0f\n", b, $1 / $2 }' >> "$out"
  done
done
for bin in "$@"; do
  grep -F "$bin " "$out" | awk '{ print $2 }' | sort -n |
    awk -v b="$bin" '{ v[NR] = $1 } END {
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%s: median %.0fx, min %.0fx, max %.0fx (%d runs)\n", b, m, v[1], v[NR], NR }'
done
