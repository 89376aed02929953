#!/usr/bin/env bash
# The container image: lints the Dockerfile (hadolint, from scripts/tools.sh), then — where a
# daemonless builder works (Debian `buildah` and `podman`, with runc) — builds the Dockerfile's
# runtime stage around the kvroute binary built here (the builder stages need Docker Hub,
# which is out of reach here: the binary and the shared libraries it links stand in for the
# static one) and runs `kvroute --version` and a request to `kvroute demo` in it.
# KVROUTE_REQUIRE_CONTAINER=1 makes a missing builder a failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${KVROUTE_BIN:-target/debug/kvroute}"
target/tools-venv/bin/hadolint --failure-threshold warning Dockerfile
echo "Dockerfile: hadolint clean"
if ! command -v buildah >/dev/null 2>&1 || ! command -v podman >/dev/null 2>&1; then
  if [ "${KVROUTE_REQUIRE_CONTAINER:-0}" = 1 ]; then
    echo "buildah and podman are required (KVROUTE_REQUIRE_CONTAINER=1)" >&2
    exit 1
  fi
  echo "SKIPPED: no container builder (apt-get install buildah podman runc)"
  exit 0
fi
export CONTAINERS_CONF="$PWD/deploy/container/containers.conf"
# Storage of its own under target/ with the vfs driver: works on any filesystem (overlay on
# an overlay root does not) and never meets the machine's own image store.
store="$PWD/target/containers"
mkdir -p "$store"
printf '[storage]\ndriver = "vfs"\nrunroot = "%s/run"\ngraphroot = "%s/root"\n' "$store" "$store" > "$store/storage.conf"
export CONTAINERS_STORAGE_CONF="$store/storage.conf"
ctx=$(mktemp -d)
name="kvroute-ci-$$"
tag="localhost/kvroute:ci-$$"
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$tag" >/dev/null 2>&1 || true
  rm -rf "$ctx"
}
trap cleanup EXIT
# The root filesystem the build stage would produce: the binary, the libraries it links.
mkdir -p "$ctx/out/usr/local/bin" "$ctx/out/tmp"
cp "$bin" "$ctx/out/usr/local/bin/kvroute"
for lib in $(ldd "$bin" | grep -oE '/[^ ]+'); do
  mkdir -p "$ctx/out$(dirname "$lib")"
  cp -L "$lib" "$ctx/out$lib"
done
# The Dockerfile's runtime stage, as written, fed from that directory.
{
  echo "FROM scratch AS build"
  echo "COPY out/ /out/"
  sed -n '/^FROM scratch AS runtime/,$p' Dockerfile
} > "$ctx/Containerfile"
buildah bud --isolation chroot -q -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
podman run --rm --network none "$tag" --version
# The demo listens on PORT (its gateway) and PORT+1 (the baseline fleet's): both must be free.
port=$(python3 -c '
import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1))
    except OSError:
        continue
    finally:
        a.close(); b.close()
    print(p); break
')
podman run -d --name "$name" --network host "$tag" demo --host 127.0.0.1 --port "$port" --workers 1 --ui-port 0 >/dev/null
ready=""
for _ in $(seq 1 300); do
  if curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "the demo in the container did not get ready within 30 s on port $port; its output:" >&2
  podman logs "$name" 2>&1 | tail -40 >&2 || true
  exit 1
fi
answer=$(curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"kvroute-sim","messages":[{"role":"user","content":"Hello from a container"}],"max_tokens":4}')
echo "$answer" | grep -q '"choices"'
user=$(podman inspect -f '{{.Config.User}}' "$tag")
[ "$user" = "65532:65532" ]
echo "image: built from the Dockerfile's runtime stage, runs as $user, answered a chat request"
