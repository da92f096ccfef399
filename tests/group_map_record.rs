//! The group-map record of sharded lock groups: a client with another map is refused while
//! any lock of a running client may live (a migration, a paused or dropped client, a lock
//! handed over, a new client cut off from the old group), a refused client disables no
//! running one, a record nobody can read fails closed, and the record's rounds hold up
//! neither an extension with a node paused nor `try_lock`s during an outage. Each test
//! states the interleaving it drives and the invariant it checks. Every wait is bounded.

mod support;

use std::time::Duration;

use quorumlock::{Error, Redlock, Retry};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use support::{eventually, queued_on_every_node, raw};
use tokio::sync::oneshot;

const RECORD: &str = support::GROUP_MAP;
const LONG: Duration = Duration::from_secs(90);
const SHORT: Duration = Duration::from_secs(5);
const BOUND: Duration = Duration::from_secs(10);

async fn group() -> LocalCluster {
    support::group3().await
}

async fn build(groups: &[&LocalCluster], version: Option<u16>) -> Result<Redlock, Error> {
    support::grouped(groups, version).await
}

async fn unsharded(g: &LocalCluster) -> Redlock {
    build(&[g], None).await.expect("unsharded client")
}

/// `Ok(true)` when the client refuses with a group map mismatch, `Ok(false)` when it
/// still locks (the probe lock is released at once).
async fn refuses(locks: &Redlock, probe: &str) -> bool {
    match locks.try_lock(probe, Duration::from_secs(5)).await {
        Ok(l) => {
            let _ = l.release().await;
            false
        }
        Err(Error::GroupMapMismatch(_)) => true,
        Err(_) => false,
    }
}

async fn record_on(cluster: &LocalCluster, i: usize) -> Option<String> {
    raw(cluster, i).await.get(RECORD).await.expect("GET")
}

async fn del_record(cluster: &LocalCluster) {
    support::forget_group_map(cluster).await;
}

/// Migration from one group to two. An unsharded client records nothing, so a sharded
/// client started while it holds locks sees no record, builds, and takes the same
/// resources in the new group: two holders at once, with no fault at all. (The unsharded
/// client only stops *new* acquisitions at its next read, ≤ 10 s later; its held locks
/// stay, and a watchdog would keep them forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsharded_holder_is_invisible_to_a_new_sharded_client() {
    let (a, b) = (group().await, group().await);
    let plain = build(&[&a], None).await.expect("unsharded client");
    let names: Vec<String> = (0..40).map(|i| format!("job-{i}")).collect();
    let mut held = Vec::new();
    for n in &names {
        held.push(plain.try_lock(n, LONG).await.expect("unsharded try_lock"));
    }
    // The operator rolls out the sharded configuration while the old client runs.
    let sharded = match build(&[&a, &b], Some(1)).await {
        Ok(s) => s,
        Err(e) => {
            // The fixed behaviour: the running unsharded client is detected.
            assert!(matches!(e, Error::GroupMapMismatch(_)), "{e:?}");
            return;
        }
    };
    let mut doubles = Vec::new();
    for (n, lock) in names.iter().zip(&held) {
        if let Ok(other) = sharded.try_lock(n, Duration::from_secs(5)).await {
            if lock.is_valid() {
                doubles.push(n.clone());
            }
            let _ = other.release().await;
        }
    }
    assert!(
        doubles.is_empty(),
        "two holders at once (unsharded on group #1, sharded on group #2): {doubles:?}"
    );
}

