//! Direct hand-off for locks on several resources, against real `redis-server`s.
//!
//! A multi-resource waiter (`lock_many` with notify waiting, unfenced) queues one entry in
//! each of its resources' queues, all with one token and one ticket (`enqueue_many.lua`).
//! A release hands it every key of its set at once or none (`release_one.lua`): the keys
//! go to it only when each is free and it heads each queue, so no waiter ever holds part of
//! a set while waiting for the rest (no hold-and-wait, hence no deadlock). Tested here: the
//! waiter holds with no acquire round of its own; it gets nothing while one of its keys is
//! held, and everything when the last one is released; a cancelled waiter does not strand
//! the waiters behind it; a lost announcement still ends with it holding; a waiter that
//! died costs one TTL; and eight clients on overlapping pairs of a ring of four resources,
//! with a node paused for a second, never overlap, never deadlock and all get the lock.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Lock, Redlock, Retry};
use quorumlock_testkit::{History, LocalCluster, ProxyMode};
use support::{
    acquires_run, count_key, eventually, get, lock_key, log_every_command, queued_on_every_node,
    raw,
};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A waiter whose retry delay (30 s) is far beyond the test: it can only get the lock by a
/// transfer (announced, or learnt at a renewal) or a hand-off-window claim.
const NOTIFIED_ONLY: Retry = Retry::new()
    .delay(Duration::from_secs(30), Duration::from_secs(30))
    .max_wait(Duration::from_secs(8));

async fn notified(cluster: &LocalCluster) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(cluster.urls())
        .retry(NOTIFIED_ONLY)
        .build()
        .await
}

/// Waits (bounded) until `n` entries are queued for `res` on every node.
async fn queued_everywhere(cluster: &LocalCluster, res: &str, n: u64) -> TestResult {
    Ok(queued_on_every_node(cluster, res, n).await?)
}

/// Whether every node's keys of `resources` hold `token` within 5 s (the release that hands
/// them over returns at its quorum; the last node's transfer may land later on a loaded
/// machine).
async fn holds_everywhere(cluster: &LocalCluster, resources: &[&str], token: &str) -> bool {
    eventually(Duration::from_secs(5), || async {
        for i in 0..cluster.len() {
            for r in resources {
                if get(cluster, i, &lock_key(r)).await.as_deref() != Some(token) {
                    return false;
                }
            }
        }
        true
    })
    .await
}

/// Asserts that no node ran an acquire since [`log_every_command`]: no `SET … NX`, no
/// acquire or claim script.
async fn assert_no_acquire_round(cluster: &LocalCluster) -> TestResult {
    let acquires = acquires_run(cluster).await;
    assert!(acquires.is_empty(), "acquires: {acquires:?}");
    Ok(())
}

/// A multi-resource waiter holds by transfer: once the holder of both resources releases,
/// the waiter holds them both with no acquire round of its own (no node ran a `SET … NX`,
/// a claim or an acquire script after the release began), its token is on every key of
/// every node, and its validity is at most the TTL minus the time since its last
/// confirmation (which came before the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_holds_by_transfer_without_an_acquire_round() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let set = ["many-a", "many-b"];
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    for r in set {
        queued_everywhere(&cluster, r, 1).await?;
    }
    log_every_command(&cluster).await?;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    println!(
        "multi-resource transfer: held {:?} after the release began",
        releasing.elapsed()
    );
    assert_no_acquire_round(&cluster).await?;
    assert!(holds_everywhere(&cluster, &set, got.token()).await);
    assert!(got.deadline() <= releasing + ttl, "{:?}", got.deadline());
    assert!(got.remaining() > ttl / 2, "{:?}", got.remaining());
    got.release().await?;
    for r in set {
        assert_eq!(count_key(&cluster, 0..3, &lock_key(r)).await, 0);
    }
    Ok(())
}

