//! The node side of the direct hand-off against real `redis-server`s: a release through
//! the library transfers the key, on every node, to a queued transfer entry (with that
//! entry's TTL), a fenced transfer raises the fence counter above the releaser's token,
//! a token is never queued twice on a node, and a transfer to a waiter that is dead (its
//! entry planted raw, no one owns the token) costs the next waiter at most that TTL.
//!
//! The waiter side: a queued waiter holds by transfer with no acquire round of its own
//! (checked in every node's command log), a fenced transfer commits a larger token, a
//! cancelled waiter does not strand the lock, a lost announcement still ends with the
//! waiter holding, and eight contenders with a node paused never overlap (history checker).

#[path = "support/scripts.rs"]
mod scripts;
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use quorumlock::{QUEUE_LEASE, Redlock, Retry};
use quorumlock_testkit::{History, LocalCluster, ProxyMode};
use redis::aio::MultiplexedConnection;
use support::{
    acl_cluster, acquires_run, connections_received, count_key, del_on, eventually, get, heralds,
    lock_key, log_every_command, plant_everywhere, queue_keys, queued_on_every_node, raw, zcards,
};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Joins (or renews) `token` raw on one node: `{state, ahead, ticket, holds, free}`.
async fn enqueue(
    conn: &mut MultiplexedConnection,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    kind: &str,
    first: bool,
) -> Vec<redis::Value> {
    redis::Script::new(&scripts::source("enqueue"))
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
    // The release returns once a quorum answered; the last node's may still be on its way.
    assert!(
        holds_everywhere(&cluster, res, waiter).await,
        "not on every node"
    );
    for i in 0..3 {
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
    // The waiter is waiting, queued behind the dead entry on every node, before the
    // release.
    queued_on_every_node(&cluster, res, 2).await?;
    let released = Instant::now();
    lock.release().await?;
    // Handed to the dead entry (the release returns at a quorum: node 0's may land later).
    let handed = eventually(Duration::from_secs(1), || async {
        get(&cluster, 0, &lock_key(res)).await.as_deref() == Some(dead)
    })
    .await;
    assert!(handed, "node 0 did not hand the key to the dead entry");
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

// ---- The waiter side: a `Lock` obtained by transfer ----

/// A waiter whose retry delay (30 s) is far beyond the test: it can only get the lock by a
/// transfer (announced, or learnt at a renewal) or a hand-off-window claim.
const NOTIFIED_ONLY: Retry = Retry::new()
    .delay(Duration::from_secs(30), Duration::from_secs(30))
    .max_wait(Duration::from_secs(8));

/// A client of `cluster` that waits with [`NOTIFIED_ONLY`].
async fn notified(cluster: &LocalCluster) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(cluster.urls())
        .retry(NOTIFIED_ONLY)
        .build()
        .await
}

/// The number of entries in the resource's wait queue on each node.
async fn queue_sizes(cluster: &LocalCluster, res: &str) -> Vec<u64> {
    zcards(cluster, &format!("quorumlock:queue:{res}")).await
}

/// Waits (bounded) until `n` waiters are queued on every node and every node has a
/// subscriber on the resource's channel.
async fn queued_everywhere(cluster: &LocalCluster, res: &str, n: u64) -> TestResult {
    queued_on_every_node(cluster, res, n).await?;
    let channel = format!("quorumlock:released:{res}");
    let subscribed = eventually(Duration::from_secs(5), || async {
        for i in 0..cluster.len() {
            let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut raw(cluster, i).await)
                .await
                .expect("NUMSUB");
            if v.first().is_none_or(|(_, k)| *k == 0) {
                return false;
            }
        }
        true
    })
    .await;
    if !subscribed {
        return Err("not subscribed".into());
    }
    Ok(())
}

/// Whether every node's key holds `token` within a second (the waiter holds once a
/// quorum transferred; the release reaches the last node moments later).
async fn holds_everywhere(cluster: &LocalCluster, res: &str, token: &str) -> bool {
    eventually(Duration::from_secs(1), || async {
        for i in 0..cluster.len() {
            if get(cluster, i, &lock_key(res)).await.as_deref() != Some(token) {
                return false;
            }
        }
        true
    })
    .await
}

