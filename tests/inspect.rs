//! Inspection against real redis-server processes: the verdict (held on a quorum, free on
//! a quorum, unknown), the per-node detail (holder prefix, TTL, fence counter, queue
//! length, failures), the read-write lock and the semaphore of the same name (readers,
//! writer, waiting writers, permits), and that inspecting writes nothing.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quorumlock::inspect::{NodeState, RwVerdict, SemaphoreVerdict, Verdict};
use quorumlock::{Error, Redlock, Retry};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use support::*;

const TTL: Duration = Duration::from_secs(30);

/// A client with a per-node timeout that a loaded CI machine meets.
async fn client(c: &LocalCluster) -> Redlock {
    Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build")
}

async fn cluster(n: usize) -> LocalCluster {
    LocalCluster::launch(n)
        .await
        .expect("start redis-server nodes (is redis-server installed?)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_free_resource_is_free_on_every_node() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let seen = locks.inspect("never-locked").await.expect("inspect");
    assert_eq!(seen.resource(), "never-locked");
    assert_eq!(seen.verdict(), &Verdict::Free { nodes: 5 });
    assert!(seen.is_free() && !seen.is_held());
    assert_eq!((seen.answered(), seen.quorum()), (5, 3));
    assert_eq!(seen.holder(), None);
    assert_eq!(seen.fence(), None);
    assert_eq!(seen.queued(), Some(0));
    // The queue length is read on the two heralds only.
    let heralds: Vec<bool> = seen.nodes().iter().map(|n| n.is_herald()).collect();
    assert_eq!(heralds.iter().filter(|h| **h).count(), 2, "{heralds:?}");
    for node in seen.nodes() {
        let r = node.reading().expect("answered");
        assert_eq!(r.holder(), None);
        assert_eq!(r.ttl(), None);
        assert_eq!(r.fence(), None);
        assert_eq!(r.queued(), node.is_herald().then_some(0));
    }
    assert_eq!(seen.nodes()[0].addr(), &locks.nodes()[0]);
    assert!(
        seen.to_string()
            .starts_with("never-locked: free on 5/5 nodes (quorum 3)"),
        "{seen}"
    );

    // Bad input is refused before any I/O.
    for bad in [
        locks.inspect("").await,
        locks.inspect(&"x".repeat(5000)).await,
    ] {
        assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
    }
    let none: [&str; 0] = [];
    assert!(matches!(
        locks.inspect_many(none).await,
        Err(Error::InvalidInput(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_held_resource_shows_its_holder_and_ttl() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let lock = locks.try_lock("held", TTL).await.expect("lock");
    let seen = locks.inspect("held").await.expect("inspect");
    let remaining_after = lock.remaining();
    let Verdict::Held { holder, nodes, ttl } = seen.verdict() else {
        panic!("not held: {seen}");
    };
    assert_eq!(*nodes, 5);
    assert_eq!(holder.as_str().len(), 8);
    assert!(
        holder.is_prefix_of(lock.token()),
        "{holder} vs the lock's token"
    );
    assert_eq!(seen.holder(), Some(holder));
    // The quorum's TTL: at most the lock's TTL, at least what the lock itself still
    // guarantees (its validity also subtracts the drift allowance).
    let ttl = ttl.expect("keys expire");
    assert!(ttl <= TTL, "{ttl:?}");
    assert!(ttl >= remaining_after, "{ttl:?} < {remaining_after:?}");
    assert!(ttl >= TTL - Duration::from_secs(5), "{ttl:?}");
    for node in seen.nodes() {
        let r = node.reading().expect("answered");
        assert_eq!(r.holder(), Some(holder));
        let t = r.ttl().expect("a TTL");
        assert!(t <= TTL && t >= ttl - Duration::from_secs(5), "{t:?}");
    }
    // Nothing shows the whole token.
    let shown = format!("{seen:?} {seen} {}", seen.nodes()[0]);
    assert!(!shown.contains(lock.token()), "{shown}");
    assert!(!shown.contains(&lock.token()[..9]), "{shown}");
    assert!(seen.to_string().contains("held by "), "{seen}");

    // A multi-resource lock shows its one token on each of its resources, in the order
    // asked (a name asked twice is answered twice).
    let many = locks
        .try_lock_many(["m:2", "m:1"], TTL)
        .await
        .expect("lock many");
    let seen = locks
        .inspect_many(["m:1", "free", "m:2", "m:1"])
        .await
        .expect("inspect many");
    let names: Vec<&str> = seen.iter().map(|s| s.resource()).collect();
    assert_eq!(names, ["m:1", "free", "m:2", "m:1"]);
    for i in [0, 2, 3] {
        assert!(
            seen[i]
                .holder()
                .is_some_and(|h| h.is_prefix_of(many.token())),
            "{}",
            seen[i]
        );
    }
    assert!(seen[1].is_free());

    lock.release().await.expect("release");
    many.release().await.expect("release");
    // The releases return at the quorum; let the slower nodes finish.
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("held").await.expect("inspect");
    assert_eq!(seen.verdict(), &Verdict::Free { nodes: 5 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_a_key_on_a_minority_is_not_held() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let key = lock_key("minority");
    let a = "aaaaaaaa-someone-else-0000000000";
    let b = "bbbbbbbb-another-one-00000000000";
    for i in [0, 1] {
        let mut r = raw(&c, i).await;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(a)
            .arg("PX")
            .arg(30_000)
            .query_async(&mut r)
            .await
            .expect("SET");
    }
    let seen = locks.inspect("minority").await.expect("inspect");
    assert_eq!(seen.verdict(), &Verdict::Free { nodes: 3 }, "{seen}");
    assert!(!seen.is_held());
    let holders: Vec<Option<String>> = seen
        .nodes()
        .iter()
        .map(|n| n.reading().and_then(|r| r.holder()).map(|h| h.to_string()))
        .collect();
    let some_a = Some("aaaaaaaa…".to_owned());
    assert_eq!(holders, [some_a.clone(), some_a, None, None, None]);

    // Two owners on two nodes each and one free node: a split, no quorum either way.
    for i in [2, 3] {
        let mut r = raw(&c, i).await;
        let _: () = r.set(&key, b).await.expect("SET");
    }
    let seen = locks.inspect("minority").await.expect("inspect");
    assert_eq!(seen.verdict(), &Verdict::Unknown, "{seen}");
    assert_eq!(seen.answered(), 5);
    // A key without expiry is shown as such.
    let r = seen.nodes()[2].reading().expect("answered");
    assert_eq!(r.holder().map(|h| h.as_str()), Some("bbbbbbbb"));
    assert_eq!(r.ttl(), None);
    assert!(seen.nodes()[2].to_string().contains("no expiry"));

    // A third node for the first owner gives it a quorum.
    let mut r = raw(&c, 4).await;
    let _: () = r.set(&key, a).await.expect("SET");
    let mut r2 = raw(&c, 2).await;
    let _: () = r2.set(&key, a).await.expect("SET");
    let seen = locks.inspect("minority").await.expect("inspect");
    match seen.verdict() {
        Verdict::Held { holder, nodes, .. } => {
            assert_eq!((holder.as_str(), *nodes), ("aaaaaaaa", 4), "{seen}");
        }
        other => panic!("{other:?}"),
    }
    // A key of the wrong type fails that node, and says why.
    let _: () = r.del(&key).await.expect("DEL");
    let _: () = r.hset(&key, "f", "v").await.expect("HSET");
    let seen = locks.inspect("minority").await.expect("inspect");
    match seen.nodes()[4].state() {
        NodeState::Failed(e) => assert!(e.contains("WRONGTYPE"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.answered(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_too_few_answers_make_it_unknown() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let lock = locks.try_lock("down", TTL).await.expect("lock");
    c.kill(0).await.expect("kill");
    c.kill(1).await.expect("kill");
    // Three of five still answer: held, on exactly the quorum.
    let seen = locks.inspect("down").await.expect("inspect");
    match seen.verdict() {
        Verdict::Held { holder, nodes, .. } => {
            assert_eq!(*nodes, 3, "{seen:?}");
            assert!(holder.is_prefix_of(lock.token()));
        }
        other => panic!("{other:?}: {seen}"),
    }
    for i in [0, 1] {
        assert!(
            matches!(seen.nodes()[i].state(), NodeState::Failed(_)),
            "{}",
            seen.nodes()[i]
        );
    }
    // A third node paused: only two answer, no verdict.
    c.pause(2).await.expect("pause");
    let seen = locks.inspect("down").await.expect("inspect");
    c.resume(2).await.expect("resume");
    assert_eq!(seen.verdict(), &Verdict::Unknown, "{seen}");
    assert_eq!(seen.answered(), 2);
    assert_eq!(seen.nodes()[2].state(), &NodeState::TimedOut);
    assert!(
        seen.to_string()
            .contains("unknown: only 2/5 nodes answered (quorum 3)"),
        "{seen}"
    );
    // A free resource with three nodes down is unknown too, not free.
    c.kill(2).await.expect("kill");
    let seen = locks.inspect("never-locked").await.expect("inspect");
    assert_eq!(seen.verdict(), &Verdict::Unknown, "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_fenced_lock_shows_the_counter() {
    let c = cluster(3).await;
    let locks = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(250))
        .fencing(true)
        .build()
        .await
        .expect("build");
    let mut last = 0;
    for _ in 0..2 {
        let lock = locks.try_lock("ledger", TTL).await.expect("lock");
        let t = lock.fencing_token().expect("fencing is on");
        assert!(t > last);
        let counters = |seen: &quorumlock::Inspection| -> Vec<u64> {
            seen.nodes()
                .iter()
                .map(|n| n.reading().and_then(|r| r.fence()).unwrap_or(0))
                .collect()
        };
        // A quorum committed the token: their counters are at least the token. The node
        // that gave the largest counter of the deciding quorum holds exactly the token; a
        // node that granted after the quorum decided may keep its own, larger counter.
        let seen = locks.inspect("ledger").await.expect("inspect");
        assert!(seen.is_held());
        let c = counters(&seen);
        assert!(c.iter().filter(|c| **c >= t).count() >= 2, "{c:?} vs {t}");
        assert!(c.contains(&t), "{c:?} vs {t}");
        // Once the last commit landed, every node's counter is at least the token (every
        // node granted: the previous lock was gone from all of them, see below).
        assert!(locks.flush(Duration::from_secs(10)).await);
        let seen = locks.inspect("ledger").await.expect("inspect");
        let counters = counters(&seen);
        assert!(counters.iter().all(|c| *c >= t), "{counters:?} vs {t}");
        assert_eq!(seen.fence(), counters.iter().max().copied());
        assert!(
            seen.nodes()
                .iter()
                .any(|n| n.to_string().contains(&format!("fence {t}"))),
            "{seen:?}"
        );
        lock.release().await.expect("release");
        assert!(locks.flush(Duration::from_secs(10)).await);
        last = t;
    }
    // The counters outlive the lock.
    let seen = locks.inspect("ledger").await.expect("inspect");
    assert!(seen.is_free());
    assert!(seen.fence().is_some_and(|f| f >= last), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_queue_length_counts_the_waiters() {
    const WAITERS: u64 = 3;
    let c = cluster(5).await;
    let locks = client(&c).await;
    let holder = locks.try_lock("queued", TTL).await.expect("lock");
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let w = client(&c).await;
        waiters.push(tokio::spawn(async move {
            let lock = w
                .lock_with(
                    "queued",
                    Duration::from_secs(5),
                    Retry::new().max_wait(Duration::from_secs(30)),
                )
                .await?;
            lock.release().await
        }));
    }
    // Each waiter joins the queue after its first refused attempt, on each herald in turn:
    // wait until both heralds count every waiter.
    let deadline = Instant::now() + Duration::from_secs(15);
    let seen = loop {
        let seen = locks.inspect("queued").await.expect("inspect");
        let both = seen
            .nodes()
            .iter()
            .filter(|n| n.is_herald())
            .all(|n| n.reading().and_then(|r| r.queued()) == Some(WAITERS));
        if both || Instant::now() >= deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(seen.queued(), Some(WAITERS), "{seen:?}");
    assert!(
        seen.holder()
            .is_some_and(|h| h.is_prefix_of(holder.token()))
    );
    // Both heralds keep the queue; the other nodes keep none.
    let by_herald: BTreeMap<bool, Vec<Option<u64>>> =
        seen.nodes().iter().fold(BTreeMap::new(), |mut m, n| {
            m.entry(n.is_herald())
                .or_default()
                .push(n.reading().and_then(|r| r.queued()));
            m
        });
    assert_eq!(by_herald[&true], [Some(WAITERS); 2]);
    assert_eq!(by_herald[&false], [None; 3]);
    assert!(
        seen.nodes()
            .iter()
            .any(|n| n.to_string().contains("queued 3"))
    );

    // Hand over: every waiter gets it in turn, and the queue empties.
    holder.release().await.expect("release");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("waiter finished")
            .expect("task")
            .expect("waiter took and released the lock");
    }
    // The last release returned at the quorum; let the slower nodes finish.
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("queued").await.expect("inspect");
    assert!(seen.is_free(), "{seen}");
    assert_eq!(seen.queued(), Some(0), "{seen:?}");
}

/// Every key on a node with its `DUMP` and `PTTL`, and the node's count of writes since
/// the last save (the servers run without snapshots, so it only grows with writes).
async fn snapshot(c: &LocalCluster, i: usize) -> (u64, BTreeMap<String, (Vec<u8>, i64)>) {
    let mut r = raw(c, i).await;
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut r)
        .await
        .expect("INFO");
    let dirty = info
        .lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("rdb_changes_since_last_save");
    let keys: Vec<String> = r.keys("*").await.expect("KEYS");
    let mut out = BTreeMap::new();
    for k in keys {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut r)
            .await
            .expect("DUMP");
        let pttl: i64 = r.pttl(&k).await.expect("PTTL");
        out.insert(k, (dump, pttl));
    }
    (dirty, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_inspecting_changes_no_key() {
    let c = cluster(3).await;
    let fenced = Redlock::builder(c.urls())
        .fencing(true)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build");
    let lock = fenced.try_lock("kept", TTL).await.expect("lock");
    let gone = fenced.try_lock("fenced-free", TTL).await.expect("lock");
    gone.release().await.expect("release");
    // A wait queue, written as the queue scripts write it (no live waiter would renew it
    // while we compare).
    for i in 0..3 {
        let mut r = raw(&c, i).await;
        let far = 4_000_000_000_000u64;
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg("quorumlock:queue:kept")
            .arg(1)
            .arg("w1")
            .cmd("ZADD")
            .arg("quorumlock:qlease:kept")
            .arg(far)
            .arg("w1")
            .query_async(&mut r)
            .await
            .expect("ZADD");
    }
    // Let the slower nodes of the release and of the fence commits finish first.
    assert!(fenced.flush(Duration::from_secs(10)).await);
    let inspector = client(&c).await;
    let before: Vec<_> = futures::future::join_all((0..3).map(|i| snapshot(&c, i))).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen = inspector
            .inspect_many(["kept", "fenced-free", "never"])
            .await
            .expect("inspect");
    }
    let after: Vec<_> = futures::future::join_all((0..3).map(|i| snapshot(&c, i))).await;
    assert!(seen[0].is_held() && seen[1].is_free() && seen[2].is_free());
    assert_eq!(seen[0].queued(), Some(1));
    assert!(seen[0].fence().is_some() && seen[1].fence().is_some());
    for (i, ((dirty0, keys0), (dirty1, keys1))) in before.iter().zip(&after).enumerate() {
        assert_eq!(dirty0, dirty1, "node {i}: a write happened");
        assert_eq!(
            keys0.keys().collect::<Vec<_>>(),
            keys1.keys().collect::<Vec<_>>(),
            "node {i}"
        );
        assert!(keys0.len() >= 4, "node {i}: {:?}", keys0.keys());
        for (k, (dump0, pttl0)) in keys0 {
            let (dump1, pttl1) = &keys1[k];
            assert_eq!(dump0, dump1, "node {i}: {k} changed");
            // TTLs only ran down; none was set, extended or removed.
            assert_eq!(*pttl0 < 0, *pttl1 < 0, "node {i}: {k}: {pttl0} → {pttl1}");
            assert!(pttl1 <= pttl0, "node {i}: {k}: {pttl0} → {pttl1}");
        }
    }
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_make_the_name_read_held() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let a = locks.try_read_lock("catalog", TTL).await.expect("reader a");
    let b = locks.try_read_lock("catalog", TTL).await.expect("reader b");
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("catalog").await.expect("inspect");
    let RwVerdict::ReadHeld {
        readers,
        nodes,
        ttl,
    } = seen.rw_verdict()
    else {
        panic!("not read-held: {seen}");
    };
    assert_eq!((*readers, *nodes), (2, 5), "{seen}");
    assert!(
        *ttl <= TTL && *ttl >= TTL - Duration::from_secs(5),
        "{ttl:?}"
    );
    // The mutex and the semaphore of the name are separate locks: free.
    assert_eq!(seen.verdict(), &Verdict::Free { nodes: 5 });
    assert_eq!(
        seen.semaphore_verdict(),
        &SemaphoreVerdict::Free { nodes: 5 }
    );
    assert_eq!(seen.waiting_writers(), 0);
    assert!(!seen.is_all_free());
    assert!(
        seen.to_string()
            .contains("catalog: read-held by 2 readers on 5/5 nodes (quorum 3)"),
        "{seen}"
    );
    for node in seen.nodes() {
        let rw = node.reading().expect("answered").rw();
        assert_eq!(rw.writer(), None);
        assert_eq!(rw.readers().len(), 2, "{node}");
        for token in [a.token(), b.token()] {
            assert!(
                rw.readers().iter().any(|e| e.id().is_prefix_of(token)),
                "{node}"
            );
        }
        assert!(rw.readers().iter().all(|e| e.ttl() <= TTL));
        assert!(!node.to_string().contains(a.token()), "{node}");
    }
    a.release().await.expect("release");
    b.release().await.expect("release");
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("catalog").await.expect("inspect");
    assert!(seen.is_all_free(), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_makes_the_name_write_held() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let writer = locks.try_write_lock("catalog", TTL).await.expect("writer");
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("catalog").await.expect("inspect");
    let RwVerdict::WriteHeld {
        writer: w,
        nodes,
        ttl,
    } = seen.rw_verdict()
    else {
        panic!("not write-held: {seen}");
    };
    assert!(w.is_prefix_of(writer.token()), "{seen}");
    assert_eq!(*nodes, 5);
    assert!(ttl.is_some_and(|t| t <= TTL), "{ttl:?}");
    assert!(seen.is_free(), "the mutex is a separate lock: {seen}");
    assert!(
        seen.to_string()
            .contains(&format!("write-held by {w} on 5/5 nodes (quorum 3)")),
        "{seen}"
    );
    for node in seen.nodes() {
        let rw = node.reading().expect("answered").rw();
        assert_eq!(rw.writer(), Some(w));
        assert!(rw.writer_ttl().is_some_and(|t| t <= TTL));
        assert!(rw.readers().is_empty());
    }
    writer.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_shown_while_readers_hold() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let reader = locks.try_read_lock("catalog", TTL).await.expect("reader");
    let w = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().max_wait(Duration::from_secs(30)))
        .build()
        .await
        .expect("build");
    let waiting = tokio::spawn(async move {
        let lock = w.write_lock("catalog", Duration::from_secs(5)).await?;
        lock.release().await
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let seen = loop {
        let seen = locks.inspect("catalog").await.expect("inspect");
        // The intent lands node by node: wait until three nodes show it.
        let with_intent = seen
            .nodes()
            .iter()
            .filter_map(|n| n.reading())
            .filter(|r| !r.rw().waiting_writers().is_empty())
            .count();
        if (seen.waiting_writers() == 1 && with_intent >= 3) || Instant::now() >= deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(seen.waiting_writers(), 1, "{seen}");
    assert!(
        matches!(seen.rw_verdict(), RwVerdict::ReadHeld { readers: 1, .. }),
        "{seen}"
    );
    assert!(seen.to_string().contains("1 writer waiting"), "{seen}");
    let with_intent = seen
        .nodes()
        .iter()
        .filter_map(|n| n.reading())
        .filter(|r| !r.rw().waiting_writers().is_empty())
        .count();
    assert!(with_intent >= 3, "{seen}");
    for r in seen.nodes().iter().filter_map(|n| n.reading()) {
        for e in r.rw().waiting_writers() {
            assert!(e.ttl() <= quorumlock::QUEUE_LEASE, "{e}");
            assert_eq!(e.id().as_str().len(), 8);
        }
    }
    // The reader leaves; the writer gets in, runs and leaves, and its intent with it.
    reader.release().await.expect("release");
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the writer finished")
        .expect("task")
        .expect("the writer took and released the lock");
    let mut seen = locks.inspect("catalog").await.expect("inspect");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.is_all_free() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = locks.inspect("catalog").await.expect("inspect");
    }
    assert!(seen.is_all_free(), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_permits_show_their_holders_and_the_count() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let pool = locks.semaphore("pool", 2).expect("semaphore");
    let (q, limit) = (pool.quorum(), pool.per_node_limit());
    let first = pool.try_acquire(TTL).await.expect("permit 1");
    let second = pool.try_acquire(TTL).await.expect("permit 2");
    // The surplus grants are given back in the background.
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("pool").await.expect("inspect");
    let SemaphoreVerdict::Held {
        holders,
        permits,
        quorum,
        ttl,
    } = seen.semaphore_verdict()
    else {
        panic!("not held: {seen}");
    };
    assert_eq!((*holders, *permits, *quorum), (2, Some(2), q), "{seen}");
    assert!(*ttl <= TTL, "{ttl:?}");
    assert_eq!(seen.semaphore_quorum(), q);
    let config = seen.semaphore_config().expect("stored configuration");
    assert_eq!(
        config.to_string(),
        format!("2:{limit}:{q}:5"),
        "the stored P:c:Q:N"
    );
    assert!(
        seen.to_string()
            .contains(&format!("semaphore: 2 of 2 permits held (quorum {q})")),
        "{seen}"
    );
    assert!(seen.is_free() && matches!(seen.rw_verdict(), RwVerdict::Free { .. }));
    // Each permit keeps its entries on exactly Q nodes; no node holds more than c.
    let mut total = 0;
    for node in seen.nodes() {
        let sem = node.reading().expect("answered").semaphore();
        assert!(sem.holders().len() <= limit as usize, "{node}");
        for e in sem.holders() {
            assert!(
                e.id().is_prefix_of(first.token()) || e.id().is_prefix_of(second.token()),
                "{node}"
            );
        }
        total += sem.holders().len();
    }
    assert_eq!(total, 2 * q, "{seen:?}");
    first.release().await.expect("release");
    second.release().await.expect("release");
    assert!(locks.flush(Duration::from_secs(10)).await);
    let seen = locks.inspect("pool").await.expect("inspect");
    assert_eq!(
        seen.semaphore_verdict(),
        &SemaphoreVerdict::Free { nodes: 5 }
    );
    assert_eq!(seen.semaphore_config(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_free_is_free_once() {
    let c = cluster(3).await;
    let locks = client(&c).await;
    let seen = locks.inspect("nothing").await.expect("inspect");
    assert!(seen.is_all_free(), "{seen}");
    assert_eq!(seen.rw_verdict(), &RwVerdict::Free { nodes: 3 });
    assert_eq!(
        seen.semaphore_verdict(),
        &SemaphoreVerdict::Free { nodes: 3 }
    );
    assert_eq!(seen.waiting_writers(), 0);
    assert_eq!(seen.semaphore_config(), None);
    assert_eq!(seen.to_string(), "nothing: free on 3/3 nodes (quorum 2)");
    for node in seen.nodes() {
        let r = node.reading().expect("answered");
        assert!(r.is_empty() && r.rw().is_free() && r.semaphore().holders().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_down_leave_the_other_kinds_partial_then_unknown() {
    let c = cluster(5).await;
    let locks = client(&c).await;
    let reader = locks.try_read_lock("shared", TTL).await.expect("reader");
    let pool = locks.semaphore("shared", 3).expect("semaphore");
    let permit = pool.try_acquire(TTL).await.expect("permit");
    assert!(locks.flush(Duration::from_secs(10)).await);
    c.kill(0).await.expect("kill");
    c.kill(1).await.expect("kill");
    let seen = locks.inspect("shared").await.expect("inspect");
    assert_eq!(seen.answered(), 3);
    assert!(
        matches!(
            seen.rw_verdict(),
            RwVerdict::ReadHeld {
                readers: 1,
                nodes: 3,
                ..
            }
        ),
        "{seen}"
    );
    // The permit kept its entries on Q nodes, some of them down: held when all of its
    // answering nodes make the quorum, otherwise unknown, never free.
    assert!(
        !matches!(seen.semaphore_verdict(), SemaphoreVerdict::Free { .. }),
        "{seen}"
    );
    // A third node down: only two answer, no verdict on any kind.
    c.kill(2).await.expect("kill");
    let seen = locks.inspect("shared").await.expect("inspect");
    assert_eq!(seen.answered(), 2);
    assert_eq!(seen.verdict(), &Verdict::Unknown);
    assert_eq!(seen.rw_verdict(), &RwVerdict::Unknown, "{seen}");
    assert_eq!(
        seen.semaphore_verdict(),
        &SemaphoreVerdict::Unknown,
        "{seen}"
    );
    assert!(!seen.is_all_free());
    assert!(
        seen.to_string()
            .contains("shared: unknown: only 2/5 nodes answered (quorum 3)"),
        "{seen}"
    );
    drop((reader, permit));
}
