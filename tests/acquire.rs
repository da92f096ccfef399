//! Acquire, release and extend against real redis-server processes: the algorithm's rules and the bad-input rules.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Error, NodeOutcome, Redlock, Retry};
use quorumlock_testkit::History;
use redis::AsyncCommands;
use support::*;

const TTL: Duration = Duration::from_secs(10);

/// A client with a fixed per-node timeout: the derived default (2 % of the TTL) is tight
/// on a loaded 2-core CI machine, and these tests are about outcomes, not latency.
async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_acquire_refuse_release_reacquire() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;

    let lock = a.try_lock("orders:42", TTL).await.expect("first lock");
    assert!(lock.is_valid());
    assert!(lock.remaining() <= TTL);
    assert!(lock.remaining() > TTL - Duration::from_secs(1));
    assert_eq!(lock.resources(), ["orders:42"]);
    // Decided at quorum: at least 3 nodes hold our token now, all 5 soon after.
    let key = lock_key("orders:42");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &key).await == 5
        })
        .await
    );
    assert_eq!(get(&c, 0, &key).await.as_deref(), Some(lock.token()));

    match b.try_lock("orders:42", TTL).await {
        Err(Error::Held(votes)) => {
            assert!(votes.held() >= 3, "decided at quorum: {votes:#}");
            assert_eq!(votes.granted(), 0);
            assert_eq!(votes.quorum(), 3);
            assert!(votes.to_string().contains("(3 needed)"), "{votes}");
            assert_eq!(votes.resources(), ["orders:42"]);
        }
        other => panic!("expected Held, got {other:?}"),
    }
    lock.release().await.expect("release");
    // A quorum at once, the others right after (the release returns at the quorum).
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &key).await == 0
        })
        .await,
        "release deletes everywhere"
    );
    let again = b.try_lock("orders:42", TTL).await.expect("free again");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t11_tokens_are_fresh_and_never_printed_whole() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let l1 = a.try_lock("r", TTL).await.unwrap();
    let t1 = l1.token().to_owned();
    l1.release().await.unwrap();
    let l2 = a.try_lock("r", TTL).await.unwrap();
    assert_ne!(t1, l2.token(), "a fresh token for every acquisition");
    assert_eq!(t1.len(), 32);
    let shown = format!("{l2:?}");
    assert!(!shown.contains(l2.token()), "{shown}");
    assert!(shown.contains(&l2.token()[..8]), "{shown}");
    l2.release().await.unwrap();
}

/// 16 contenders, each with its own Redlock (separate services), never hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_sixteen_contenders_never_overlap() {
    let c = cluster5().await;
    let history = History::new();
    let in_section = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for id in 0..16u64 {
        let urls = c.urls();
        let history = history.clone();
        let in_section = in_section.clone();
        let max_seen = max_seen.clone();
        tasks.push(tokio::spawn(async move {
            let locks = Redlock::builder(&urls)
                .node_timeout(Duration::from_millis(250))
                .retry(Retry::new().max_wait(Duration::from_secs(60)))
                .build()
                .await
                .unwrap();
            let rec = history.client(id);
            let mut done = 0;
            for _ in 0..10 {
                rec.acquire_invoked("shared");
                let lock = match locks.lock("shared", Duration::from_secs(5)).await {
                    Ok(l) => l,
                    Err(e) => panic!("client {id}: {e}"),
                };
                rec.acquired("shared", lock.deadline(), None);
                rec.work_started("shared");
                let now = in_section.fetch_add(1, Ordering::SeqCst) + 1;
                max_seen.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                in_section.fetch_sub(1, Ordering::SeqCst);
                rec.work_ended("shared");
                rec.release_invoked("shared");
                // Under heavy load a release may miss the quorum; the keys then
                // expire by TTL, which only delays the others.
                let _ = lock.release().await;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 160);
    assert_eq!(
        max_seen.load(Ordering::SeqCst),
        1,
        "two holders in the critical section"
    );
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

/// Killing one or two nodes does not stop acquisition; killing three makes it fail fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_killed_nodes() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    c.kill(0).await.unwrap();
    let l = a.try_lock("k", TTL).await.expect("4 of 5 alive");
    l.release().await.unwrap();
    // The release returns at a quorum; its last leg must land before the next attempt,
    // or that node still holds the old token and three failures decide.
    assert!(a.flush(Duration::from_secs(2)).await);
    c.kill(1).await.unwrap();
    let l = a.try_lock("k", TTL).await.expect("3 of 5 alive");
    let votes_ok = l.remaining();
    assert!(votes_ok > TTL - Duration::from_secs(1));
    l.release().await.unwrap();
    c.kill(2).await.unwrap();
    match a.try_lock("k", TTL).await {
        Err(Error::NoQuorum(v)) => {
            // Three "no"s decide: the dead nodes' errors (or a survivor still finishing
            // the previous release in the background).
            assert!(v.failed() + v.timed_out() + v.held() >= 3, "{v:#}");
            assert!(v.failed() + v.timed_out() >= 1, "{v:#}");
            assert!(v.granted() <= 2);
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // The two survivors hold nothing of the failed attempt (their release may still be
    // in flight when the decision came from the three dead nodes first).
    let key = lock_key("k");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 3..5, &key).await == 0
        })
        .await
    );
    // Nodes come back: the same client works again (it reconnects by itself).
    c.start(0).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.try_lock("k", TTL).await.is_ok_and(|l| {
                drop(l);
                true
            })
        })
        .await,
        "reconnects after a restart"
    );
}

