//! quorumlock's metrics in Prometheus: installs `metrics-exporter-prometheus`'s HTTP
//! listener on 127.0.0.1, runs a small workload (waiting and failing-fast callers on a few
//! shared resources, kept locks, a node fault) and serves `/metrics` while it runs.
//!
//! ```sh
//! cargo run --release --features metrics --example metrics -- --port 9091 --seconds 60
//! curl -s 127.0.0.1:9091/metrics | grep quorumlock_
//! ```
//!
//! Options (all optional):
//!
//! * `--port P`: the listener's port on 127.0.0.1 (default 9091);
//! * `--seconds S`: how long the workload runs (default 30), then `--linger S` more
//!   seconds of serving (default 3) so a last scrape sees the final values;
//! * `--nodes URL,URL,…` (or `QUORUMLOCK_NODES`): your nodes; otherwise a local 5-node
//!   cluster is started (needs `redis-server`);
//! * `--workers W` (default 8) on `--resources R` (default 4) resources;
//! * `--pause-at S --pause-for S`: with the local cluster, node 0 is paused (SIGSTOP) at
//!   S seconds for S seconds (default 15 and 10; `--pause-for 0`: no fault).

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use quorumlock::{Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use rand::RngExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Histogram buckets for every `_seconds` metric: 100 µs to 10 s.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

struct Options {
    port: u16,
    seconds: u64,
    linger: u64,
    nodes: Option<Vec<String>>,
    workers: usize,
    resources: usize,
    pause_at: u64,
    pause_for: u64,
}

fn options() -> Result<Options, BoxError> {
    let mut o = Options {
        port: 9091,
        seconds: 30,
        linger: 3,
        nodes: std::env::var("QUORUMLOCK_NODES")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
        workers: 8,
        resources: 4,
        pause_at: 15,
        pause_for: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--port" => o.port = value.parse().map_err(|e| format!("--port: {e}"))?,
            "--seconds" => o.seconds = number()?,
            "--linger" => o.linger = number()?,
            "--nodes" => o.nodes = Some(value.split(',').map(|s| s.trim().to_owned()).collect()),
            "--workers" => o.workers = usize::try_from(number()?)?.max(1),
            "--resources" => o.resources = usize::try_from(number()?)?.max(1),
            "--pause-at" => o.pause_at = number()?,
            "--pause-for" => o.pause_for = number()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(o)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let o = options()?;

    // The recorder first, so that building the client registers the metric descriptions.
    PrometheusBuilder::new()
        .with_http_listener(([127, 0, 0, 1], o.port))
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install()?;
    println!("serving http://127.0.0.1:{}/metrics", o.port);

    let (cluster, urls) = match o.nodes.clone() {
        Some(urls) => (None, urls),
        None => {
            let c = LocalCluster::launch(5)
                .await
                .map_err(|e| format!("could not start redis-server: {e}"))?;
            let urls = c.urls();
            (Some(c), urls)
        }
    };
    println!("nodes: {}", urls.join(","));
    let locks = Redlock::builder(&urls).build().await?;

    let start = Instant::now();
    let end = start + Duration::from_secs(o.seconds);
    let mut workers = Vec::new();
    for w in 0..o.workers {
        let locks = locks.clone();
        let resource = format!("example:{}", w % o.resources);
        workers.push(tokio::spawn(worker(locks, resource, w, end)));
    }

    // The fault: node 0 paused for a while (only on a cluster this program started).
    if let Some(c) = &cluster
        && o.pause_for > 0
        && o.pause_at < o.seconds
    {
        tokio::time::sleep_until((start + Duration::from_secs(o.pause_at)).into()).await;
        c.pause(0).await?;
        println!("{:>5.1} s: node 0 paused", start.elapsed().as_secs_f64());
        let resume_at = start + Duration::from_secs(o.pause_at.saturating_add(o.pause_for));
        tokio::time::sleep_until(resume_at.min(end).into()).await;
        c.resume(0).await?;
        println!("{:>5.1} s: node 0 resumed", start.elapsed().as_secs_f64());
    }

    let mut done = 0u64;
    for w in workers {
        done += w.await?;
    }
    let flushed = locks.flush(Duration::from_secs(2)).await;
    println!(
        "{:>5.1} s: workload done, {done} locks taken and released (background work finished: {flushed}); serving {} s more",
        start.elapsed().as_secs_f64(),
        o.linger
    );
    tokio::time::sleep(Duration::from_secs(o.linger)).await;
    drop(cluster);
    Ok(())
}

/// One worker until `end`: mostly waits for its resource (`lock`), sometimes tries once
/// (`try_lock`, refused while another worker holds it), sometimes extends or keeps the lock
/// alive for a while; returns how many locks it took.
async fn worker(locks: Redlock, resource: String, w: usize, end: Instant) -> u64 {
    let ttl = Duration::from_secs(2);
    let retry = Retry::new().max_wait(Duration::from_secs(5));
    let mut taken = 0u64;
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let (hold_ms, think_ms) = {
            let mut rng = rand::rng();
            (rng.random_range(2..10), rng.random_range(5..40))
        };
        let hold = Duration::from_millis(hold_ms);
        let got = if n.is_multiple_of(5) {
            locks.try_lock(&resource, ttl).await
        } else {
            locks.lock_with(&resource, ttl, retry).await
        };
        if let Ok(mut lock) = got {
            taken += 1;
            if n.is_multiple_of(7) {
                let _ = lock.extend(ttl).await;
            }
            if w == 0 && n.is_multiple_of(50) {
                // A kept lock, held longer than its TTL by the watchdog, capped.
                let kept = lock
                    .keep_alive(Watchdog::new().max_hold(Duration::from_millis(2500)))
                    .expect("a watchdog policy that fits the TTL");
                let _ = tokio::time::timeout(Duration::from_secs(3), kept.lost()).await;
                let _ = kept.release().await;
            } else {
                tokio::time::sleep(hold).await;
                let _ = lock.release().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(think_ms)).await;
    }
    taken
}
