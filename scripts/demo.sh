#!/usr/bin/env bash
# The main job: the coupon demo on a local 5-node Redis cluster that it starts itself
# (or on the nodes in QUORUMLOCK_NODES). Installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || { echo "quorumlock: FAILED: could not install redis-server" >&2; exit 1; }
exec cargo run --quiet --example coupon -- "$@"