/// A paused node (SIGSTOP) does not stop acquisition and costs at most the node timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_paused_nodes_cost_at_most_the_node_timeout() {
    let c = cluster5().await;
    let node_timeout = Duration::from_millis(100);
    let a = Redlock::builder(c.urls())
        .node_timeout(node_timeout)
        .build()
        .await
        .unwrap();
    c.pause(0).await.unwrap();
    c.pause(1).await.unwrap();
    // Two paused: the three others decide; the paused nodes are not awaited.
    let l = a.try_lock("p", TTL).await.expect("3 healthy nodes");
    let drift = TTL / 100 + Duration::from_millis(2);
    // validity = TTL − elapsed − drift, so this bounds the attempt's duration.
    assert!(
        l.remaining() > TTL - drift - node_timeout,
        "remaining {:?}",
        l.remaining()
    );
    l.release().await.unwrap();
    // Now a third node refuses (held by someone else): the outcome needs a paused
    // node's answer, which never comes: the decision waits exactly one node timeout.
    let mut raw2 = raw(&c, 2).await;
    let _: () = raw2.set(lock_key("p"), "someone-else").await.unwrap();
    let start = Instant::now();
    let err = a.try_lock("p", TTL).await.unwrap_err();
    let took = start.elapsed();
    let votes = err.votes().expect("votes").clone();
    assert_eq!(votes.timed_out(), 2, "{votes:#}");
    assert_eq!(votes.held(), 1, "{votes:#}");
    assert!(
        took < node_timeout * 5,
        "took {took:?} with a {node_timeout:?} node timeout"
    );
    c.resume(0).await.unwrap();
    c.resume(1).await.unwrap();
    // After resuming, the late SETs of that failed attempt land and are cleaned up.
    let key = lock_key("p");
    assert!(
        eventually(Duration::from_secs(3), || async {
            count_key(&c, [0, 1, 3, 4], &key).await == 0
        })
        .await,
        "late SETs on resumed nodes were released"
    );
    assert_eq!(
        get(&c, 2, &key).await.as_deref(),
        Some("someone-else"),
        "never deletes another owner's key"
    );
}

