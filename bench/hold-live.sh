#!/usr/bin/env bash
# The burst hold live: `kvroute demo --gateways 3` (simulated workers at --speedup 20, a
# nats-server the demo starts) with router.peer_hold_secs = HOLD_SECS and
# router.peer_hold_max_cached = MAX_CACHED, and one `kvroute loadgen` (multi-turn
# conversations) against each gateway at once. Prints, per gateway, requests, TTFT p50 /
# p95 ms, hit rate, and how many requests the hold held (kvroute_peer_hold_seconds_count).
# Usage: bash bench/hold-live.sh HOLD_SECS [MAX_CACHED] [CONCURRENCY] [SECS]
# (defaults 0.5, 8 and 15); needs nats-server and target/release/kvroute (or K).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
K=${K:-target/release/kvroute}
[ -x "$K" ] || cargo build --release -q -p kvroute
HOLD=${1:?usage: bash bench/hold-live.sh HOLD_SECS [MAX_CACHED] [CONCURRENCY] [SECS]}
MAX_CACHED=${2:-0.5}
CONC=${3:-8}
SECS=${4:-15}
dir=$(mktemp -d)
trap 'cleanup; rm -rf "$dir"' EXIT
printf '[router]\npeer_hold_secs = %s\npeer_hold_max_cached = %s\n' "$HOLD" "$MAX_CACHED" > "$dir/gateway.toml"
port=$(free_port)
"$K" demo --gateways 3 --port "$port" --speedup 20 --no-ui --baseline-policy none \
  --config "$dir/gateway.toml" > "$dir/demo.log" 2>&1 &
pids+=($!)
for g in 0 1 2; do wait_http "http://127.0.0.1:$((port + g))/health" || { tail -20 "$dir/demo.log"; exit 1; }; done
sleep 2 # the gateways hear from each other (load heartbeats)
for g in 0 1 2; do
  "$K" loadgen --target "http://127.0.0.1:$((port + g))" --concurrency "$CONC" \
    --duration-secs "$SECS" --seed "$((g + 1))" --json > "$dir/g$g.json" 2> "$dir/g$g.log" &
  lg[$g]=$!
done
for g in 0 1 2; do wait "${lg[$g]}" || { tail -5 "$dir/g$g.log"; exit 1; }; done
echo "hold ${HOLD} s, max cached share ${MAX_CACHED}, concurrency ${CONC} x 3 gateways, ${SECS} s"
echo "| gateway | requests | TTFT p50 / p95 ms | hit rate | held |"
echo "| --- | ---: | ---: | ---: | ---: |"
for g in 0 1 2; do
  held=$(curl -sf "http://127.0.0.1:$((port + g))/metrics" | awk '/^kvroute_peer_hold_seconds_count/ {print $2}')
  python3 - "$dir/g$g.json" "$g" "${held:-0}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {r.get('completed', r.get('requests'))} | {r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p95']:.1f} | {r.get('hit_rate', float('nan')):.4f} | {sys.argv[3]} |")
PY
done
