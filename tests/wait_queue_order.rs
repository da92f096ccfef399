//! Adversarial probes of the wait queue against real `redis-server`s: holders that never
//! had to wait, heralds slower than the other nodes, heralds restarted empty.

#[path = "support/scripts.rs"]
mod scripts;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Error, Redlock, Retry};
use quorumlock_testkit::{LocalCluster, ProxyMode};
use support::heralds;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Five nodes; the resource's two heralds answer one client 30 ms late (a second data
/// centre, a loaded host). That client takes the lock with `lock` and gets it at the first
/// attempt, holds it 10 ms, releases, and takes it again, in a loop. Its releases are
/// decided by the three fast nodes, which keep no queue and report no waiters: it must
/// still not take the lock again ahead of a queued waiter. A waiter that arrives while it
/// holds (no one else waiting) is served within two hand-offs (one for the greedy
/// client's re-acquisition before the waiter's place reached the heralds, one of slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_waited_leaves_the_lock_to_a_queued_waiter() -> TestResult {
    let resource = "wr:greedy";
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let slow = heralds(resource, 5);
    let mut greedy_urls = Vec::new();
    for i in 0..5 {
        if slow.contains(&i) {
            cluster
                .proxy(i)?
                .set_mode(ProxyMode::Delay(Duration::from_millis(30)));
            greedy_urls.push(cluster.url(i)?);
        } else {
            greedy_urls.push(cluster.direct_url(i)?);
        }
    }
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let greedy = Redlock::builder(&greedy_urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(AtomicU64::new(0));
    let (stop2, holds2) = (stop.clone(), holds.clone());
    let g = tokio::spawn(async move {
        let started = Instant::now();
        while !stop2.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(20) {
            let lock = greedy.lock(resource, Duration::from_secs(10)).await?;
            holds2.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            lock.release().await?;
        }
        Ok::<_, Error>(())
    });
    // The greedy client is in its loop before the waiter arrives.
    let t = Instant::now();
    while holds.load(Ordering::Relaxed) < 3 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        holds.load(Ordering::Relaxed) >= 3,
        "the greedy loop never ran"
    );
    let waiter = Redlock::builder(&direct)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let patient = Retry::new()
        .delay(Duration::from_secs(2), Duration::from_secs(2))
        .max_wait(Duration::from_secs(6));
    let before = holds.load(Ordering::Relaxed);
    let got = waiter
        .lock_with(resource, Duration::from_secs(10), patient)
        .await;
    let during = holds.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let outcome = match got {
        Ok(l) => {
            l.release().await?;
            Ok(())
        }
        Err(e) => Err(e),
    };
    tokio::time::timeout(Duration::from_secs(30), g).await???;
    eprintln!("greedy holder took the lock {during} times while the waiter waited: {outcome:?}");
    assert!(outcome.is_ok(), "the waiter gave up: {outcome:?}");
    assert!(
        during <= 2,
        "the releaser took the lock {during} times ahead of the queued waiter"
    );
    Ok(())
}

