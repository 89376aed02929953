#!/usr/bin/env bash
# The real-vLLM test: installs vLLM 0.32 (CPU) into target/vllm-venv (once; later runs reuse
# it), writes the tiny model to target/vllm-model, and runs test_real_vllm.py against the
# kvroute binary (KVROUTE_BIN, default target/debug/kvroute, built if absent).
#
# Prints `SKIPPED: <reason>` and exits 0 only when the CPU lacks AVX-512; any other problem
# (install, model, engine start, a failed scenario) exits non-zero.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
t0=$SECONDS
step() { printf '\n== vllm: %s (%ss)\n' "$1" "$((SECONDS - t0))"; }

if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "SKIPPED: this CPU lacks AVX-512 (no avx512f in /proc/cpuinfo); the real-vLLM test needs it"
  exit 0
fi

venv="${KVROUTE_VLLM_VENV:-$root/target/vllm-venv}"
export KVROUTE_VLLM_VENV="$venv"

step "install (scripts/vllm/install.sh)"
bash "$here/install.sh"

step "tiny model (scripts/vllm/make_model.py)"
"$venv/bin/python" "$here/make_model.py" "$root/target/vllm-model"

bin="${KVROUTE_BIN:-$root/target/debug/kvroute}"
if [ ! -x "$bin" ]; then
  step "cargo build -p kvroute"
  cargo build -p kvroute --locked
fi

step "test_real_vllm.py against $bin"
# The test stops its own processes at its deadline (660 s); timeout is the backstop.
timeout -k 15 720 "$venv/bin/python" "$here/test_real_vllm.py" --kvroute "$bin" \
  --model "$root/target/vllm-model" --logs "$root/target/vllm-test-logs"
step "done"
