//! A semaphore permit's kept nodes: each test sets up one interleaving of the give-back
//! decision with the permit's drop, release, extension and the watchdog's rounds, against
//! real redis-server processes, and asserts what the proofs in `docs/safety.md` rely on:
//! nothing of a released permit is left anywhere (a grant that lands after the permit was
//! returned included), and each permit of a mixed watchdog round is counted on its own kept
//! nodes only.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{LostReason, Redlock, Watchdog};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use support::{client, node_ms, proxied, raw};

const FLUSH: Duration = Duration::from_secs(5);

fn holders(name: &str) -> String {
    format!("quorumlock:sem:{name}")
}

/// The nodes among `nodes` where `member` is in `key` at all (live or lapsed).
async fn present_on(c: &LocalCluster, nodes: &[usize], key: &str, member: &str) -> Vec<usize> {
    let mut on = Vec::new();
    for &i in nodes {
        let score: Option<f64> = raw(c, i).await.zscore(key, member).await.expect("ZSCORE");
        if score.is_some() {
            on.push(i);
        }
    }
    on
}

/// Loads the semaphore's scripts on every node and opens the connections, so a delayed
/// link later delays one round trip, not two (`NOSCRIPT`, then `EVAL`).
async fn warm_up(a: &Redlock) {
    let s = a.semaphore("sem-kept:warm-up", 3).expect("semaphore");
    let mut p = s.try_acquire(Duration::from_secs(5)).await.expect("permit");
    p.extend(Duration::from_secs(5)).await.expect("extend");
    p.release().await.expect("release");
    assert!(a.flush(FLUSH).await);
}

/// A permit returned at quorum while one node's grant is still on its way, then dropped,
/// released or kept and dropped before its give-back is decided: once the background work
/// is done, its token is on no node, the late grant's node included (the drop's release
/// waits for that node's acquire, and the give-back never counts on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_let_go_before_its_give_back_leaves_nothing_behind() {
    let c = proxied(3).await;
    let a = client(c.urls(), Duration::from_secs(2), false).await;
    let name = "sem-kept:let-go";
    let s = a.semaphore(name, 3).expect("semaphore");
    assert_eq!((s.per_node_limit(), s.quorum()), (2, 2));
    warm_up(&a).await;
    c.delay(2, Duration::from_millis(300)).expect("delay");
    for how in ["drop", "release", "keep-then-drop"] {
        let p = s
            .try_acquire(Duration::from_secs(20))
            .await
            .expect("permit");
        let tok = p.token().to_owned();
        match how {
            "drop" => drop(p),
            "release" => p.release().await.expect("released at quorum"),
            _ => drop(
                p.keep_alive(Watchdog::new())
                    .expect("a watchdog policy that fits the TTL"),
            ),
        }
        assert!(a.flush(FLUSH).await, "{how}: background work finished");
        let left = present_on(&c, &[0, 1, 2], &holders(name), &tok).await;
        assert!(left.is_empty(), "{how}: the token is left on {left:?}");
    }
}

/// A grant that times out (its node answers after the per-node timeout) but lands on the
/// node anyway: the permit keeps the two prompt grants, and the give-back, sent after the
/// acquire on the same link, removes the late entry. The permit's token ends up on exactly
/// its `Q` kept nodes, which its extensions then reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_lands_after_its_timeout_is_given_back() {
    let c = proxied(3).await;
    let a = client(c.urls(), Duration::from_millis(150), false).await;
    let name = "sem-kept:late-landing";
    let s = a.semaphore(name, 3).expect("semaphore");
    warm_up(&a).await;
    c.delay(2, Duration::from_millis(400)).expect("delay");
    let mut p = s
        .try_acquire(Duration::from_secs(20))
        .await
        .expect("permit");
    let tok = p.token().to_owned();
    // The acquire lands on node 2 about 400 ms after it was sent, the give-back after it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(a.flush(FLUSH).await);
    let on = present_on(&c, &[0, 1, 2], &holders(name), &tok).await;
    assert_eq!(on, [0, 1], "kept on the prompt grants only");
    c.delay(2, Duration::ZERO).expect("undelay");
    p.extend(Duration::from_secs(30))
        .await
        .expect("extended on its kept nodes");
    p.release().await.expect("release");
}