/// A contended hand-off happens by transfer: once the holder releases, the queued waiter
/// holds the lock with no acquire round of its own (no node ran a `SET … NX`, a claim
/// script or a fenced acquire after the release began: checked in every node's command
/// log), its token is on every node, and its validity is at most the TTL minus the time
/// since its last confirmation (which came before the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_holds_by_transfer_without_an_acquire_round() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let res = "handoff-waiter";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    log_every_command(&cluster).await?;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let took = releasing.elapsed();
    println!("transfer: the waiter held {took:?} after the release began");
    let acquires = acquires_run(&cluster).await;
    assert!(
        acquires.is_empty(),
        "acquires after the release: {acquires:?}"
    );
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    // Its last confirmation came before the release began.
    assert!(got.deadline() <= releasing + ttl, "{:?}", got.deadline());
    assert!(got.remaining() > ttl / 2, "{:?}", got.remaining());
    got.release().await?;
    assert_eq!(count_key(&cluster, 0..3, &lock_key(res)).await, 0);
    Ok(())
}

/// The release of a lock on several resources hands each key to its own queue's head
/// too: a waiter queued on one of them holds it by transfer, with no acquire round of its
/// own (checked in every node's command log), while the other resource's key is simply
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_several_resources_transfers_each_to_its_queue() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let (res, other) = ("handoff-many-a", "handoff-many-b");
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many([res, other], ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    log_every_command(&cluster).await?;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let acquires = acquires_run(&cluster).await;
    assert!(
        acquires.is_empty(),
        "acquires after the release: {acquires:?}"
    );
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    assert_eq!(count_key(&cluster, 0..3, &lock_key(other)).await, 0);
    assert!(got.deadline() <= releasing + ttl, "{:?}", got.deadline());
    got.release().await?;
    assert_eq!(count_key(&cluster, 0..3, &lock_key(res)).await, 0);
    Ok(())
}

/// A fenced transfer: the waiter's fencing token is larger than the releaser's, and the
/// commit round ran: at least a quorum of counters is exactly the waiter's fencing token
/// (the transfers raised each node's counter to its own value, from the node's clock in
/// µs; the commit raised the counted ones to their maximum; a node whose transfer came
/// after the quorum may be higher still).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_holds_by_transfer_with_a_larger_committed_token() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls())
        .fencing(true)
        .build()
        .await?;
    let waiter = Redlock::builder(cluster.urls())
        .fencing(true)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    let res = "handoff-waiter-fenced";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let before = lock.fencing_token().ok_or("no fencing token")?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let t = got.fencing_token().ok_or("no fencing token")?;
    assert!(t > before, "{t} <= {before}");
    let mut at_t = 0;
    for i in 0..3 {
        let counter: u64 = get(&cluster, i, &format!("quorumlock:fence:{res}"))
            .await
            .ok_or("no counter")?
            .parse()?;
        assert!(counter > before, "node {i}: {counter} <= {before}");
        at_t += usize::from(counter == t);
    }
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    assert!(at_t >= 2, "the commit raised a quorum's counters to {t}");
    got.release().await?;
    Ok(())
}

/// A waiter cancelled while queued (its future dropped) does not strand the lock: its
/// token is retired in the background (released on every node, passing on any transfer to
/// it), so the next waiter holds within about a round of the release, far below the TTL
/// and its own retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_does_not_strand_the_lock() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let first = notified(&cluster).await?;
    let second = notified(&cluster).await?;
    let res = "handoff-cancelled";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let a = tokio::spawn(async move { first.lock(res, ttl).await.map(|l| l.token().to_owned()) });
    queued_everywhere(&cluster, res, 1).await?;
    let b = tokio::spawn(async move { second.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 2).await?;
    a.abort();
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), b).await???;
    let took = releasing.elapsed();
    println!("cancelled head: the next waiter held {took:?} after the release began");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    got.release().await?;
    Ok(())
}

/// A waiter whose subscriptions are cut while the release is announced still ends up
/// holding: its next lease renewal learns that the keys hold its token (or it claims).
/// Its retry delay (30 s) is far beyond the test, so the fallback timer plays no part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_announcement_still_ends_with_the_waiter_holding() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(&direct).build().await?;
    let waiter = notified(&cluster).await?;
    let res = "handoff-lost";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Blackhole);
    }
    lock.release().await?; // announced, and lost on the cut links
    let released = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await; // the announcement is gone
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    println!(
        "lost announcement: held {:?} after the release",
        released.elapsed()
    );
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    assert!(got.is_valid());
    got.release().await?;
    Ok(())
}

