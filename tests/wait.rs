//! Waiting strategies against real `redis-server`s: notify hand-off vs polling, a cut
//! subscription link, 16 contenders with their own clients, wait-queue hygiene (bounded
//! under contention, crashed waiters' entries lapse, nothing left behind), the attempt
//! budget, and hand-over in arrival order.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Error, QUEUE_LEASE, Redlock, Retry};
use quorumlock_testkit::{History, LocalCluster, ProxyMode};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const SLOW: Retry = Retry::new()
    .delay(Duration::from_secs(2), Duration::from_secs(2))
    .max_wait(Duration::from_secs(10));

/// Waits (bounded) until every node reports a subscriber on the resource's channel.
async fn subscribed(direct_urls: &[String], resource: &str) -> TestResult {
    let channel = format!("quorumlock:released:{resource}");
    let t = Instant::now();
    for u in direct_urls {
        let c = redis::Client::open(u.as_str())?;
        let mut conn = c.get_multiplexed_async_connection().await?;
        loop {
            let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await?;
            if v.first().is_some_and(|(_, n)| *n > 0) {
                break;
            }
            if t.elapsed() > Duration::from_secs(5) {
                return Err(format!("no subscriber on {u}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

fn direct(cluster: &LocalCluster) -> Result<Vec<String>, std::io::Error> {
    (0..cluster.len()).map(|i| cluster.direct_url(i)).collect()
}

/// Holder takes the lock, a waiter starts waiting; returns the time between `release`
/// returning and the waiter's `lock` returning. A notified waiter's retry delay (30 s) is
/// longer than its maximum wait (5 s): it gets the lock only if the release wakes it. A
/// polling waiter's retry delay is 2 s.
async fn hand_off(
    notify: bool,
    resource: &str,
) -> Result<Duration, Box<dyn std::error::Error + Send + Sync>> {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let holder = Redlock::builder(&urls).build().await?;
    let waiter = Redlock::builder(&urls).notify(notify).build().await?;
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(resource, ttl).await?;
    let res = resource.to_owned();
    let retry = if notify { NOTIFIED_ONLY } else { SLOW };
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(&res, ttl, retry).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    if notify {
        // Queued on the heralds (after its first attempt) and subscribed everywhere: the
        // release names it.
        queued_and_subscribed(&cluster, resource).await?;
    } else {
        // Give the waiter time for its first (failing) attempt; not synchronization of
        // correctness, only the starting point of the measured delay.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock.release().await?;
    let released = Instant::now();
    let acquired = tokio::time::timeout(Duration::from_secs(8), w).await???;
    Ok(acquired.saturating_duration_since(released))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_the_waiter_well_before_its_retry_delay() -> TestResult {
    // Returns only if the waiter acquired: it gives up before its fallback timer fires.
    let took = hand_off(true, "w:notify").await?;
    eprintln!("notify hand-off: {took:?} after release (retry delay 30 s, maximum wait 5 s)");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_waits_out_the_retry_delay() -> TestResult {
    let took = hand_off(false, "w:poll").await?;
    eprintln!("polling hand-off: {took:?} after release (retry delay 2 s)");
    assert!(took >= Duration::from_secs(1), "took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_subscription_link_only_delays_the_waiter() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct_urls = direct(&cluster)?;
    // The holder bypasses the proxies; the waiter (and its subscriptions) go through them.
    let holder = Redlock::builder(&direct_urls).build().await?;
    let waiter = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let resource = "w:cut";
    let lock = holder.try_lock(resource, ttl).await?;
    let started = Instant::now();
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(resource, ttl, SLOW).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    subscribed(&direct_urls, resource).await?;
    // Cut every link of the waiter: its subscriptions silently stop delivering.
    cut_off_every_node(&cluster)?;
    lock.release().await?; // the announcement is published, and lost on the cut links
    let released = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await; // the announcement is gone by now
    for i in 0..cluster.len() {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    let healed = Instant::now();
    let acquired = tokio::time::timeout(Duration::from_secs(8), w).await???;
    let took = acquired.saturating_duration_since(released);
    eprintln!(
        "cut link: acquired {took:?} after release, {:?} after the waiter started (fallback timer 2 s)",
        acquired - started
    );
    // Delayed, never stranded: the announcement was lost, so the waiter could only get it
    // after the links healed: woken by its re-subscription (which announces itself, since a
    // release may have been missed while the link was down) or by its fallback timer.
    assert!(acquired >= healed, "acquired before the links healed");
    assert!(took >= Duration::from_millis(300));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_contenders_never_overlap_and_all_finish() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let history = History::new();
    let rounds = 5;
    let mut tasks = Vec::new();
    for id in 0..16u64 {
        let locks = Redlock::builder(&urls)
            .retry(
                Retry::new()
                    .delay(Duration::from_millis(50), Duration::from_millis(150))
                    .max_wait(Duration::from_secs(60)),
            )
            .build()
            .await?;
        let rec = history.client(id);
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                rec.acquire_invoked("w:herd");
                let lock = locks.lock("w:herd", Duration::from_secs(2)).await?;
                rec.acquired("w:herd", lock.deadline(), None);
                rec.work_started("w:herd");
                tokio::time::sleep(Duration::from_millis(2)).await;
                rec.work_ended("w:herd");
                rec.release_invoked("w:herd");
                match lock.release().await {
                    Ok(()) => {
                        rec.released("w:herd");
                    }
                    Err(_) => {
                        rec.release_failed("w:herd");
                    }
                }
            }
            Ok::<_, Error>(())
        }));
    }
    let start = Instant::now();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await???;
    }
    let took = start.elapsed();
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    eprintln!(
        "16 contenders × {rounds} holds: {took:?} ({:?} per hand-off)",
        took / (16 * rounds)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Wait-queue hygiene, the attempt budget, and arrival order.

/// How long a crashed waiter's queue entry may outlive it: its lease, plus the renewal
/// period of the waiters still alive (whose scripts purge it), plus slack for a loaded
/// machine.
const ENTRY_BOUND: Duration = QUEUE_LEASE
    .saturating_add(Duration::from_millis(QUEUE_LEASE.as_millis() as u64 / 3))
    .saturating_add(Duration::from_secs(3));

/// One direct connection per node, for inspection.
async fn inspectors(
    cluster: &LocalCluster,
) -> Result<Vec<redis::aio::MultiplexedConnection>, Box<dyn std::error::Error + Send + Sync>> {
    let mut out = Vec::new();
    for u in direct(cluster)? {
        let c = redis::Client::open(u.as_str())?;
        out.push(c.get_multiplexed_async_connection().await?);
    }
    Ok(out)
}

/// `ZCARD` of the resource's wait queue on every node.
async fn queue_sizes(
    conns: &mut [redis::aio::MultiplexedConnection],
    resource: &str,
) -> Result<Vec<u64>, redis::RedisError> {
    let key = format!("quorumlock:queue:{resource}");
    let mut out = Vec::new();
    for c in conns.iter_mut() {
        out.push(redis::cmd("ZCARD").arg(&key).query_async(c).await?);
    }
    Ok(out)
}

/// `DBSIZE` of every node, without the group-map record (which lives while the client
/// does: not a leak).
async fn db_sizes(
    conns: &mut [redis::aio::MultiplexedConnection],
) -> Result<Vec<u64>, redis::RedisError> {
    let mut out = Vec::new();
    for c in conns.iter_mut() {
        let all: u64 = redis::cmd("DBSIZE").query_async(c).await?;
        let record: u64 = redis::cmd("EXISTS")
            .arg("quorumlock:groupmap")
            .query_async(c)
            .await?;
        out.push(all.saturating_sub(record));
    }
    Ok(out)
}

/// Waits (at most 5 s) until some node's queue holds at least `n` entries; fails with
/// `what` and the sizes it saw otherwise.
async fn until_queued(
    conns: &mut [redis::aio::MultiplexedConnection],
    resource: &str,
    n: u64,
    what: &str,
) {
    let (sizes, queued) = poll_until(
        Duration::from_secs(5),
        async || queue_sizes(conns, resource).await.unwrap_or_default(),
        |s: &Vec<u64>| s.iter().any(|q| *q >= n),
    )
    .await;
    assert!(queued, "{what}: {sizes:?}");
}

/// Every proxy swallows traffic from now on: to the nodes, the client behind it has
/// crashed.
fn cut_off_every_node(cluster: &LocalCluster) -> std::io::Result<()> {
    for i in 0..cluster.len() {
        cluster.proxy(i)?.set_mode(ProxyMode::Blackhole);
    }
    Ok(())
}

/// Polls (every 50 ms, at most `within`) until `done` holds for the value `probe` reads;
/// returns the last value read and whether `done` held.
async fn poll_until<T, F, P>(within: Duration, mut probe: P, done: F) -> (T, bool)
where
    P: AsyncFnMut() -> T,
    F: Fn(&T) -> bool,
{
    let t = Instant::now();
    loop {
        let v = probe().await;
        if done(&v) || t.elapsed() >= within {
            let ok = done(&v);
            return (v, ok);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Eight contenders, each with its own client, take and release one resource in a loop for
/// 30 s. At every sample (10 per second) no node's wait queue holds more entries than there
/// are live waiters; when the contention ends, every node is empty within the entry bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_stay_bounded_under_steady_contention_and_vanish_after() -> TestResult {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const CONTENDERS: usize = 8;
    const RUN: Duration = Duration::from_secs(30);
    let resource = "w:steady";
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let mut conns = inspectors(&cluster).await?;
    // Contenders between calling `lock` and `release` returning.
    let live = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        // Generous timeouts: the machine running the suite may be busy, and a lock whose
        // release failed would leave its key behind until its TTL.
        let locks = Redlock::builder(&urls)
            .node_timeout(Duration::from_millis(500))
            .retry(Retry::new().max_wait(Duration::from_secs(60)))
            .build()
            .await?;
        let (live, stop) = (live.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut held = 0u64;
            while !stop.load(Ordering::Relaxed) {
                live.fetch_add(1, Ordering::SeqCst);
                let lock = locks.lock(resource, Duration::from_secs(10)).await;
                let lock = match lock {
                    Ok(l) => l,
                    Err(e) => {
                        live.fetch_sub(1, Ordering::SeqCst);
                        return Err(format!("lock: {e:?}"));
                    }
                };
                held += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
                let r = lock.release().await;
                live.fetch_sub(1, Ordering::SeqCst);
                r.map_err(|e| format!("release: {e:?}"))?;
            }
            Ok::<_, String>(held)
        }));
    }
    let start = Instant::now();
    let (mut samples, mut worst) = (0u64, 0u64);
    while start.elapsed() < RUN {
        let before = live.load(Ordering::SeqCst) as u64;
        let sizes = queue_sizes(&mut conns, resource)
            .await
            .map_err(|e| format!("sampling the queues: {e}"))?;
        let after = live.load(Ordering::SeqCst) as u64;
        let largest = sizes.iter().copied().max().unwrap_or(0);
        worst = worst.max(largest);
        samples += 1;
        assert!(
            largest <= before.max(after),
            "sample {samples} at {:?}: queue sizes {sizes:?} with {} live waiters",
            start.elapsed(),
            before.max(after)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut holds = 0;
    for t in tasks {
        holds += tokio::time::timeout(Duration::from_secs(60), t).await???;
    }
    let ended = Instant::now();
    let (sizes, empty) = poll_until(
        ENTRY_BOUND,
        async || db_sizes(&mut conns).await.unwrap_or_default(),
        |s: &Vec<u64>| s.len() == 3 && s.iter().all(|n| *n == 0),
    )
    .await;
    eprintln!(
        "steady contention: {holds} holds in {RUN:?}, {samples} samples, largest queue {worst}; \
         keys per node {sizes:?} {:?} after the end",
        ended.elapsed()
    );
    assert!(
        empty,
        "keys left on the nodes after {ENTRY_BOUND:?}: {sizes:?}"
    );
    Ok(())
}

/// A waiter that cannot reach the nodes any more (its links cut, then its future dropped)
/// never dequeues; with nobody else waiting, its queue entry is gone within its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiters_entry_expires_without_other_traffic() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let mut conns = inspectors(&cluster).await?;
    let resource = "w:crash-alone";
    let holder = Redlock::builder(direct(&cluster)?).build().await?;
    let lock = holder.try_lock(resource, Duration::from_secs(60)).await?;
    let waiter = Redlock::builder(cluster.urls()).build().await?;
    let slow = SLOW.max_wait(Duration::from_secs(60));
    let w = tokio::spawn(async move {
        waiter
            .lock_with(resource, Duration::from_secs(10), slow)
            .await
    });
    until_queued(&mut conns, resource, 1, "the waiter never queued").await;
    cut_off_every_node(&cluster)?;
    w.abort();
    let crashed = Instant::now();
    // Only the holder's lock key may be left.
    let (sizes, gone) = poll_until(
        ENTRY_BOUND,
        async || db_sizes(&mut conns).await.unwrap_or_default(),
        |s: &Vec<u64>| s.len() == 3 && s.iter().all(|n| *n <= 1),
    )
    .await;
    eprintln!(
        "crashed waiter alone: keys per node {sizes:?} {:?} after the crash",
        crashed.elapsed()
    );
    assert!(
        gone,
        "the crashed waiter's queue is still there after {ENTRY_BOUND:?}: {sizes:?}"
    );
    lock.release().await?;
    Ok(())
}

/// Waiters that leave — one cancelled (its future dropped), one giving up at its maximum
/// wait — take their queue entries with them at once, on every node: well before their
/// leases could have lapsed, only the holder's lock key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_leave_take_their_entries_with_them() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let mut conns = inspectors(&cluster).await?;
    let resource = "w:leave";
    let urls = cluster.urls();
    let holder = Redlock::builder(&urls).build().await?;
    let lock = holder.try_lock(resource, Duration::from_secs(60)).await?;
    // The one that gives up queues first, the one that is cancelled (patient) second.
    let giving_up = Redlock::builder(&urls).build().await?;
    let short = SLOW.max_wait(Duration::from_millis(1500));
    let g = tokio::spawn(async move {
        giving_up
            .lock_with(resource, Duration::from_secs(10), short)
            .await
    });
    until_queued(&mut conns, resource, 1, "the first waiter never queued").await;
    let cancelled = Redlock::builder(&urls).build().await?;
    let slow = SLOW.max_wait(Duration::from_secs(60));
    let c = tokio::spawn(async move {
        cancelled
            .lock_with(resource, Duration::from_secs(10), slow)
            .await
    });
    until_queued(&mut conns, resource, 2, "the second waiter never queued").await;
    c.abort();
    match tokio::time::timeout(Duration::from_secs(5), g).await?? {
        Err(Error::Timeout(_)) => {}
        other => panic!("expected the first waiter to give up: {other:?}"),
    }
    let left = Instant::now();
    let (sizes, gone) = poll_until(
        QUEUE_LEASE / 2,
        async || db_sizes(&mut conns).await.unwrap_or_default(),
        |s: &Vec<u64>| s.len() == 3 && s.iter().all(|n| *n == 1),
    )
    .await;
    eprintln!(
        "waiters left: keys per node {sizes:?} {:?} later",
        left.elapsed()
    );
    assert!(gone, "queue entries left behind: keys per node {sizes:?}");
    lock.release().await?;
    Ok(())
}

/// A crashed waiter's entry is purged within its lease even while another waiter keeps
/// the queue busy (joining, renewing): live waiters do not keep it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiters_entry_expires_while_others_wait() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let mut conns = inspectors(&cluster).await?;
    let resource = "w:crash-busy";
    let holder = Redlock::builder(direct(&cluster)?).build().await?;
    let lock = holder.try_lock(resource, Duration::from_secs(60)).await?;
    let slow = SLOW.max_wait(Duration::from_secs(60));
    let crashing = Redlock::builder(cluster.urls()).build().await?;
    let a = tokio::spawn(async move {
        crashing
            .lock_with(resource, Duration::from_secs(10), slow)
            .await
    });
    until_queued(&mut conns, resource, 1, "the first waiter never queued").await;
    // The live waiter polls every 200 ms: traffic that used to keep the whole queue alive.
    let live = Redlock::builder(direct(&cluster)?).build().await?;
    let busy = Retry::new()
        .delay(Duration::from_millis(200), Duration::from_millis(200))
        .max_wait(Duration::from_secs(60));
    let b = tokio::spawn(async move {
        let l = live
            .lock_with(resource, Duration::from_secs(10), busy)
            .await?;
        l.release().await
    });
    let (sizes, both) = poll_until(
        Duration::from_secs(5),
        async || queue_sizes(&mut conns, resource).await.unwrap_or_default(),
        |s: &Vec<u64>| s.iter().any(|n| *n >= 2),
    )
    .await;
    assert!(both, "the second waiter never queued: {sizes:?}");
    cut_off_every_node(&cluster)?;
    a.abort();
    let crashed = Instant::now();
    let (sizes, purged) = poll_until(
        ENTRY_BOUND,
        async || queue_sizes(&mut conns, resource).await.unwrap_or_default(),
        |s: &Vec<u64>| s.iter().all(|n| *n <= 1),
    )
    .await;
    eprintln!(
        "crashed waiter among live ones: queue sizes {sizes:?} {:?} after the crash",
        crashed.elapsed()
    );
    assert!(
        purged,
        "the crashed waiter's entry is still queued after {ENTRY_BOUND:?}: {sizes:?}"
    );
    assert!(
        sizes.contains(&1),
        "the live waiter lost its place: {sizes:?}"
    );
    lock.release().await?;
    tokio::time::timeout(Duration::from_secs(10), b).await???;
    let (sizes, empty) = poll_until(
        ENTRY_BOUND,
        async || db_sizes(&mut conns).await.unwrap_or_default(),
        |s: &Vec<u64>| s.len() == 3 && s.iter().all(|n| *n == 0),
    )
    .await;
    assert!(empty, "keys left on the nodes: {sizes:?}");
    Ok(())
}

/// `SET` commands a node has executed (every single-resource acquire attempt sends one;
/// the group-map record is written with `PSETEX`, counted apart).
async fn sets_executed(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<u64, redis::RedisError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(support::calls(&info, "set"))
}

/// Two waiters of one client with `attempts(3)` on a held resource, over slow links (every
/// attempt takes ~100 ms): while one tries, the other's turns are skipped by the
/// one-at-a-time gate. A skipped turn sends nothing and must not use up the budget, so
/// each waiter gives up after exactly three attempts that reached the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_skipped_by_the_gate_do_not_count() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let mut conns = inspectors(&cluster).await?;
    let resource = "w:gate";
    let holder = Redlock::builder(direct(&cluster)?).build().await?;
    let lock = holder.try_lock(resource, Duration::from_secs(60)).await?;
    for i in 0..cluster.len() {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(50)));
    }
    let locks = std::sync::Arc::new(
        Redlock::builder(cluster.urls())
            .node_timeout(Duration::from_secs(2))
            .build()
            .await?,
    );
    let budget = Retry::new()
        .attempts(3)
        .delay(Duration::ZERO, Duration::from_millis(2))
        .max_wait(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            locks
                .lock_with(resource, Duration::from_secs(10), budget)
                .await
        }));
    }
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(30), t).await?? {
            Err(Error::Timeout(t)) => assert_eq!(t.attempts(), 3, "{t:?}"),
            other => panic!("expected to give up after 3 attempts: {other:?}"),
        }
    }
    // The holder's SET plus 3 per waiter, on every node (the last ones may still be on
    // their way through the slow links).
    let mut counts = Vec::new();
    for c in conns.iter_mut() {
        let (n, _) = poll_until(
            Duration::from_secs(3),
            async || sets_executed(c).await.unwrap_or(0),
            |n: &u64| *n >= 7,
        )
        .await;
        counts.push(n);
    }
    eprintln!("SETs executed per node: {counts:?} (1 holder + 2 waiters × 3 attempts)");
    assert!(
        counts.iter().all(|n| *n == 7),
        "attempts sent per node: {counts:?}"
    );
    lock.release().await?;
    Ok(())
}

