#!/usr/bin/env bash
# The fuzz campaign: every target under fuzz/ (or the ones named) run for RUNS inputs each
# (default 10,000,000) with cargo-fuzz (nightly toolchain, address sanitizer), one after
# another; prints per target the inputs run, the seconds taken, the coverage reached (edges)
# and the outcome. Seeds kv_events and kv_event_stream with the real vLLM 0.32 frames of
# ../shared/data/vllm when they are there. Needs `cargo install cargo-fuzz` and a nightly
# toolchain; corpora stay under fuzz/corpus/ (not committed).
#
#   bash scripts/fuzz.sh                 # all targets, 10M inputs each
#   bash scripts/fuzz.sh 100000 sse      # one target, 100k inputs
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs=${1:-10000000}
shift || true
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v '^kvroute-fuzz$')
fi
frames=../../shared/data/vllm/frames-vllm-0.32.txt
if [ -f "$frames" ]; then
  mkdir -p corpus/kv_events corpus/kv_event_stream
  python3 - "$frames" <<'PY'
import struct, sys
text = open(sys.argv[1]).read().splitlines()
samples = []
for i, line in enumerate(text):
    if not line.startswith("## sample"):
        continue
    rest = text[i:]
    seq = next(l for l in rest if l.startswith("seq hex:")).split(":", 1)[1].split()[0]
    k = next(j for j, l in enumerate(rest) if l.startswith("payload ("))
    samples.append((bytes.fromhex(seq), bytes.fromhex(rest[k + 1].strip())))
def message(seq, payload):
    out = bytes([3])
    for f in (b"", seq, payload):
        out += struct.pack("<H", len(f)) + f
    return out
stream = b""
for n, (seq, payload) in enumerate(samples):
    open(f"corpus/kv_events/vllm-{n}", "wb").write(payload)
    open(f"corpus/kv_event_stream/vllm-{n}", "wb").write(message(seq, payload))
    stream += message(seq, payload)
open("corpus/kv_event_stream/vllm-all", "wb").write(stream)
PY
fi
printf '%-18s %12s %8s %8s  %s\n' target inputs seconds edges outcome
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  start=$(date +%s)
  if cargo +nightly fuzz run "$t" "corpus/$t" -- -runs="$runs" >"$log" 2>&1; then
    outcome="no crash, hang or leak"
  else
    outcome="FAILED (see $log)"
  fi
  secs=$(($(date +%s) - start))
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  inputs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$done_line")
  edges=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$done_line")
  printf '%-18s %12s %8s %8s  %s\n' "$t" "${inputs:-?}" "$secs" "${edges:-?}" "$outcome"
  case $outcome in FAILED*) ;; *) rm -f "$log" ;; esac
done