/// Eight clients contend for one resource for about three seconds while one node is
/// paused (SIGSTOP) for a second in the middle: the history checker finds no two holders
/// at once, and the lock keeps changing hands during and after the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_transfers_with_a_paused_node_never_overlap() -> TestResult {
    const CLIENTS: u32 = 8;
    let cluster = LocalCluster::builder(3).launch().await?;
    let history = History::new();
    let res = "handoff-contended";
    let ttl = Duration::from_secs(2);
    let end = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = Redlock::builder(cluster.urls())
            .retry(Retry::new().max_wait(Duration::from_secs(10)))
            .build()
            .await?;
        let rec = history.client(u64::from(c) + 1);
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..1_000 {
                if Instant::now() >= end {
                    break;
                }
                rec.acquire_invoked(res);
                match client.lock(res, ttl).await {
                    Ok(lock) => {
                        rec.acquired(res, lock.deadline(), None);
                        held.push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        rec.release_invoked(res);
                        match lock.release().await {
                            Ok(()) => rec.released(res),
                            Err(_) => rec.release_failed(res),
                        };
                    }
                    Err(_) => {
                        rec.acquire_failed(res);
                    }
                }
            }
            held
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let paused_at = Instant::now();
    cluster.pause(0).await?;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.resume(0).await?;
    let resumed_at = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(tokio::time::timeout(Duration::from_secs(30), t).await??);
    }
    let during = all
        .iter()
        .filter(|t| **t >= paused_at && **t < resumed_at)
        .count();
    let after = all.iter().filter(|t| **t >= resumed_at).count();
    println!(
        "contended: {} acquisitions, {during} while node 0 was paused, {after} after",
        all.len()
    );
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    assert!(during >= 3, "progress while a node was paused: {during}");
    assert!(after >= 3, "progress after the pause: {after}");
    Ok(())
}

/// A waiter's first claim (before it ever joined) is granted on a slow node only after
/// the round was decided (refused by the others); the claim's clean-up release reaches
/// that node only once the grant's reply is back, so the waiter's first join arrives in
/// between and finds the key holding its own token. That key was set by the claim, not
/// by a transfer: counting it (with the join's send time as its confirmation) would let
/// the waiter hold with a key its own clean-up deletes moments later. Here the holder's
/// release reaches node 0 only (node 1's link is cut), so such a waiter would hold with
/// one real key out of three. The waiter must never hold a lock that fewer than a quorum
/// of keys carry while it is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_by_the_waiters_own_failed_claim_is_never_counted() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let holder = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .build()
        .await?;
    let waiter = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .retry(
            Retry::new()
                .delay(Duration::from_secs(1), Duration::from_secs(1))
                .max_wait(Duration::from_secs(8)),
        )
        .build()
        .await?;
    let res = "handoff-own-claim";
    let lock = holder.try_lock(res, Duration::from_secs(3)).await?;
    // Node 2's key is gone (expired there early, say): a claim is granted there.
    let _: () = redis::cmd("DEL")
        .arg(lock_key(res))
        .query_async(&mut raw(&cluster, 2).await)
        .await?;
    cluster.delay(2, Duration::from_millis(300))?;
    let ttl = Duration::from_secs(10);
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    let joined = eventually(Duration::from_secs(5), || async {
        queue_sizes(&cluster, res).await.first() == Some(&1)
    })
    .await;
    assert!(joined, "the waiter joined node 0");
    cluster.proxy(1)?.set_mode(ProxyMode::Blackhole);
    let _ = lock.release().await; // transfers on node 0 only
    let got = tokio::time::timeout(Duration::from_secs(9), w).await??;
    cluster.proxy(1)?.set_mode(ProxyMode::Pass);
    let Ok(got) = got else {
        return Ok(()); // gave up: safe
    };
    let token = got.token().to_owned();
    let short = eventually(Duration::from_secs(3), || async {
        let mut n = 0;
        for i in 0..3 {
            n += usize::from(get(&cluster, i, &lock_key(res)).await.as_deref() == Some(&*token));
        }
        n < 2 && got.is_valid()
    })
    .await;
    assert!(
        !short,
        "the waiter holds a valid lock that fewer than 2 of 3 keys carry"
    );
    Ok(())
}