/// A client paused (GC, VM freeze, SIGSTOP) for longer than a fixed record lease but
/// shorter than its lock's TTL would let the record lapse, and a client with another map
/// start and take the resource in another group while the paused client's lock is still
/// valid. So the record must outlive every lock of its client: right after a lock of 90 s
/// is taken (and after it is extended to 120 s), every node's record lives at least as long
/// as the lock, and a client with another map is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_outlives_every_lock_of_its_client() {
    let (a, b) = (group().await, group().await);
    let locks = build(&[&a, &b], Some(1)).await.expect("v1 client");
    let name = (0..1000)
        .map(|i| format!("ledger-{i}"))
        .find(|n| locks.group_of(n) == 1)
        .expect("a name in group #2");
    let mut lock = locks.try_lock(&name, LONG).await.expect("v1 lock");
    let shortest = |lock: &quorumlock::Lock| lock.remaining().as_millis() as i64;
    for (c, i) in [(&a, 0), (&a, 1), (&a, 2), (&b, 0), (&b, 1), (&b, 2)] {
        let pttl: i64 = raw(c, i).await.pttl(RECORD).await.expect("PTTL");
        assert!(
            pttl >= shortest(&lock),
            "the record lapses in {pttl} ms, the lock in {} ms",
            shortest(&lock)
        );
    }
    lock.extend(Duration::from_secs(120)).await.expect("extend");
    for (c, i) in [(&a, 0), (&b, 2)] {
        let pttl: i64 = raw(c, i).await.pttl(RECORD).await.expect("PTTL");
        assert!(
            pttl >= shortest(&lock),
            "after the extension the record lapses in {pttl} ms, the lock in {} ms",
            shortest(&lock)
        );
    }
    let other = build(&[&a], Some(2)).await;
    assert!(
        matches!(other, Err(Error::GroupMapMismatch(_))),
        "a client of another map built while the lock lives: {other:?}"
    );
    lock.release().await.expect("release");
}

/// The refresher upgrades only the groups still alive. A client dropped while one of
/// its locks (in group #2) lives stops refreshing group #1's nodes; once the record there
/// lapses (emulated by deleting it, as tests/groups.rs does), a client whose map is group
/// #1 alone builds and takes the same resource: two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_outliving_its_client_keeps_the_record_on_every_group() {
    let (a, b) = (group().await, group().await);
    let locks = build(&[&a, &b], Some(1)).await.expect("v1 client");
    let name = (0..1000)
        .map(|i| format!("ledger-{i}"))
        .find(|n| locks.group_of(n) == 1)
        .expect("a name in group #2");
    let lock = locks.try_lock(&name, LONG).await.expect("v1 lock");
    drop(locks);
    // The record lapses on group #1 (30 s after the last refresh there).
    del_record(&a).await;
    // A refresher that kept the whole map recorded writes it back within a period.
    let back = eventually(Duration::from_secs(13), || async {
        record_on(&a, 0).await.is_some()
    })
    .await;
    if !back {
        let new = build(&[&a], Some(2)).await;
        let doubled = match &new {
            Ok(n) => n.try_lock(&name, Duration::from_secs(5)).await.is_ok() && lock.is_valid(),
            Err(_) => false,
        };
        panic!(
            "group #1's record is not refreshed while a lock of the client lives; \
             a group-#1-only v2 client builds: {}, and holds {name} alongside: {doubled}",
            new.is_ok()
        );
    }
    let _ = lock.release().await;
}

/// A client refused at build still leaves its record on the nodes where none was
/// (a node restarted without persistence, or one the running clients could not reach for
/// 30 s). The running, correct clients read it at their next refresh and refuse every
/// lock from then on, for good (the mismatch is sticky and the refresher stops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_does_not_disable_the_running_ones() {
    let (a, b) = (group().await, group().await);
    let running = build(&[&a, &b], Some(1)).await.expect("v1 client");
    // Node a0 lost the record (restart without persistence).
    let _: () = raw(&a, 0).await.del(RECORD).await.expect("DEL");
    let wrong = build(&[&a, &b], Some(2)).await;
    assert!(
        matches!(wrong, Err(Error::GroupMapMismatch(_))),
        "the misconfigured client is refused: {wrong:?}"
    );
    let stray = record_on(&a, 0).await;
    let poisoned = eventually(Duration::from_secs(15), || refuses(&running, "probe")).await;
    assert!(
        !poisoned,
        "the refused v2 client left {stray:?} on a0 and the running v1 client now refuses \
         every lock"
    );
}

/// A semaphore made before the mismatch holds its group's state and never looks at the
/// mismatch flag again: it keeps handing out permits after the client refuses locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_made_before_a_mismatch_keeps_handing_out_permits() {
    let (a, b) = (group().await, group().await);
    let plain = build(&[&a], None).await.expect("unsharded client");
    let pool = plain.semaphore("pool", 2).expect("semaphore");
    // The unsharded client's record lapsed (emulated): a sharded client gets to start.
    del_record(&a).await;
    let _sharded = build(&[&a, &b], Some(1)).await.expect("sharded client");
    let refused = eventually(Duration::from_secs(15), || refuses(&plain, "probe")).await;
    assert!(refused, "the unsharded client never saw the sharded map");
    let permit = pool.try_acquire(Duration::from_secs(5)).await;
    assert!(
        matches!(permit, Err(Error::GroupMapMismatch(_))),
        "a permit after the mismatch: {permit:?}"
    );
}

