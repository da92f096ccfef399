//! Multi-resource waiters (notified, then claimed, every key or none): a holder of one key
//! waiting for another is never stuck behind a blocked multi-resource waiter (it does not
//! queue); a cancelled waiter leaves nothing beyond its marks' lease; a release that runs while a
//! waiter's join or mark is on its way is not lost; and random
//! sets under cancellation, crashes and link faults never overlap and leave no key behind.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::LocalCluster;
use support::{announcements, count_key, eventually, lock_key, zcards};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Waits (bounded) until some node has `n` entries queued for `res` (before the change a
/// multi-resource waiter queued on its first resource's heralds only).
async fn queued_somewhere(cluster: &LocalCluster, res: &str, n: u64) -> TestResult {
    let key = format!("quorumlock:queue:{res}");
    let ok = eventually(Duration::from_secs(2), || async {
        zcards(cluster, &key).await.contains(&n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("{key}: {:?} (queued: {ok})", zcards(cluster, &key).await);
    Ok(())
}

/// Liveness (head-of-line blocking turned into a deadlock). Client Y holds `b` and then
/// waits for `a` (nested locks: legal, and deadlock-free against a `lock_many(a, b)`
/// caller, which holds nothing while it waits). A multi-resource waiter W for {a, b}
/// queued before Y. `a`'s holder releases: the release cannot hand W its set (`b` is
/// held), so `a` is deleted and W stays at the head of `a`'s queue. Y, queued behind W,
/// is not the head, so it never claims the free key; W claims on its fallback timer and
/// is refused on `b` (held by Y), every node refusing, so it keeps its place. Nobody
/// makes progress until Y gives up: `a` stays free the whole time.
/// The release now serves the first waiter behind W that can be served now: Y gets `a`
/// within milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_holder_is_not_deadlocked_by_a_multi_resource_waiter() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = Redlock::builder(&urls).build().await?;
    let y = Redlock::builder(&urls)
        .retry(Retry::new().max_wait(Duration::from_secs(4)))
        .build()
        .await?;
    let w = Redlock::builder(&urls)
        .retry(Retry::new().max_wait(Duration::from_secs(15)))
        .build()
        .await?;
    let (a, b) = ("hol-a", "hol-b");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, ttl).await?;
    let b_lock = y.try_lock(b, ttl).await?; // Y holds b ...
    let waiter = tokio::spawn(async move { w.lock_many([a, b], ttl).await });
    queued_somewhere(&cluster, a, 1).await?;
    // ... and waits for a (queued behind W).
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock(a, ttl).await });
    queued_somewhere(&cluster, a, 2).await?;
    let released = Instant::now();
    a_lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(10), nested).await??;
    let took = released.elapsed();
    let a_free_on = 3 - count_key(&cluster, 0..3, &lock_key(a)).await;
    println!(
        "nested holder waiting for a free key behind a blocked multi-resource waiter: {:?} \
         after {took:?} (a free on {a_free_on} nodes)",
        got.as_ref().map(|l| l.token().to_owned())
    );
    waiter.abort();
    assert!(
        got.is_ok(),
        "Y never got the free key `a` (deadlock until its max_wait): {took:?}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    if let Ok(l) = got {
        l.release().await?;
    }
    b_lock.release().await?;
    Ok(())
}

