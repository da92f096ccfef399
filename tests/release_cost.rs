//! What a lock costs the Redis nodes, counted from `INFO commandstats` on real
//! `redis-server`s: an uncontended release is a compare-and-delete (no queue command, no
//! announcement), and a contended acquisition's commands per node stay bounded.
#![cfg(feature = "testkit")]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, Retry};
use support::{calls, raw};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The data commands the lock paths use (connection, pub/sub subscription and admin
/// commands are left out: the clients' subscriptions and group-map records run beside).
const COUNTED: &[&str] = &[
    "get",
    "set",
    "del",
    "exists",
    "pexpireat",
    "incr",
    "time",
    "zadd",
    "zrem",
    "zcard",
    "zcount",
    "zscore",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "hget",
    "hset",
    "hdel",
    "publish",
    "spublish",
];

async fn reset(cluster: &LocalCluster) -> TestResult {
    for i in 0..cluster.len() {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut raw(cluster, i).await)
            .await?;
    }
    Ok(())
}

/// The calls of each counted command (and `evalsha`/`eval`), summed over every node.
async fn stats(cluster: &LocalCluster) -> Result<BTreeMap<String, u64>, redis::RedisError> {
    let mut sum = BTreeMap::new();
    for i in 0..cluster.len() {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw(cluster, i).await)
            .await?;
        for cmd in COUNTED.iter().chain(&["evalsha", "eval"]) {
            let n = calls(&text, cmd);
            if n > 0 {
                *sum.entry((*cmd).to_owned()).or_insert(0) += n;
            }
        }
    }
    Ok(sum)
}

fn data_commands(s: &BTreeMap<String, u64>) -> u64 {
    COUNTED.iter().filter_map(|c| s.get(*c)).sum()
}

/// With nobody waiting, a release runs `GET`, `EXISTS` (the waiting mark) and `DEL` on each
/// node, nothing else: no queue command, no clock, no announcement. (It ran the whole
/// hand-off script before: `EXISTS` twice, `ZCARD`, and `PUBLISH` on the heralds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_release_runs_no_queue_command_and_announces_nothing() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let ql = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    // Warm: the scripts are loaded, the subscriptions made.
    ql.try_lock("cost-warm", ttl).await?.release().await?;
    ql.flush(Duration::from_secs(2)).await;
    const ROUNDS: u64 = 20;
    reset(&cluster).await?;
    for _ in 0..ROUNDS {
        let lock = ql.try_lock("cost-one", ttl).await?;
        lock.release().await?;
    }
    ql.flush(Duration::from_secs(2)).await;
    // The release returns at its quorum; the last node runs it a moment later.
    let mut s = stats(&cluster).await?;
    for _ in 0..100 {
        if s.get("exists").copied().unwrap_or(0) >= ROUNDS * cluster.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = stats(&cluster).await?;
    }
    println!("uncontended, {ROUNDS} cycles on 3 nodes: {s:?}");
    let nodes = cluster.len() as u64;
    let per_cycle = data_commands(&s) as f64 / (ROUNDS * nodes) as f64;
    println!("uncontended: {per_cycle:.2} data commands per node per acquire + release");
    for cmd in COUNTED {
        let n = s.get(*cmd).copied().unwrap_or(0);
        match *cmd {
            "set" | "get" | "exists" => assert_eq!(n, ROUNDS * nodes, "{cmd}: {s:?}"),
            // A node the previous release reached after the next `SET NX` refused that
            // acquire (it was decided at the quorum): its key is not ours to delete.
            "del" => assert!(n >= ROUNDS * 2 && n <= ROUNDS * nodes, "{cmd}: {s:?}"),
            _ => assert_eq!(n, 0, "{cmd}: {s:?}"),
        }
    }
    Ok(())
}

/// Sixteen clients take one resource in turn (notify waiting: queued, handed over): the
/// data commands per node per acquisition are counted and printed, and bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_acquisition_with_sixteen_waiters_costs_a_bounded_number_of_commands()
-> TestResult {
    const TASKS: usize = 16;
    const EACH: usize = 10;
    let cluster = LocalCluster::builder(3).launch().await?;
    let mut clients = Vec::new();
    for _ in 0..TASKS {
        let ql = Redlock::builder(cluster.urls())
            .retry(Retry::new().max_wait(Duration::from_secs(30)))
            .build()
            .await?;
        ql.try_lock("cost-warm", Duration::from_secs(1))
            .await?
            .release()
            .await?;
        clients.push(ql);
    }
    reset(&cluster).await?;
    let mut tasks = Vec::new();
    for ql in clients.clone() {
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                let lock = ql.lock("cost-many", Duration::from_secs(5)).await?;
                lock.release().await?;
            }
            Ok::<_, quorumlock::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    for ql in &clients {
        ql.flush(Duration::from_secs(2)).await;
    }
    let s = stats(&cluster).await?;
    let acquisitions = (TASKS * EACH) as f64;
    let per = data_commands(&s) as f64 / acquisitions / cluster.len() as f64;
    let scripts = (s.get("evalsha").copied().unwrap_or(0) + s.get("eval").copied().unwrap_or(0))
        as f64
        / acquisitions
        / cluster.len() as f64;
    println!("contended, {TASKS} tasks x {EACH}: {s:?}");
    println!(
        "contended: {per:.1} data commands and {scripts:.1} script calls per node per acquisition"
    );
    assert!(per < 60.0, "{per:.1} commands per node per acquisition");
    Ok(())
}