/// A waiting `lock` call that began before its client saw another group map acquires
/// nothing after: neither by a claim nor by a hand-off (a release handing it the lock
/// while it waited past the mismatch; the hand-off was accepted under the record's old
/// coverage, seen once under load), and it ends with the mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_acquires_after_the_mismatch_is_seen() {
    let (a, b) = (group().await, group().await);
    let holder = build(&[&a], None).await.expect("unsharded holder");
    let waiter = build(&[&a], None).await.expect("unsharded waiter");
    let lock = holder.try_lock("job", LONG).await.expect("holder locks");
    let w = waiter.clone();
    let waiting = tokio::spawn(async move {
        w.lock_with(
            "job",
            Duration::from_secs(10),
            Retry::new().max_wait(Duration::from_secs(45)),
        )
        .await
    });
    del_record(&a).await;
    let _sharded = build(&[&a, &b], Some(1)).await.expect("sharded client");
    let refused = eventually(Duration::from_secs(15), || refuses(&waiter, "probe")).await;
    assert!(refused, "the waiter's client never saw the sharded map");
    lock.release().await.expect("release");
    let got = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter ends")
        .expect("join");
    assert!(
        matches!(got, Err(Error::GroupMapMismatch(_))),
        "the waiting call acquired after its client saw the mismatch: {got:?}"
    );
}

/// The check must not fail open. A node that answers the record script with an error
/// (a non-string value at the key: WRONGTYPE; an ACL key pattern narrower than
/// `~quorumlock:*`) was skipped with a debug log, so clients with different maps both
/// built and both locked one resource in two groups. Now such a record counts as another
/// map: every client is refused, naming the node's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_fails_closed() {
    let (a, b) = (group().await, group().await);
    for c in [&a, &b] {
        for i in 0..3 {
            let _: () = raw(c, i)
                .await
                .hset(RECORD, "junk", "1")
                .await
                .expect("HSET");
        }
    }
    for (groups, version) in [
        (vec![&a, &b], Some(1)),
        (vec![&a], Some(2)),
        (vec![&b], None),
    ] {
        match build(&groups, version).await {
            Err(Error::GroupMapMismatch(m)) => {
                assert!(m.recorded().starts_with("an unreadable record"), "{m}");
                assert!(m.to_string().contains("WRONGTYPE"), "{m}");
            }
            other => panic!("built over an unreadable record: {other:?}"),
        }
    }
}

/// A lock handed over to a waiter holds for the waiter's TTL without an acquisition
/// round of its own. The record must cover that TTL too. (A waiter covers its TTL before
/// it queues. In this scenario, a client that released the resource moments ago asks
/// again with a long TTL and a long retry delay, its refused claims already cover it, so
/// this test also passed without that line; it guards the outcome, whichever step
/// provides it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_is_covered_by_the_record_in_every_group() {
    let (a, b) = (group().await, group().await);
    let other = build(&[&a, &b], Some(1)).await.expect("other client");
    let yielder = build(&[&a, &b], Some(1)).await.expect("yielding client");
    let name = "handed";
    let home = if yielder.group_of(name) == 0 { &a } else { &b };
    let short = Duration::from_secs(5);
    let first = yielder.try_lock(name, short).await.expect("first hold");
    let o = other.clone();
    let other_waits = tokio::spawn(async move {
        o.lock_with(name, short, Retry::new().max_wait(Duration::from_secs(20)))
            .await
    });
    support::queued_on_every_node(home, name, 1)
        .await
        .expect("the other client queues");
    first.release().await.expect("release to the other client");
    let second = tokio::time::timeout(Duration::from_secs(20), other_waits)
        .await
        .expect("the other client returns")
        .expect("join")
        .expect("the other client holds");
    // The yielder asks again at once, with a long TTL: it yields, queues, is handed it.
    let y = yielder.clone();
    let yielder_waits = tokio::spawn(async move {
        // A retry delay far beyond the test: no claim on the fallback timer.
        let slow = Retry::new()
            .delay(Duration::from_secs(30), Duration::from_secs(30))
            .max_wait(Duration::from_secs(40));
        y.lock_with(name, LONG, slow).await
    });
    support::queued_on_every_node(home, name, 1)
        .await
        .expect("the yielder queues");
    second.release().await.expect("release to the yielder");
    let lock = tokio::time::timeout(Duration::from_secs(20), yielder_waits)
        .await
        .expect("the yielder returns")
        .expect("join")
        .expect("the yielder holds");
    // A covering write goes ahead once a quorum of every group took it (the others take
    // it a moment later): the record outlives the lock on a quorum of each group.
    for c in [&a, &b] {
        let mut covering = Vec::new();
        for i in 0..3 {
            let pttl: i64 = raw(c, i).await.pttl(RECORD).await.expect("PTTL");
            let left = lock.remaining().as_millis() as i64;
            covering.push((pttl >= left, pttl, left));
        }
        assert!(
            covering.iter().filter(|c| c.0).count() >= 2,
            "the record lapses before the handed-over lock on a majority: (covers, record ms, lock ms) {covering:?}"
        );
    }
    lock.release().await.expect("release");
}

