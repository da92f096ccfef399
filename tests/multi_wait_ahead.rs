//! Single-resource waiters and multi-resource waiters on a shared key: the multi-resource
//! waiter does not queue (it marks the key and claims when a release is announced), so it
//! is never "ahead" of a queued waiter, blocked or not, and no waiter is kept behind any
//! number of multi-resource waiters. (The set hand-off counted blocked entries among the
//! first 64 ahead, and served around a blocked head among the next 8.)
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, Retry};
use support::settle;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn client(urls: &[String], retry: Retry) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(urls).retry(retry).build().await
}

/// H holds `a`, M waits for {a, b} (b free), then W for `a`: W heads `a`'s queue (M only
/// marks it), so H's release hands `a` to W by transfer; M gets {a, b} once W releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_single_waiter_is_handed_the_key_before_a_multi_resource_waiter() -> TestResult {
    single_before_multi(false).await
}

/// The same with H holding both `a` and `b` (one `lock_many`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_single_waiter_goes_before_a_waiter_for_the_holders_whole_set() -> TestResult {
    single_before_multi(true).await
}

async fn single_before_multi(holder_of_both: bool) -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let m = client(&urls, Retry::new().max_wait(Duration::from_secs(20))).await?;
    let w = client(&urls, Retry::new().max_wait(Duration::from_secs(20))).await?;
    let (a, b) = if holder_of_both {
        ("ra1m-a", "ra1m-b")
    } else {
        ("ra1-a", "ra1-b")
    };
    let ttl = Duration::from_secs(20);
    let a_lock = if holder_of_both {
        h.try_lock_many([a, b], ttl).await?
    } else {
        h.try_lock(a, ttl).await?
    };
    let mut mh = tokio::spawn(async move { m.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let mut wh = tokio::spawn(async move { w.lock(a, ttl).await });
    settle(&cluster, a, 2).await?;
    assert!(
        !mh.is_finished() && !wh.is_finished(),
        "no one took a held key"
    );
    let released = Instant::now();
    a_lock.release().await?;
    let (first, other) = tokio::select! {
        r = &mut mh => ("M", r??),
        r = &mut wh => ("W", r??),
    };
    println!("first: {first} after {:?}", released.elapsed());
    assert_eq!(first, "W", "the queued waiter was handed `a` first");
    other.release().await?;
    let m_lock = tokio::time::timeout(Duration::from_secs(5), mh).await???;
    m_lock.release().await?;
    Ok(())
}

/// H crashes holding `a`. M {a,b} (b free) arrived first; W (single) second. W heads `a`'s
/// queue (M does not queue) and claims on its fallback timer once `a` expires; M, whose
/// retry delay is about 1 s and which no release wakes, comes second. (With the set
/// hand-off M was queued ahead of W and went first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_holder_crash_the_queued_single_waiter_goes_before_an_earlier_multi_waiter()
-> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let m = client(
        &urls,
        Retry::new()
            .delay(Duration::from_millis(900), Duration::from_millis(1000))
            .max_wait(Duration::from_secs(20)),
    )
    .await?;
    let w = client(&urls, Retry::new().max_wait(Duration::from_secs(20))).await?;
    let (a, b) = ("ra2-a", "ra2-b");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, Duration::from_millis(2500)).await?;
    let mut mh = tokio::spawn(async move { m.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let mut wh = tokio::spawn(async move { w.lock(a, ttl).await });
    settle(&cluster, a, 2).await?;
    std::mem::forget(a_lock); // H crashes
    let first = tokio::select! {
        r = &mut mh => { let _ = r??; "M" }
        r = &mut wh => { let _ = r??; "W" }
    };
    println!("first: {first}");
    mh.abort();
    wh.abort();
    assert_eq!(first, "W", "the queued waiter went first");
    Ok(())
}

/// Y holds `b` and waits for `a` behind 17 waiters for {a, b} (which cannot be served while
/// Y holds `b`): Y heads `a`'s queue (they do not queue) and is handed `a` by its release.
/// (A 16-entry look-ahead once told Y one was ahead, and `a` stayed free for Y's whole
/// max_wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_holder_behind_seventeen_blocked_multi_waiters() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let y = client(&urls, Retry::new().max_wait(Duration::from_secs(6))).await?;
    let (a, b) = ("ra3-a", "ra3-b");
    let ttl = Duration::from_secs(30);
    let a_lock = h.try_lock(a, ttl).await?;
    let b_lock = y.try_lock(b, ttl).await?;
    let mut waiters = Vec::new();
    for i in 0..17u64 {
        let w = client(&urls, Retry::new().max_wait(Duration::from_secs(40))).await?;
        waiters.push(tokio::spawn(async move { w.lock_many([a, b], ttl).await }));
        settle(&cluster, a, i + 1).await?;
    }
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock(a, ttl).await });
    settle(&cluster, a, 18).await?;
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
    assert!(got.is_ok(), "Y (18th in a's queue) never got the free `a`");
    b_lock.release().await?;
    Ok(())
}