/// All or nothing: with each of its two resources held by another client, the waiter gets
/// nothing when the first is released (that key is free, the waiter still heads both
/// queues on every node), and both keys, by transfer, when the second is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_gets_nothing_until_every_key_is_free() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let first = Redlock::builder(cluster.urls()).build().await?;
    let second = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let set = ["part-a", "part-b"];
    let ttl = Duration::from_secs(10);
    let a = first.try_lock(set[0], ttl).await?;
    let b = second.try_lock(set[1], ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    for r in set {
        queued_everywhere(&cluster, r, 1).await?;
    }
    a.release().await?;
    // The release ran on every node (the quorum answered; the last one within a moment):
    // `part-a` is free everywhere and the waiter is still queued on both everywhere.
    let freed = eventually(Duration::from_secs(1), || async {
        count_key(&cluster, 0..3, &lock_key(set[0])).await == 0
    })
    .await;
    assert!(freed, "the first release ran everywhere");
    for r in set {
        queued_everywhere(&cluster, r, 1).await?;
    }
    assert!(!w.is_finished(), "holds part of its set");
    log_every_command(&cluster).await?;
    let releasing = Instant::now();
    b.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    println!(
        "all or nothing: held {:?} after the last key's release began",
        releasing.elapsed()
    );
    assert_no_acquire_round(&cluster).await?;
    assert!(holds_everywhere(&cluster, &set, got.token()).await);
    got.release().await?;
    Ok(())
}

/// A multi-resource waiter cancelled while queued (its future dropped) does not strand the
/// single-resource waiter behind it: its token is released on every node in the
/// background (its entries leave every queue), so the holder's release hands the key to
/// the next waiter within about a round, far below the TTL and the retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_multi_resource_waiter_does_not_strand_the_next() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let many = notified(&cluster).await?;
    let one = notified(&cluster).await?;
    let set = ["cancel-a", "cancel-b"];
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set, ttl).await?;
    let m = tokio::spawn(async move { many.lock_many(set, ttl).await.map(|_| ()) });
    queued_everywhere(&cluster, set[0], 1).await?;
    let s = tokio::spawn(async move { one.lock(set[0], ttl).await });
    queued_everywhere(&cluster, set[0], 2).await?;
    m.abort();
    queued_everywhere(&cluster, set[0], 1).await?;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), s).await???;
    let took = releasing.elapsed();
    println!("cancelled multi-resource head: the next waiter held {took:?} after the release");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(holds_everywhere(&cluster, &set[..1], got.token()).await);
    assert_eq!(count_key(&cluster, 0..3, &lock_key(set[1])).await, 0);
    got.release().await?;
    Ok(())
}

/// A multi-resource waiter whose links are cut while the transfer is announced still ends
/// up holding: its next renewal learns that every key holds its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_that_lost_the_announcement_still_holds() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(&direct).build().await?;
    let waiter = notified(&cluster).await?;
    let set = ["lost-a", "lost-b"];
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    for r in set {
        queued_everywhere(&cluster, r, 1).await?;
    }
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Blackhole);
    }
    lock.release().await?; // handed over and announced; the announcement is lost
    let released = Instant::now();
    let handed = eventually(Duration::from_secs(1), || async {
        get(&cluster, 0, &lock_key(set[1])).await.is_some()
    })
    .await;
    assert!(handed, "the release handed the keys over");
    tokio::time::sleep(Duration::from_millis(300)).await; // the announcement is gone
    for i in 0..3 {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    println!(
        "lost announcement: held {:?} after the release",
        released.elapsed()
    );
    assert!(holds_everywhere(&cluster, &set, got.token()).await);
    assert!(got.is_valid());
    got.release().await?;
    Ok(())
}