/// An extension cancelled while it waits for the give-back's decision sends nothing: the
/// deadline is unchanged and no node's entry moved; once decided, the next extension
/// succeeds on the kept nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_cancelled_while_it_waits_for_the_kept_nodes_sends_nothing() {
    let c = proxied(3).await;
    let a = client(c.urls(), Duration::from_secs(2), false).await;
    let name = "sem-kept:cancelled-extend";
    let key = holders(name);
    let s = a.semaphore(name, 3).expect("semaphore");
    warm_up(&a).await;
    c.delay(2, Duration::from_millis(400)).expect("delay");
    let ttl = Duration::from_secs(5);
    let mut p = s.try_acquire(ttl).await.expect("permit");
    let tok = p.token().to_owned();
    let deadline = p.deadline();
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), p.extend(Duration::from_secs(60))).await;
    assert!(
        cancelled.is_err(),
        "still waiting for the decision: {cancelled:?}"
    );
    assert_eq!(
        p.deadline(),
        deadline,
        "a cancelled extension moves nothing"
    );
    for i in [0, 1] {
        let now = node_ms(&c, i).await as f64;
        let score: Option<f64> = raw(&c, i).await.zscore(&key, &tok).await.expect("ZSCORE");
        let score = score.expect("granted promptly");
        assert!(
            score <= now + ttl.as_millis() as f64,
            "node {i}'s entry was extended by a cancelled call"
        );
    }
    c.delay(2, Duration::ZERO).expect("undelay");
    p.extend(Duration::from_secs(60)).await.expect("extended");
    assert!(p.remaining() > Duration::from_secs(30));
    p.release().await.expect("release");
}

/// One watchdog round with a mutex on every node and two permits kept on different pairs
/// of nodes (per-node batches of different lengths). Killing the node that only the first
/// permit keeps loses that permit (before its deadline) and nothing else: each lock's
/// answers are counted for that lock, from its own nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_round_counts_each_permit_on_its_own_kept_nodes() {
    let c = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes");
    let a = client(c.urls(), Duration::from_millis(200), false).await;
    let b = client(c.urls(), Duration::from_millis(200), false).await;
    // Long enough for the set-up below on a loaded machine (it took over 2 s once in CI).
    let ttl = Duration::from_millis(4_000);
    // P = 1 on 3 nodes: c = 1, Q = 2, each permit kept on two nodes.
    let sa = a.semaphore("sem-kept:mix-a", 1).expect("semaphore");
    let sb = a.semaphore("sem-kept:mix-b", 1).expect("semaphore");
    let mut pa = sa.try_acquire(ttl).await.expect("permit a");
    assert!(a.flush(FLUSH).await, "a's give-back done");
    let kept_a = present_on(&c, &[0, 1, 2], &holders("sem-kept:mix-a"), pa.token()).await;
    assert_eq!(kept_a.len(), 2, "a kept on Q nodes: {kept_a:?}");
    let (x, y) = (kept_a[0], kept_a[1]);
    let z = (0..3).find(|i| !kept_a.contains(i)).expect("a third node");
    pa.extend(ttl).await.expect("extend a during the set-up");
    // Another holder fills semaphore b on x: b is kept on y and z.
    let now = node_ms(&c, x).await;
    let mut conn = raw(&c, x).await;
    let _: () = conn
        .zadd(holders("sem-kept:mix-b"), "other-holder", now + 60_000)
        .await
        .expect("ZADD");
    let mut pb = sb.try_acquire(ttl).await.expect("permit b");
    assert!(a.flush(FLUSH).await, "b's give-back done");
    let kept_b = present_on(&c, &[0, 1, 2], &holders("sem-kept:mix-b"), pb.token()).await;
    assert_eq!(kept_b, {
        let mut v = vec![y, z];
        v.sort_unstable();
        v
    });
    let m = a.try_lock("sem-kept:mix-m", ttl).await.expect("mutex");
    // A full TTL ahead of each when it is handed over (the set-up took a while).
    pa.extend(ttl).await.expect("extend a");
    pb.extend(ttl).await.expect("extend b");
    let w = Watchdog::new().safety_margin(Duration::from_millis(400));
    assert!(!pa.remaining().is_zero() && !pb.remaining().is_zero());
    let (ka, kb, km) = (
        pa.keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
        pb.keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
        m.keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
    );
    assert!(
        !ka.is_lost() && !kb.is_lost() && !km.is_lost(),
        "kept at hand-over"
    );
    c.kill(x).await.expect("kill x");
    let started = Instant::now();
    let lost = tokio::time::timeout(ttl * 2, ka.lost())
        .await
        .expect("a is lost within its TTL");
    assert!(
        matches!(
            lost.reason(),
            LostReason::NotHeld | LostReason::ExtendFailed
        ),
        "{lost:?}"
    );
    assert!(
        ka.remaining() > Duration::ZERO,
        "a lost before its deadline"
    );
    // Two TTLs past the kill: b and the mutex are still kept, and still exclusive.
    tokio::time::sleep((ttl * 2).saturating_sub(started.elapsed())).await;
    assert!(!kb.is_lost() && kb.remaining() > Duration::ZERO, "b kept");
    assert!(
        !km.is_lost() && km.remaining() > Duration::ZERO,
        "mutex kept"
    );
    // (Refused, or short of nodes with x dead: never granted.)
    let other = b.try_lock("sem-kept:mix-m", ttl).await;
    assert!(other.is_err(), "a second holder of the mutex: {other:?}");
    let sb2 = b.semaphore("sem-kept:mix-b", 1).expect("semaphore");
    let other = sb2.try_acquire(ttl).await;
    assert!(other.is_err(), "a second holder of b: {other:?}");
    let _ = ka.release().await;
    kb.release().await.expect("release b");
    km.release().await.expect("release the mutex");
}
