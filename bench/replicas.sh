#!/usr/bin/env bash
# The race between selection and booking with several router replicas (gateways), in the
# simulator: N replicas, each routing the conversations assigned to it round-robin (trace
# requests by number), their bookings reaching the others after 0 / 1 / 10 ms or never.
# Prints goodput req/s, hit rate and TTFT p95 per cell (docs/scale-out.md quotes them).
# Usage: bash bench/replicas.sh [POLICY] (default goodput); needs target/release/kvroute
# (or the binary K names).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-target/release/kvroute}
[ -x "$K" ] || cargo build --release -q -p kvroute
POLICY=${1:-goodput}
TRACE=${TRACE:-../shared/data/mooncake/conversation_trace.jsonl}
cell() { # args...: prints "goodput hit ttft_p95"
  "$K" simulate "$@" --policy "$POLICY" 2>/dev/null | tail -1 |
    awk -F'|' '{gsub(/ /,"",$21); gsub(/ /,"",$17); gsub(/ /,"",$8); printf "%s / %s / %s", $21, $17, $8}'
}
run() { # label, simulate args
  local label=$1; shift
  printf '| %s | %s |' "$label" "$(cell "$@" --replicas 1)"
  for sync in 0 1 10 none; do
    printf ' %s |' "$(cell "$@" --replicas 3 --replica-sync-ms "$sync")"
  done
  echo
}
echo "policy $POLICY; each cell: goodput req/s / hit rate / TTFT p95 ms"
echo
echo "| load | 1 replica | 3, sync 0 ms | 3, 1 ms | 3, 10 ms | 3, never |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
REF="--profile h200-llama3-70b-fp8 --workload multiturn --workers 3 --ramp-secs 60 --warmup-secs 120 --duration-secs 420 --admission none"
for c in 60 120 180; do
  run "reference demo, $c conversations" $REF --concurrency "$c"
done
if [ -f "$TRACE" ]; then
  # The trace's timestamps come in 3 s steps: its requests spread over their step, and (the
  # worst case) all of a step's requests at one instant.
  for s in 1 2; do
    run "conversation trace, 4 x mocker-poly, ${s}x" --profile mocker-poly --workload "mooncake:$TRACE" --workers 4 --speedup "$s" --admission none --spread-bursts-secs 3
  done
  run "same, 1x, each step's requests at one instant" --profile mocker-poly --workload "mooncake:$TRACE" --workers 4 --speedup 1 --admission none
fi