/// What the arrival-order test records, in one sequence (under one mutex).
#[derive(Clone, Copy, Debug)]
enum Turn {
    /// Contender called `lock`.
    Arrived(usize),
    /// Contender got the lock (recorded while holding it, so these are in true order).
    Acquired(usize),
}

/// For every arrival after the first round: how many others were waiting when it arrived
/// (`k`), and how many acquisitions by others came between its arrival and its own.
fn hand_offs_waited(log: &[Turn], contenders: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut waiting = vec![false; contenders];
    let mut first_round = vec![true; contenders];
    // Per waiting contender: (k at arrival, acquisitions by others since).
    let mut open: Vec<Option<(usize, usize)>> = vec![None; contenders];
    for t in log {
        match *t {
            Turn::Arrived(c) => {
                let k = waiting.iter().filter(|w| **w).count();
                waiting[c] = true;
                open[c] = Some((k, 0));
            }
            Turn::Acquired(c) => {
                waiting[c] = false;
                if let Some((k, served)) = open[c].take()
                    && !std::mem::take(&mut first_round[c])
                {
                    out.push((c, k, served));
                }
                for (o, slot) in open.iter_mut().enumerate() {
                    if o != c
                        && let Some((_, served)) = slot
                    {
                        *served += 1;
                    }
                }
            }
        }
    }
    out
}

