//! The README's quick start is a program a new user can copy: it is `examples/quickstart.rs`
//! word for word, and that example, built by `cargo test`, takes and releases a lock on
//! real `redis-server` nodes.
#![cfg(feature = "testkit")]

use std::path::PathBuf;
use std::time::Duration;

use quorumlock::testkit::LocalCluster;

/// The README's first `rust` code block.
fn readme_quick_start() -> String {
    let readme = include_str!("../README.md");
    let start = readme
        .find("```rust\n")
        .map(|i| i + "```rust\n".len())
        .expect("the README has a rust code block");
    let len = readme[start..].find("```").expect("the code block ends");
    readme[start..start + len].to_owned()
}

#[test]
fn the_readme_quick_start_is_the_example() {
    assert_eq!(
        readme_quick_start(),
        include_str!("../examples/quickstart.rs"),
        "the README's quick start and examples/quickstart.rs differ"
    );
}

/// The example binary `cargo test` built beside this test's own (`target/<profile>/deps/`
/// holds the test, `target/<profile>/examples/` the examples).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    profile.join("examples").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_takes_and_releases_a_lock() {
    let cluster = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes (run scripts/install-deps.sh)");
    let bin = example("quickstart");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples (with `--test` alone, run `cargo build --examples` first)",
        bin.display()
    );
    let run = tokio::process::Command::new(&bin)
        .env("QUORUMLOCK_NODES", cluster.urls().join(","))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the quick start finishes within 30 s")
        .expect("run the quick start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("issuing the last coupon; "), "{stdout}");
    // Released at the end: another client takes it at once.
    let locks = quorumlock::Redlock::builder(cluster.urls())
        .build()
        .await
        .expect("client");
    let lock = locks
        .try_lock("coupon:last", Duration::from_secs(5))
        .await
        .expect("released by the quick start");
    lock.release().await.expect("release");
}