/// A lock obtained by hand-off never passes through `acquire_as`, so `cover(ttl)` is
/// never called with its TTL. Client A locks `r` for 5 s, releases it to a queued waiter
/// C, and (within the polite window) asks `lock("r", 90 s)`: it yields, joins the queue
/// without a claim, and C's release hands it the key with a 90 s TTL. A's `longest` is
/// still 5 s, so the record's lease stays 30 s: if A is now paused or dies, the record
/// lapses ~60 s before A's lock, and a client with another map builds and locks the
/// resource in another group while A's lock is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_is_covered_by_the_record_on_every_node() {
    let g = group().await;
    let a = unsharded(&g).await;
    let first = a.try_lock("r", SHORT).await.expect("A locks r");
    // Two waiters of the same map, C then D, each holding until told to release.
    let mut waiters = Vec::new();
    for n in 1..=2u64 {
        let w = unsharded(&g).await;
        let (got_tx, got_rx) = oneshot::channel::<()>();
        let (go_tx, go_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let l = w.lock("r", SHORT).await.expect("waiter locks r");
            let _ = got_tx.send(());
            let _ = tokio::time::timeout(BOUND, go_rx).await;
            l.release().await.expect("waiter releases");
        });
        queued_on_every_node(&g, "r", n)
            .await
            .expect("waiter queued");
        waiters.push((got_rx, go_tx, task));
    }
    // A's release hands r to C with D still queued: A yields on its next lock().
    first.release().await.expect("A releases to C");
    let (c_got, c_go, c_task) = waiters.remove(0);
    tokio::time::timeout(BOUND, c_got)
        .await
        .expect("C holds in time")
        .expect("C holds");
    let a2 = a.clone();
    let again = tokio::spawn(async move { a2.lock("r", LONG).await });
    queued_on_every_node(&g, "r", 2)
        .await
        .expect("A queued behind D (yielded)");
    let _ = c_go.send(());
    let (d_got, d_go, d_task) = waiters.remove(0);
    tokio::time::timeout(BOUND, d_got)
        .await
        .expect("D holds in time")
        .expect("D holds");
    let _ = d_go.send(());
    let lock = tokio::time::timeout(BOUND, again)
        .await
        .expect("A holds in time")
        .expect("join")
        .expect("A holds r by hand-off");
    for t in [c_task, d_task] {
        tokio::time::timeout(BOUND, t)
            .await
            .expect("waiter ends")
            .expect("join");
    }
    let remaining = lock.remaining().as_millis() as i64;
    assert!(remaining > 60_000, "A's lock: {remaining} ms");
    let mut short = Vec::new();
    for i in 0..3 {
        let pttl: i64 = raw(&g, i).await.pttl(RECORD).await.expect("PTTL");
        if pttl < remaining {
            short.push((i, pttl));
        }
    }
    assert!(
        short.is_empty(),
        "A holds r (by hand-off) for {remaining} ms more, but the record lapses first on \
         (node, PTTL ms) {short:?}"
    );
    lock.release().await.expect("release");
}

