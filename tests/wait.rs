//! Waiting strategies against real `redis-server`s: notify hand-off vs polling, a cut
//! subscription link, and 16 contenders with their own clients.
#![cfg(feature = "testkit")]

use std::time::{Duration, Instant};

use quorumlock::testkit::{History, LocalCluster, ProxyMode};
use quorumlock::{Error, Redlock, Retry};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const SLOW: Retry = Retry::new()
    .delay(Duration::from_secs(2), Duration::from_secs(2))
    .max_wait(Duration::from_secs(10));

/// Waits (bounded) until every node reports a subscriber on the resource's channel.
async fn subscribed(direct_urls: &[String], resource: &str) -> TestResult {
    let channel = format!("quorumlock:released:{resource}");
    let t = Instant::now();
    for u in direct_urls {
        let c = redis::Client::open(u.as_str())?;
        let mut conn = c.get_multiplexed_async_connection().await?;
        loop {
            let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await?;
            if v.first().is_some_and(|(_, n)| *n > 0) {
                break;
            }
            if t.elapsed() > Duration::from_secs(5) {
                return Err(format!("no subscriber on {u}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

fn direct(cluster: &LocalCluster) -> Result<Vec<String>, std::io::Error> {
    (0..cluster.len()).map(|i| cluster.direct_url(i)).collect()
}

/// Holder takes the lock, a waiter with a 2 s retry delay starts waiting; returns the
/// time between `release` returning and the waiter's `lock` returning.
async fn hand_off(
    notify: bool,
    resource: &str,
) -> Result<Duration, Box<dyn std::error::Error + Send + Sync>> {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let holder = Redlock::builder(&urls).build().await?;
    let waiter = Redlock::builder(&urls).notify(notify).build().await?;
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(resource, ttl).await?;
    let res = resource.to_owned();
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(&res, ttl, SLOW).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    if notify {
        subscribed(&direct(&cluster)?, resource).await?;
    } else {
        // Give the waiter time for its first (failing) attempt; not synchronization of
        // correctness, only the starting point of the measured delay.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock.release().await?;
    let released = Instant::now();
    let acquired = tokio::time::timeout(Duration::from_secs(8), w).await???;
    Ok(acquired.saturating_duration_since(released))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_the_waiter_well_before_its_retry_delay() -> TestResult {
    let took = hand_off(true, "w:notify").await?;
    eprintln!("notify hand-off: {took:?} after release (retry delay 2 s)");
    assert!(took < Duration::from_millis(500), "took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_waits_out_the_retry_delay() -> TestResult {
    let took = hand_off(false, "w:poll").await?;
    eprintln!("polling hand-off: {took:?} after release (retry delay 2 s)");
    assert!(took >= Duration::from_secs(1), "took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_subscription_link_only_delays_the_waiter() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct_urls = direct(&cluster)?;
    // The holder bypasses the proxies; the waiter (and its subscriptions) go through them.
    let holder = Redlock::builder(&direct_urls).build().await?;
    let waiter = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let resource = "w:cut";
    let lock = holder.try_lock(resource, ttl).await?;
    let started = Instant::now();
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(resource, ttl, SLOW).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    subscribed(&direct_urls, resource).await?;
    // Cut every link of the waiter: its subscriptions silently stop delivering.
    for i in 0..cluster.len() {
        cluster.proxy(i)?.set_mode(ProxyMode::Blackhole);
    }
    lock.release().await?; // the announcement is published, and lost on the cut links
    let released = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await; // the announcement is gone by now
    for i in 0..cluster.len() {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    let healed = Instant::now();
    let acquired = tokio::time::timeout(Duration::from_secs(8), w).await???;
    let took = acquired.saturating_duration_since(released);
    eprintln!(
        "cut link: acquired {took:?} after release, {:?} after the waiter started (fallback timer 2 s)",
        acquired - started
    );
    // Delayed, never stranded: the announcement was lost, so the waiter could only get it
    // after the links healed: woken by its re-subscription (which announces itself, since a
    // release may have been missed while the link was down) or by its fallback timer.
    assert!(acquired >= healed, "acquired before the links healed");
    assert!(took >= Duration::from_millis(300));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_contenders_never_overlap_and_all_finish() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let history = History::new();
    let rounds = 5;
    let mut tasks = Vec::new();
    for id in 0..16u64 {
        let locks = Redlock::builder(&urls)
            .retry(
                Retry::new()
                    .delay(Duration::from_millis(50), Duration::from_millis(150))
                    .max_wait(Duration::from_secs(60)),
            )
            .build()
            .await?;
        let rec = history.client(id);
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                rec.acquire_invoked("w:herd");
                let lock = locks.lock("w:herd", Duration::from_secs(2)).await?;
                rec.acquired("w:herd", lock.deadline(), None);
                rec.work_started("w:herd");
                tokio::time::sleep(Duration::from_millis(2)).await;
                rec.work_ended("w:herd");
                rec.release_invoked("w:herd");
                match lock.release().await {
                    Ok(()) => {
                        rec.released("w:herd");
                    }
                    Err(_) => {
                        rec.release_failed("w:herd");
                    }
                }
            }
            Ok::<_, Error>(())
        }));
    }
    let start = Instant::now();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await???;
    }
    let took = start.elapsed();
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    eprintln!(
        "16 contenders × {rounds} holds: {took:?} ({:?} per hand-off)",
        took / (16 * rounds)
    );
    Ok(())
}
