//! Multi-resource locks whose resources fall in different lock groups, against real Redis
//! servers (two groups of three nodes): taken group by group, all or nothing (a refused
//! part undoes the parts already held before the call returns; a cancelled call leaves
//! nothing behind), one token on every part, one fencing token above every earlier and
//! below every later holder's token of each resource, extension and the watchdog over
//! every group, and a part lost making the whole lock lost.
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, LostReason, Redlock, Watchdog};
use redis::AsyncCommands;
use support::{count_key, eventually, get, lock_key, raw};

const TTL: Duration = Duration::from_secs(5);

async fn client(a: &LocalCluster, b: &LocalCluster, fencing: bool) -> Redlock {
    Redlock::builder(a.urls())
        .group(b.urls())
        .groups_version(1)
        .fencing(fencing)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build a client of two groups")
}

/// The first name `prefix-<i>` the client routes to group `g`.
fn name_in(locks: &Redlock, g: usize, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| locks.group_of(name) == g)
        .expect("a name in each group")
}

/// How many `SET` requests each node of `cluster` ran (a plain acquisition is one).
async fn sets(cluster: &LocalCluster) -> u64 {
    let mut total = 0;
    for i in 0..cluster.len() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("INFO commandstats");
        total += support::calls(&info, "set");
    }
    total
}