/// The fenced twin of the lost-announcement case: the renewal's reply (the keys hold the
/// token) carries no fence value, so the waiter cannot commit from it; it must claim (its
/// own token there counts as granted, the counter raised as for a fresh grant) rather
/// than give away the lock it was handed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_that_lost_the_announcement_claims_what_it_was_handed() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(&direct).fencing(true).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .fencing(true)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    let res = "handoff-lost-fenced";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let before = lock.fencing_token().ok_or("no fencing token")?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Blackhole);
    }
    lock.release().await?; // announced, and lost on the cut links
    tokio::time::sleep(Duration::from_millis(300)).await; // the announcement is gone
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    let got = tokio::time::timeout(Duration::from_secs(9), w).await???;
    let t = got.fencing_token().ok_or("no fencing token")?;
    assert!(t > before, "{t} <= {before}");
    assert!(got.is_valid());
    got.release().await?;
    Ok(())
}

/// A transfer is announced to the waiter's client only: the release publishes it on the
/// channel the waiter's queue entry named (its client's inbox), not on the resource's
/// channel, so a client listening to the resource hears nothing of the hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_is_announced_to_the_waiters_client_only() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let res = "handoff-inbox";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let mut listener = redis::Client::open(cluster.direct_url(0)?)?
        .get_async_pubsub()
        .await?;
    listener.psubscribe("quorumlock:*").await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    // The waiter holds at a quorum; wait for the release to reach every node (node 0's
    // transfer included), then publish a marker on node 0: once it arrives, everything
    // node 0 published before it has arrived too.
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    let end = "quorumlock:test-end";
    let _: i64 = redis::cmd("PUBLISH")
        .arg(end)
        .arg("end")
        .query_async(&mut raw(&cluster, 0).await)
        .await?;
    let mut heard = Vec::new();
    let mut messages = listener.on_message();
    let finished = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(m) = messages.next().await {
            let channel: Vec<u8> = m.get_channel().unwrap_or_default();
            if channel == end.as_bytes() {
                return true;
            }
            heard.push((
                channel,
                String::from_utf8_lossy(m.get_payload_bytes()).into_owned(),
            ));
        }
        false
    })
    .await;
    assert_eq!(
        finished,
        Ok(true),
        "the end marker never arrived: {heard:?}"
    );
    let [(channel, payload)] = heard.as_slice() else {
        panic!("expected the one transfer announcement, heard {heard:?}");
    };
    // The inbox: under the release channels' prefix, then byte 0xFF (never in a
    // resource name) and `inbox:`.
    assert!(
        channel.starts_with(b"quorumlock:released:\xffinbox:"),
        "{:?}",
        String::from_utf8_lossy(channel)
    );
    assert!(
        payload.contains(":>:") && payload.ends_with(got.token()),
        "{payload} for {}",
        got.token()
    );
    got.release().await?;
    Ok(())
}

/// A release that hands the lock to no one (here the waiter's queue entries were deleted
/// behind its back, as a node restarted without persistence would lose them) still wakes
/// the waiter at the head of the queue: it claims at once, not at its fallback timer
/// (30 s, beyond its maximum wait of 8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_wakes_the_waiter_at_the_head() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let res = "handoff-plain";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    let all: Vec<usize> = (0..cluster.len()).collect();
    del_on(&cluster, &all, &queue_keys(res)).await;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    let took = releasing.elapsed();
    println!("plain release: the head waiter held {took:?} after the release began");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Held by a claim, decided at a quorum: a node the holder's release had not reached
    // yet refused it, so only a quorum is sure to hold the token.
    let mut holding = 0;
    for n in 0..cluster.len() {
        if get(&cluster, n, &lock_key(res)).await.as_deref() == Some(got.token()) {
            holding += 1;
        }
    }
    assert!(holding >= 2, "{holding} of 3 nodes hold the waiter's token");
    assert!(got.is_valid());
    got.release().await?;
    Ok(())
}

