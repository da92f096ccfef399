//! The `metrics` feature's cost in CPU instructions: the client's instructions per
//! uncontended acquire + release cycle, counted by `valgrind --tool=callgrind` rather than
//! timed, so the figure does not depend on what else the machine is doing.
//!
//! Starts 5 local `redis-server` nodes (outside valgrind: they are child processes, which
//! callgrind does not follow), builds a client, warms up, then runs `QL_CYCLES` cycles
//! (default 1000) of `try_lock` + `release` on fresh resource names. With the feature and
//! `QL_RECORDER=prometheus`, every cycle records into a Prometheus recorder (the exporter's
//! own, buckets as docs/operations.md recommends); otherwise no recorder is installed.
//!
//! `scripts/bench-metrics-instructions.sh` runs it under callgrind at two cycle counts for
//! each build and subtracts, which cancels the start-up cost: what is left is the client's
//! instructions per cycle.

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;

const TTL: Duration = Duration::from_secs(30);

fn main() {
    let cycles: usize = std::env::var("QL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let recorder = std::env::var("QL_RECORDER").unwrap_or_default();
    #[cfg(feature = "metrics")]
    if recorder == "prometheus" {
        use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
        let buckets = [
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0,
        ];
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
            .expect("buckets")
            .build_recorder();
        metrics::set_global_recorder(recorder).expect("install the recorder");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let granted = rt.block_on(async {
        let cluster = LocalCluster::launch(5)
            .await
            .expect("launch 5 redis-server nodes (is redis-server installed?)");
        // Generous timeouts: under valgrind the client runs tens of times slower.
        let locks = Redlock::builder(cluster.urls())
            .node_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("build the client");
        for i in 0..100 {
            if let Ok(l) = locks.try_lock(&format!("warm:{i}"), TTL).await {
                let _ = l.release().await;
            }
        }
        let mut granted = 0usize;
        for i in 0..cycles {
            if let Ok(l) = locks.try_lock(&format!("cycle:{i}"), TTL).await {
                granted += usize::from(l.release().await.is_ok());
            }
        }
        drop(cluster);
        granted
    });
    println!("cycles {cycles} granted-and-released {granted} recorder {recorder:?}");
    if granted != cycles {
        eprintln!("only {granted} of {cycles} cycles succeeded: the count is not comparable");
        std::process::exit(1);
    }
}
