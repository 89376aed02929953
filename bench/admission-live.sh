#!/usr/bin/env bash
# Admission against workers given by --worker, live: three simulated workers (kvroute worker,
# `tiny-fast`, real time) behind `kvroute serve`, which learns each one's KV capacity from its
# /metrics (`vllm:cache_config_info`, as a vLLM engine publishes it), driven by the multi-turn
# chat load at a concurrency far past what the fleet serves. One arm per admission mode
# (none, shed, queue) on fresh workers, then shed and queue again with each worker's batch
# limit given (`max_batch`: no engine publishes its `max_num_seqs`). Prints per arm: requests completed and refused, TTFT
# p50 / p99 of the completed ones, TTFT p50 / p99 over all sent (refused ones count as never
# served), output tokens/s, and the gateway's learned capacity.
# Usage: bash bench/admission-live.sh [CONCURRENCY, default 200] [SECONDS, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p kvroute
bin=target/release/kvroute
conc="${1:-200}"
secs="${2:-60}"
logs=$(mktemp -d)
source bench/lib.sh

arm() {
  local mode=$1 batch=${2:-} specs=() gp conf="$logs/gateway.toml"
  : > "$conf"
  for i in 1 2 3; do
    local hp zp rp
    hp=$(free_port); zp=$(free_port); rp=$(free_port)
    "$bin" worker --port "$hp" --profile tiny-fast --name "w$i" --tokenizer builtin \
      --zmq-publish "tcp://127.0.0.1:$zp" --zmq-replay "tcp://127.0.0.1:$rp" >/dev/null 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$hp/health"
    if [ -n "$batch" ]; then
      printf '[[workers]]\nurl = "http://127.0.0.1:%s"\nevents = "tcp://127.0.0.1:%s"\nreplay = "tcp://127.0.0.1:%s"\nmax_batch = %s\n' \
        "$hp" "$zp" "$rp" "$batch" >> "$conf"
    else
      specs+=(--worker "http://127.0.0.1:$hp=tcp://127.0.0.1:$zp=tcp://127.0.0.1:$rp")
    fi
  done
  gp=$(free_port)
  "$bin" serve --config "$conf" --port "$gp" --tokenizer builtin --admission "$mode" "${specs[@]}" >/dev/null 2>"$logs/serve-$mode.log" &
  pids+=($!)
  wait_http "http://127.0.0.1:$gp/health"
  sleep 3  # a health round: the workers' capacity is read with their /metrics
  local learned
  learned=$(sed 's/\x1b\[[0-9;]*m//g' "$logs/serve-$mode.log" | { grep -o 'kv_blocks=[0-9]*' || true; } | cut -d= -f2 | paste -sd, -)
  "$bin" loadgen --target "http://127.0.0.1:$gp" --concurrency "$conc" --conversations 1000000 --duration-secs "$secs" \
    --max-tokens 64 --seed 7 --json 2>"$logs/loadgen-$mode.log" |
    python3 -c '
import json, sys
s = json.load(sys.stdin); s = s.get("summary", s)
f = lambda v: "-" if v is None else (v if isinstance(v, str) else "%.0f" % v)
t, a = s["ttft_ms"], s["ttft_all_ms"]
print("%-15s completed %6d  refused %6d  failed %4d  TTFT p50/p99 %s/%s ms  over all sent %s/%s ms  %s out tok/s  learned KV blocks [%s]" % (
    sys.argv[1], s["completed"], s["rejected"], s["failed"], f(t.get("p50")), f(t.get("p99")),
    f(a.get("p50")), f(a.get("p99")), f(s.get("output_tokens_per_s")), sys.argv[2]))
' "$mode${batch:+, max_batch $batch}" "$learned"
  cleanup
  pids=()
}

echo "3 tiny-fast workers, chat load at concurrency $conc for $secs s, max_tokens 64"
[ -n "${ONLY_BATCH:-}" ] || for mode in none shed queue; do arm "$mode"; done
# The engines' batch limit (tiny-fast: max_num_seqs 32) is published by no engine: given.
for mode in shed queue; do arm "$mode" 32; done