/// Safety stress: clients lock random sets of one to three of four resources (transfer
/// waiting for all of them), some waits cancelled mid-way, some holders "crash" (the lock
/// is forgotten, never released), with link faults cycling over the nodes (replies
/// dropped, stalls, delays) and a node paused. The history checker must find no two
/// holders of one resource at once (each hold counted up to its deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sets_with_cancellation_crashes_and_link_faults_never_overlap() -> TestResult {
    use quorumlock_testkit::{History, ProxyMode};
    use rand::RngExt;
    const CLIENTS: u64 = 8;
    let names = ["rs-0", "rs-1", "rs-2", "rs-3"];
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let history = History::new();
    let secs: u64 = std::env::var("QUORUMLOCK_TRANSFER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = Redlock::builder(cluster.urls())
            .retry(
                Retry::new()
                    .delay(Duration::from_millis(20), Duration::from_millis(150))
                    .max_wait(Duration::from_secs(3)),
            )
            .build()
            .await?;
        let rec = history.client(c + 1);
        tasks.push(tokio::spawn(async move {
            let mut held = 0u32;
            let mut failed = 0u32;
            while Instant::now() < end {
                let (set, ttl, cancel, crash, hold) = {
                    let mut rng = rand::rng();
                    let k = rng.random_range(1..=3usize);
                    let mut set: Vec<String> = Vec::new();
                    while set.len() < k {
                        let n = names[rng.random_range(0..4)].to_owned();
                        if !set.contains(&n) {
                            set.push(n);
                        }
                    }
                    let ttl = Duration::from_millis(rng.random_range(250..=1200));
                    let cancel = rng
                        .random_bool(0.15)
                        .then(|| Duration::from_millis(rng.random_range(1..=200)));
                    let crash = rng.random_bool(0.05);
                    let hold = Duration::from_millis(rng.random_range(0..=30));
                    (set, ttl, cancel, crash, hold)
                };
                for r in &set {
                    rec.acquire_invoked(r);
                }
                let fut = client.lock_many(set.clone(), ttl);
                let got = match cancel {
                    Some(d) => tokio::time::timeout(d, fut).await.ok(),
                    None => Some(fut.await),
                };
                match got {
                    Some(Ok(lock)) => {
                        for r in &set {
                            rec.acquired(r, lock.deadline(), None);
                        }
                        held += 1;
                        tokio::time::sleep(hold).await;
                        if crash {
                            // Never released: the keys lapse with the TTL.
                            std::mem::forget(lock);
                            continue;
                        }
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
                    Some(Err(_)) | None => {
                        if cancel.is_none() {
                            failed += 1;
                        }
                        for r in &set {
                            rec.acquire_failed(r);
                        }
                    }
                }
            }
            (held, failed)
        }));
    }
    let faults = async {
        let mut step = 0u64;
        while Instant::now() + Duration::from_millis(1500) < end {
            let (node, mode, dur) = {
                let mut rng = rand::rng();
                let mode = match rng.random_range(0..4) {
                    0 => ProxyMode::BlackholeReplies,
                    1 => ProxyMode::Stall,
                    2 => ProxyMode::Delay(Duration::from_millis(rng.random_range(5..=80))),
                    _ => ProxyMode::Blackhole,
                };
                (
                    rng.random_range(0..3usize),
                    mode,
                    Duration::from_millis(rng.random_range(50..=400)),
                )
            };
            step += 1;
            if step.is_multiple_of(7) {
                cluster.pause(node).await.ok();
                tokio::time::sleep(dur).await;
                cluster.resume(node).await.ok();
            } else if let Ok(p) = cluster.proxy(node) {
                p.set_mode(mode);
                tokio::time::sleep(dur).await;
                p.set_mode(ProxyMode::Pass);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    faults.await;
    let (mut total, mut gave_up) = (0, 0);
    for t in tasks {
        let (h, f) = tokio::time::timeout(Duration::from_secs(60), t).await??;
        total += h;
        gave_up += f;
    }
    println!(
        "random sets: {total} acquisitions, {gave_up} gave up (3 s), {} events",
        history.len()
    );
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    // Leaks: right after, and once every lease and TTL has run out, what is left.
    for wait in [0u64, 4_000] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        for i in 0..3 {
            let mut c = support::raw(&cluster, i).await;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("quorumlock:*")
                .query_async(&mut c)
                .await?;
            let mut persistent = Vec::new();
            for k in &keys {
                let ttl: i64 = redis::cmd("PTTL").arg(k).query_async(&mut c).await?;
                if ttl < 0 {
                    persistent.push(k.clone());
                }
            }
            let sets = keys
                .iter()
                .filter(|k| k.starts_with("quorumlock:qset:"))
                .count();
            println!(
                "after {wait} ms, node {i}: {} keys ({sets} set keys), without TTL: {persistent:?}",
                keys.len()
            );
            if wait > 0 {
                // The group-map record lives while the client does (not a leak).
                let left: Vec<&String> = keys
                    .iter()
                    .filter(|k| *k != "quorumlock:groupmap")
                    .collect();
                assert!(left.is_empty(), "node {i} keeps {left:?}");
            }
        }
    }
    Ok(())
}

/// Leak (bounded): a cancelled multi-resource waiter leaves only its marks, which lapse
/// with their lease (`QUEUE_LEASE`, 3 s): then no waiting key of its resources is left on
/// any node, and a release there is a plain compare-and-delete again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_multi_resource_waiter_leaves_nothing_beyond_its_lease() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let many = Redlock::builder(cluster.urls()).build().await?;
    let set = ["leak-a", "leak-b"];
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set, ttl).await?;
    let m = tokio::spawn(async move { many.lock_many(set, ttl).await.map(|_| ()) });
    for r in set {
        let marked = eventually(Duration::from_secs(5), || async {
            zcards(&cluster, &format!("quorumlock:qlease:{r}"))
                .await
                .iter()
                .all(|n| *n == 1)
        })
        .await;
        assert!(marked, "{r} marked on every node");
    }
    m.abort();
    let aborted = Instant::now();
    let gone = eventually(Duration::from_secs(5), || async {
        for r in set {
            for k in ["queue", "qlease", "qattrs"] {
                for i in 0..cluster.len() {
                    let n: u64 = redis::cmd("EXISTS")
                        .arg(format!("quorumlock:{k}:{r}"))
                        .query_async(&mut support::raw(&cluster, i).await)
                        .await
                        .unwrap_or(1);
                    if n > 0 {
                        return false;
                    }
                }
            }
        }
        true
    })
    .await;
    println!(
        "marks gone {:?} after the waiter was cancelled",
        aborted.elapsed()
    );
    assert!(gone, "waiting keys left after the lease");
    lock.release().await?;
    for r in set {
        assert_eq!(count_key(&cluster, 0..3, &lock_key(r)).await, 0);
    }
    Ok(())
}

