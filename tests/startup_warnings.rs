//! The start-up check's warnings, as an operator reads them: each breach of the deployment
//! contract is reported once per node per process, however many clients are built, with
//! its settings printed as Redis names them.
//!
//! One test in this file: it installs the process's global `tracing` subscriber.

#[path = "support/logs.rs"]
mod logs;

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;

/// Three nodes with Redis's default persistence (`appendonly no`): two clients built on
/// them, then a third, give one persistence warning per node, naming the node and the
/// settings as Redis does (`appendonly=no appendfsync=everysec`, not `Some("no")`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_breach_is_reported_once_per_node_per_process() {
    logs::capture(tracing::Level::WARN);
    let cluster = LocalCluster::builder(3).launch().await.expect("cluster");
    let first = Redlock::builder(cluster.urls())
        .build()
        .await
        .expect("first");
    let second = Redlock::builder(cluster.urls())
        .build()
        .await
        .expect("second");
    let third = Redlock::builder(cluster.urls())
        .build()
        .await
        .expect("third");
    let shown = logs::text();
    let warnings: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("does not persist every write"))
        .collect();
    assert_eq!(warnings.len(), 3, "one per node:\n{shown}");
    for url in cluster.urls() {
        let about: Vec<_> = warnings
            .iter()
            .filter(|l| l.contains(url.as_str()))
            .collect();
        assert_eq!(about.len(), 1, "once for {url}:\n{shown}");
    }
    for w in &warnings {
        assert!(
            w.contains("appendonly=no") && w.contains("appendfsync=everysec"),
            "settings as Redis names them: {w}"
        );
        assert!(!w.contains("Some(") && !w.contains("shard"), "{w}");
    }
    drop((first, second, third));
}