/// A multi-resource waiter that died with its entries queued (planted raw with
/// `enqueue_many.lua`: no one owns the token) is handed both keys by the release; the next
/// waiter gets them once that transfer's TTL runs out, not later than about one TTL plus
/// its retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_multi_resource_waiter_costs_at_most_one_ttl() -> TestResult {
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
    let set = ["dead-a", "dead-b"];
    let lock = holder.try_lock_many(set, Duration::from_secs(30)).await?;
    let dead_ttl = Duration::from_millis(1_500);
    let dead = "deaddeaddeaddeaddeaddeaddeaddead";
    let script = redis::Script::new(concat!(
        include_str!("../src/scripts/sets.lua"),
        include_str!("../src/scripts/enqueue_many.lua")
    ));
    for i in 0..3 {
        let mut call = script.prepare_invoke();
        for r in set {
            call.key(format!("quorumlock:queue:{r}"))
                .key(format!("quorumlock:qlease:{r}"))
                .key(format!("quorumlock:qattrs:{r}"))
                .key(lock_key(r));
        }
        call.key(format!("quorumlock:qset:{dead}"))
            .arg(dead)
            .arg("")
            .arg(60_000)
            .arg(dead_ttl.as_millis().to_string())
            .arg("1")
            .arg("quorumlock:released:\u{1}nobody");
        let _: redis::Value = call.invoke_async(&mut raw(&cluster, i).await).await?;
    }
    let next = tokio::spawn(async move {
        let got = waiter.lock_many(set, Duration::from_secs(10)).await;
        got.map(|l| l.token().to_owned())
    });
    for r in set {
        queued_everywhere(&cluster, r, 2).await?;
    }
    let released = Instant::now();
    lock.release().await?;
    assert_eq!(
        get(&cluster, 0, &lock_key(set[1])).await.as_deref(),
        Some(dead)
    );
    let token = tokio::time::timeout(Duration::from_secs(10), next).await???;
    let after = released.elapsed();
    println!("dead multi-resource waiter: the next held {after:?} after the release");
    assert_ne!(token, dead);
    assert!(
        after >= dead_ttl - Duration::from_millis(100),
        "the dead waiter's transfer held the keys: got them after {after:?}"
    );
    assert!(
        after <= dead_ttl + Duration::from_secs(2),
        "at most about one TTL: {after:?}"
    );
    Ok(())
}

/// Eight clients lock overlapping pairs of a ring of four resources (client `c` takes
/// `ring-c%4` and `ring-(c+1)%4`, so every resource is wanted by four clients and every
/// client's pair overlaps four others) for about three seconds, while one node is paused
/// for a second in the middle. The history checker finds no two holders of a resource at
/// once; every client gets its pair (no deadlock, no starvation), and the pairs keep
/// changing hands during and after the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_pairs_never_overlap_deadlock_or_starve() -> TestResult {
    const CLIENTS: u64 = 8;
    let cluster = LocalCluster::builder(3).launch().await?;
    let history = History::new();
    let ttl = Duration::from_secs(2);
    let end = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = Redlock::builder(cluster.urls())
            .retry(Retry::new().max_wait(Duration::from_secs(10)))
            .build()
            .await?;
        let rec = history.client(c + 1);
        let pair = [format!("ring-{}", c % 4), format!("ring-{}", (c + 1) % 4)];
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            let mut failed = 0u32;
            for _ in 0..1_000 {
                if Instant::now() >= end {
                    break;
                }
                for r in &pair {
                    rec.acquire_invoked(r);
                }
                let got: Result<Lock, _> = client.lock_many(&pair, ttl).await;
                match got {
                    Ok(lock) => {
                        for r in &pair {
                            rec.acquired(r, lock.deadline(), None);
                        }
                        held.push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        for r in &pair {
                            rec.release_invoked(r);
                        }
                        let ok = lock.release().await.is_ok();
                        for r in &pair {
                            if ok {
                                rec.released(r);
                            } else {
                                rec.release_failed(r);
                            }
                        }
                    }
                    Err(_) => {
                        failed += 1;
                        for r in &pair {
                            rec.acquire_failed(r);
                        }
                    }
                }
            }
            (held, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let paused_at = Instant::now();
    cluster.pause(0).await?;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.resume(0).await?;
    let resumed_at = Instant::now();
    let mut all = Vec::new();
    let mut per_client = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (held, failed) = tokio::time::timeout(Duration::from_secs(30), t).await??;
        per_client.push(held.len());
        failures += failed;
        all.extend(held);
    }
    let during = all
        .iter()
        .filter(|t| **t >= paused_at && **t < resumed_at)
        .count();
    let after = all.iter().filter(|t| **t >= resumed_at).count();
    println!(
        "overlapping pairs: {} acquisitions (per client {per_client:?}), {during} while node 0 \
         was paused, {after} after, {failures} gave up",
        all.len()
    );
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    assert!(
        per_client.iter().all(|n| *n >= 1),
        "every client got its pair: {per_client:?}"
    );
    assert_eq!(failures, 0, "no waiter gave up within 10 s");
    assert!(during >= 3, "progress while a node was paused: {during}");
    assert!(after >= 3, "progress after the pause: {after}");
    Ok(())
}
