#!/usr/bin/env bash
# The docker runtime: the daemon and the sandbox image, with no registry. Idempotent; a second run takes ~1 s.
#  1. apt: docker.io and debootstrap, if missing (needs root);
#  2. dockerd, if no daemon answers: --bridge=none --iptables=false, so there is no docker0 bridge and the host's
#     firewall is left alone (log and pid file under $POLAR_CACHE/docker). A daemon that already runs is used as
#     it is: the runtime's containers have network_mode none whatever the daemon's defaults;
#  3. a Debian bookworm minbase rootfs, debootstrapped once into a cached tarball and `docker import`ed;
#  4. the runtime image on top of it (nemo_polar/sandbox/Dockerfile), rebuilt when that file changes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${POLAR_CACHE:-$HOME/.cache/nemo_polar}/docker
IMAGE=${POLAR_DOCKER_IMAGE:-nemo-polar/runtime:1}
BASE=nemo-polar/bookworm-minbase:1
# The Debian archive this machine's apt already uses (the first deb URI of a main archive), unless DEBIAN_MIRROR says.
debian_source() {
  local uri
  uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list |
    grep -v -- '-security' | grep -oE 'https?://[^ ]+/debian/?' | head -1)
  [ -n "$uri" ] || { echo "no Debian archive in /etc/apt sources: set DEBIAN_MIRROR" >&2; return 1; }
  echo "$uri"
}
MIRROR=${DEBIAN_MIRROR:-}
DOCKERFILE=$ROOT/nemo_polar/sandbox/Dockerfile
mkdir -p "$CACHE"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v socat >/dev/null || missing+=(socat)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "the docker runtime needs: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "no docker daemon answers and starting one needs root: sudo $0" >&2
    exit 1
  fi
  echo "starting dockerd (log: $CACHE/dockerd.log)"
  setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false --pidfile "$CACHE/dockerd.pid" \
    >>"$CACHE/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see $CACHE/dockerd.log" >&2; exit 1; }
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  tarball=$CACHE/bookworm-minbase.tar
  if [ ! -s "$tarball" ]; then
    [ -n "$MIRROR" ] || MIRROR=$(debian_source)
    echo "debootstrap bookworm minbase from $MIRROR"
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
      { echo "debootstrap failed; see $CACHE/debootstrap.log" >&2; rm -rf "$rootfs"; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
  fi
  docker import "$tarball" "$BASE" >/dev/null
fi

digest=$(sha256sum "$DOCKERFILE" | cut -c1-16)
built=$(docker image inspect -f '{{index .Config.Labels "nemo_polar.dockerfile"}}' "$IMAGE" 2>/dev/null || true)
if [ "$built" != "$digest" ]; then
  echo "building $IMAGE"
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  cp "$DOCKERFILE" "$context/Dockerfile"
  # --network host: apt needs the mirror; the image's containers run with no network at all.
  docker build --network host --build-arg "BASE=$BASE" --label "nemo_polar.dockerfile=$digest" \
    -t "$IMAGE" "$context" >"$CACHE/build.log" 2>&1 || { tail -20 "$CACHE/build.log" >&2; exit 1; }
fi

# The harnesses run on the host's node, bound in read-only: it must load against the image's libraries.
node=$(readlink -f "$(command -v node || echo /usr/bin/node)")
if ! docker run --rm --network none -v "$node:/usr/bin/node:ro" "$IMAGE" node -e 'process.exit(0)' 2>/dev/null; then
  echo "warning: the host's node ($node) does not run in $IMAGE (ldd $node: its libraries must be in the image)" >&2
fi
echo "docker runtime ready: $IMAGE"
