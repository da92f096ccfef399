#!/usr/bin/env bash
# quorumlock Docker Compose harness.
#
# usage: testkit/compose/harness.sh COMMAND [--failover]
#   image            pick the Redis image (build it locally if needed); prints its reference
#   up [--failover]  bring up redis1..redis5 (and redis-primary/redis-replica with --failover),
#                    wait until every container is healthy, print the client URLs
#   status           list the project's containers and their health
#   promote          promote redis-replica to master (REPLICAOF NO ONE)
#   down             stop and remove containers, networks and volumes of the project
#   compose ARGS...  run the compose tool with this project's settings (e.g. `compose ps`)
#
# Environment:
#   QUORUMLOCK_REDIS_IMAGE        image to use (default: redis:7.2 if present or pullable,
#                                 else quorumlock/redis:local built by testkit/compose/build-image.sh)
#   QUORUMLOCK_COMPOSE_PROJECT    compose project name (default quorumlock)
#   QUORUMLOCK_COMPOSE_PORT_BASE  host ports are BASE+1..BASE+5, BASE+11 (primary),
#                                 BASE+12 (replica); default 7000
#   QUORUMLOCK_COMPOSE_CMD        compose command (default: `docker compose`, else `docker-compose`)
#   QUORUMLOCK_COMPOSE_PULL=0     never try to pull redis:7.2
#   QUORUMLOCK_COMPOSE_TIMEOUT    seconds to wait for health (default 90)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FILE="$HERE/docker-compose.yml"
PROJECT="${QUORUMLOCK_COMPOSE_PROJECT:-quorumlock}"
BASE="${QUORUMLOCK_COMPOSE_PORT_BASE:-7000}"
OFFICIAL="redis:7.2"
LOCAL="${QUORUMLOCK_LOCAL_IMAGE:-quorumlock/redis:local}"
WAIT="${QUORUMLOCK_COMPOSE_TIMEOUT:-90}"

die() { echo "harness.sh: error: $*" >&2; exit 1; }
log() { echo "harness.sh: $*" >&2; }

case "$BASE" in ''|*[!0-9]*) die "QUORUMLOCK_COMPOSE_PORT_BASE must be a number, got '$BASE'";; esac
for i in 1 2 3 4 5; do
  v="QUORUMLOCK_REDIS${i}_PORT"
  export "$v=${!v:-$((BASE + i))}"
done
export QUORUMLOCK_PRIMARY_PORT="${QUORUMLOCK_PRIMARY_PORT:-$((BASE + 11))}"
export QUORUMLOCK_REPLICA_PORT="${QUORUMLOCK_REPLICA_PORT:-$((BASE + 12))}"

command -v docker >/dev/null 2>&1 || die "docker CLI not found on PATH"

compose_cmd() {
  if [ -n "${QUORUMLOCK_COMPOSE_CMD:-}" ]; then
    echo "$QUORUMLOCK_COMPOSE_CMD"
  elif docker compose version >/dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose >/dev/null 2>&1; then
    echo "docker-compose"
  else
    die "neither 'docker compose' nor 'docker-compose' is installed"
  fi
}

# shellcheck disable=SC2046
dc() { $(compose_cmd) -p "$PROJECT" -f "$FILE" --project-directory "$HERE" "$@"; }

engine() { timeout 15 docker info >/dev/null 2>&1 || die "docker engine not answering (is dockerd running?)"; }

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

try_pull() {
  [ "${QUORUMLOCK_COMPOSE_PULL:-1}" != 0 ] || return 1
  log "trying to pull $1"
  timeout 120 docker pull -q "$1" >/dev/null 2>&1
}

