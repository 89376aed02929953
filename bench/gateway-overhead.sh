#!/usr/bin/env bash
# Gateway overhead against a zero-delay worker: TTFT through the gateway versus direct at
# concurrency 1 and 64, short and long prompts, the closed-loop request rate, and the CPU
# per streamed token.
# Each pass first prints the cost of waking a sleeping thread on the same core and across
# cores. Three runs: the gateway on its own two-thread runtime; the same with the whole process on
# one core (`taskset -c 0`: no cross-core wake-ups, so the added time is the gateway's own
# CPU work plus two context switches); everything on one thread.
# Usage: bash bench/gateway-overhead.sh [REQUESTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p kvroute-gateway --example overhead
bin=target/release/examples/overhead
args=("${1:-2000}" "${2:-5}" 30,2000)
"$bin" "${args[@]}" own-runtime
echo
if command -v taskset >/dev/null 2>&1; then
  echo "(whole process on core 0)"
  taskset -c 0 "$bin" "${args[@]}" own-runtime
  echo
fi
"$bin" "${args[@]}" same-thread
