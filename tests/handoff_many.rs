//! Waiting for several resources, against real `redis-server`s: notify-and-claim.
//!
//! A multi-resource waiter (`lock_many` with notify waiting) does not queue: after a
//! refused attempt it marks each of its resources' waiting state on every node
//! (`listen.lua`: its id in the resource's leases, renewed while it waits), so every
//! release of those resources announces itself; woken, it staggers within the resource's
//! contention window and claims every key or none. Tested here: the waiter is woken by the
//! release (it published), not by its retry delay nor its mark's renewal; it gets nothing
//! while one of its keys is held; a release it marked between (before the mark on some
//! nodes, after it on others) is found by renewals brought forward; a
//! waiter behind any number of waiters that cannot be served is served; its mark is
//! dropped by its lock's release; and eight clients on overlapping pairs of a ring of four
//! resources, with a node paused for a second, never overlap, never deadlock and all get
//! the lock.

#[path = "support/scripts.rs"]
mod scripts;
mod support;

use std::time::{Duration, Instant};

use quorumlock::{Lock, Redlock, Retry};
use quorumlock_testkit::{History, LocalCluster, ProxyMode};
use support::{announcements, count_key, eventually, get, lock_key, raw};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A waiter whose retry delay (30 s) is far beyond the test: it can only get the lock by
/// being woken by a release announcement.
const NOTIFIED_ONLY: Retry = Retry::new()
    .delay(Duration::from_secs(30), Duration::from_secs(30))
    .max_wait(Duration::from_secs(8));

async fn notified(cluster: &LocalCluster) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(cluster.urls())
        .retry(NOTIFIED_ONLY)
        .build()
        .await
}

/// How many live marks (queue entries and listeners) the leases key of `res` holds on
/// node `i`.
async fn marks(cluster: &LocalCluster, i: usize, res: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("quorumlock:qlease:{res}"))
        .query_async(&mut raw(cluster, i).await)
        .await
        .unwrap_or(0)
}

/// Far below the mark's renewal (a third of the lease, 1 s), whose reply alone would start
/// an attempt; a wake-up by the release takes a few milliseconds unloaded.
const WOKEN_WITHIN: Duration = Duration::from_millis(300);

/// Waits (at most 5 s) until every node has at least `n` marks for each of `resources`.
async fn marked_everywhere(cluster: &LocalCluster, resources: &[&str], n: u64) -> TestResult {
    let ok = eventually(Duration::from_secs(5), || async {
        for i in 0..cluster.len() {
            for r in resources {
                if marks(cluster, i, r).await < n {
                    return false;
                }
            }
        }
        true
    })
    .await;
    if ok {
        Ok(())
    } else {
        Err(format!("{n} marks for {resources:?} on every node").into())
    }
}

/// Waits (at most 5 s) until no node has more than `n` marks for any of `resources`.
async fn marked_everywhere_at_most(
    cluster: &LocalCluster,
    resources: &[&str],
    n: u64,
) -> TestResult {
    let ok = eventually(Duration::from_secs(5), || async {
        for i in 0..cluster.len() {
            for r in resources {
                if marks(cluster, i, r).await > n {
                    return false;
                }
            }
        }
        true
    })
    .await;
    if ok {
        Ok(())
    } else {
        Err(format!("at most {n} marks for {resources:?} on every node").into())
    }
}

/// A first wait of `waiter` for `set` (held for a moment by another client): it subscribes
/// the waiter's client to the resources' channels, which stay subscribed a while after, so
/// the one wake-up a new subscription gives (and the quick renewals a refused wake-up
/// brings) play no part in what a test measures next. Returns once its mark is gone.
async fn subscribe_first(
    cluster: &LocalCluster,
    waiter: &Redlock,
    set: [&'static str; 2],
) -> TestResult {
    let ttl = Duration::from_secs(10);
    let other = Redlock::builder(cluster.urls()).build().await?;
    let lock = other.try_lock(set[0], ttl).await?;
    let first = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock_many(set, ttl).await })
    };
    marked_everywhere(cluster, &set, 1).await?;
    lock.release().await?;
    tokio::time::timeout(Duration::from_secs(5), first)
        .await???
        .release()
        .await?;
    marked_everywhere_at_most(cluster, &set, 0).await
}

/// Caches the release script on every node: through slow links a `NOSCRIPT` exchange would
/// take two round trips, past the node timeout.
async fn load_release_script(cluster: &LocalCluster) -> TestResult {
    for i in 0..cluster.len() {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(scripts::source("release_one"))
            .query_async(&mut raw(cluster, i).await)
            .await?;
    }
    Ok(())
}

