#!/usr/bin/env bash
# Build a Redis image with NO container registry: a `FROM scratch`-style root file system
# assembled from this machine's own Debian `redis-server` / `redis-cli` binaries, the shared
# libraries they link (found with ldd) and the dynamic loader, imported with `docker import`
# (no base image, no builder, nothing pulled).
#
# usage: testkit/compose/build-image.sh [--force] [--tag IMAGE]
#   --force      rebuild even if the image already exists
#   --tag IMAGE  image reference to create (default: $QUORUMLOCK_LOCAL_IMAGE or quorumlock/redis:local)
#
# Installs redis-server with apt-get when it is missing (needs root and a working apt).
# On success the last line of stdout is the image reference.
set -euo pipefail

TAG="${QUORUMLOCK_LOCAL_IMAGE:-quorumlock/redis:local}"
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --tag) shift; TAG="${1:?--tag needs a value}" ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "build-image.sh: error: $*" >&2; exit 1; }
log() { echo "build-image.sh: $*" >&2; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found on PATH"
timeout 15 docker info >/dev/null 2>&1 || die "docker engine not answering (is dockerd running?)"

if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  log "image $TAG already exists (use --force to rebuild)"
  echo "$TAG"
  exit 0
fi

# 1. The binaries: install from apt when missing.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  log "redis-server/redis-cli not found: installing with apt-get"
  command -v apt-get >/dev/null 2>&1 || die "redis-server missing and apt-get not available; install redis-server (>= 7) yourself"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "redis-server missing and not root (no sudo) to apt-get install it"
    SUDO="sudo -n"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >&2 || die "apt-get update failed; install redis-server yourself"
  $SUDO apt-get install -y -q --no-install-recommends redis-server redis-tools >&2 \
    || die "apt-get install redis-server failed; install redis-server yourself"
fi

SERVER="$(command -v redis-server)"
CLI="$(command -v redis-cli)"
command -v ldd >/dev/null 2>&1 || die "ldd not found (package libc-bin)"

ROOT="$(mktemp -d "${TMPDIR:-/tmp}/quorumlock-redis-root.XXXXXX")"
trap 'rm -rf "$ROOT"' EXIT

mkdir -p "$ROOT/usr/bin" "$ROOT/etc" "$ROOT/data" "$ROOT/tmp" "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" \
         "$ROOT/run" "$ROOT/var/lib/redis"
chmod 1777 "$ROOT/tmp"

# Copy a binary: Debian's redis-server is a symlink to the multi-call redis-check-rdb, which
# picks its personality from argv[0], so keep the real file and recreate the symlink.
copy_bin() {
  local src="$1" name="$2" real
  real="$(readlink -f "$src")"
  cp -p "$real" "$ROOT/usr/bin/$(basename "$real")"
  if [ "$(basename "$real")" != "$name" ]; then
    ln -sf "$(basename "$real")" "$ROOT/usr/bin/$name"
  fi
}
copy_bin "$SERVER" redis-server
copy_bin "$CLI" redis-cli

# Copy every library ldd reports (resolved to a regular file, kept at the path the loader
# looks for) and the dynamic loader itself.
copy_libs() {
  local bin="$1" lib
  while read -r lib; do
    [ -n "$lib" ] || continue
    [ -e "$lib" ] || die "ldd reported $lib for $bin but it does not exist"
    mkdir -p "$ROOT$(dirname "$lib")"
    cp -L "$lib" "$ROOT$lib"
  done < <(ldd "$bin" | awk '/=> \// {print $3} /^[[:space:]]*\/[^ ]+ \(/ {print $1}')
  if ldd "$bin" | grep -q "not found"; then
    die "ldd $bin: missing libraries: $(ldd "$bin" | grep 'not found' | tr -d '\t' | tr '\n' ' ')"
  fi
}
copy_libs "$(readlink -f "$SERVER")"
copy_libs "$(readlink -f "$CLI")"

cat > "$ROOT/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
redis:x:999:999:redis:/data:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
cat > "$ROOT/etc/group" <<'EOF'
root:x:0:
redis:x:999:
nogroup:x:65534:
EOF
echo "hosts: files dns" > "$ROOT/etc/nsswitch.conf"
: > "$ROOT/etc/hosts"
: > "$ROOT/etc/resolv.conf"

VERSION="$("$SERVER" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
log "building $TAG from $SERVER (redis $VERSION) with $(find "$ROOT" -name '*.so*' | wc -l) shared objects"

# 2. Import: tar the root (data dir owned by the redis user) and `docker import` it.
tar -C "$ROOT" --numeric-owner --owner=0 --group=0 --exclude=./data --exclude=./var/lib/redis \
  -cf "$ROOT.tar" . \
  || die "tar of the image root failed"
# /data must be writable by uid 999: add it (excluded above) owned by the redis user.
tar -C "$ROOT" --numeric-owner --owner=999 --group=999 --no-recursion -rf "$ROOT.tar" ./data ./var/lib/redis \
  || die "tar of /data failed"
trap 'rm -rf "$ROOT" "$ROOT.tar"' EXIT

docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'WORKDIR /data' \
  --change 'USER 999:999' \
  --change 'VOLUME /data' \
  --change 'EXPOSE 6379' \
  --change 'CMD ["redis-server"]' \
  --change "LABEL org.opencontainers.image.title=quorumlock-redis-local org.quorumlock.redis.version=$VERSION" \
  --message "quorumlock local redis $VERSION from $SERVER" \
  "$ROOT.tar" "$TAG" >/dev/null || die "docker import failed"

# 3. Smoke test: the binaries must run inside the image.
docker run --rm --network none "$TAG" redis-server --version >/dev/null 2>&1 \
  || die "smoke test failed: redis-server does not run inside $TAG"
docker run --rm --network none "$TAG" redis-cli --version >/dev/null 2>&1 \
  || die "smoke test failed: redis-cli does not run inside $TAG"

log "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.1f MB", $1/1e6}'))"
echo "$TAG"