/// A failed attempt leaves no key on any node, including a node whose SET timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t32_failed_attempt_leaves_no_key() {
    let c = cluster5().await;
    let a = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    // Another owner holds nodes 0..3.
    for i in 0..3 {
        let mut r = raw(&c, i).await;
        let _: () = r.set_ex(lock_key("x"), "other", 30).await.unwrap();
    }
    match a.try_lock("x", TTL).await {
        Err(Error::Held(v)) => assert_eq!(v.held(), 3, "{v:#}"),
        other => panic!("expected Held, got {other:?}"),
    }
    // Nodes 3 and 4 granted; they are released before try_lock returned (or, if one
    // timed out on a busy machine, in the background right after).
    let key = lock_key("x");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 3..5, &key).await == 0
        })
        .await
    );
    // Now with node 4's replies blackholed (requests still delivered): its SET lands
    // but the answer never comes. The clean-up must still remove it.
    c.proxy(4)
        .unwrap()
        .set_mode(quorumlock_testkit::ProxyMode::BlackholeReplies);
    let err = a.try_lock("x", TTL).await.unwrap_err();
    assert!(err.is_held(), "{err}");
    // The attempt may be decided (three nodes held) before node 4's SET has even crossed
    // the proxy; its release waits for a reply that never comes, so the key stays.
    assert!(
        eventually(Duration::from_secs(2), || async {
            get(&c, 4, &lock_key("x")).await.map(|v| v.len()) == Some(32)
        })
        .await,
        "the SET landed on node 4"
    );
    c.proxy(4)
        .unwrap()
        .set_mode(quorumlock_testkit::ProxyMode::Pass);
    // The release was queued behind the SET; after the link heals the key goes.
    // (If the blackholed connection was reset, the key expires by TTL instead; the
    // proxy keeps it, so the release reaches the node.)
    let key = lock_key("x");
    let cleaned = eventually(Duration::from_secs(5), || async {
        get(&c, 4, &key).await.is_none()
    })
    .await;
    assert!(cleaned, "the late SET on node 4 was released");
    for i in 0..3 {
        assert_eq!(get(&c, i, &key).await.as_deref(), Some("other"));
    }
}