/// A node that does not answer is skipped, so a new client that cannot reach any
/// node of the old map at its build sees no record, builds, and locks in a group the old
/// client never used. Unsharded client A holds `name` on group #1 for 90 s; group #1 is
/// unreachable from B for the ~1 s of B's build (paused); B (groups #1 and #2, v1)
/// builds and takes `name`, which it routes to group #2, while A's lock is valid. The
/// docs say a mismatch is missed only where every shared node *lost* the record; here
/// none did.
///
/// A lock now goes ahead only once its client's record is confirmed on a majority of every
/// group: B, cut off from group #1, refuses every lock until it reaches group #1, where
/// it finds A's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_cut_off_from_the_old_group_does_not_lock_beside_it() {
    let (g1, g2) = (group().await, group().await);
    let a = unsharded(&g1).await;
    let held: Vec<_> = {
        let mut v = Vec::new();
        for i in 0..40 {
            v.push(
                a.try_lock(&format!("job-{i}"), LONG)
                    .await
                    .expect("A locks"),
            );
        }
        v
    };
    for i in 0..3 {
        g1.pause(i).await.expect("pause");
    }
    let b = Redlock::builder(g1.urls())
        .group(g2.urls())
        .groups_version(1)
        .connect_timeout(Duration::from_millis(300))
        .node_timeout(Duration::from_millis(250))
        .build()
        .await;
    let mut doubles = Vec::new();
    if let Ok(b) = &b {
        for (i, lock) in held.iter().enumerate() {
            let name = format!("job-{i}");
            if b.group_of(&name) != 1 {
                continue;
            }
            if let Ok(other) = b.try_lock(&name, SHORT).await {
                if lock.is_valid() {
                    doubles.push(name);
                }
                drop(other);
            }
        }
    }
    for i in 0..3 {
        g1.resume(i).await.expect("resume");
    }
    assert!(
        doubles.is_empty(),
        "B built ({}) while group #1 was unreachable and holds {doubles:?} in group #2 \
         while A holds them in group #1",
        b.is_ok()
    );
}

/// `Lock::extend` now runs `cover(ttl)` first, and a TTL the record does not cover
/// yet makes it a synchronous write round on *every* node, awaited to the slowest one
/// with the connect timeout (1 s by default), before the extension is even sent. With
/// one node of three paused, extending a 2 s lock to 60 s when 700 ms are left waits
/// ~1 s for the record, and the lock is gone by the time the extension goes out,
/// although two nodes answer within a millisecond and the node timeout is 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_with_one_node_paused_is_not_held_up_by_the_record() {
    let g = group().await;
    let locks = Redlock::builder(g.urls())
        .node_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("client");
    let mut lock = locks
        .try_lock("e", Duration::from_secs(2))
        .await
        .expect("lock");
    g.pause(2).await.expect("pause");
    let left = lock.remaining().saturating_sub(Duration::from_millis(700));
    tokio::time::sleep(left).await;
    let started = std::time::Instant::now();
    let extended = lock.extend(Duration::from_secs(60)).await;
    let took = started.elapsed();
    g.resume(2).await.expect("resume");
    assert!(
        extended.is_ok(),
        "extend(60 s) with 700 ms left and 2 of 3 nodes up failed after {took:?}: {extended:?}"
    );
    let _ = lock.release().await;
}

/// `cover` holds the `writing` mutex across a round that waits for every node up to
/// the connect timeout, and a round that no node answers leaves `covered` unchanged, so
/// the next caller waiting on the mutex does the same round again. With every node
/// unreachable (paused), six concurrent `try_lock`s with a TTL the record does not cover
/// (60 s > the build's 30 s lease) queue behind each other: the n-th returns after ~n
/// seconds, where each should fail after about one node timeout (100 ms here) plus at
/// most one record round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_during_an_outage_is_not_serialised_behind_record_rounds() {
    let g = group().await;
    let locks = Redlock::builder(g.urls())
        .node_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("client");
    for i in 0..3 {
        g.pause(i).await.expect("pause");
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        let l = locks.clone();
        tasks.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = l.try_lock(&format!("o-{i}"), Duration::from_secs(60)).await;
            (started.elapsed(), r.is_ok())
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        let (d, ok) = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("bounded")
            .expect("join");
        assert!(!ok, "locked on paused nodes");
        took.push(d);
    }
    for i in 0..3 {
        g.resume(i).await.expect("resume");
    }
    took.sort();
    let slowest = took.last().copied().unwrap_or_default();
    assert!(
        slowest <= Duration::from_millis(2500),
        "try_lock latencies during the outage: {took:?}"
    );
}
