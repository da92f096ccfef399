//! The node side of the direct hand-off against real `redis-server`s: a release through
//! the library transfers the key, on every node, to a queued transfer entry (with that
//! entry's TTL), a fenced transfer raises the fence counter above the releaser's token,
//! a token is never queued twice on a node, and a transfer to a waiter that is dead (its
//! entry planted raw, no one owns the token) costs the next waiter at most that TTL.
//!
//! The waiter side (a `Lock` obtained by transfer) is not wired in yet: the library's
//! waiters still join name-only entries, which these tests also exercise.
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, Retry};
use redis::aio::MultiplexedConnection;
use support::{get, lock_key, raw};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Joins (or renews) `token` raw on one node: `{state, ahead, ticket, holds}`.
async fn enqueue(
    conn: &mut MultiplexedConnection,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    kind: &str,
    first: bool,
) -> Vec<redis::Value> {
    redis::Script::new(include_str!("../src/scripts/enqueue.lua"))
        .key(format!("quorumlock:queue:{resource}"))
        .key(format!("quorumlock:qlease:{resource}"))
        .key(format!("quorumlock:qattrs:{resource}"))
        .key(lock_key(resource))
        .arg(token)
        .arg("")
        .arg(3000)
        .arg(ttl_ms)
        .arg(kind)
        .arg(if first { "1" } else { "0" })
        .invoke_async(conn)
        .await
        .expect("enqueue")
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// A release with a transfer entry queued sets the key, on every node, to the entry's
/// token with the entry's TTL, and counts as a release for the releaser. The token is
/// then gone from the queue for good: a renewal reports it gone and the key holding it.
#[tokio::test]
async fn a_release_transfers_to_the_queued_token() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let locks = Redlock::builder(cluster.urls()).build().await?;
    let res = "handoff-transfer";
    let lock = locks.try_lock(res, Duration::from_secs(30)).await?;
    let waiter = "feedfacefeedfacefeedfacefeedface";
    for i in 0..3 {
        let mut c = raw(&cluster, i).await;
        let r = enqueue(&mut c, res, waiter, 5_000, "t", true).await;
        assert_eq!(r.first(), Some(&redis::Value::Int(1)), "node {i}: added");
    }
    lock.release().await?;
    for i in 0..3 {
        assert_eq!(
            get(&cluster, i, &lock_key(res)).await.as_deref(),
            Some(waiter)
        );
        let mut c = raw(&cluster, i).await;
        let left = pttl(&mut c, &lock_key(res)).await;
        assert!(
            (4_000..=5_000).contains(&left),
            "node {i}: the waiter's TTL, {left} ms left"
        );
        // Never queued again on this node, and the renewal learns of the transfer.
        for first in [false, true] {
            let r = enqueue(&mut c, res, waiter, 5_000, "t", first).await;
            assert_eq!(r.first(), Some(&redis::Value::Int(2)), "node {i}: gone");
            assert_eq!(r.get(3), Some(&redis::Value::Int(1)), "node {i}: holds");
        }
    }
    Ok(())
}

/// A fenced transfer raises each node's fence counter as a fenced grant does: the
/// announced fencing value is strictly larger than the releaser's fencing token.
#[tokio::test]
async fn a_fenced_transfer_gives_a_larger_fencing_value() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let locks = Redlock::builder(cluster.urls())
        .fencing(true)
        .build()
        .await?;
    let res = "handoff-fenced";
    let lock = locks.try_lock(res, Duration::from_secs(30)).await?;
    let before = lock.fencing_token().ok_or("fenced lock without a token")?;
    let waiter = "0badc0de0badc0de0badc0de0badc0de";
    for i in 0..3 {
        enqueue(&mut raw(&cluster, i).await, res, waiter, 5_000, "f", true).await;
    }
    let mut sub = redis::Client::open(cluster.direct_url(0)?)?
        .get_async_pubsub()
        .await?;
    sub.subscribe(format!("quorumlock:released:{res}")).await?;
    let mut messages = sub.into_on_message();
    lock.release().await?;
    let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await?
        .ok_or("no announcement")?;
    let payload: String = msg.get_payload()?;
    let parts: Vec<&str> = payload.split(':').collect();
    assert_eq!(parts.get(1..3), Some(&[">", waiter][..]), "{payload}");
    let fence: u64 = parts.get(3).ok_or("no fence value")?.parse()?;
    assert!(fence > before, "transferred {fence}, releaser had {before}");
    for i in 0..3 {
        assert_eq!(
            get(&cluster, i, &lock_key(res)).await.as_deref(),
            Some(waiter)
        );
        let counter: u64 = get(&cluster, i, &format!("quorumlock:fence:{res}"))
            .await
            .ok_or("no counter")?
            .parse()?;
        assert!(counter > before, "node {i}: counter {counter} <= {before}");
    }
    Ok(())
}

/// A waiter that died with its entry queued (planted raw: no one owns the token) is
/// handed the lock by the release; the next waiter gets it once that transfer's TTL runs
/// out, not later than about one TTL plus its retry delay.
#[tokio::test]
async fn a_dead_waiter_costs_at_most_one_ttl() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .retry(
            Retry::new()
                .delay(Duration::from_millis(100), Duration::from_millis(200))
                .max_wait(Duration::from_secs(10)),
        )
        .build()
        .await?;
    let res = "handoff-dead";
    let lock = holder.try_lock(res, Duration::from_secs(30)).await?;
    let dead_ttl = Duration::from_millis(1_500);
    let dead = "deaddeaddeaddeaddeaddeaddeaddead";
    for i in 0..3 {
        let ms = u64::try_from(dead_ttl.as_millis())?;
        enqueue(&mut raw(&cluster, i).await, res, dead, ms, "t", true).await;
    }
    let next = tokio::spawn(async move {
        let t = Instant::now();
        let got = waiter.lock(res, Duration::from_secs(10)).await;
        (got.map(|l| l.token().to_owned()), t.elapsed())
    });
    // The waiter is waiting (its first attempt was refused) before the release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    lock.release().await?;
    assert_eq!(
        get(&cluster, 0, &lock_key(res)).await.as_deref(),
        Some(dead)
    );
    let (got, _) = next.await?;
    let after = released.elapsed();
    let token = got?;
    println!(
        "dead waiter: the next waiter held {after:?} after the release (planted TTL {dead_ttl:?})"
    );
    assert_ne!(token, dead);
    assert!(
        after >= dead_ttl - Duration::from_millis(100),
        "the dead waiter's transfer held the key: got it after {after:?}"
    );
    assert!(
        after <= dead_ttl + Duration::from_secs(2),
        "at most about one TTL: {after:?}"
    );
    Ok(())
}