/// A cancelled attempt (future dropped mid-vote) leaves no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t33_cancelled_attempt_leaves_no_key() {
    let c = cluster5().await;
    let a = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    for i in 0..3 {
        c.pause(i).await.unwrap();
    }
    // The attempt cannot decide before the paused nodes time out; cancel it first.
    let r = tokio::time::timeout(Duration::from_millis(30), a.try_lock("cancel", TTL)).await;
    assert!(r.is_err(), "still deciding when cancelled");
    let key = lock_key("cancel");
    for i in 0..3 {
        c.resume(i).await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            count_key(&c, 0..5, &key).await == 0
        })
        .await,
        "every key of the cancelled attempt was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_extend_rules() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let mut l = a.try_lock("e", Duration::from_secs(2)).await.unwrap();
    let before = l.remaining();
    l.extend(Duration::from_secs(20)).await.expect("extend");
    assert!(l.remaining() > before + Duration::from_secs(10));
    assert!(
        l.remaining() <= Duration::from_secs(20),
        "validity never above the TTL"
    );
    assert_eq!(l.ttl(), Duration::from_secs(20));
    let key = lock_key("e");
    // A quorum has the new TTL at once (the rest may still be in flight).
    let mut extended = 0;
    for i in 0..5 {
        let mut r = raw(&c, i).await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut r)
            .await
            .unwrap();
        extended += usize::from(pttl > 15_000);
    }
    assert!(extended >= 3, "node TTLs extended on {extended} nodes");

    // Extension misses the quorum because 3 nodes are down: nothing is deleted, the
    // lock keeps its deadline.
    c.kill(0).await.unwrap();
    c.kill(1).await.unwrap();
    c.kill(2).await.unwrap();
    let deadline = l.deadline();
    match l.extend(Duration::from_secs(20)).await {
        Err(Error::NoQuorum(v)) => assert!(v.granted() <= 2, "{v:#}"),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert_eq!(
        l.deadline(),
        deadline,
        "a failed extension never moves the deadline"
    );
    assert_eq!(
        count_key(&c, 3..5, &key).await,
        2,
        "a failed extension deletes nothing"
    );
    for i in 0..3 {
        c.start(i).await.unwrap();
    }
    // The restarted nodes came back empty (no persistence): 2 of 5 hold our token,
    // 3 refuse: a quorum no longer holds it: lost. (The first request on each
    // restarted node may meet the old, dead connection: allow two tries.)
    let mut result = l.extend(Duration::from_secs(20)).await;
    if matches!(result, Err(Error::NoQuorum(_))) {
        result = l.extend(Duration::from_secs(20)).await;
    }
    match result {
        Err(Error::Lost(lost)) => assert!(!lost.is_expired()),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(!l.is_valid(), "a lock found lost is marked expired");
    assert_eq!(count_key(&c, 3..5, &key).await, 2, "still nothing deleted");
    match l.extend(Duration::from_secs(20)).await {
        Err(Error::Lost(lost)) => assert!(lost.is_expired()),
        other => panic!("extending an expired lock: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t41_extend_and_release_of_an_expired_lock() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let mut l = a
        .try_lock("short", Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep_until(l.deadline().into()).await;
    assert!(!l.is_valid());
    assert_eq!(l.remaining(), Duration::ZERO);
    assert!(
        matches!(l.extend(Duration::from_secs(1)).await, Err(Error::Lost(x)) if x.is_expired())
    );
    match l.release().await {
        Err(Error::Lost(x)) => assert!(x.is_expired()),
        other => panic!("releasing an expired lock: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_release_never_deletes_another_owners_key() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let l = a.try_lock("mine", TTL).await.unwrap();
    let key = lock_key("mine");
    // Simulate our key expiring on node 4 and someone else taking it there.
    let mut r4 = raw(&c, 4).await;
    let _: () = r4.set(&key, "theirs").await.unwrap();
    l.release().await.expect("4 of 5 confirm");
    assert_eq!(get(&c, 4, &key).await.as_deref(), Some("theirs"));
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..4, &key).await == 0
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_release_with_a_majority_down() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let l = a.try_lock("down", TTL).await.unwrap();
    for i in 0..3 {
        c.kill(i).await.unwrap();
    }
    match l.release().await {
        Err(Error::NoQuorum(v)) => assert!(v.granted() <= 2, "{v:#}"),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    let key = lock_key("down");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 3..5, &key).await == 0
        })
        .await,
        "reachable nodes are released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_multi_resource_all_or_nothing() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let hold_b = b.try_lock("stock:2", TTL).await.unwrap();
    let err = a
        .try_lock_many(["stock:1", "stock:2"], TTL)
        .await
        .unwrap_err();
    assert!(err.is_held(), "{err}");
    let k1 = lock_key("stock:1");
    let k2 = lock_key("stock:2");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &k1).await == 0
        })
        .await,
        "none of the keys taken"
    );
    hold_b.release().await.unwrap();
    let mut both = a.try_lock_many(["stock:2", "stock:1"], TTL).await.unwrap();
    assert_eq!(both.resources(), ["stock:1", "stock:2"]);
    assert!(b.try_lock("stock:1", TTL).await.unwrap_err().is_held());
    assert!(b.try_lock("stock:2", TTL).await.unwrap_err().is_held());
    both.extend(TTL).await.unwrap();
    both.release().await.unwrap();
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &k1).await == 0 && count_key(&c, 0..5, &k2).await == 0
        })
        .await
    );
    let l = b
        .lock_many(vec!["stock:1".to_string(), "stock:2".to_string()], TTL)
        .await
        .unwrap();
    l.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_drop_releases_in_the_background() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let l = a.try_lock("dropped", TTL).await.unwrap();
    drop(l);
    let key = lock_key("dropped");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &key).await == 0
        })
        .await
    );
}