async fn pttl(cluster: &LocalCluster, i: usize, key: &str) -> i64 {
    raw(cluster, i).await.pttl(key).await.expect("PTTL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_across_groups_takes_every_part_or_none() {
    let (a, b) = (support::group3().await, support::group3().await);
    let (holder, other) = (client(&a, &b, false).await, client(&a, &b, false).await);
    let x = name_in(&holder, 0, "x");
    let y = name_in(&holder, 1, "y");

    // y is held: the set is refused, and the part already taken on group A (x, taken first
    // in the groups' order) is undone before the call returns.
    let held = holder.try_lock(&y, TTL).await.expect("lock y");
    let sets_before = sets(&a).await;
    let refused = other.try_lock_many([&x, &y], TTL).await;
    assert!(matches!(&refused, Err(e) if e.is_held()), "{refused:?}");
    assert!(
        sets(&a).await >= sets_before + 3,
        "group A's part was not attempted"
    );
    assert_eq!(count_key(&a, 0..3, &lock_key(&x)).await, 0, "x left behind");
    held.release().await.expect("release y");

    // Free: one lock over both groups, one token on every part, each key on its own group.
    let mut lock = other
        .try_lock_many([&y, &x], TTL)
        .await
        .expect("lock x and y");
    let mut both = vec![x.clone(), y.clone()];
    both.sort();
    assert_eq!(lock.resources(), both.as_slice());
    for i in 0..3 {
        assert_eq!(
            get(&a, i, &lock_key(&x)).await.as_deref(),
            Some(lock.token())
        );
        assert_eq!(
            get(&b, i, &lock_key(&y)).await.as_deref(),
            Some(lock.token())
        );
    }
    assert_eq!(count_key(&a, 0..3, &lock_key(&y)).await, 0);
    assert_eq!(count_key(&b, 0..3, &lock_key(&x)).await, 0);
    assert!(lock.remaining() > Duration::ZERO && lock.remaining() <= TTL);

    // Each part excludes on its own.
    let single = holder.try_lock(&x, TTL).await;
    assert!(matches!(&single, Err(e) if e.is_held()), "{single:?}");

    // Extension reaches every group.
    lock.extend(TTL * 4).await.expect("extend");
    assert!(lock.remaining() > TTL, "{:?}", lock.remaining());
    for i in 0..3 {
        assert!(pttl(&a, i, &lock_key(&x)).await > 5_000);
        assert!(pttl(&b, i, &lock_key(&y)).await > 5_000);
    }

    lock.release().await.expect("release");
    assert_eq!(count_key(&a, 0..3, &lock_key(&x)).await, 0);
    assert_eq!(count_key(&b, 0..3, &lock_key(&y)).await, 0);
    let again = holder
        .try_lock_many([&x, &y], TTL)
        .await
        .expect("free again");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_across_groups_leaves_no_part_behind() {
    let (a, b) = (support::group3().await, support::group3().await);
    let locks = client(&a, &b, false).await;
    let x = name_in(&locks, 0, "x");
    let y = name_in(&locks, 1, "y");
    // Group B hangs: the call is cancelled after group A's part was granted, while group
    // B's requests are in flight.
    for i in 0..3 {
        b.pause(i).await.expect("pause");
    }
    let cancelled = tokio::time::timeout(
        Duration::from_millis(150),
        locks.try_lock_many([&x, &y], TTL),
    )
    .await;
    assert!(cancelled.is_err(), "the call finished: {cancelled:?}");
    for i in 0..3 {
        b.resume(i).await.expect("resume");
    }
    // Long before the 5 s TTL, neither part is left anywhere.
    let gone = eventually(Duration::from_secs(3), || async {
        count_key(&a, 0..3, &lock_key(&x)).await == 0
            && count_key(&b, 0..3, &lock_key(&y)).await == 0
    })
    .await;
    assert!(gone, "a part of the cancelled lock was left behind");
    let lock = locks.try_lock_many([&x, &y], TTL).await.expect("free");
    lock.release().await.expect("release");
}

/// The node's fence counter key of `name`.
fn fence_key(name: &str) -> String {
    format!("quorumlock:fence:{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_token_of_a_lock_across_groups_orders_every_resource() {
    let (a, b) = (support::group3().await, support::group3().await);
    let locks = client(&a, &b, true).await;
    let x = name_in(&locks, 0, "x");
    let y = name_in(&locks, 1, "y");
    let first = locks.try_lock(&x, TTL).await.expect("lock x");
    let tx = first.fencing_token().expect("fenced");
    first.release().await.expect("release");
    // y's counters on group B are far ahead of x's on group A (an hour, in microseconds),
    // so the parts' own tokens differ a lot.
    let ahead = tx + 3_600_000_000;
    for i in 0..3 {
        let _: () = raw(&b, i)
            .await
            .set(fence_key(&y), ahead)
            .await
            .expect("SET");
    }
    let lock = locks
        .try_lock_many([&x, &y], TTL)
        .await
        .expect("lock x and y");
    let t = lock.fencing_token().expect("fenced");
    assert!(
        t > ahead && t > tx,
        "{t} not above the earlier holders' {tx} and {ahead}"
    );
    lock.release().await.expect("release");
    // A later holder of either resource alone gets a larger token: x's counters on group A
    // were raised to the lock's token.
    for name in [&x, &y] {
        let later = locks.try_lock(name, TTL).await.expect("lock one");
        let t2 = later.fencing_token().expect("fenced");
        assert!(t2 > t, "{name}: a later holder got {t2}, not above {t}");
        later.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_every_part_and_a_lost_part_loses_the_lock() {
    let (a, b) = (support::group3().await, support::group3().await);
    let locks = client(&a, &b, false).await;
    let x = name_in(&locks, 0, "x");
    let y = name_in(&locks, 1, "y");
    let ttl = Duration::from_millis(800);
    let kept = locks
        .try_lock_many([&x, &y], ttl)
        .await
        .expect("lock")
        .keep_alive(Watchdog::new());
    // Three TTLs later the lock is still held on every node of both groups.
    tokio::time::sleep(ttl * 3).await;
    assert!(!kept.is_lost());
    assert!(kept.remaining() > Duration::ZERO);
    assert_eq!(count_key(&a, 0..3, &lock_key(&x)).await, 3);
    assert_eq!(count_key(&b, 0..3, &lock_key(&y)).await, 3);
    let context = kept.context();

    // Group B's part is lost (its keys deleted behind the holder's back): the whole lock
    // is reported lost, through the guard and through a context.
    for i in 0..3 {
        let _: () = raw(&b, i).await.del(lock_key(&y)).await.expect("DEL");
    }
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(3), kept.lost())
        .await
        .expect("the lost signal fires");
    assert!(
        matches!(&lost, Error::Lost(l) if matches!(l.reason(), LostReason::NotHeld | LostReason::ExtendFailed)),
        "{lost:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(kept.is_lost() && context.is_lost());
    let released = kept.release().await;
    assert!(matches!(&released, Err(Error::Lost(_))), "{released:?}");
    // The part still held was released all the same.
    assert_eq!(count_key(&a, 0..3, &lock_key(&x)).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_many_across_groups_waits_for_the_holder() {
    let (a, b) = (support::group3().await, support::group3().await);
    let (holder, waiter) = (client(&a, &b, false).await, client(&a, &b, false).await);
    let x = name_in(&holder, 0, "x");
    let y = name_in(&holder, 1, "y");
    let held = holder.try_lock(&y, TTL).await.expect("lock y");
    let (wx, wy) = (x.clone(), y.clone());
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock_many([&wx, &wy], TTL).await;
        (lock, Instant::now())
    });
    // While y is held, the waiter holds no part for long: x stays free for others most of
    // the time (each attempt undoes its part on group A before it sleeps).
    let mut free = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if count_key(&a, 0..3, &lock_key(&x)).await == 0 {
            free += 1;
        }
    }
    assert!(
        free >= 10,
        "x was held by the waiter {}/20 times",
        20 - free
    );
    let released_at = Instant::now();
    held.release().await.expect("release y");
    let (lock, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter returns")
        .expect("task");
    let lock = lock.expect("the waiter gets the lock");
    assert!(at >= released_at);
    assert_eq!(count_key(&a, 0..3, &lock_key(&x)).await, 3);
    assert_eq!(count_key(&b, 0..3, &lock_key(&y)).await, 3);
    lock.release().await.expect("release");
}