/// A herald announces a plain release as soon as its own key is free, while the same
/// release is still on its way to the other nodes; the other herald's announcement of it
/// wakes no one (a release wakes a client's waiters once). The waiter at the head, woken
/// by the first announcement, claims before the release reached the others and is
/// refused there by the lock being released. Here the holder reaches the second herald
/// and the third node 80 ms late, after the waiter queued again: the release, landing
/// there, transfers the key to it, and it holds at once, not at its fallback timer (30 s,
/// beyond its maximum wait of 8 s). (Landing before it queued again, the release leaves
/// the key free: see the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_overtakes_the_release_it_heard_is_handed_the_lock() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let res = "handoff-overtaken";
    let [first, _] = heralds(res, cluster.len());
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let direct: Vec<String> = (0..cluster.len())
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let waiter = Redlock::builder(direct)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    // No queue entry, but the waiting mark (the leases key) stays: the release is a plain
    // one everywhere, announced by the heralds. (Without the mark nothing is announced, and
    // the waiter finds the free key at its next renewal: the next test.)
    let all: Vec<usize> = (0..cluster.len()).collect();
    let [queue, _leases, attrs] = queue_keys(res);
    del_on(&cluster, &all, &[queue, attrs]).await;
    for i in (0..cluster.len()).filter(|i| *i != first) {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(80)));
    }
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let took = releasing.elapsed();
    println!("overtaken release: the head waiter held {took:?} after the release began");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(got.is_valid());
    let mut holding = 0;
    for n in 0..cluster.len() {
        if get(&cluster, n, &lock_key(res)).await.as_deref() == Some(got.token()) {
            holding += 1;
        }
    }
    assert!(holding >= 2, "{holding} of 3 nodes hold the waiter's token");
    got.release().await?;
    Ok(())
}

/// The head of the queue claims when its renewal finds the key free on a quorum, with no
/// announcement at all. That is how it ends a release that a claim of its overtook: the
/// release landed on the other nodes between the refused claim and the waiter's next
/// join, and its one announcement was spent on the claim. Here the keys are deleted
/// behind the waiter's back (no announcement), and it holds within about one renewal
/// (a third of the queue lease), not at its fallback timer (30 s, beyond its maximum
/// wait of 8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_claims_when_its_renewal_finds_the_key_free() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let res = "handoff-silent";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    let freed = Instant::now();
    let all: Vec<usize> = (0..cluster.len()).collect();
    del_on(&cluster, &all, &[lock_key(res)]).await;
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    let took = freed.elapsed();
    println!("silent release: the head waiter held {took:?} after the keys were freed");
    assert!(took < QUEUE_LEASE / 3 + Duration::from_secs(1), "{took:?}");
    assert!(got.is_valid());
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    got.release().await?;
    drop(lock);
    Ok(())
}

/// The ACL a deployment needs for hand-offs is keys `~quorumlock:*` and the channels
/// `&quorumlock:released:*`: a client's inbox lies under that prefix too, so a waiter's
/// subscription is accepted, the release's announcement to it is allowed (the release
/// succeeds), the waiter holds by transfer, and no node sees a stream of reconnections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_needs_no_channel_beyond_the_release_prefix() -> TestResult {
    let (cluster, urls) = acl_cluster(&["&quorumlock:released:*"], false).await?;
    let before: Vec<u64> =
        futures::future::join_all((0..cluster.len()).map(|i| connections_received(&cluster, i)))
            .await;
    let holder = Redlock::builder(urls.clone()).build().await?;
    let waiter = Redlock::builder(urls).retry(NOTIFIED_ONLY).build().await?;
    let res = "handoff-acl";
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    assert!(holds_everywhere(&cluster, res, got.token()).await);
    got.release().await?;
    for (i, b) in before.iter().enumerate() {
        let opened = connections_received(&cluster, i).await.saturating_sub(*b);
        assert!(opened < 30, "node {i} accepted {opened} connections");
    }
    Ok(())
}

/// A node that refuses a client's subscriptions (an ACL user with no channels) costs the
/// client its notifications, not a reconnection loop: the waiter still waits (its retry
/// delay), gives up at its maximum wait, and each node accepts a handful of connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_not_retried_in_a_loop() -> TestResult {
    let (cluster, urls) = acl_cluster(&["resetchannels"], false).await?;
    let res = "handoff-refused";
    plant_everywhere(&cluster, &lock_key(res), "someone-else", 60_000).await;
    let before: Vec<u64> =
        futures::future::join_all((0..cluster.len()).map(|i| connections_received(&cluster, i)))
            .await;
    let waiter = Redlock::builder(urls)
        .retry(
            Retry::new()
                .delay(Duration::from_millis(50), Duration::from_millis(100))
                .max_wait(Duration::from_millis(1500)),
        )
        .build()
        .await?;
    let start = Instant::now();
    let got = waiter.lock(res, Duration::from_secs(10)).await;
    assert!(got.is_err(), "held a lock someone else holds");
    assert!(start.elapsed() >= Duration::from_millis(1400));
    for (i, b) in before.iter().enumerate() {
        let opened = connections_received(&cluster, i).await.saturating_sub(*b);
        assert!(
            opened < 30,
            "node {i} accepted {opened} connections in 1.5 s"
        );
    }
    Ok(())
}