/// A release returns at the quorum; `flush` waits for the slower nodes' part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_flush_waits_for_the_background_part_of_a_release() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let l = a.try_lock("flushed", TTL).await.unwrap();
    let key = lock_key("flushed");
    assert!(
        eventually(Duration::from_secs(2), || async {
            count_key(&c, 0..5, &key).await == 5
        })
        .await
    );
    c.pause(4).await.unwrap();
    l.release().await.expect("4 of 5 confirm");
    assert!(
        !a.flush(Duration::from_millis(300)).await,
        "the release to the paused node is still on its way"
    );
    c.resume(4).await.unwrap();
    assert!(
        a.flush(Duration::from_secs(10)).await,
        "everything finished"
    );
    assert_eq!(count_key(&c, 0..5, &key).await, 0, "no key left anywhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t62_lock_waits_and_times_out() {
    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let b = Redlock::builder(c.urls())
        .retry(
            Retry::new()
                .attempts(3)
                .delay(Duration::from_millis(5), Duration::from_millis(10)),
        )
        .notify(false)
        .build()
        .await
        .unwrap();
    let held = a.try_lock("busy", TTL).await.unwrap();
    match b.lock("busy", TTL).await {
        Err(Error::Timeout(t)) => {
            assert!(t.is_max_wait());
            assert_eq!(t.attempts(), 3);
            assert!(t.votes().is_some_and(|v| v.held() >= 3));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let start = Instant::now();
    let r = b
        .lock_with(
            "busy",
            TTL,
            Retry::new().max_wait(Duration::from_millis(200)),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout(_))));
    assert!(start.elapsed() >= Duration::from_millis(200));
    held.release().await.unwrap();
    b.lock("busy", TTL).await.unwrap().release().await.unwrap();
}