/// The extra hand-offs a waiter may wait beyond the `k` waiters that were queued ahead of
/// it (see the arrival-order guarantee in the `wait` module docs).
const ORDER_SLACK: usize = 2;

/// Eight contenders, each with its own client (notify waiting, no faults), take one
/// resource 25 times each on three nodes. Every waiter that arrived while `k` others waited
/// is served within `k + ORDER_SLACK` hand-offs (the first, simultaneous round excepted:
/// those contenders had no place in the queue yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() -> TestResult {
    arrival_order(3, "w:order3").await
}

/// The same on five nodes, where a release is decided by three answers that need not
/// include either of the two nodes that keep the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order_on_five_nodes() -> TestResult {
    arrival_order(5, "w:order5").await
}

async fn arrival_order(nodes: usize, resource: &'static str) -> TestResult {
    use std::sync::{Arc, Mutex};
    const CONTENDERS: usize = 8;
    const ROUNDS: usize = 25;
    let cluster = LocalCluster::builder(nodes).launch().await?;
    let urls = cluster.urls();
    let log: Arc<Mutex<Vec<Turn>>> = Arc::new(Mutex::new(Vec::new()));
    // Every client is connected before anyone starts, so that the first round (the only
    // one with callers that are not queued yet) is one simultaneous burst.
    let mut clients = Vec::new();
    for _ in 0..CONTENDERS {
        clients.push(
            Redlock::builder(&urls)
                .retry(Retry::new().max_wait(Duration::from_secs(60)))
                .build()
                .await?,
        );
    }
    let go = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for (c, locks) in clients.into_iter().enumerate() {
        let (log, go) = (log.clone(), go.clone());
        tasks.push(tokio::spawn(async move {
            go.wait().await;
            for _ in 0..ROUNDS {
                log.lock().map_err(|_| "poisoned")?.push(Turn::Arrived(c));
                let lock = locks.lock(resource, Duration::from_secs(10)).await?;
                log.lock().map_err(|_| "poisoned")?.push(Turn::Acquired(c));
                tokio::time::sleep(Duration::from_millis(2)).await;
                lock.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await???;
    }
    let log = log.lock().map_err(|_| "poisoned")?.clone();
    let waited = hand_offs_waited(&log, CONTENDERS);
    assert_eq!(waited.len(), CONTENDERS * (ROUNDS - 1));
    let mut excess = std::collections::BTreeMap::<i64, usize>::new();
    for (_, k, served) in &waited {
        *excess.entry(*served as i64 - *k as i64).or_default() += 1;
    }
    eprintln!(
        "arrival order, {nodes} nodes: hand-offs waited beyond the waiters ahead → count: {excess:?}"
    );
    let late: Vec<_> = waited
        .iter()
        .filter(|(_, k, served)| *served > k + ORDER_SLACK)
        .collect();
    if !late.is_empty() {
        let text: Vec<String> = log
            .iter()
            .map(|t| match t {
                Turn::Arrived(c) => format!("a{c}"),
                Turn::Acquired(c) => format!("G{c}"),
            })
            .collect();
        eprintln!("log: {}", text.join(" "));
    }
    assert!(
        late.is_empty(),
        "served later than k + {ORDER_SLACK} (contender, k, hand-offs): {late:?}"
    );
    Ok(())
}

/// A waiter that can only get the lock through a release announcement: its retry delay
/// (30 s) is longer than its maximum wait (5 s), so missing its turn makes it give up.
const NOTIFIED_ONLY: Retry = Retry::new()
    .delay(Duration::from_secs(30), Duration::from_secs(30))
    .max_wait(Duration::from_secs(5));

/// Waits (bounded) until the waiter's entry is in the resource's queue on at least two
/// nodes (a single-resource waiter queues on every node) and it is subscribed on every
/// node; returns the indices of the nodes where it is queued.
async fn queued_and_subscribed(
    cluster: &LocalCluster,
    resource: &str,
) -> Result<Vec<usize>, Box<dyn std::error::Error + Send + Sync>> {
    let mut conns = inspectors(cluster).await?;
    let (sizes, ok) = poll_until(
        Duration::from_secs(5),
        async || queue_sizes(&mut conns, resource).await.unwrap_or_default(),
        |s: &Vec<u64>| s.iter().filter(|n| **n == 1).count() >= 2,
    )
    .await;
    if !ok {
        return Err(format!("the waiter did not queue on two heralds: {sizes:?}").into());
    }
    subscribed(&direct(cluster)?, resource).await?;
    Ok((0..sizes.len()).filter(|i| sizes[*i] == 1).collect())
}

/// How a holder's release reaches each node: at once (`None`), or through its link to the
/// node in the given mode.
type ReleaseLinks = fn(i: usize, heralds: &[usize]) -> Option<ProxyMode>;

/// 300 ms each way on the holder's link: its release (two round trips on a fresh node,
/// the script is loaded on first use) lands about a second after the first herald's.
const LATE: Option<ProxyMode> = Some(ProxyMode::Delay(Duration::from_millis(300)));

/// A holder's release reaches the first herald at once and the other nodes as `links`
/// says. The first herald's announcement names the queued waiter, whose attempt then
/// overtakes the release on the other nodes and is refused by the releasing lock itself.
/// The waiter must still get the lock once the release has reached a quorum: its fallback
/// timer (30 s) is longer than its maximum wait (5 s), so only the release can wake it.
async fn overtaken_release(
    nodes: usize,
    resource: &'static str,
    links: ReleaseLinks,
) -> TestResult {
    let cluster = LocalCluster::builder(nodes).proxies(true).launch().await?;
    // The holder goes through the proxies (its release may take a while), the waiter
    // directly.
    let holder = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(3))
        .build()
        .await?;
    let waiter = Redlock::builder(&direct(&cluster)?).build().await?;
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(resource, ttl).await?;
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(resource, ttl, NOTIFIED_ONLY).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    let heralds = queued_and_subscribed(&cluster, resource).await?;
    for i in 0..cluster.len() {
        if let Some(mode) = links(i, &heralds) {
            cluster.proxy(i)?.set_mode(mode);
        }
    }
    let releasing = Instant::now();
    lock.release().await?;
    let outcome = tokio::time::timeout(Duration::from_secs(10), w).await??;
    if let Ok(at) = &outcome {
        eprintln!(
            "{resource}: acquired {:?} after the release began",
            at.saturating_duration_since(releasing)
        );
    }
    assert!(
        outcome.is_ok(),
        "the waiter lost its turn to the release it overtook: {outcome:?}"
    );
    Ok(())
}

/// Three nodes: the release reaches the second herald and the other node late. The second
/// herald's announcement is the same release naming the same waiter again: it wakes the
/// waiter again instead of being dropped as a duplicate. (Before, the waiter's lease
/// renewal found its place popped and made it try, up to a second late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_waiter_that_overtakes_the_release_keeps_its_turn() -> TestResult {
    overtaken_release(3, "w:overtaken3", |i, h| {
        (h.first() != Some(&i)).then_some(LATE?)
    })
    .await
}

/// Three nodes: the release reaches the first node at once, never reaches the second and
/// reaches the third late. (The single-resource waiter now queues on every node and is
/// handed the lock by transfer: the first and the third node's transfers make its quorum.
/// Before, it queued on the two heralds only, and the blackholed node was the second
/// herald.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_waiter_that_overtakes_a_release_announced_once_keeps_its_turn() -> TestResult {
    overtaken_release(3, "w:overtaken-once", |i, _| match i {
        0 => None,
        1 => Some(ProxyMode::Blackhole),
        _ => LATE,
    })
    .await
}

/// Five nodes: both heralds announce at once, the three other nodes (which announce
/// nothing) get the release late, so no further announcement comes at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_waiter_that_overtakes_the_release_on_silent_nodes_keeps_its_turn() -> TestResult {
    overtaken_release(
        5,
        "w:overtaken5",
        |i, h| if h.contains(&i) { None } else { LATE },
    )
    .await
}

