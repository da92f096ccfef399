//! Sharded lock groups against real Redis servers: two groups of three nodes each. Where a
//! resource's keys land, how the load splits, the group map that refuses a client with
//! other groups (at build, and later through the refresher), multi-resource locks and hash
//! tags (locks across groups: `tests/spanning.rs`), fencing tokens across a map change, and a soak with a minority of each group
//! killed, checked for mutual exclusion.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use quorumlock::{Error, ErrorKind, Redlock};
use quorumlock_testkit::{History, LocalCluster};
use redis::AsyncCommands;
use support::{count_key, eventually, lock_key, raw};

const TTL: Duration = Duration::from_secs(5);
const RECORD: &str = support::GROUP_MAP;

async fn group() -> LocalCluster {
    support::group3().await
}

async fn build(groups: &[&LocalCluster], version: Option<u16>) -> Result<Redlock, Error> {
    support::grouped(groups, version).await
}

async fn sharded(a: &LocalCluster, b: &LocalCluster) -> Redlock {
    build(&[a, b], Some(1)).await.expect("build sharded client")
}

/// The lock requests each node of `cluster` ran since it started, from `INFO
/// commandstats`: `SET` (a plain acquisition), `EVAL` and `EVALSHA` (the scripts: release,
/// fenced or waited acquisitions, the group-map check).
async fn requests(cluster: &LocalCluster) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("INFO commandstats");
        let calls = |cmd: &str| support::calls(&info, cmd);
        out.push(calls("set") + calls("eval") + calls("evalsha"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resource_is_locked_on_its_own_group_only() {
    let (a, b) = (group().await, group().await);
    let locks = sharded(&a, &b).await;
    assert_eq!(locks.groups(), 2);
    assert_eq!(locks.nodes().len(), 6);
    assert_eq!(locks.quorum(), 2);
    assert!(
        locks.group_map().starts_with("v1/2/"),
        "{}",
        locks.group_map()
    );
    assert_eq!(locks.group_nodes(0), Some(&locks.nodes()[..3]));
    assert_eq!(locks.group_nodes(1), Some(&locks.nodes()[3..]));
    assert_eq!(locks.group_nodes(2), None);

    let names: Vec<String> = (0..40).map(|i| format!("stock-{i}")).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(locks.try_lock(name, TTL).await.expect("try_lock"));
    }
    let homes: Vec<usize> = names.iter().map(|n| locks.group_of(n)).collect();
    assert!(
        homes.contains(&0) && homes.contains(&1),
        "40 names all in one group: {homes:?}"
    );
    for (name, home) in names.iter().zip(&homes) {
        let (mine, other) = if *home == 0 { (&a, &b) } else { (&b, &a) };
        let key = lock_key(name);
        assert_eq!(count_key(mine, 0..3, &key).await, 3, "{name} on its group");
        assert_eq!(
            count_key(other, 0..3, &key).await,
            0,
            "{name} on the other group"
        );
    }
    // A second client with the same groups sees the same homes: the locks exclude it.
    let other = sharded(&a, &b).await;
    for name in &names {
        assert_eq!(other.group_of(name), locks.group_of(name));
        let refused = other.try_lock(name, TTL).await;
        assert!(
            matches!(&refused, Err(e) if e.kind() == ErrorKind::Held),
            "{name}: {refused:?}"
        );
    }
    for lock in held {
        lock.release().await.expect("release");
    }
    for name in &names {
        assert_eq!(count_key(&a, 0..3, &lock_key(name)).await, 0);
        assert_eq!(count_key(&b, 0..3, &lock_key(name)).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_splits_by_the_routing() {
    let (a, b) = (group().await, group().await);
    let locks = sharded(&a, &b).await;
    let before = [requests(&a).await, requests(&b).await];
    let names: Vec<String> = (0..400).map(|i| format!("coupon-{i}")).collect();
    let mut routed = [0u64; 2];
    for name in &names {
        routed[locks.group_of(name)] += 1;
        let lock = locks.try_lock(name, TTL).await.expect("try_lock");
        lock.release().await.expect("release");
    }
    let after = [requests(&a).await, requests(&b).await];
    println!("routed {routed:?}; requests before {before:?} after {after:?}");
    // The routing itself is even. It hashes the groups' addresses, whose ports change from
    // run to run, so each name's group is a fair coin here: 400 names split within 3.5
    // standard deviations (10 each) of half, which fails once in two thousand runs (±20,
    // two deviations, failed one run in twenty). The spread itself is pinned with fixed
    // addresses by `protocol::groups::tests::spreads_evenly`.
    for r in routed {
        assert!((165..=235).contains(&r), "routed {routed:?}");
    }
    // Each node ran one acquisition and one release per resource of its group (and at
    // most a few group-map checks besides), and nothing for the other group's.
    for g in 0..2 {
        for node in 0..3 {
            let ran = after[g][node].saturating_sub(before[g][node]);
            let expected = 2 * routed[g];
            assert!(
                ran >= expected && ran <= expected + 5,
                "group {g} node {node}: {ran} requests for {} resources",
                routed[g]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_another_group_map_is_refused_at_build() {
    let (a, b) = (group().await, group().await);
    let first = sharded(&a, &b).await;
    let recorded: Option<String> = raw(&a, 0).await.get(RECORD).await.expect("GET");
    assert_eq!(recorded.as_deref(), Some(first.group_map()));
    let pttl: i64 = raw(&b, 2).await.pttl(RECORD).await.expect("PTTL");
    assert!((1..=30_000).contains(&pttl), "record lease {pttl} ms");

    let refused = |r: Result<Redlock, Error>, what: &str| match r {
        Err(Error::GroupMapMismatch(m)) => {
            assert_eq!(m.recorded(), first.group_map(), "{what}");
            assert_ne!(m.ours(), m.recorded(), "{what}");
            assert_eq!(
                Error::GroupMapMismatch(m).kind(),
                ErrorKind::GroupMapMismatch
            );
        }
        other => panic!("{what}: expected a group map mismatch, got {other:?}"),
    };
    refused(build(&[&a, &b], Some(2)).await, "another version");
    refused(build(&[&b, &a], Some(1)).await, "the groups swapped");
    refused(build(&[&a], None).await, "unsharded on the first group");
    refused(build(&[&b], None).await, "unsharded on the second group");
    refused(build(&[&a], Some(1)).await, "one group of the two");
    // The same map is welcome, and the first client still locks.
    let same = build(&[&a, &b], Some(1)).await.expect("same map");
    assert_eq!(same.group_map(), first.group_map());
    let lock = first.try_lock("still-mine", TTL).await.expect("try_lock");
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsharded_and_a_sharded_client_refuse_each_other() {
    let (a, b) = (group().await, group().await);
    let plain = build(&[&a], None).await.expect("unsharded client");
    assert_eq!(plain.group_map(), "unsharded");
    // It records its map too: a sharded client cannot start beside it.
    for i in 0..3 {
        let recorded: Option<String> = raw(&a, i).await.get(RECORD).await.expect("GET");
        assert_eq!(recorded.as_deref(), Some("unsharded"));
    }
    let early = build(&[&a, &b], Some(1)).await;
    assert!(
        matches!(&early, Err(Error::GroupMapMismatch(m)) if m.recorded() == "unsharded"),
        "{early:?}"
    );
    let lock = plain.try_lock("job", TTL).await.expect("try_lock");
    lock.release().await.expect("release");

    // Made before the mismatch: a semaphore, and a waiter queued behind a held lock
    // with a long wait.
    let pool = plain.semaphore("pool", 2).expect("semaphore");
    let held = plain
        .try_lock("busy", Duration::from_secs(60))
        .await
        .expect("hold");
    let waiter = {
        let plain = plain.clone();
        tokio::spawn(async move {
            let retry = quorumlock::Retry::new().max_wait(Duration::from_secs(40));
            let r = plain.lock_with("busy", TTL, retry).await;
            (r, Instant::now())
        })
    };
    support::queued_on_every_node(&a, "busy", 1)
        .await
        .expect("the waiter queues");

    // The unsharded client's record is lost on every node (emulated: as by restarts
    // without persistence), and a sharded client starts in that moment.
    support::forget_group_map(&a).await;
    let started = Instant::now();
    let _sharded = sharded(&a, &b).await;
    // The unsharded client writes its record every 10 s, finds the other map instead,
    // and refuses: within 15 s.
    let refused = eventually(Duration::from_secs(15), || async {
        matches!(
            plain.try_lock("job", TTL).await,
            Err(Error::GroupMapMismatch(_))
        )
    })
    .await;
    assert!(refused, "still locking {:?} after", started.elapsed());
    // Every acquiring call refuses from then on, without writing.
    let many = plain.lock_many(["job", "other"], TTL).await;
    assert!(matches!(many, Err(Error::GroupMapMismatch(_))), "{many:?}");
    assert_eq!(count_key(&a, 0..3, &lock_key("job")).await, 0);
    let permit = pool.try_acquire(TTL).await;
    assert!(
        matches!(permit, Err(Error::GroupMapMismatch(_))),
        "{permit:?}"
    );
    let read = plain.try_read_lock("catalog", TTL).await;
    assert!(matches!(read, Err(Error::GroupMapMismatch(_))), "{read:?}");
    let write = plain.try_write_lock("catalog", TTL).await;
    assert!(
        matches!(write, Err(Error::GroupMapMismatch(_))),
        "{write:?}"
    );
    // The waiter gives up with the mismatch at its next turn (it renews its queue entry
    // every second), long before its 40 s wait, and leaves the queue.
    let (r, at) = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter returns")
        .expect("task");
    assert!(matches!(r, Err(Error::GroupMapMismatch(_))), "{r:?}");
    assert!(at.duration_since(started) < Duration::from_secs(20));
    let left = eventually(Duration::from_secs(5), || async {
        support::zcards(&a, "quorumlock:queue:busy")
            .await
            .iter()
            .all(|n| *n == 0)
    })
    .await;
    assert!(left, "the waiter stayed queued");
    // Locks held before are not revoked: the holder still releases its own.
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_locks_share_a_group_through_hash_tags() {
    let (a, b) = (group().await, group().await);
    let locks = sharded(&a, &b).await;
    // A common tag puts any names together: 20 orders, each with two resources.
    let mut homes = [0usize; 2];
    for order in 0..20 {
        let names = [
            format!("order:{{{order}}}:stock"),
            format!("order:{{{order}}}:invoice"),
        ];
        let g = locks.group_of(&names[0]);
        assert_eq!(g, locks.group_of(&names[1]));
        assert_eq!(g, locks.group_of(&format!("{{{order}}}")));
        homes[g] += 1;
        let lock = locks.lock_many(&names, TTL).await.expect("lock_many");
        let mine = if g == 0 { &a } else { &b };
        // On a quorum of its group (decided at the quorum: the third node's request may
        // still be on its way).
        for name in &names {
            assert!(count_key(mine, 0..3, &lock_key(name)).await >= 2, "{name}");
        }
        lock.release().await.expect("release");
    }
    assert!(
        homes[0] > 0 && homes[1] > 0,
        "tags all in one group: {homes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_when_a_resource_moves_to_another_group() {
    let (a, b) = (group().await, group().await);
    // The map before: group A alone, version 1.
    let before = Redlock::builder(a.urls())
        .groups_version(1)
        .fencing(true)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("v1 client");
    // Twenty resources locked under the old map, on group A.
    let names: Vec<String> = (0..20).map(|i| format!("ledger-{i}")).collect();
    let mut t1 = 0;
    for name in &names {
        let lock = before.try_lock(name, TTL).await.expect("v1 lock");
        t1 = t1.max(lock.fencing_token().expect("fenced"));
        lock.release().await.expect("release");
    }
    // The old clients stop and their record's lease runs out (emulated by deleting it).
    drop(before);
    support::forget_group_map(&a).await;
    // The map after: A and a new group B, version 2.
    let after = Redlock::builder(a.urls())
        .group(b.urls())
        .groups_version(2)
        .fencing(true)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("v2 client");
    let moved = names
        .iter()
        .find(|n| after.group_of(n) == 1)
        .expect("one of 20 names moves to the new group")
        .clone();
    // The moved resource's counter on group B starts from scratch, yet its tokens stay
    // above every token group A handed out: counters are floored at the nodes' clocks.
    let l2 = after.try_lock(&moved, TTL).await.expect("v2 lock");
    let t2 = l2.fencing_token().expect("fenced");
    assert!(
        t2 > t1,
        "token went back across the map change: {t1} then {t2}"
    );
    l2.release().await.expect("release");
}

/// Tasks lock many resources (single ones, tagged pairs, and pairs across both groups)
/// on two groups while a minority of each group is killed, one node restarted (after
/// longer than the TTL, as the deployment contract asks for nodes without persistence). The history must hold no two
/// overlapping holders of a resource, and both groups must have served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_over_two_groups_with_a_minority_of_each_killed() {
    let (a, b) = (group().await, group().await);
    let history = History::new();
    let ttl = Duration::from_secs(1);
    let stop = Instant::now() + Duration::from_secs(9);
    let mut tasks = Vec::new();
    for c in 0..4u64 {
        let locks = sharded(&a, &b).await;
        let rec = history.client(c);
        tasks.push(tokio::spawn(async move {
            // [group A, group B, sets across both]
            let mut per_group = [0usize; 3];
            // Pairs of items in different groups: item-k with the first item-j of the
            // other group.
            let crossing: Vec<Vec<String>> = (0..8)
                .filter_map(|k| {
                    let first = format!("item-{k}");
                    (0..8)
                        .map(|j| format!("item-{j}"))
                        .find(|other| locks.group_of(other) != locks.group_of(&first))
                        .map(|other| vec![first, other])
                })
                .collect();
            assert!(!crossing.is_empty(), "all eight items in one group");
            let mut i = c as usize;
            while Instant::now() < stop {
                i = i.wrapping_mul(31).wrapping_add(7) % 1000;
                let names: Vec<String> = if i.is_multiple_of(3) {
                    let k = i % 5;
                    vec![format!("pair:{{{k}}}:a"), format!("pair:{{{k}}}:b")]
                } else if i % 3 == 1 && i.is_multiple_of(2) {
                    // A set across both groups, overlapping the single items.
                    crossing[i % crossing.len()].clone()
                } else {
                    vec![format!("item-{}", i % 8)]
                };
                for n in &names {
                    rec.acquire_invoked(n);
                }
                let attempt =
                    tokio::time::timeout(Duration::from_secs(3), locks.lock_many(&names, ttl))
                        .await;
                match attempt {
                    Ok(Ok(lock)) => {
                        for g in names
                            .iter()
                            .map(|n| locks.group_of(n))
                            .collect::<BTreeSet<_>>()
                        {
                            per_group[g] += 1;
                        }
                        if names
                            .iter()
                            .any(|n| locks.group_of(n) != locks.group_of(&names[0]))
                        {
                            per_group[2] += 1;
                        }
                        for n in &names {
                            rec.acquired(n, lock.deadline(), None);
                            rec.work_started(n);
                        }
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        for n in &names {
                            rec.work_ended(n);
                            rec.release_invoked(n);
                        }
                        let released = lock.release().await.is_ok();
                        for n in &names {
                            if released {
                                rec.released(n);
                            } else {
                                rec.release_failed(n);
                            }
                        }
                    }
                    Ok(Err(_)) => names.iter().for_each(|n| {
                        rec.acquire_failed(n);
                    }),
                    Err(_) => names.iter().for_each(|n| {
                        rec.acquire_unknown(n);
                    }),
                }
            }
            per_group
        }));
    }
    // The faults: one node of each group down, one of them back after 2.5 s (> the TTL).
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.kill(0).await.expect("kill a0");
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.kill(2).await.expect("kill b2");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.start(0).await.expect("restart a0");

    let mut served = [0usize; 3];
    for t in tasks {
        let per = t.await.expect("task");
        for (s, p) in served.iter_mut().zip(per) {
            *s += p;
        }
    }
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    println!("soak over two groups: {served:?} acquisitions per group, and across both");
    assert!(
        served[0] > 20 && served[1] > 20 && served[2] > 5,
        "a group, or the sets across both, barely served: {served:?}"
    );
}
