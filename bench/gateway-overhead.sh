#!/usr/bin/env bash
# Gateway overhead against a zero-delay worker: TTFT through the gateway versus direct at
# concurrency 1 and 64, short and long prompts, and the closed-loop request rate.
# Usage: bash bench/gateway-overhead.sh [REQUESTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
for mode in own-runtime same-thread; do
  cargo run --release --locked -q -p kvroute-gateway --example overhead -- "${1:-2000}" "${2:-5}" 30,2000 "$mode"
  echo
done