/// Unexpected replies are failures with their text, never grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_unexpected_replies() {
    let c = cluster5().await;
    // A wrong-typed key under the lock's name: `SET … NX GET` fails with WRONGTYPE there.
    let mut r0 = raw(&c, 0).await;
    let _: () = r0.lpush(lock_key("typed"), "x").await.unwrap();
    let a = client(&c.urls()).await;
    let l = a.try_lock("typed", TTL).await.expect("4 of 5");
    // Release on the wrong-typed node fails with WRONGTYPE; the others confirm.
    l.release().await.expect("quorum confirms");
    // OOM: node 1 has no memory left for writes.
    let mut r1 = raw(&c, 1).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut r1)
        .await
        .unwrap();
    // READONLY: node 2 becomes a replica of nowhere reachable.
    let mut r2 = raw(&c, 2).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg("1")
        .query_async(&mut r2)
        .await
        .unwrap();
    let err = a.try_lock("typed", TTL).await.unwrap_err();
    let v = err.votes().expect("votes");
    let texts: Vec<String> = v
        .iter()
        .filter_map(|nv| match &nv.outcome {
            NodeOutcome::Failed(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert!(texts.iter().any(|t| t.contains("OOM")), "{v:#}");
    assert!(texts.iter().any(|t| t.contains("read only")), "{v:#}");
    assert!(texts.iter().any(|t| t.contains("WRONGTYPE")), "{v:#}");
    assert!(v.granted() <= 2, "{v:#}");
    assert!(matches!(err, Error::NoQuorum(_)), "{err}");
}

/// Every bad input (zero or duplicate nodes, bad URLs, bad TTLs, empty resources, …) gets a
/// clear error, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_bad_input() {
    let urls = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    let cfg = |r: Result<Redlock, Error>| match r {
        Err(Error::Config(c)) => c.field().to_owned(),
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(
        cfg(Redlock::builder(Vec::<String>::new()).build().await),
        "nodes"
    );
    assert_eq!(
        cfg(
            Redlock::builder(["redis://127.0.0.1:1", "redis://127.0.0.1:1"])
                .build()
                .await
        ),
        "nodes"
    );
    assert_eq!(cfg(Redlock::builder(["not a url"]).build().await), "nodes");
    assert_eq!(cfg(Redlock::builder(["redis://"]).build().await), "nodes");
    assert_eq!(
        cfg(Redlock::builder(urls).drift_factor(2.0).build().await),
        "drift_factor"
    );
    assert_eq!(
        cfg(Redlock::builder(urls)
            .retry(Retry::new().delay(Duration::ZERO, Duration::ZERO))
            .build()
            .await),
        "retry.delay"
    );
    // An even count is allowed (with a warning).
    let even = Redlock::builder(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .connect_timeout(Duration::from_millis(50))
        .build()
        .await
        .expect("even count allowed");
    assert_eq!(even.quorum(), 2);

    let c = cluster5().await;
    let a = client(&c.urls()).await;
    let input = |r: Result<quorumlock::Lock, Error>| match r {
        Err(Error::InvalidInput(i)) => i.what().to_owned(),
        other => panic!("expected invalid input, got {other:?}"),
    };
    assert_eq!(input(a.try_lock("", TTL).await), "resource");
    assert_eq!(input(a.try_lock("r", Duration::ZERO).await), "ttl");
    assert_eq!(
        input(a.try_lock("r", Duration::from_millis(2)).await),
        "ttl"
    );
    assert_eq!(
        input(a.try_lock("r", Duration::from_secs(365 * 86_400)).await),
        "ttl"
    );
    assert_eq!(input(a.try_lock("r", Duration::MAX).await), "ttl");
    assert_eq!(input(a.lock("", TTL).await), "resource");
    assert_eq!(
        input(a.try_lock_many(Vec::<String>::new(), TTL).await),
        "resources"
    );
    assert_eq!(input(a.try_lock_many(["a", "a"], TTL).await), "resources");
    assert_eq!(input(a.try_lock_many(["a", ""], TTL).await), "resource");
    assert_eq!(
        input(a.lock_with("r", TTL, Retry::new().attempts(0)).await),
        "retry"
    );
    // Nothing was written by any rejected call (the client's group-map record is from
    // its build).
    let mut r0 = raw(&c, 0).await;
    let keys: Vec<String> = r0.keys("*").await.unwrap();
    assert_eq!(keys, ["quorumlock:groupmap"], "{keys:?}");
}

/// No Debug, Display or error ever prints a password from a node URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_passwords_never_printed() {
    let a = Redlock::builder([
        "redis://app:hunter2@127.0.0.1:1",
        "redis://:hunter2@127.0.0.1:2",
        "redis://127.0.0.1:3",
    ])
    .connect_timeout(Duration::from_millis(50))
    .node_timeout(Duration::from_millis(50))
    .build()
    .await
    .unwrap();
    let err = a.try_lock("r", TTL).await.unwrap_err();
    for shown in [
        format!("{a:?}"),
        format!("{err}"),
        format!("{err:?}"),
        format!("{:#}", err.votes().unwrap()),
    ] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
    assert!(format!("{a:?}").contains("<redacted>"));
    let b = Redlock::builder(["redis://app:hunter2@127.0.0.1:1"]);
    assert!(!format!("{b:?}").contains("hunter2"));
    let bad = Redlock::builder(["redis://app:hunter2@127.0.0.1:notaport"])
        .build()
        .await
        .unwrap_err();
    assert!(!bad.to_string().contains("hunter2"), "{bad}");
}

/// A client can start while every node is down, and works once they are up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t82_start_with_nodes_down() {
    let c = cluster5().await;
    for i in 0..5 {
        c.kill(i).await.unwrap();
    }
    let a = Redlock::builder(c.urls())
        .connect_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("build never fails on unreachable nodes");
    assert!(matches!(
        a.try_lock("r", TTL).await,
        Err(Error::NoQuorum(_))
    ));
    for i in 0..5 {
        c.start(i).await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.try_lock("r", TTL).await.is_ok()
        })
        .await
    );
}

/// The start-up checks warn, through `tracing`, about every breach of the deployment
/// contract they can see.
#[tokio::test]
async fn t90_start_up_checks_warn_about_the_deployment_contract() {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // A current-thread test runtime: the checks' spawned tasks run on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    let c = quorumlock_testkit::LocalCluster::launch(4).await.unwrap();
    let mut r0 = raw(&c, 0).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut r0)
        .await
        .unwrap();
    let mut r1 = raw(&c, 1).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg("1")
        .query_async(&mut r1)
        .await
        .unwrap();
    let _locks = Redlock::builder(c.urls()).build().await.unwrap();
    let text = || String::from_utf8_lossy(&buf.0.lock().unwrap()).to_string();
    let expected = [
        "an even number of nodes",
        "maxmemory-policy is not noeviction",
        "node is a replica",
        "appendfsync always",
    ];
    // The checks run in the background, each query with a few seconds' patience: allow
    // a loaded machine that long.
    let seen = eventually(Duration::from_secs(20), || async {
        expected.iter().all(|e| text().contains(e))
    })
    .await;
    assert!(seen, "missing warnings in:\n{}", text());
}