/// One client of the queue protocol as the library speaks it, on a host whose wall clock
/// runs `skew_back` behind. It joins as the library does: a first join lets the herald
/// assign the arrival score, a re-join sends back the score that herald returned (the
/// protocol has no place for the client's clock; before, the client sent its own clock's
/// reading, `now - skew_back` here). It waits until a release names it, takes the lock
/// with `SET NX PX` on a majority (in parallel), holds it 5 ms, releases it (heralds: the
/// hand-over script naming the next waiter), and queues again at once.
async fn skewed_peer(
    urls: Vec<String>,
    resource: &'static str,
    skew_back: Duration,
    stop: Arc<AtomicBool>,
    holds: Arc<AtomicU64>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use futures::StreamExt;
    let enqueue = redis::Script::new(&scripts::source("enqueue"));
    let release = redis::Script::new(&scripts::source("release_one"));
    let n = urls.len();
    let hs = heralds(resource, n);
    let mut conns = Vec::new();
    for u in &urls {
        conns.push(
            redis::Client::open(u.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let channel = format!("quorumlock:released:{resource}");
    let mut subs = Vec::new();
    for h in hs {
        let mut p = redis::Client::open(urls[h].as_str())?
            .get_async_pubsub()
            .await?;
        p.subscribe(&channel).await?;
        subs.push(p.into_on_message());
    }
    let mut messages = futures::stream::select_all(subs);
    let (queue, leases, attrs, key, fence) = (
        format!("quorumlock:queue:{resource}"),
        format!("quorumlock:qlease:{resource}"),
        format!("quorumlock:qattrs:{resource}"),
        format!("quorumlock:lock:{resource}"),
        format!("quorumlock:fence:{resource}"),
    );
    let id = format!("{:016x}", rand::random::<u64>());
    let mut round = 0u64;
    let mut try_now = true;
    let mut scores: std::collections::HashMap<usize, Vec<u8>> = Default::default();
    // After a failed attempt a waiter tries again at its (short) fallback delay.
    let mut patience = Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        if try_now {
            round += 1;
            // Random from the first character: announcements carry the token's first 8.
            let token = format!("{:016x}{round}", rand::random::<u64>());
            let sets = conns.iter().map(|c| {
                let mut c = c.clone();
                let (key, token) = (key.clone(), token.clone());
                async move {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async::<Option<String>>(&mut c)
                        .await
                }
            });
            let mut granted = 0;
            for r in futures::future::join_all(sets).await {
                granted += usize::from(r?.is_some());
            }
            let won = granted > n / 2;
            patience = if won {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(30)
            };
            if won {
                // This `lock()` call is over: the next one is a new waiter, a new place.
                scores.clear();
                holds.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let releases = conns.iter().enumerate().map(|(i, c)| {
                let mut c = c.clone();
                // Heralds announce and name (the hand-over script runs on every node).
                let loud = if won && hs.contains(&i) { "1" } else { "0" };
                let mut call = release.key(&key);
                call.key(&queue).key(&leases).key(&attrs).key(&fence);
                call.arg(&token).arg(&id).arg(&channel).arg(loud);
                async move { call.invoke_async::<redis::Value>(&mut c).await }
            });
            for r in futures::future::join_all(releases).await {
                r?;
            }
        }
        // (Re-)join: the score each herald gave us, or none yet (the herald assigns one).
        // This host's clock (`skew_back` behind) plays no part.
        let _clock = std::time::SystemTime::now().checked_sub(skew_back);
        for h in hs {
            let score = scores.get(&h).cloned().unwrap_or_default();
            // A name-only entry, joined or renewed (re-added if it was popped).
            let reply: Vec<redis::Value> = enqueue
                .key(&queue)
                .key(&leases)
                .key(&attrs)
                .key(&key)
                .arg(&id)
                .arg(score)
                .arg(3000)
                .arg(10_000)
                .arg("n")
                .arg("1")
                .invoke_async(&mut conns[h])
                .await?;
            if let Some(redis::Value::BulkString(s)) = reply.get(2) {
                scores.insert(h, s.clone());
            }
        }
        while futures::FutureExt::now_or_never(messages.next()).is_some() {}
        let named = tokio::time::timeout(patience, async {
            while let Some(m) = messages.next().await {
                let p: Vec<u8> = m.get_payload_bytes().to_vec();
                if p.split(|b| *b == b':').skip(1).any(|w| w == id.as_bytes()) {
                    return;
                }
            }
        })
        .await;
        // Named: our turn. Nothing for a while: try anyway (a fallback timer).
        try_now = true;
        let _ = named;
    }
    Ok(())
}

/// Two clients on a host whose clock is 60 s behind hold a resource in turn: each queues
/// again while the other holds. A waiter on a correct clock that arrived while one held and
/// the other was queued is served within arrival order's bound. (When arrival scores came
/// from the clients' clocks, each re-join was a minute "older" than the waiter's, every
/// release named the other skewed client, the waiter skipped its fallback attempts because
/// a hand-off was always under way, and it got the lock only when a race broke their
/// turn-taking: after 39 to 190 of their holds; or gave up at its maximum wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_a_clock_behind_do_not_starve_a_waiter() -> TestResult {
    let resource = "wr:skew";
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(AtomicU64::new(0));
    let mut peers = Vec::new();
    for _ in 0..2 {
        peers.push(tokio::spawn(skewed_peer(
            urls.clone(),
            resource,
            Duration::from_secs(60),
            stop.clone(),
            holds.clone(),
        )));
    }
    let t = Instant::now();
    while holds.load(Ordering::Relaxed) < 5 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(holds.load(Ordering::Relaxed) >= 5, "the peers never ran");
    let waiter = Redlock::builder(&urls).build().await?;
    let before = holds.load(Ordering::Relaxed);
    let got = waiter
        .lock_with(
            resource,
            Duration::from_secs(10),
            Retry::new().max_wait(Duration::from_secs(4)),
        )
        .await;
    let during = holds.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let outcome = match got {
        Ok(l) => {
            l.release().await?;
            Ok(())
        }
        Err(e) => Err(e),
    };
    for p in peers {
        tokio::time::timeout(Duration::from_secs(10), p).await???;
    }
    eprintln!("skewed peers held the lock {during} times while the waiter waited: {outcome:?}");
    // When the waiter arrived one skewed client held and the other was queued (k = 1):
    // arrival order allows k + 2 hand-offs to others, one more for the hold under way.
    assert!(
        outcome.is_ok() && during <= 4,
        "a waiter on a correct clock was passed over {during} times by the skewed clients: {outcome:?}"
    );
    Ok(())
}

/// Two waiters queue (first A, then B, each with its own client and a 2 s fallback delay)
/// while a holder keeps the resource; one herald is restarted empty. The renewals rebuild
/// its queue within a renewal period, in the original order (a re-join sends back the
/// ticket the first herald gave at the first join), and the hand-overs still go A, then B.
/// (With transfers, the renewals find the waiters' tokens gone there and re-join with fresh
/// tokens and the same tickets. The head's fallback claim can then win the empty node's
/// key and its clean-up pass that key on to the other waiter's entry there, popping it, so
/// the test waits for one entry back rather than both.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herald_restarted_empty_gets_its_queue_back_in_order() -> TestResult {
    use std::sync::Mutex;
    let resource = "wr:restart";
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let queue = format!("quorumlock:queue:{resource}");
    let [restarted, _] = heralds(resource, 3);
    let mut inspect = redis::Client::open(urls[restarted].as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let holder = Redlock::builder(&urls).build().await?;
    let lock = holder.try_lock(resource, Duration::from_secs(60)).await?;
    let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let slow = Retry::new()
        .delay(Duration::from_secs(2), Duration::from_secs(2))
        .max_wait(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for name in ["A", "B"] {
        let locks = Redlock::builder(&urls).build().await?;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let l = locks
                .lock_with(resource, Duration::from_secs(10), slow)
                .await?;
            order.lock().map_err(|_| "poisoned")?.push(name);
            tokio::time::sleep(Duration::from_millis(20)).await;
            l.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
        // The next waiter arrives once this one is queued.
        let t = Instant::now();
        let want = tasks.len() as u64;
        loop {
            let n: u64 = redis::cmd("ZCARD")
                .arg(&queue)
                .query_async(&mut inspect)
                .await?;
            if n >= want || t.elapsed() > Duration::from_secs(5) {
                assert!(n >= want, "waiter {name} never queued");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    cluster.restart(restarted, Duration::ZERO).await?;
    let mut inspect = redis::Client::open(urls[restarted].as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let t = Instant::now();
    let back = loop {
        let n: u64 = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut inspect)
            .await?;
        if n >= 1 || t.elapsed() > Duration::from_secs(5) {
            break n >= 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("restarted herald's queue back after {:?}", t.elapsed());
    assert!(back, "the restarted herald's queue never came back");
    lock.release().await?;
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task).await???;
    }
    let order = order.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(order, ["A", "B"]);
    Ok(())
}