/// Polls `links` (1 ms apart, at most 200 times) until none holds `key`: whether a release
/// on its way reached them.
async fn released_on(
    links: &mut [redis::aio::MultiplexedConnection],
    key: &str,
) -> Result<bool, redis::RedisError> {
    for _ in 0..200 {
        let mut held = 0u32;
        for c in links.iter_mut() {
            let n: u32 = redis::cmd("EXISTS").arg(key).query_async(c).await?;
            held += n;
        }
        if held == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(false)
}

/// Whether a quorum of nodes hold `token` on every key of `resources` (the waiter's attempt
/// is decided at its quorum: a node the holder's release reached late refused it).
async fn holds_on_a_quorum(cluster: &LocalCluster, resources: &[&str], token: &str) -> bool {
    let mut holding = 0;
    for i in 0..cluster.len() {
        let mut all = true;
        for r in resources {
            all &= get(cluster, i, &lock_key(r)).await.as_deref() == Some(token);
        }
        holding += usize::from(all);
    }
    holding > cluster.len() / 2
}

/// A multi-resource waiter marks its resources on every node, is woken by the holder's
/// release (its retry delay is 30 s; the release published, and the waiter holds both keys
/// well before its mark's renewal would have found them free); its lock's
/// release drops its mark, so the next release of those resources is a plain one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_is_woken_by_the_release_and_its_mark_goes_with_its_lock()
-> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let set = ["many-a", "many-b"];
    let ttl = Duration::from_secs(10);
    subscribe_first(&cluster, &waiter, set).await?;
    let lock = holder.try_lock_many(set, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    marked_everywhere(&cluster, &set, 1).await?;
    let before = announcements(&cluster).await;
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let took = releasing.elapsed();
    println!("multi-resource waiter: held {took:?} after the release began");
    assert!(
        announcements(&cluster).await > before,
        "the release announced itself"
    );
    assert!(took < WOKEN_WITHIN, "woken by the release: {took:?}");
    assert!(holds_on_a_quorum(&cluster, &set, got.token()).await);
    got.release().await?;
    let unmarked = eventually(Duration::from_secs(2), || async {
        for i in 0..cluster.len() {
            for r in set {
                if marks(&cluster, i, r).await > 0 {
                    return false;
                }
            }
        }
        true
    })
    .await;
    assert!(unmarked, "the lock's release dropped the waiter's mark");
    for r in set {
        assert_eq!(count_key(&cluster, 0..3, &lock_key(r)).await, 0);
    }
    Ok(())
}

/// All or nothing: with each of its two resources held by another client, the waiter gets
/// nothing when the first is released, and both keys when the second is, woken by that
/// release's announcement (well before its mark's renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_gets_nothing_until_every_key_is_free() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let first = Redlock::builder(cluster.urls()).build().await?;
    let second = Redlock::builder(cluster.urls()).build().await?;
    let waiter = notified(&cluster).await?;
    let set = ["part-a", "part-b"];
    let ttl = Duration::from_secs(10);
    subscribe_first(&cluster, &waiter, set).await?;
    let a = first.try_lock(set[0], ttl).await?;
    let b = second.try_lock(set[1], ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    marked_everywhere(&cluster, &set, 1).await?;
    a.release().await?;
    let freed = eventually(Duration::from_secs(1), || async {
        count_key(&cluster, 0..3, &lock_key(set[0])).await == 0
    })
    .await;
    assert!(freed, "the first release ran everywhere");
    assert!(!w.is_finished(), "holds part of its set");
    assert_eq!(count_key(&cluster, 0..3, &lock_key(set[0])).await, 0);
    let before = announcements(&cluster).await;
    let releasing = Instant::now();
    b.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), w).await???;
    let took = releasing.elapsed();
    println!("all or nothing: held {took:?} after the last key's release began");
    assert!(
        announcements(&cluster).await > before,
        "the last release announced itself"
    );
    assert!(took < WOKEN_WITHIN, "woken by the last release: {took:?}");
    assert!(holds_on_a_quorum(&cluster, &set, got.token()).await);
    got.release().await?;
    Ok(())
}

