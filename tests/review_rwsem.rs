//! Adversarial review of read-write locks and semaphores: each test sets up one exact
//! interleaving against real redis-server processes and asserts the safety invariant the
//! proofs in `docs/safety.md` rely on.
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, Redlock};
use redis::AsyncCommands;
use support::raw;

const FLUSH: Duration = Duration::from_secs(5);

async fn cluster_with_proxies(n: usize) -> LocalCluster {
    LocalCluster::builder(n)
        .proxies(true)
        .launch()
        .await
        .expect("start redis-server nodes")
}

async fn client(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(node_timeout)
        .build()
        .await
        .expect("build")
}

/// Node `i`'s clock in milliseconds (TIME).
async fn node_ms(c: &LocalCluster, i: usize) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut raw(c, i).await)
        .await
        .expect("TIME");
    s * 1000 + us / 1000
}

/// The nodes among `nodes` where `member` is a live member of `key` (score > node now).
async fn live_on(c: &LocalCluster, nodes: &[usize], key: &str, member: &str) -> Vec<usize> {
    let mut on = Vec::new();
    for &i in nodes {
        let now = node_ms(c, i).await;
        let score: Option<f64> = raw(c, i).await.zscore(key, member).await.expect("ZSCORE");
        if score.is_some_and(|s| s > now as f64) {
            on.push(i);
        }
    }
    on
}

/// Loads every script on every node (an `EVALSHA` that meets `NOSCRIPT` costs a second
/// round trip, which would skew the timings of a delayed link), and the connections.
async fn warm_up(a: &Redlock) {
    let s = a.semaphore("review:warm-up", 3).expect("semaphore");
    let mut p = s.try_acquire(Duration::from_secs(5)).await.expect("permit");
    p.extend(Duration::from_secs(5)).await.expect("extend");
    p.release().await.expect("release");
    let mut r = a
        .try_read_lock("review:warm-up", Duration::from_secs(5))
        .await
        .expect("read");
    r.extend(Duration::from_secs(5)).await.expect("extend");
    r.release().await.expect("release");
    let mut w = a
        .try_write_lock("review:warm-up", Duration::from_secs(5))
        .await
        .expect("write");
    w.extend(Duration::from_secs(5)).await.expect("extend");
    w.release().await.expect("release");
    assert!(a.flush(FLUSH).await);
}

/// A permit extended while its give-back is still waiting for a slow node counts the
/// grant it is about to give back: the extension reaches a quorum with a node whose entry
/// the give-back then removes, so the holder believes itself valid for the new TTL while
/// fewer than `Q` of its entries live that long. (With N = 5, P = 3, c = 2, Q = 3 one such
/// holder left with one entry plus three fresh ones are four holders of three permits.)
///
/// Interleaving (N = 3, P = 3, c = 2, Q = 2; another holder's entry on node 1):
/// nodes 0 (load 1) and 1 (load 2) grant at once, node 2 is slow; the permit is returned;
/// the link to node 0 is cut; `extend` succeeds on node 1 at once and on node 2 once its
/// acquire landed (quorum: 1 and 2); the give-back, decided when node 2's grant (load 1)
/// lands, keeps nodes 0 and 2 (least loaded) and removes node 1's freshly extended entry.
/// The entry on node 0 keeps its first TTL: once it lapses the holder, still valid, has a
/// live entry on node 2 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_racing_the_give_back_keeps_a_quorum_of_entries() {
    let c = cluster_with_proxies(3).await;
    let a = client(&c.urls(), Duration::from_secs(2)).await;
    let name = "review:giveback";
    let key = format!("quorumlock:sem:{name}");
    let s = a.semaphore(name, 3).expect("semaphore");
    assert_eq!((s.per_node_limit(), s.quorum()), (2, 2));
    warm_up(&a).await;
    // Another holder's entry on node 1 (as a permit kept there would be).
    let now = node_ms(&c, 1).await;
    let mut conn = raw(&c, 1).await;
    let _: () = conn
        .zadd(&key, "other-holder", now + 60_000)
        .await
        .expect("ZADD");
    let _: () = conn
        .pexpire_at(&key, (now + 60_000) as i64)
        .await
        .expect("PEXPIREAT");
    // Node 2 is slow: its grant lands after the permit is returned.
    c.delay(2, Duration::from_millis(300)).expect("delay");
    let ttl = Duration::from_millis(2000);
    let started = Instant::now();
    let mut permit = s.try_acquire(ttl).await.expect("permit on nodes 0 and 1");
    c.disconnect(0).await.expect("cut node 0");
    permit
        .extend(Duration::from_secs(10))
        .await
        .expect("extension at quorum (nodes 1 and 2)");
    // The give-back (node 0's extension hangs on the cut link, so no flush).
    let given_back = support::eventually(FLUSH, || async {
        let score: Option<f64> = raw(&c, 1)
            .await
            .zscore(&key, permit.token())
            .await
            .expect("ZSCORE");
        score.is_none()
    })
    .await;
    assert!(
        given_back,
        "node 1's entry, extended a moment ago, was given back"
    );
    // The first TTL has passed on every node.
    let wait = (ttl + Duration::from_millis(500)).saturating_sub(started.elapsed());
    tokio::time::sleep(wait).await;
    assert!(permit.is_valid(), "the holder believes it holds its permit");
    let live = live_on(&c, &[0, 1, 2], &key, permit.token()).await;
    assert!(
        live.len() >= s.quorum(),
        "a valid permit has live entries on {live:?} only, fewer than Q = {}",
        s.quorum()
    );
}

/// A TTL the client accepts (the builder allows a maximum up to `i64::MAX / 2` ms) but
/// whose expiry, `now + ttl`, Redis formats as `1.0…e+17`: `read_acquire.lua` adds the
/// reader, then `PEXPIREAT` refuses the score text and the script errors after its write.
/// The mutex takes the same TTL (`SET … PX`). Either both kinds work, or the client
/// refuses the TTL up front: a node failure is neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_ttl_the_mutex_accepts_is_not_a_node_failure_for_readers() {
    let c = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes");
    let a = Redlock::builder(c.urls())
        .max_ttl(Duration::from_millis(i64::MAX as u64 / 2))
        .build()
        .await
        .expect("build");
    let ttl = Duration::from_millis(100_000_000_000_000_000);
    let mutex = a.try_lock("review:long-ttl", ttl).await;
    let reader = a.try_read_lock("review:long-ttl", ttl).await;
    match (&mutex, &reader) {
        (Ok(_), Ok(_)) => {}
        (Err(Error::InvalidInput(_)), Err(Error::InvalidInput(_))) => {}
        _ => panic!("mutex: {mutex:?}; reader: {reader:?}"),
    }
}