/// The notice that a subscription became active is no release: a waiter does not spend a
/// claim on it. With two attempts and a fallback delay of 500 ms, the waiter's second
/// claim comes at its fallback timer, so it gives up after 500 ms, not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_notice_does_not_spend_an_attempt() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let res = "handoff-notice";
    let lock = holder.try_lock(res, Duration::from_secs(10)).await?;
    let waiter = Redlock::builder(cluster.urls())
        .retry(
            Retry::new()
                .attempts(2)
                .delay(Duration::from_millis(500), Duration::from_millis(500))
                .no_max_wait(),
        )
        .build()
        .await?;
    let start = Instant::now();
    let got = waiter.lock(res, Duration::from_secs(10)).await;
    let took = start.elapsed();
    assert!(got.is_err(), "held a lock someone else holds");
    assert!(took >= Duration::from_millis(450), "gave up after {took:?}");
    lock.release().await?;
    Ok(())
}

/// A waiter that won the lock by a claim (its queue entries still in place) lets them
/// lapse at once: should it crash holding the lock, the next waiter is the queue's head
/// and takes the lock when the TTL (1 s) runs out, not when the crashed holder's entry
/// lease (3 s) would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_claim_holder_does_not_hold_back_the_next_waiter() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let first = Redlock::builder(cluster.urls()).build().await?;
    let retry = Retry::new()
        .delay(Duration::from_millis(20), Duration::from_millis(50))
        .max_wait(Duration::from_secs(8));
    let claimer = Redlock::builder(cluster.urls())
        .retry(retry)
        .build()
        .await?;
    let next = Redlock::builder(cluster.urls())
        .retry(retry)
        .build()
        .await?;
    let res = "handoff-crashed-claimer";
    let ttl = Duration::from_secs(1);
    // The first holder crashes (its guard forgotten): the queued claimer takes the lock by
    // a claim when the key expires, its entries still queued.
    let gone = first.try_lock(res, Duration::from_millis(700)).await?;
    std::mem::forget(gone);
    let claimed = claimer.lock(res, ttl).await?;
    let held_at = Instant::now();
    // The claimer crashes too; the next waiter queues behind whatever it left.
    std::mem::forget(claimed);
    let got = tokio::time::timeout(Duration::from_secs(6), next.lock(res, ttl)).await??;
    let took = held_at.elapsed();
    println!("next waiter held {took:?} after the claimer took a 1 s lock");
    assert!(took < Duration::from_millis(1900), "{took:?}");
    got.release().await?;
    Ok(())
}

/// A waiter whose latest reply had someone ahead of it hears a plain release (here of a
/// multi-resource holder) after that someone left: it renews soon (100 ms after its previous
/// join at the soonest), learns that it is the head, and claims, instead of waiting for its
/// next renewal and its fallback timer (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_after_the_waiter_ahead_left_wakes_the_next_one() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let first = notified(&cluster).await?;
    let second = notified(&cluster).await?;
    let res = "handoff-stale-head";
    let ttl = Duration::from_secs(10);
    let lock = holder
        .try_lock_many([res, "handoff-stale-head-other"], ttl)
        .await?;
    let a = tokio::spawn(async move { first.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 1).await?;
    let b = tokio::spawn(async move { second.lock(res, ttl).await });
    queued_everywhere(&cluster, res, 2).await?;
    // The first waiter leaves; the second one's latest reply still had it ahead.
    a.abort();
    let _ = a.await;
    queued_everywhere(&cluster, res, 1).await?;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(8), b).await???;
    let took = releasing.elapsed();
    println!("the next waiter held {took:?} after the plain release began");
    assert!(took < Duration::from_millis(700), "{took:?}");
    got.release().await?;
    Ok(())
}