/// A release is announced once per release: the waiter, woken by the node that ran it
/// first, attempts while the release is still on its way to the other two (80 ms late) and
/// is refused there. It renews its marks soon after (not a third of the lease later), the
/// replies say its keys are free on a quorum, and it takes them, long before its retry
/// delay (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_refused_by_a_release_still_on_its_way_takes_the_keys_soon()
-> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let direct: Vec<String> = (0..cluster.len())
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let waiter = Redlock::builder(direct)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    let set = ["late-a", "late-b"];
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock_many(set, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    marked_everywhere(&cluster, &set, 1).await?;
    // The release script is cached everywhere: through the delays a `NOSCRIPT` exchange
    // would take two round trips (320 ms), past the node timeout (200 ms).
    load_release_script(&cluster).await?;
    for i in 1..cluster.len() {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(80)));
    }
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    let took = releasing.elapsed();
    println!("refused by a release on its way: held {took:?} after the release began");
    // Not at the next regular renewal (a third of the lease, 1 s).
    assert!(took < Duration::from_millis(700), "{took:?}");
    assert!(holds_on_a_quorum(&cluster, &set, got.token()).await);
    got.release().await?;
    Ok(())
}

/// A release that lands on its resource's heralds before the waiter's mark does (so they
/// announce nothing) and on the other nodes after it (which announce nothing for a lock on
/// one resource): no announcement comes. The mark's reply finds the keys free on some
/// nodes, not yet on a quorum, so the waiter looks again soon and holds well before its
/// mark's renewal (1 s) and its retry delay (30 s). Five nodes; the holder's links to the
/// three that are not heralds are 90 ms slow each way, the waiter's are direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_marking_between_a_releases_nodes_takes_the_keys_soon() -> TestResult
{
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let holder = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .build()
        .await?;
    let direct: Vec<String> = (0..cluster.len())
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let waiter = Redlock::builder(direct)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    let set = ["between-a", "between-b"];
    let ttl = Duration::from_secs(10);
    let seen = waiter.inspect(set[0]).await?;
    let heralds: Vec<usize> = (0..cluster.len())
        .filter(|i| seen.nodes().get(*i).is_some_and(|n| n.is_herald()))
        .collect();
    assert_eq!(heralds.len(), 2, "two heralds of {}", set[0]);
    subscribe_first(&cluster, &waiter, set).await?;
    let lock = holder.try_lock(set[0], ttl).await?;
    load_release_script(&cluster).await?;
    for i in (0..cluster.len()).filter(|i| !heralds.contains(i)) {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(90)));
    }
    let mut herald_links = Vec::new();
    for i in &heralds {
        herald_links.push(raw(&cluster, *i).await);
    }
    let before = announcements(&cluster).await;
    let releasing = Instant::now();
    let release = tokio::spawn(async move { lock.release().await });
    assert!(
        released_on(&mut herald_links, &lock_key(set[0])).await?,
        "the release ran on the heralds"
    );
    let waiting = releasing.elapsed();
    assert!(
        waiting < Duration::from_millis(60),
        "the waiter starts before the release reaches the other nodes: {waiting:?}"
    );
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    let took = releasing.elapsed();
    println!(
        "marked between a release's nodes: started {waiting:?}, held {took:?} after the release began"
    );
    release.await??;
    assert_eq!(
        announcements(&cluster).await,
        before,
        "the release announced nothing"
    );
    assert!(took < Duration::from_millis(400), "{took:?}");
    assert!(holds_on_a_quorum(&cluster, &set, got.token()).await);
    got.release().await?;
    Ok(())
}

/// The waiter's own attempt is decided (refused by the three nodes that still hold) before
/// the heralds, where the keys are already free, answer it: its request lands there after
/// the decision and is released only once it has. The mark sent right after the attempt
/// finds that attempt's own key on the heralds and the holder's on the rest. The mark
/// counts the waiter's own attempt's keys as free (they were free on two nodes: a release
/// may be on its way to the rest), so the waiter looks again soon, and holds well before
/// its mark's renewal (1 s); counted as held, the keys were free nowhere. Five nodes;
/// the holder's links to the three that are not heralds are 90 ms slow each way, the
/// waiter's links to the heralds 30 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_whose_attempt_outran_its_own_replies_takes_the_keys_soon()
-> TestResult {
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let set = ["outran-a", "outran-b"];
    let ttl = Duration::from_secs(10);
    let seen = Redlock::builder(cluster.urls())
        .build()
        .await?
        .inspect(set[0])
        .await?;
    let heralds: Vec<usize> = (0..cluster.len())
        .filter(|i| seen.nodes().get(*i).is_some_and(|n| n.is_herald()))
        .collect();
    assert_eq!(heralds.len(), 2, "two heralds of {}", set[0]);
    // Each proxy serves one client: the holder's to the other nodes, the waiter's to the
    // heralds.
    let (mut to_holder, mut to_waiter) = (Vec::new(), Vec::new());
    for i in 0..cluster.len() {
        let (proxied, direct) = (cluster.urls()[i].clone(), cluster.direct_url(i)?);
        if heralds.contains(&i) {
            to_holder.push(direct);
            to_waiter.push(proxied);
        } else {
            to_holder.push(proxied);
            to_waiter.push(direct);
        }
    }
    // The holder's release crosses 90 ms links each way: a node timeout well above that
    // (its release's own timing is not what is checked here).
    let holder = Redlock::builder(to_holder)
        .node_timeout(Duration::from_secs(1))
        .build()
        .await?;
    let waiter = Redlock::builder(to_waiter)
        .retry(NOTIFIED_ONLY)
        .build()
        .await?;
    subscribe_first(&cluster, &waiter, set).await?;
    let lock = holder.try_lock(set[0], ttl).await?;
    load_release_script(&cluster).await?;
    for i in 0..cluster.len() {
        let slow = if heralds.contains(&i) { 30 } else { 90 };
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(slow)));
    }
    let mut herald_links = Vec::new();
    for i in &heralds {
        herald_links.push(raw(&cluster, *i).await);
    }
    let releasing = Instant::now();
    let release = tokio::spawn(async move { lock.release().await });
    assert!(
        released_on(&mut herald_links, &lock_key(set[0])).await?,
        "the release ran on the heralds"
    );
    let w = tokio::spawn(async move { waiter.lock_many(set, ttl).await });
    let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
    let took = releasing.elapsed();
    println!("attempt outran its own replies: held {took:?} after the release began");
    release.await??;
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert!(holds_on_a_quorum(&cluster, &set, got.token()).await);
    got.release().await?;
    Ok(())
}

