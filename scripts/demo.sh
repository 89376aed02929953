#!/usr/bin/env bash
# The demo in one command: builds the dashboard (once) and the binary, then runs
# `kvroute demo` (gateway on :8000, dashboard on :8080); extra arguments go to `kvroute demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f ui/dist/index.html ]; then
  (cd ui && npm ci --no-audit --no-fund && npm run build)
fi
exec cargo run --release -p kvroute -- demo "$@"
