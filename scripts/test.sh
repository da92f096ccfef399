#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with the Rust toolchain:
# installs redis-server if missing, then formatting, lints, docs, unit, integration,
# doc and (when a Docker engine answers) Docker Compose tests, then the package (its
# contents, a build of it) and a dry run of `cargo publish` (these two need crates.io).
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

step "the coupon demo (examples/coupon.rs: exits non-zero if a locked or lock-free sale oversells)"
cargo run --quiet --all-features --example coupon || fail "the coupon demo"

step "cargo package (contents, then a build of the packaged crate with all features)"
list=$(cargo package --allow-dirty --list 2>/dev/null) || fail "cargo package --list"
for need in src/lib.rs src/scripts/acquire.lua src/bin/quorumlock/main.rs src/testkit/mod.rs \
    docs/guide.md README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE examples/coupon.rs \
    compose/docker-compose.yml; do
    grep -qx "$need" <<<"$list" || fail "the package lacks $need"
done
if unwanted=$(grep -E '^(tests|benches|bench-out|scripts|\.ci|target)/|^docs/(img/|benchmarks\.md)' <<<"$list"); then
    fail "the package holds files users do not need: $(tr '\n' ' ' <<<"$unwanted")"
fi
# Cargo names every test and benchmark left out of the package ("ignoring test …"): that is
# on purpose, so those lines are not shown.
quiet() { grep -v '^warning: ignoring ' || true; }
out=$(cargo package --allow-dirty --all-features 2>&1) \
    || { quiet <<<"$out"; fail "cargo package (the packaged crate does not build)"; }
quiet <<<"$out"

step "cargo publish --dry-run"
out=$(cargo publish --dry-run --allow-dirty 2>&1) || { quiet <<<"$out"; fail "cargo publish --dry-run"; }
quiet <<<"$out"

echo
echo "quorumlock: all checks passed"
