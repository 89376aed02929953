#!/usr/bin/env bash
# The endpoint picker's cost per request: TTFT through a real Envoy asking `kvroute epp`
# (ext_proc, bodies FULL_DUPLEX_STREAMED, deploy/envoy/picker-fail-closed.yaml) against the
# same Envoy routing straight to a zero-delay engine stub, at concurrency 1 and 16, short and
# long prompts, and the closed-loop rate of both. Envoy comes from scripts/tools.sh.
# Usage: bash bench/epp-overhead.sh [REQUESTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/tools.sh
cargo build --release --locked -q -p kvroute-gateway --example overhead
target/release/examples/overhead "${1:-2000}" "${2:-5}" 30 epp
