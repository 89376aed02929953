#!/usr/bin/env bash
# Prints the simulator's JSON for a fixed set of cells, wall time removed, so two builds can
# be compared: speed work on the engine, the index or the event loop must not change a result.
#
#   bash bench/sim-golden.sh target/release/kvroute > before.jsonl
#   ... change, build ...
#   bash bench/sim-golden.sh target/release/kvroute | diff before.jsonl - && echo same
set -euo pipefail
bin=${1:-target/release/kvroute}
trace=${TRACE:-../shared/data/mooncake/conversation_trace.jsonl}
sim() { "$bin" simulate --json "$@" | sed -E 's/"wall_seconds":[0-9.e+-]+,?//'; }

# The speed run, every policy.
sim --profile mocker-poly --workload "mooncake:$trace" --workers 8 \
  --policy round_robin,kv,predictive
# The conversation trace at 3x on 4 workers.
sim --profile mocker-poly --workload "mooncake:$trace" --workers 4 --speedup 3 \
  --policy kv,predictive --admission none
# Calibration cells (multi-turn chat, H200).
sim --profile h200-llama3-70b-fp8 --workload multiturn --workers 3 --concurrency 60,180 \
  --ramp-secs 60 --warmup-secs 120 --duration-secs 420 --policy round_robin,kv,predictive \
  --admission none
# The study's N=2 cells: no admission, shedding, queueing.
for adm in none shed queue; do
  sim --profile a100-40g-qwen3-8b --workload "mooncake:$trace" --max-input-tokens 16384 \
    --limit 1000 --workers 2 --policy kv,predictive --admission "$adm"
done
# Delayed KV events; a synthetic closed loop.
sim --profile mocker-poly --workload "mooncake:$trace" --limit 3000 --workers 4 \
  --policy kv --kv-event-delay-ms 50 --admission none
sim --profile tiny --workload synthetic --workers 4 --concurrency 32 --limit 4000 \
  --policy kv,predictive,round_robin
