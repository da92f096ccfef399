//! A nested holder Y (it holds `b`, then waits for a free key) beside multi-resource waiters
//! that cannot be served (a key of their set is held): they do not queue, so Y heads the
//! queue of the key it waits for and is handed it, or claims it, whatever their number or
//! the holder's fate. (The set hand-off served around a blocked head among the next 8
//! entries at a release only, and these cases timed out there.)
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, Retry};
use support::settle;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const Y_WAIT: Duration = Duration::from_secs(6);

async fn client(urls: &[String], wait: Duration) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(urls)
        .retry(Retry::new().max_wait(wait))
        .build()
        .await
}

/// The accepted deadlock (multi_wait_transfer::a_nested_holder_…), but `a`'s holder
/// crashes instead of releasing: `a` frees by expiry, no release runs, so no backfill.
/// W {a,b} heads `a`'s queue and claims on its fallback (refused: Y holds `b`); Y is behind
/// W, never the head, never claims. `a` is free for the whole of Y's max_wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_holder_behind_blocked_head_when_the_holder_crashes() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Duration::from_secs(1)).await?;
    let y = client(&urls, Y_WAIT).await?;
    let w = client(&urls, Duration::from_secs(20)).await?;
    let (a, b) = ("bfx-a", "bfx-b");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, Duration::from_millis(1500)).await?;
    let b_lock = y.try_lock(b, ttl).await?;
    let waiter = tokio::spawn(async move { w.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock(a, ttl).await });
    settle(&cluster, a, 2).await?;
    let crashed = Instant::now();
    std::mem::forget(a_lock); // H crashes: `a` expires in 1.5 s, no release ever runs
    let got = nested.await?;
    println!(
        "Y: {:?} after {:?}",
        got.as_ref().map(|l| l.token().to_owned()),
        crashed.elapsed()
    );
    waiter.abort();
    assert!(
        got.is_ok(),
        "Y never got `a` (free after 1.5 s) before its max_wait: {:?}",
        crashed.elapsed()
    );
    b_lock.release().await?;
    Ok(())
}

/// BACKFILL = 8: nine multi-resource waiters {a,b} ahead of Y (holding `b`). The release
/// of `a` looks at entries 1..=8 only (all blocked on `b`), deletes `a`; Y (entry 9) hears
/// a plain release, renews, is not the head, does not claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_holder_behind_nine_blocked_multi_waiters() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Duration::from_secs(1)).await?;
    let y = client(&urls, Y_WAIT).await?;
    let (a, b) = ("bf9-a", "bf9-b");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, ttl).await?;
    let b_lock = y.try_lock(b, ttl).await?;
    let mut waiters = Vec::new();
    for i in 0..9u64 {
        let w = client(&urls, Duration::from_secs(20)).await?;
        waiters.push(tokio::spawn(async move { w.lock_many([a, b], ttl).await }));
        settle(&cluster, a, i + 1).await?;
    }
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock(a, ttl).await });
    settle(&cluster, a, 10).await?;
    let released = Instant::now();
    a_lock.release().await?;
    let got = nested.await?;
    println!(
        "Y: {:?} after {:?}",
        got.as_ref().map(|l| l.token().to_owned()),
        released.elapsed()
    );
    for w in waiters {
        w.abort();
    }
    assert!(
        got.is_ok(),
        "Y (10th in a's queue) never got the free `a`: {:?}",
        released.elapsed()
    );
    b_lock.release().await?;
    Ok(())
}

/// The relaxed head check covers the released queue only. Y holds `b` and waits for
/// {a, c}; M1 {a,b} heads `a`'s queue, M2 {c,b} heads `c`'s, both blocked on `b`. `a` and
/// `c` are released: each release finds Y behind a blocked head in its OTHER queue, so Y
/// is served by neither; both keys stay free, Y is not the head anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_multi_waiter_behind_blocked_heads_in_two_queues() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Duration::from_secs(1)).await?;
    let y = client(&urls, Y_WAIT).await?;
    let m1 = client(&urls, Duration::from_secs(20)).await?;
    let m2 = client(&urls, Duration::from_secs(20)).await?;
    let (a, b, c) = ("bf2-a", "bf2-b", "bf2-c");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, ttl).await?;
    let c_lock = h.try_lock(c, ttl).await?;
    let b_lock = y.try_lock(b, ttl).await?;
    let w1 = tokio::spawn(async move { m1.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let w2 = tokio::spawn(async move { m2.lock_many([c, b], ttl).await });
    settle(&cluster, c, 1).await?;
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock_many([a, c], ttl).await });
    settle(&cluster, a, 2).await?;
    settle(&cluster, c, 2).await?;
    let released = Instant::now();
    a_lock.release().await?;
    c_lock.release().await?;
    let got = nested.await?;
    println!(
        "Y: {:?} after {:?}",
        got.as_ref().map(|l| l.token().to_owned()),
        released.elapsed()
    );
    w1.abort();
    w2.abort();
    assert!(
        got.is_ok(),
        "Y never got the free {{a, c}}: {:?}",
        released.elapsed()
    );
    b_lock.release().await?;
    Ok(())
}
