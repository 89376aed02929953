#!/usr/bin/env bash
# kvroute against sglang-router's `cache_aware` in front of the same engines without KV
# events: two simulated workers (kvroute worker, 16-token blocks, a KV cache of BLOCKS blocks
# each, too small for every prefix on both) behind each router on fresh caches, the same
# shared-prefix load on a fixed schedule (bench/shared_prefix_load.py: text prompts on
# /v1/completions, streamed, open loop). Arms: sglang-router 0.3.2 (PyPI, into
# target/bench-venv) with `--policy cache_aware`; kvroute with its default policy and the
# workers tracked approximately (no event source). Prints each arm's cache-read share
# (cached / prompt tokens, from the engines' usage), the load's ideal, TTFT mean and p50.
# Usage: bash bench/sglang-router.sh [REQUESTS 600] [RATE/s 8] [PREFIXES 16] [WORDS 600] [BLOCKS 1024]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p kvroute
bin=target/release/kvroute
n="${1:-600}"; rate="${2:-8}"; prefixes="${3:-16}"; words="${4:-600}"; blocks="${5:-1024}"
venv=target/bench-venv
if [ ! -x "$venv/bin/sglang-router" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'sglang-router==0.3.2'
fi
source bench/lib.sh

worker() { # port name
  "$bin" worker --port "$1" --profile tiny-fast --speedup 20 --num-gpu-blocks "$blocks" --name "$2" >/dev/null 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$1/health"
}

arm() { # label
  local label=$1 w1 w2 rp cal
  w1=$(free_port); w2=$(free_port); rp=$(free_port); cal=$(free_port)
  worker "$w1" w1; worker "$w2" w2; worker "$cal" calibration
  case "$label" in
    sglang-router)
      "$venv/bin/sglang-router" launch --host 127.0.0.1 --port "$rp" --policy cache_aware \
        --worker-urls "http://127.0.0.1:$w1" "http://127.0.0.1:$w2" >/dev/null 2>&1 &
      pids+=($!)
      ;;
    kvroute*)
      local policy=${label#kvroute-}
      "$bin" serve --port "$rp" --policy "$policy" --tokenizer builtin --block-size 16 \
        --worker "http://127.0.0.1:$w1" --worker "http://127.0.0.1:$w2" >/dev/null 2>&1 &
      pids+=($!)
      ;;
  esac
  wait_http "http://127.0.0.1:$rp/health"
  local model
  model=$(curl -sf "http://127.0.0.1:$w1/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
  python3 bench/shared_prefix_load.py "http://127.0.0.1:$rp" "$model" "$n" "$rate" "$prefixes" "$words" 7 "http://127.0.0.1:$cal" |
    python3 -c 'import json,sys; s=json.load(sys.stdin); print("| '"$label"' | %.4f | %.4f | %.1f | %.1f | %d / %d |" % (s["cache_read_share"], s["ideal_share"], s["ttft_mean_ms"], s["ttft_p50_ms"], s["completed"], s["completed"] + s["failed"]))'
  cleanup
  pids=()
}

echo "$n requests at $rate/s, $prefixes prefixes of ~$words words (uniform), 2 workers of $blocks blocks, no KV events"
echo
echo "| router | cache-read share | ideal | TTFT mean ms | TTFT p50 ms | completed |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for a in ${ARMS:-sglang-router kvroute-goodput kvroute-predictive}; do
  arm "$a"
done
