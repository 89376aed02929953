#!/usr/bin/env bash
# Approximate tracking, live: four simulated workers (kvroute worker, 16-token blocks, a KV
# cache of 512 blocks each, too small to hold every prefix on every worker) behind a gateway
# with the shipped tokenizer, driven by shared-prefix requests one at a time (nothing forces
# spreading). Three arms on fresh caches: round_robin; predictive with the workers' KV events
# (exact tracking: every repeat of a prefix lands where it is cached, the workload's ideal at
# this load); predictive with no event source (approximate tracking). Prints each arm's hit
# rate (cached / input tokens, from the workers' usage) and approximate / exact.
# Usage: bash bench/approx-live.sh [REQUESTS] [KV BLOCKS PER WORKER, default 512]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p kvroute
bin=target/release/kvroute
n="${1:-300}"
blocks="${2:-512}"
source bench/lib.sh

start_workers() {
  workers=()
  for i in 1 2 3 4; do
    local hp zp rp
    hp=$(free_port); zp=$(free_port); rp=$(free_port)
    "$bin" worker --port "$hp" --profile tiny-fast --speedup 20 --num-gpu-blocks "$blocks" --name "w$i" \
      --zmq-publish "tcp://127.0.0.1:$zp" --zmq-replay "tcp://127.0.0.1:$rp" >/dev/null 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$hp/health"
    workers+=("http://127.0.0.1:$hp=tcp://127.0.0.1:$zp=tcp://127.0.0.1:$rp")
  done
}

arm() {
  local policy=$1 events=$2 gp specs=()
  start_workers
  for w in "${workers[@]}"; do
    if [ "$events" = yes ]; then specs+=(--worker "$w"); else specs+=(--worker "${w%%=*}"); fi
  done
  gp=$(free_port)
  "$bin" serve --port "$gp" --policy "$policy" --tokenizer builtin --block-size 16 "${specs[@]}" >/dev/null 2>&1 &
  local gpid=$!
  pids+=($gpid)
  wait_http "http://127.0.0.1:$gp/health"
  "$bin" loadgen --target "http://127.0.0.1:$gp" --workload synthetic --concurrency 1 \
    --conversations "$n" --prefixes 24 --prefix-tokens 512 --suffix-tokens 32 --zipf-s 0 \
    --max-tokens 4 --seed 7 --json 2>/dev/null |
    python3 -c 'import json,sys; s=json.load(sys.stdin); s=s.get("summary", s); print(s["hit_rate"], s["completed"], s["failed"])'
  cleanup
  pids=()
}

echo "requests per arm: $n, $blocks KV blocks per worker (24 prefixes of 512 tokens, uniform, 32-token suffixes, concurrency 1)"
read -r rr rr_done rr_failed < <(arm round_robin yes)
read -r ex ex_done ex_failed < <(arm predictive yes)
read -r ap ap_done ap_failed < <(arm predictive no)
printf 'round_robin            hit rate %.4f (completed %s, failed %s)\n' "$rr" "$rr_done" "$rr_failed"
printf 'predictive, events     hit rate %.4f (completed %s, failed %s)\n' "$ex" "$ex_done" "$ex_failed"
printf 'predictive, no events  hit rate %.4f (completed %s, failed %s)\n' "$ap" "$ap_done" "$ap_failed"
python3 -c "print('approximate / exact: %.4f' % ($ap / $ex))"
