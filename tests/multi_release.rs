//! The release of several resources through `release_one.lua` (each key handed to its own
//! queue's head): a lock on several resources is still announced by every node, so its
//! waiters hear it with the heralds down; its releaser still yields to a waiter that
//! listened; and clients mixing `lock_many` with `lock` never overlap.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::{History, LocalCluster};
use support::{heralds, raw};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A retry delay (30 s) longer than the maximum wait (5 s): the waiter gets the lock only
/// if a release announcement wakes it.
fn notified_only() -> Retry {
    Retry::new()
        .delay(Duration::from_secs(30), Duration::from_secs(30))
        .max_wait(Duration::from_secs(5))
}

/// Waits until `n` subscribers listen on the resource's channel on node `i`.
async fn subscribers(cluster: &LocalCluster, i: usize, resource: &str, n: u64) -> TestResult {
    let channel = format!("quorumlock:released:{resource}");
    let t = Instant::now();
    let mut c = raw(cluster, i).await;
    loop {
        let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut c)
            .await?;
        if v.first().is_some_and(|(_, k)| *k >= n) {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("no subscriber on node {i} for {resource}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Liveness. Five nodes; both heralds of both resources are down (two of five: the
/// other three are a quorum, so locks are still granted and released). A multi-resource
/// waiter waits on {a, b}; the holder of {a, b} releases. Were the release announced by
/// the heralds only, a waiter that relies on announcements would hear nothing and sleep
/// until its fallback timer (30 s here; it gives up at its 5 s maximum wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_release_wakes_its_waiter_with_the_heralds_down() -> TestResult {
    let n = 5;
    // Two names with the same heralds.
    let a = "rmr-a".to_owned();
    let b = (0..10_000)
        .map(|k| format!("rmr-b{k}"))
        .find(|b| heralds(b, n) == heralds(&a, n))
        .ok_or("no name with the same heralds")?;
    let [h1, h2] = heralds(&a, n);
    let cluster = LocalCluster::builder(n).launch().await?;
    cluster.kill(h1).await?;
    cluster.kill(h2).await?;
    let live: Vec<usize> = (0..n).filter(|i| *i != h1 && *i != h2).collect();
    let quick = Duration::from_millis(200);
    let holder = Redlock::builder(cluster.urls())
        .node_timeout(quick)
        .build()
        .await?;
    let waiter = Redlock::builder(cluster.urls())
        .node_timeout(quick)
        .retry(notified_only())
        .build()
        .await?;
    let ttl = Duration::from_secs(20);
    let lock = holder.try_lock_many([a.as_str(), b.as_str()], ttl).await?;
    let (wa, wb) = (a.clone(), b.clone());
    let w = tokio::spawn(async move {
        let got = waiter.lock_many([wa.as_str(), wb.as_str()], ttl).await;
        (Instant::now(), got.map(|l| l.token().to_string()))
    });
    for i in &live {
        subscribers(&cluster, *i, &a, 1).await?;
        subscribers(&cluster, *i, &b, 1).await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // its first attempt was refused
    lock.release().await?;
    let released = Instant::now();
    let (at, got) = tokio::time::timeout(Duration::from_secs(10), w).await??;
    eprintln!(
        "heralds {h1},{h2} down: waiter {} {:?} after the release",
        if got.is_ok() { "held" } else { "gave up" },
        at - released
    );
    assert!(got.is_ok(), "the waiter never heard the release: {got:?}");
    Ok(())
}

/// Liveness. Five nodes, both heralds of a resource down: a single-resource waiter still
/// queues (a non-herald assigns its ticket when neither herald answers) on the three
/// others, a quorum, and the holder's release hands it the lock there. Before, it queued
/// nowhere, no node announced the release (only heralds do, for one resource), and it
/// slept until its fallback timer (30 s here; it gave up at its 5 s maximum wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_heralds_are_down_still_holds_by_transfer() -> TestResult {
    let n = 5;
    let res = "rmr-single";
    let [h1, h2] = heralds(res, n);
    let cluster = LocalCluster::builder(n).launch().await?;
    cluster.kill(h1).await?;
    cluster.kill(h2).await?;
    let quick = Duration::from_millis(200);
    let holder = Redlock::builder(cluster.urls())
        .node_timeout(quick)
        .build()
        .await?;
    let waiter = Redlock::builder(cluster.urls())
        .node_timeout(quick)
        .retry(notified_only())
        .build()
        .await?;
    let ttl = Duration::from_secs(20);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move {
        let got = waiter.lock(res, ttl).await;
        (Instant::now(), got.map(|l| l.token().to_string()))
    });
    let live: Vec<usize> = (0..n).filter(|i| *i != h1 && *i != h2).collect();
    let queue = format!("quorumlock:queue:{res}");
    let t = Instant::now();
    loop {
        let mut queued = 0;
        for i in &live {
            let k: u64 = redis::cmd("ZCARD")
                .arg(&queue)
                .query_async(&mut raw(&cluster, *i).await)
                .await?;
            queued += k;
        }
        if queued == live.len() as u64 {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("queued on {queued} of {} live nodes", live.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lock.release().await?;
    let released = Instant::now();
    let (at, got) = tokio::time::timeout(Duration::from_secs(10), w).await??;
    eprintln!(
        "heralds {h1},{h2} of one resource down: waiter {} {:?} after the release",
        if got.is_ok() { "held" } else { "gave up" },
        at.saturating_duration_since(released)
    );
    assert!(got.is_ok(), "the waiter was never handed the lock: {got:?}");
    Ok(())
}

/// Liveness (fairness). The holder of {a, b} releases while another client waits for
/// {a, b} in the notify loop, then asks for {a, b} again at once. The release reached a
/// listener, so the releaser should yield (`contention::releaser_yields`: for several
/// resources, the subscribers an announcement reached or the waiters queued). With only
/// the queued waiters counted, a waiter that does not queue (the notify loop) made the
/// releaser take the lock back every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_releaser_yields_to_a_multi_resource_waiter() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let rounds = 10;
    let mut waiter_first = 0;
    for r in 0..rounds {
        let (a, b) = (format!("rmy-a{r}"), format!("rmy-b{r}"));
        let waiter = Redlock::builder(cluster.urls())
            .retry(notified_only())
            .build()
            .await?;
        let lock = holder.try_lock_many([a.as_str(), b.as_str()], ttl).await?;
        let (wa, wb) = (a.clone(), b.clone());
        let w = tokio::spawn(async move {
            let l = waiter.lock_many([wa.as_str(), wb.as_str()], ttl).await?;
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            l.release().await?;
            Ok::<_, quorumlock::Error>(at)
        });
        for i in 0..3 {
            subscribers(&cluster, i, &a, 1).await?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        lock.release().await?;
        let again = holder.lock_many([a.as_str(), b.as_str()], ttl).await?;
        let holder_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        again.release().await?;
        let waiter_at = tokio::time::timeout(Duration::from_secs(10), w).await???;
        if waiter_at < holder_at {
            waiter_first += 1;
        }
    }
    eprintln!("the waiter went first in {waiter_first} of {rounds} rounds");
    assert!(
        waiter_first * 2 >= rounds,
        "the releaser took the lock back first in {} of {rounds} rounds",
        rounds - waiter_first
    );
    Ok(())
}

/// Safety: clients mixing `lock_many` on overlapping pairs with single-resource `lock`
/// (transfer waiters) while node 0 is paused for a second; the history checker finds no
/// two holders of one resource at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_many_and_single_transfers_with_a_paused_node_never_overlap() -> TestResult {
    const CLIENTS: u64 = 8;
    let names = ["rms-0", "rms-1", "rms-2"];
    let cluster = LocalCluster::builder(3).launch().await?;
    let history = History::new();
    let ttl = Duration::from_millis(1500);
    let end = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = Redlock::builder(cluster.urls())
            .retry(
                Retry::new()
                    .delay(Duration::from_millis(50), Duration::from_millis(300))
                    .max_wait(Duration::from_secs(10)),
            )
            .build()
            .await?;
        let rec = history.client(c + 1);
        tasks.push(tokio::spawn(async move {
            let mut held = 0u32;
            let mut k = c as usize;
            while Instant::now() < end {
                k += 1;
                let set: Vec<String> = if c % 2 == 0 {
                    vec![names[k % 3].to_owned(), names[(k + 1) % 3].to_owned()]
                } else {
                    vec![names[k % 3].to_owned()]
                };
                for r in &set {
                    rec.acquire_invoked(r);
                }
                let got = if set.len() == 1 {
                    client.lock(&set[0], ttl).await
                } else {
                    client.lock_many(set.clone(), ttl).await
                };
                match got {
                    Ok(lock) => {
                        for r in &set {
                            rec.acquired(r, lock.deadline(), None);
                        }
                        held += 1;
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        for r in &set {
                            rec.release_invoked(r);
                        }
                        let ok = lock.release().await.is_ok();
                        for r in &set {
                            if ok {
                                rec.released(r);
                            } else {
                                rec.release_failed(r);
                            }
                        }
                    }
                    Err(_) => {
                        for r in &set {
                            rec.acquire_failed(r);
                        }
                    }
                }
            }
            held
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    cluster.pause(0).await?;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.resume(0).await?;
    let mut total = 0;
    for t in tasks {
        total += tokio::time::timeout(Duration::from_secs(30), t).await??;
    }
    eprintln!("mixed: {total} acquisitions");
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    assert!(total >= 10, "progress: {total}");
    Ok(())
}
