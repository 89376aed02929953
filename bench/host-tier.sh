#!/usr/bin/env bash
# KV tiers in the fleet simulator: the Mooncake conversation trace on 8 `mocker-poly` engines
# whose device cache is cut to DEVICE blocks (default 2,048 of 64 tokens, an eighth of the
# profile's), at several replay speeds. Arms per policy: no host tier; a host tier of HOST
# blocks (default 32,768) the router charges at the default load ratio (0.1 of a prefill
# token, the engines' load time set to match: 1.5 us per token against ~15 us of prefill);
# the same tier charged as if loading cost as much as computing (ratio 1: host hits count
# for nothing in the cost). Prints one row per cell: goodput (TTFT <= SLO_TTFT ms and
# TPOT <= SLO_TPOT ms), output throughput, hit rate, TTFT p50/p95, prediction ratio.
# Usage: bash bench/host-tier.sh [SPEEDUPS, default 1,2,3] [DEVICE] [HOST] [SLO_TTFT] [SLO_TPOT]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p kvroute
bin=target/release/kvroute
trace=../shared/data/mooncake/conversation_trace.jsonl
speedups="${1:-1,2,3}"
device="${2:-2048}"
host="${3:-32768}"
slo_ttft="${4:-2000}"
slo_tpot="${5:-100}"

read -r -d '' fmt <<'PY' || true
import json, sys
s, policy, arm = sys.argv[1:4]
for line in sys.stdin:
    d = json.loads(line)
    g = d["goodput"]
    print("| %sx | %s | %s | %.2f (%.1f%%) | %.0f | %.4f | %.0f / %.0f | %.4f |" % (
        s, policy, arm, g["per_s"], 100 * g["fraction_of_sent"], d["output_tokens_per_s"],
        d["hit_rate"], d["ttft_ms"]["p50"], d["ttft_ms"]["p95"], d["prediction_ratio"]))
PY

echo "| speed-up | policy | arm | goodput req/s (share) | output tok/s | hit rate | TTFT p50 / p95 ms | predicted / cached |"
echo "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"
for s in ${speedups//,/ }; do
  for policy in kv predictive; do
    for arm in "no host tier" "host tier, ratio 0.1" "host tier, ratio 1"; do
      args=()
      case "$arm" in
        "no host tier") ;;
        "host tier, ratio 0.1") args=(--host-blocks "$host" --host-load-ratio 0.1) ;;
        "host tier, ratio 1") args=(--host-blocks "$host" --host-load-ratio 1) ;;
      esac
      "$bin" simulate --profile mocker-poly --workload "mooncake:$trace" --speedup "$s" \
        --workers 8 --policy "$policy" --num-gpu-blocks "$device" \
        --host-load-secs-per-token 1.5e-6 "${args[@]}" \
        --slo-ttft-ms "$slo_ttft" --slo-tpot-ms "$slo_tpot" --json 2>/dev/null |
        python3 -c "$fmt" "$s" "$policy" "$arm"
    done
  done
done