/// A waiter whose links are slow (150 ms one way) is refused by a holder with direct links,
/// and the holder releases while the waiter's next step is still on its way: for one
/// resource its queue join (the release runs before the join lands: a plain release,
/// announced on the heralds, and the waiter handles the announcement once its join is
/// acknowledged); for several its mark (no mark is on the nodes when the release runs, so
/// the release is a plain compare-and-delete that announces nothing, and the mark's reply
/// finds every key free on a quorum). Before that, a first wait that the waiter wins and
/// releases subscribes its client to the resources' channels with no mark or queue entry
/// left. Returns how long the waiter took after the release (retry delay 30 s, max wait
/// 5 s), and how many announcements the nodes published from the release on.
async fn release_before_the_wait_lands(
    many: bool,
) -> Result<(Result<Duration, String>, u64), Box<dyn std::error::Error + Send + Sync>> {
    use quorumlock_testkit::ProxyMode;
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(&direct).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .retry(
            Retry::new()
                .delay(Duration::from_secs(30), Duration::from_secs(30))
                .max_wait(Duration::from_secs(5)),
        )
        .build()
        .await?;
    let set: Vec<&str> = if many {
        vec!["race-a", "race-b"]
    } else {
        vec!["race-a"]
    };
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set.clone(), ttl).await?;
    let first = {
        let (waiter, set) = (waiter.clone(), set.clone());
        tokio::spawn(async move { waiter.lock_many(set, ttl).await })
    };
    let waiting = eventually(Duration::from_secs(5), || async {
        zcards(&cluster, &format!("quorumlock:qlease:{}", set[0]))
            .await
            .iter()
            .all(|n| *n > 0)
    })
    .await;
    assert!(waiting, "the first wait marked or queued on every node");
    lock.release().await?;
    tokio::time::timeout(Duration::from_secs(5), first)
        .await???
        .release()
        .await?;
    let left = eventually(Duration::from_secs(5), || async {
        zcards(&cluster, &format!("quorumlock:qlease:{}", set[0]))
            .await
            .iter()
            .all(|n| *n == 0)
    })
    .await;
    assert!(left, "the first wait left no mark or queue entry");
    let lock = holder.try_lock_many(set.clone(), ttl).await?;
    for i in 0..3 {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(150)));
    }
    let s2 = set.clone();
    let w = tokio::spawn(async move {
        if s2.len() == 1 {
            waiter.lock(s2[0], ttl).await
        } else {
            waiter.lock_many(s2, ttl).await
        }
    });
    // The attempt lands at ~150 ms (refused), the join or mark at ~450 ms or later.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = announcements(&cluster).await;
    let released = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(10), w).await??;
    let took = released.elapsed();
    let announced = announcements(&cluster).await.saturating_sub(before);
    let queued = zcards(&cluster, &format!("quorumlock:queue:{}", set[0])).await;
    println!(
        "many={many}: {:?} after {took:?}; {announced} announcements; queue {queued:?}",
        got.as_ref().map(|l| l.token().to_owned())
    );
    Ok((got.map(|_| took).map_err(|e| e.to_string()), announced))
}

/// A single-resource waiter whose queue join lands after the release: the release,
/// announced on the heralds, is handled once the join is acknowledged, and the waiter holds
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_during_the_join_is_not_lost_single() -> TestResult {
    let (took, announced) = release_before_the_wait_lands(false).await?;
    assert!(announced > 0, "the release announced itself");
    assert!(
        took.as_ref().is_ok_and(|t| *t < Duration::from_secs(2)),
        "{took:?}"
    );
    Ok(())
}

/// A multi-resource waiter whose mark lands after the release: the release found no mark
/// and announced nothing, and the mark's reply (every key free on a quorum) starts the
/// attempt at once. The attempt, the mark and the claim take a round trip each through the
/// slow links (about 0.7 s after the release); waiting for the mark's renewal instead would
/// take until about 1.7 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_mark_lands_is_found_by_the_marks_reply_many() -> TestResult {
    let (took, announced) = release_before_the_wait_lands(true).await?;
    assert_eq!(announced, 0, "a release with no mark announces nothing");
    assert!(
        took.as_ref()
            .is_ok_and(|t| *t < Duration::from_millis(1_300)),
        "{took:?}"
    );
    Ok(())
}
