//! Extensions against real `redis-server`s: an extension never shortens a lock, on any
//! path (success, a minority reached, a timeout, cancellation, a request finished late in
//! the background), so `Lock::remaining()` never exceeds the time for which a quorum of
//! nodes still holds our token.
#![cfg(feature = "testkit")]

mod support;

use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, Lock, Redlock, Retry};
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const RESOURCE_TTL: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_secs(2);

async fn client(urls: &[String], node_timeout: Duration) -> Result<Redlock, Error> {
    Redlock::builder(urls)
        .node_timeout(node_timeout)
        .retry(Retry::new().attempts(1))
        .build()
        .await
}

/// The key's time to live on every node, in milliseconds (`-2`: no key).
async fn pttls(cluster: &LocalCluster, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let mut c = support::raw(cluster, i).await;
        out.push(c.pttl(key).await.unwrap_or(-2));
    }
    out
}

/// Every node that answers still holds the key at least until the lock's deadline: the
/// TTLs are read first, `remaining()` after, so an expiry at or after the deadline always
/// satisfies `pttl >= remaining` (1 ms for PTTL's rounding down).
async fn assert_no_node_expires_before_the_deadline(
    cluster: &LocalCluster,
    lock: &Lock,
    key: &str,
) {
    let ttls = pttls(cluster, key).await;
    let remaining = i64::try_from(lock.remaining().as_millis()).unwrap_or(i64::MAX);
    assert!(
        remaining > 20_000,
        "the deadline moved: {remaining} ms left"
    );
    for (i, t) in ttls.iter().enumerate() {
        assert!(
            t + 1 >= remaining,
            "node {i} expires the key in {t} ms but the lock reports {remaining} ms left: \
             an extension shortened the lock behind the holder's back (all: {ttls:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_extension_that_succeeds_keeps_the_deadline_and_every_expiry() -> TestResult {
    let cluster = LocalCluster::builder(5).launch().await?;
    let a = client(&cluster.urls(), Duration::from_millis(250)).await?;
    let mut lock = a.try_lock("ext:ok", RESOURCE_TTL).await?;
    let before = lock.deadline();
    lock.extend(SHORT).await?;
    assert!(
        lock.deadline() >= before,
        "a successful shorter extension moved the deadline earlier"
    );
    assert_no_node_expires_before_the_deadline(&cluster, &lock, &support::lock_key("ext:ok")).await;
    // A longer extension still moves it later.
    lock.extend(RESOURCE_TTL * 2).await?;
    assert!(lock.deadline() > before);
    assert!(lock.remaining() > RESOURCE_TTL);
    lock.release().await?;
    Ok(())
}

/// The review's example: hold 30 s, pause 3 of 5 nodes, a 2 s extension fails, resume.
/// Before extensions were made unable to shorten, the two live nodes applied the short
/// TTL at once and the three paused ones on resume: every key expired at +2 s while the
/// holder still reported 28 s, and a second client won the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_reaches_a_minority_never_shortens_the_lock() -> TestResult {
    let cluster = LocalCluster::builder(5).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls, Duration::from_millis(100)).await?;
    let key = support::lock_key("ext:minority");
    let mut lock = a.try_lock("ext:minority", RESOURCE_TTL).await?;
    let before = lock.deadline();
    for i in 2..5 {
        cluster.pause(i).await?;
    }
    let r = lock.extend(SHORT).await;
    assert!(
        matches!(&r, Err(Error::NoQuorum(_))),
        "a minority extension must fail with NoQuorum: {r:?}"
    );
    assert_eq!(
        lock.deadline(),
        before,
        "a failed extension moved the deadline"
    );
    for i in 2..5 {
        cluster.resume(i).await?;
    }
    // The requests the paused nodes buffered now run; the late exchanges finish in the
    // background. Wait for them, then every node's expiry must still cover the deadline.
    assert!(
        a.flush(Duration::from_secs(10)).await,
        "late requests did not finish"
    );
    assert_no_node_expires_before_the_deadline(&cluster, &lock, &key).await;
    // After the short TTL has passed, the key is still everyone's obstacle.
    let b = client(&urls, Duration::from_millis(250)).await?;
    tokio::time::sleep(SHORT + Duration::from_millis(300)).await;
    match b.try_lock("ext:minority", SHORT).await {
        Ok(_) => panic!("a second client won a lock whose holder still reports validity"),
        Err(e) => assert!(e.is_held(), "expected Held, got {e}"),
    }
    assert!(lock.is_valid());
    lock.release().await?;
    Ok(())
}

/// An extension dropped midway (its caller gave up) leaves requests in flight; whatever
/// they do when they land, no expiry moves earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_extension_never_shortens_the_lock() -> TestResult {
    let cluster = LocalCluster::builder(5).launch().await?;
    let a = client(&cluster.urls(), Duration::from_millis(500)).await?;
    let key = support::lock_key("ext:cancelled");
    let mut lock = a.try_lock("ext:cancelled", RESOURCE_TTL).await?;
    let before = lock.deadline();
    for i in 2..5 {
        cluster.pause(i).await?;
    }
    // The two live nodes answer at once; the call then waits for the paused ones and is
    // dropped before any quorum could form.
    let r = tokio::time::timeout(Duration::from_millis(50), lock.extend(SHORT)).await;
    assert!(r.is_err(), "the extension should still be waiting: {r:?}");
    assert_eq!(
        lock.deadline(),
        before,
        "a cancelled extension moved the deadline"
    );
    for i in 2..5 {
        cluster.resume(i).await?;
    }
    assert!(a.flush(Duration::from_secs(10)).await);
    assert_no_node_expires_before_the_deadline(&cluster, &lock, &key).await;
    lock.release().await?;
    Ok(())
}