/// Three nodes A (0), B (1), X (2); quorum 2. The holder H reaches A and X directly and B
/// through B's proxy; the waiter W reaches A through A's proxy (50 ms each way), X through
/// X's proxy, B directly.
///
/// 1. H holds the set everywhere; H's link to B stalls (its release will be stuck there).
/// 2. W's link to X stalls; W attempts (attempt k): B refuses at once, A 100 ms later:
///    decided, refused, X's request still pending (its release waits for it to land).
///    W's mark follows: it lands on B at once, on A 50 ms later, on X behind attempt k.
/// 3. Seeing the mark on B, H releases: A and X free now (B stuck).
/// 4. X's link resumes: attempt k lands on X (granted, key = k), then the mark (counts k
///    as free): free on A and X, a quorum: W attempts at once (attempt k+1).
/// 5. If attempt k+1 reaches X before attempt k's release, X refuses it (held by k),
///    attempt k+1 fails (A granted, B held by H) and nothing brings W's next look forward.
///
/// An attempt that a free mark started and that is refused looks again soon (a mark
/// 100 ms later): without that, W slept until its mark's renewal (1 s) in 3 to 8 rounds
/// of 12. Any round where W takes more than 700 ms after X resumes (it needs one 100 ms
/// round trip to A) is such a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_refused_by_its_own_previous_attempt_looks_again_soon() -> TestResult
{
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let (a, b, x) = (0usize, 1usize, 2usize);
    let ttl = Duration::from_secs(10);
    let urls = |proxied: &[usize]| -> Result<Vec<String>, std::io::Error> {
        (0..3)
            .map(|i| {
                if proxied.contains(&i) {
                    Ok(cluster.urls()[i].clone())
                } else {
                    cluster.direct_url(i)
                }
            })
            .collect()
    };
    let holder = Redlock::builder(urls(&[b])?)
        .node_timeout(Duration::from_millis(300))
        .build()
        .await?;
    let waiter = Redlock::builder(urls(&[a, x])?)
        .retry(NOTIFIED_ONLY)
        .node_timeout(Duration::from_secs(2))
        .build()
        .await?;
    let rounds = 8;
    let set = ["own-a", "own-b"];
    // Subscribe the waiter to the set's channels first (as handoff_many's
    // subscribe_first): a new subscription's one wake-up must play no part below.
    {
        let lock = holder.lock_many(set, ttl).await?;
        let first = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.lock_many(set, ttl).await })
        };
        let mut marked = false;
        for _ in 0..500 {
            if marks(&cluster, a, set[0]).await >= 1 && marks(&cluster, x, set[0]).await >= 1 {
                marked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(marked, "the first wait marked");
        lock.release().await?;
        tokio::time::timeout(Duration::from_secs(5), first)
            .await???
            .release()
            .await?;
    }
    let mut times = Vec::new();
    for round in 0..rounds {
        for i in 0..3 {
            cluster.proxy(i)?.set_mode(ProxyMode::Pass);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let lock = holder.lock_many(set, ttl).await?;
        cluster.proxy(b)?.set_mode(ProxyMode::Stall);
        cluster
            .proxy(a)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(50)));
        cluster.proxy(x)?.set_mode(ProxyMode::Stall);
        let w = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.lock_many(set, ttl).await })
        };
        // The mark landed on B: attempt k was decided.
        let mut seen = false;
        for _ in 0..2000 {
            if marks(&cluster, b, set[0]).await >= 1 {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(seen, "round {round}: the mark reached B");
        let release = tokio::spawn(async move { lock.release().await });
        // The mark lands on A (50 ms after B) after H's release.
        tokio::time::sleep(Duration::from_millis(120)).await;
        // H's release reached A and X (direct links): neither holds a key of H's now.
        for i in [a, x] {
            let mut c = raw(&cluster, i).await;
            let held: i64 = redis::cmd("EXISTS")
                .arg(lock_key(set[0]))
                .arg(lock_key(set[1]))
                .query_async(&mut c)
                .await?;
            assert_eq!(held, 0, "round {round}: H's release reached node {i}");
        }
        let resumed = Instant::now();
        cluster.proxy(x)?.set_mode(ProxyMode::Pass);
        let got = tokio::time::timeout(Duration::from_secs(6), w).await???;
        let took = resumed.elapsed();
        println!("round {round}: held {took:?} after X resumed");
        times.push(took);
        cluster.proxy(b)?.set_mode(ProxyMode::Pass);
        let _ = release.await?;
        got.release().await?;
        // H's release timed out on B: its key there stays; clear it for the next round.
        for i in 0..3 {
            let mut c = raw(&cluster, i).await;
            for r in set {
                let _: i64 = redis::cmd("DEL")
                    .arg(lock_key(r))
                    .query_async(&mut c)
                    .await?;
            }
        }
    }
    let stalls = times
        .iter()
        .filter(|t| **t > Duration::from_millis(700))
        .count();
    println!("stalls: {stalls} of {rounds}: {times:?}");
    assert_eq!(stalls, 0, "{times:?}");
    Ok(())
}

