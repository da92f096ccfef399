#!/usr/bin/env bash
# The whole test suite of the workspace (the library, `testkit/`, `cli/`), from a fresh
# Debian machine with the Rust toolchain: installs redis-server if missing, then
# formatting, lints, docs, unit, integration, doc and (when a Docker engine answers)
# Docker Compose tests, then the packages' contents, a dry run of `cargo publish` of the
# library (built from its package as crates.io would), a check that the other packages
# hold every file their sources include, and a build against a fresh lockfile (these need
# crates.io).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
step() { printf '\n==> [%ds] %s\n' "$((SECONDS - start))" "$*"; }
fail() { printf '\nquorumlock: FAILED: %s\n' "$*" >&2; exit 1; }

step "dependencies (redis-server)"
bash scripts/install-deps.sh || fail "could not install redis-server"
redis-server --version

step "cargo fmt --check"
cargo fmt --all -- --check || fail "formatting (run: cargo fmt --all)"

step "cargo clippy (the workspace: all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings || fail "clippy"

step "cargo clippy (the library without features)"
cargo clippy -p quorumlock --lib -- -D warnings || fail "clippy without features"

step "cargo doc (the workspace, no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features || fail "rustdoc warnings"

threads="${QUORUMLOCK_TEST_THREADS:-4}"
if cargo nextest --version >/dev/null 2>&1; then
    # Every test in a process of its own, the binaries side by side (.config/nextest.toml
    # names the tests that take turns); doc tests through cargo (nextest does not run them).
    step "cargo nextest run (the workspace, all features: unit and integration tests)"
    cargo nextest run --workspace --all-features --no-fail-fast --test-threads "$threads" \
        --status-level fail --final-status-level slow || fail "tests"
    step "cargo test --doc (the workspace, all features)"
    cargo test --workspace --all-features --doc || fail "doc tests"
else
    step "cargo test (the workspace, all features: unit, integration, doc tests; no cargo-nextest)"
    cargo test --workspace --all-features --no-fail-fast -- --test-threads="$threads" || fail "tests"
fi

step "the coupon demo (examples/coupon.rs: exits non-zero if a locked or lock-free sale oversells)"
cargo run --quiet --all-features --example coupon || fail "the coupon demo"

step "cargo package --list (what each package holds)"
list=$(cargo package -p quorumlock --allow-dirty --list 2>/dev/null) || fail "cargo package --list"
for need in src/lib.rs src/scripts/acquire.lua docs/guide.md README.md CHANGELOG.md \
    LICENSE-MIT LICENSE-APACHE examples/coupon.rs; do
    grep -qx "$need" <<<"$list" || fail "the package lacks $need"
done
kit=$(cargo package -p quorumlock-testkit --allow-dirty --list 2>/dev/null) \
    || fail "cargo package -p quorumlock-testkit --list"
for need in src/lib.rs compose/docker-compose.yml compose/harness.sh; do
    grep -qx "$need" <<<"$kit" || fail "the test kit's package lacks $need"
done
if grep -qE '^(testkit|cli)/' <<<"$list"; then
    fail "the library's package holds the test kit or the command line"
fi
if unwanted=$(grep -E '^(tests|benches|bench-out|scripts|\.ci|target)/|^docs/(img/|benchmarks\.md)' <<<"$list"); then
    fail "the package holds files users do not need: $(tr '\n' ' ' <<<"$unwanted")"
fi
# Cargo names every test and benchmark left out of the package ("ignoring test …"): that is
# on purpose, so those lines are not shown.
quiet() { grep -v '^warning: ignoring ' || true; }

step "cargo publish --dry-run (the library: packed, then built from its package with all features)"
out=$(cargo publish -p quorumlock --dry-run --allow-dirty --all-features 2>&1) \
    || { quiet <<<"$out"; fail "cargo publish --dry-run (the packaged library does not build)"; }
quiet <<<"$out"

# The test kit and the command line are packed, not built again from their packages (that
# rebuilds every dependency under their feature sets: about 80 s). What once broke such a
# package, a file it includes from outside itself, is checked from the package's own file
# list: every include_str!/include_bytes!/#[path] in what the package builds (src/, build.rs)
# must name a file the package holds.
step "cargo package (the test kit and the command line: what their sources include is packed)"
cargo package --workspace --no-verify --allow-dirty >/dev/null 2>&1 \
    || fail "cargo package --workspace --no-verify"
for crate in testkit cli; do
    files=$(cargo package -p "quorumlock-$crate" --allow-dirty --list 2>/dev/null) \
        || fail "cargo package -p quorumlock-$crate --list"
    while IFS= read -r src; do
        dir=$(dirname "$src")
        while IFS= read -r target; do
            want=$(realpath -m --relative-to="$crate" "$crate/$dir/$target")
            grep -qx "$want" <<<"$files" \
                || fail "quorumlock-$crate: $src includes $target, which its package does not hold"
        done < <(grep -oE '(include_str!|include_bytes!)\("[^"]+"\)|#\[path = "[^"]+"\]' "$crate/$src" \
            | sed -E 's/.*"([^"]+)".*/\1/')
    done < <(grep -E '^(src/.*|build)\.rs$' <<<"$files")
done

step "the library's dependencies: one version of each random crate"
dups=$(cargo tree -p quorumlock -e normal --all-features -d --prefix none 2>/dev/null \
    | grep -E '^(rand|rand_core|getrandom) v' | sort -u || true)
[ -z "$dups" ] || fail "the library builds more than one version of: $(echo $dups)"

step "a fresh lockfile (cargo update in a scratch copy: the library builds without warnings against the newest compatible dependencies)"
# What `cargo add quorumlock` resolves for an application. clippy's
# -D warnings applies to the workspace's own crates only, and the shared target directory
# rebuilds only the dependencies whose versions moved.
main_target="${CARGO_TARGET_DIR:-$PWD/target}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$scratch" \
    || fail "could not copy the workspace to a scratch directory"
(cd "$scratch" && cargo update --quiet) || fail "cargo update (in a scratch copy)"
(cd "$scratch" && CARGO_TARGET_DIR="$main_target" cargo clippy --quiet --all-features \
    -p quorumlock --lib -- -D warnings) \
    || fail "with a fresh lockfile (cargo update), the library has warnings"

echo
echo "quorumlock: all checks passed in $((SECONDS - start)) s"
