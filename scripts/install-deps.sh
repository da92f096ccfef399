#!/usr/bin/env bash
# Installs what quorumlock's demo, tests and benchmarks need on a fresh Debian machine:
# Debian's redis-server (and redis-tools; ca-certificates for the TLS tests). Idempotent;
# says clearly what failed.
set -euo pipefail

say() { printf 'quorumlock: %s\n' "$*" >&2; }

if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "redis-server is missing and apt-get is not available: install Redis 7 (redis-server) by hand, or set QUORUMLOCK_REDIS_SERVER to its path"
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    say "redis-server is missing and we are not root (no sudo): run 'apt-get install -y redis-server' as root"
    exit 1
  fi
fi
say "installing redis-server with apt-get ..."
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >/tmp/quorumlock-apt.log 2>&1; then
  say "apt-get update failed (see /tmp/quorumlock-apt.log)"
  exit 1
fi
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server redis-tools ca-certificates >>/tmp/quorumlock-apt.log 2>&1; then
  say "apt-get install redis-server failed (see /tmp/quorumlock-apt.log)"
  exit 1
fi
# The package may start a system-wide server on 6379; our tests use their own ports and
# never touch it. Stop it where a service manager runs it, to keep the machine quiet.
($SUDO service redis-server stop >/dev/null 2>&1 || true)
command -v redis-server >/dev/null 2>&1 || { say "redis-server still not on PATH after install"; exit 1; }
say "installed $(redis-server --version | cut -d' ' -f1-3)"