/// A multi-resource waiter behind 70 waiters that cannot be served (each also wants a key
/// held for the whole test) is served by the release of the key they all want: nothing
/// looks ahead a bounded number of entries (the hand-off of waiting sets looked at 64
/// blocked entries at a join and 8 at a release, and this waiter, told 6 were ahead of
/// it, never claimed and gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_behind_seventy_blocked_waiters_is_served() -> TestResult {
    const BLOCKED: usize = 70;
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let blocker = Redlock::builder(cluster.urls()).build().await?;
    let crowd = Redlock::builder(cluster.urls())
        .retry(
            Retry::new()
                .delay(Duration::from_secs(30), Duration::from_secs(30))
                .max_wait(Duration::from_secs(20)),
        )
        .build()
        .await?;
    let waiter = notified(&cluster).await?;
    let ttl = Duration::from_secs(20);
    subscribe_first(&cluster, &waiter, ["blk-a", "blk-c"]).await?;
    let held: Vec<String> = (0..BLOCKED).map(|i| format!("blk-b{i}")).collect();
    let blocking = blocker.try_lock_many(&held, ttl).await?;
    let a = holder.try_lock("blk-a", ttl).await?;
    let mut blocked = Vec::new();
    for b in &held {
        let crowd = crowd.clone();
        let set = ["blk-a".to_owned(), b.clone()];
        blocked.push(tokio::spawn(
            async move { crowd.lock_many(&set, ttl).await },
        ));
    }
    marked_everywhere(&cluster, &["blk-a"], BLOCKED as u64).await?;
    let w = tokio::spawn(async move { waiter.lock_many(["blk-a", "blk-c"], ttl).await });
    marked_everywhere(&cluster, &["blk-a"], BLOCKED as u64 + 1).await?;
    let before = announcements(&cluster).await;
    let releasing = Instant::now();
    a.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(7), w).await???;
    let took = releasing.elapsed();
    println!("behind {BLOCKED} blocked waiters: held {took:?} after the release began");
    assert!(
        announcements(&cluster).await > before,
        "the release announced itself"
    );
    // Seventy-one waiters wake at once and stagger: allow more than one waiter's wake-up,
    // still well below the mark's renewal.
    assert!(
        took < Duration::from_millis(600),
        "woken by the release: {took:?}"
    );
    assert!(holds_on_a_quorum(&cluster, &["blk-a", "blk-c"], got.token()).await);
    assert!(
        blocked.iter().all(|t| !t.is_finished()),
        "no blocked waiter held"
    );
    got.release().await?;
    for t in &blocked {
        t.abort();
    }
    blocking.release().await?;
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