resolve_image() {
  local img="${QUORUMLOCK_REDIS_IMAGE:-}"
  if [ -n "$img" ]; then
    if have_image "$img"; then echo "$img"; return; fi
    if [ "$img" = "$LOCAL" ]; then "$HERE/build-image.sh" --tag "$LOCAL" | tail -n1; return; fi
    try_pull "$img" || die "QUORUMLOCK_REDIS_IMAGE=$img is not present and cannot be pulled"
    echo "$img"; return
  fi
  if have_image "$OFFICIAL"; then echo "$OFFICIAL"; return; fi
  if have_image "$LOCAL"; then echo "$LOCAL"; return; fi
  if try_pull "$OFFICIAL"; then echo "$OFFICIAL"; return; fi
  log "$OFFICIAL cannot be pulled: building $LOCAL from the machine's redis-server"
  "$HERE/build-image.sh" --tag "$LOCAL" | tail -n1
}

wait_healthy() {
  local deadline=$((SECONDS + WAIT)) ids id st pending
  ids="$(dc "$@" ps -q)"
  [ -n "$ids" ] || die "no containers in project $PROJECT"
  while :; do
    pending=""
    for id in $ids; do
      st="$(docker inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id" 2>/dev/null || echo gone/)"
      case "$st" in
        running/healthy) ;;
        exited/*|dead/*|gone/*) die "container $id is $st; see: docker logs $id" ;;
        *) pending="$pending $id" ;;
      esac
    done
    [ -z "$pending" ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || die "containers not healthy after ${WAIT}s:$pending"
    sleep 1
  done
}

PROFILES=()
FAILOVER=0
cmd="${1:-}"; [ $# -gt 0 ] && shift
if [ "$cmd" = up ]; then
  for a in "$@"; do
    case "$a" in
      --failover) FAILOVER=1 ;;
      *) die "up: unknown argument $a" ;;
    esac
  done
  [ "${QUORUMLOCK_COMPOSE_FAILOVER:-0}" = 1 ] && FAILOVER=1
  [ "$FAILOVER" = 1 ] && PROFILES=(--profile failover)
fi

case "$cmd" in
  image)
    engine
    resolve_image
    ;;
  up)
    engine
    QUORUMLOCK_REDIS_IMAGE="$(resolve_image)"
    export QUORUMLOCK_REDIS_IMAGE
    log "project $PROJECT, image $QUORUMLOCK_REDIS_IMAGE, ports $QUORUMLOCK_REDIS1_PORT-$QUORUMLOCK_REDIS5_PORT"
    dc "${PROFILES[@]}" up -d >&2 || die "compose up failed"
    wait_healthy "${PROFILES[@]}"
    for i in 1 2 3 4 5; do v="QUORUMLOCK_REDIS${i}_PORT"; echo "redis://127.0.0.1:${!v}"; done
    if [ "$FAILOVER" = 1 ]; then
      echo "primary redis://127.0.0.1:$QUORUMLOCK_PRIMARY_PORT"
      echo "replica redis://127.0.0.1:$QUORUMLOCK_REPLICA_PORT"
    fi
    ;;
  status)
    engine
    docker ps -a --filter "label=com.docker.compose.project=$PROJECT" \
      --format 'table {{.Names}}\t{{.Status}}\t{{.Ports}}'
    ;;
  promote)
    engine
    id="$(dc --profile failover ps -q redis-replica)"
    [ -n "$id" ] || die "redis-replica is not running (bring it up with: harness.sh up --failover)"
    out="$(docker exec "$id" redis-cli -p 6379 REPLICAOF NO ONE)" || die "REPLICAOF NO ONE failed"
    [ "$out" = OK ] || die "REPLICAOF NO ONE answered: $out"
    log "redis-replica promoted to master"
    ;;
  down)
    engine
    # Profiles named so that their containers are removed too.
    QUORUMLOCK_REDIS_IMAGE="${QUORUMLOCK_REDIS_IMAGE:-$OFFICIAL}" \
      dc --profile failover --profile promote --profile clusters down -v --remove-orphans -t 2 >&2
    ;;
  compose)
    export QUORUMLOCK_REDIS_IMAGE="${QUORUMLOCK_REDIS_IMAGE:-$(resolve_image)}"
    dc "$@"
    ;;
  ''|-h|--help|help)
    sed -n '2,21p' "$0"
    ;;
  *)
    die "unknown command '$cmd' (try: image, up, status, promote, down, compose)"
    ;;
esac