/// A release that lands after a waiter subscribed but before it joined the queue names no
/// one; the waiter must still take the lock at once, not after its fallback timer (here
/// longer than its maximum wait). The waiter's links to the heralds are delayed 100 ms
/// each way, so its subscription (one round trip) is active well before its join (two:
/// the script is loaded on first use) reaches them; the release is sent as soon as the
/// subscription is seen on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_between_subscription_and_queue_join_is_not_missed() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let resource = "w:join-window";
    let direct_urls = direct(&cluster)?;
    let holder = Redlock::builder(&direct_urls).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .build()
        .await?;
    // Find the heralds: a first waiter's entry, then let it go.
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(resource, ttl).await?;
    let probe = Redlock::builder(&direct_urls).build().await?;
    let p = tokio::spawn(async move { probe.lock_with(resource, ttl, NOTIFIED_ONLY).await });
    let heralds = queued_and_subscribed(&cluster, resource).await?;
    p.abort();
    let mut conns = inspectors(&cluster).await?;
    let (_, gone) = poll_until(
        Duration::from_secs(5),
        async || queue_sizes(&mut conns, resource).await.unwrap_or_default(),
        |s: &Vec<u64>| s.iter().all(|n| *n == 0),
    )
    .await;
    assert!(gone, "the probe's entries stayed");
    // Unload the scripts (the probe's join loaded the queue's), so that the waiter's join
    // takes two round trips.
    for c in conns.iter_mut() {
        let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(c).await?;
    }
    for h in &heralds {
        cluster
            .proxy(*h)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(100)));
    }
    let w = tokio::spawn(async move {
        let l = waiter.lock_with(resource, ttl, NOTIFIED_ONLY).await?;
        let at = Instant::now();
        l.release().await?;
        Ok::<_, Error>(at)
    });
    // Wait until the waiter is subscribed on every node (bounded); its join is not there.
    let channel = format!("quorumlock:released:{resource}");
    let t = Instant::now();
    let mut subscribed_on = 0;
    while subscribed_on < conns.len() {
        let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conns[subscribed_on])
            .await?;
        if v.first().is_some_and(|(_, n)| *n > 0) {
            subscribed_on += 1;
        } else if t.elapsed() > Duration::from_secs(5) {
            return Err("the waiter did not subscribe".into());
        } else {
            tokio::task::yield_now().await;
        }
    }
    let queued = queue_sizes(&mut conns, resource).await?;
    lock.release().await?;
    let released = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), w).await??;
    assert_eq!(queued, [0, 0, 0], "the join overtook the subscription");
    let at = outcome.map_err(|e| format!("the waiter missed the release: {e:?}"))?;
    eprintln!(
        "release before the join: acquired {:?} after the release",
        at.saturating_duration_since(released)
    );
    Ok(())
}
