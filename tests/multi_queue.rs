//! The ordered multi-resource waiter against real `redis-server`s: a `lock_many` caller
//! that waits keeps its place in each resource's queue (ahead of later single-resource
//! waiters), overlapping sets taken in every order never deadlock and never overlap, a
//! cancelled waiter frees what it reserved at once, a crashed one costs at most its TTL,
//! reservations held during a long wait are kept alive, a conversion that cannot reach a
//! quorum gives up and leaves none of its keys behind, a fenced conversion raises every
//! resource's fence, and a node paused while the waiter is queued does not stop it.
#![cfg(feature = "testkit")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use quorumlock::testkit::{LocalCluster, ProxyMode};
use quorumlock::{Error, Redlock, Retry};
use support::{
    commands_run, count_key, eventually, get, lock_key, log_every_command, plant_everywhere, raw,
    zcards,
};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Waits (bounded) until at least `n` waiters are queued for `res` on every node.
async fn queued(cluster: &LocalCluster, res: &str, n: u64) -> TestResult {
    let key = format!("quorumlock:queue:{res}");
    let ok = eventually(Duration::from_secs(5), || async {
        zcards(cluster, &key).await.iter().all(|s| *s >= n)
    })
    .await;
    if ok {
        Ok(())
    } else {
        Err(format!("not queued on {res}: {:?}", zcards(cluster, &key).await).into())
    }
}

/// Whether `res`'s key exists on a majority of the nodes.
async fn held_on_majority(cluster: &LocalCluster, res: &str) -> bool {
    count_key(cluster, 0..cluster.len(), &lock_key(res)).await > cluster.len() / 2
}

/// Overlapping sets taken in every order ({x,y}, {y,z}, {z,x}), beside single-resource
/// lockers of each: every task finishes all its rounds (no deadlock, no starvation within
/// the budget) and no two tasks ever hold the same resource at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_every_order_neither_deadlock_nor_overlap() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let retry = Retry::new().max_wait(Duration::from_secs(40));
    let names = ["mq-x", "mq-y", "mq-z"];
    let busy: Arc<HashMap<&str, AtomicBool>> =
        Arc::new(names.iter().map(|n| (*n, AtomicBool::new(false))).collect());
    let overlaps = Arc::new(AtomicU32::new(0));
    let sets: Vec<Vec<&'static str>> = vec![
        vec!["mq-x", "mq-y"],
        vec!["mq-z", "mq-y"],
        vec!["mq-x", "mq-z"],
        vec!["mq-y", "mq-x"],
        vec!["mq-x"],
        vec!["mq-y"],
        vec!["mq-z"],
    ];
    const ROUNDS: u32 = 6;
    let mut tasks = Vec::new();
    for set in sets {
        let locks = Redlock::builder(cluster.urls())
            .retry(retry)
            .build()
            .await?;
        let busy = busy.clone();
        let overlaps = overlaps.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0u32;
            for _ in 0..ROUNDS {
                let lock = if set.len() == 1 {
                    locks.lock(set[0], Duration::from_secs(5)).await?
                } else {
                    locks.lock_many(&set, Duration::from_secs(5)).await?
                };
                for r in &set {
                    if busy[r].swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for r in &set {
                    busy[r].store(false, Ordering::SeqCst);
                }
                lock.release().await?;
                done += 1;
            }
            Ok::<u32, Error>(done)
        }));
    }
    let mut finished = 0;
    for t in tasks {
        let done = tokio::time::timeout(Duration::from_secs(60), t).await???;
        assert_eq!(done, ROUNDS);
        finished += 1;
    }
    assert_eq!(finished, 7);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    Ok(())
}

/// A `lock_many` caller that queued on a held resource before a single-resource waiter
/// did is served first when the holder releases: it kept its place in the queue. The
/// single-resource waiter gets the resource once the multi-resource lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_keeps_its_place_in_the_queue() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let single = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let held = holder.try_lock("mq-place-a", ttl).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let tx_m = tx.clone();
    let m = tokio::spawn(async move {
        let lock = multi.lock_many(["mq-place-a", "mq-place-b"], ttl).await?;
        let _ = tx_m.send("multi");
        // Hold a moment so that the single waiter would be seen holding too if it could.
        tokio::time::sleep(Duration::from_millis(200)).await;
        lock.release().await
    });
    queued(&cluster, "mq-place-a", 1).await?;
    let s = tokio::spawn(async move {
        let lock = single.lock("mq-place-a", ttl).await?;
        let _ = tx.send("single");
        lock.release().await
    });
    queued(&cluster, "mq-place-a", 2).await?;
    held.release().await?;
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?;
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?;
    assert_eq!(
        first,
        Some("multi"),
        "the earlier multi-resource waiter goes first"
    );
    assert_eq!(second, Some("single"));
    m.await??;
    s.await??;
    Ok(())
}

/// A `lock_many` caller waiting for its second resource holds a reservation on its first
/// (so later waiters queue behind it); cancelled, it releases that reservation at once:
/// a single-resource waiter of the first resource gets it well within the reservation's
/// 10 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_multi_resource_waiter_frees_its_reservations_at_once() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let single = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let b = holder
        .try_lock("mq-cancel-b", Duration::from_secs(30))
        .await?;
    let m = tokio::spawn(async move { multi.lock_many(["mq-cancel-a", "mq-cancel-b"], ttl).await });
    queued(&cluster, "mq-cancel-b", 1).await?;
    assert!(
        held_on_majority(&cluster, "mq-cancel-a").await,
        "the first resource is reserved while the second is awaited"
    );
    assert!(single.try_lock("mq-cancel-a", ttl).await.is_err());
    m.abort();
    let _ = m.await;
    let cancelled = Instant::now();
    let got =
        tokio::time::timeout(Duration::from_secs(8), single.lock("mq-cancel-a", ttl)).await??;
    let took = cancelled.elapsed();
    println!("cancelled multi waiter: its reservation was free after {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    got.release().await?;
    b.release().await?;
    Ok(())
}

/// A `lock_many` caller that crashes while waiting (its future forgotten, nothing dropped)
/// costs the next waiter of its reserved resource at most the reservation's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_multi_resource_waiter_costs_at_most_its_ttl() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let single = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_millis(1500);
    let b = holder
        .try_lock("mq-crash-b", Duration::from_secs(30))
        .await?;
    let mut waiting = Box::pin(multi.lock_many(["mq-crash-a", "mq-crash-b"], ttl));
    // Drive the waiter until it holds its reservation of "a" and is queued on "b".
    let mut reserved_at = None;
    for _ in 0..500 {
        tokio::select! {
            r = &mut waiting => return Err(format!("the waiter finished: {r:?}").into()),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let key = "quorumlock:queue:mq-crash-b";
        if held_on_majority(&cluster, "mq-crash-a").await
            && zcards(&cluster, key).await.iter().all(|n| *n >= 1)
        {
            reserved_at = Some(Instant::now());
            break;
        }
    }
    let Some(reserved_at) = reserved_at else {
        return Err("the waiter never reserved its first resource".into());
    };
    std::mem::forget(waiting);
    let got =
        tokio::time::timeout(Duration::from_secs(8), single.lock("mq-crash-a", ttl)).await??;
    let took = reserved_at.elapsed();
    println!("crashed multi waiter: its reservation was free after {took:?} (TTL {ttl:?})");
    assert!(took < ttl + Duration::from_millis(1500), "{took:?}");
    got.release().await?;
    b.release().await?;
    Ok(())
}

/// Reservations are extended while the next resource is awaited: with a 1 s TTL and the
/// second resource held for 3 s, the first stays reserved throughout, and the caller ends
/// up holding both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_stay_alive_through_a_long_wait() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let other = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(1);
    let b = holder
        .try_lock("mq-alive-b", Duration::from_secs(30))
        .await?;
    let m = tokio::spawn(async move { multi.lock_many(["mq-alive-a", "mq-alive-b"], ttl).await });
    queued(&cluster, "mq-alive-b", 1).await?;
    let started = Instant::now();
    let mut looks = 0;
    while started.elapsed() < Duration::from_secs(3) {
        assert!(
            other.try_lock("mq-alive-a", ttl).await.is_err(),
            "the reservation lapsed after {:?}",
            started.elapsed()
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(looks >= 10, "{looks}");
    b.release().await?;
    let lock = tokio::time::timeout(Duration::from_secs(5), m).await???;
    assert_eq!(lock.resources(), ["mq-alive-a", "mq-alive-b"]);
    assert!(lock.is_valid());
    for i in 0..3 {
        for r in ["mq-alive-a", "mq-alive-b"] {
            assert_eq!(
                get(&cluster, i, &lock_key(r)).await.as_deref(),
                Some(lock.token())
            );
        }
    }
    lock.release().await?;
    Ok(())
}

/// Foreign keys laid out so that each resource alone can be reserved on a quorum but no
/// quorum of nodes can grant both ("a" held on nodes 3 and 4, "b" on nodes 0 and 1): the
/// conversion is refused every time, the caller gets `Timeout` within its budget, and none
/// of its reservations or conversion keys is left on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_without_a_quorum_gives_up_and_leaves_nothing() -> TestResult {
    let cluster = LocalCluster::builder(5).launch().await?;
    let locks = Redlock::builder(cluster.urls())
        .retry(Retry::new().max_wait(Duration::from_millis(1500)))
        .build()
        .await?;
    let (a, b) = ("mq-split-a", "mq-split-b");
    for (res, nodes) in [(a, [3, 4]), (b, [0, 1])] {
        for i in nodes {
            let _: () = redis::cmd("SET")
                .arg(lock_key(res))
                .arg("foreign")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut raw(&cluster, i).await)
                .await?;
        }
    }
    let started = Instant::now();
    let r = locks.lock_many([a, b], Duration::from_secs(10)).await;
    let took = started.elapsed();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(locks.flush(Duration::from_secs(5)).await);
    let clean = eventually(Duration::from_secs(3), || async {
        for i in 0..5 {
            for res in [a, b] {
                let v = get(&cluster, i, &lock_key(res)).await;
                if v.as_deref().is_some_and(|v| v != "foreign") {
                    return false;
                }
            }
        }
        true
    })
    .await;
    assert!(clean, "a key of the waiter was left behind");
    Ok(())
}

/// With fencing on, the lock a waiting `lock_many` caller ends up with carries a fencing
/// token larger than those of the earlier holders of each of its resources, and the
/// resources' next holder gets a larger one still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_conversion_raises_every_resource_fence() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls())
        .fencing(true)
        .build()
        .await?;
    let multi = Redlock::builder(cluster.urls())
        .fencing(true)
        .build()
        .await?;
    let ttl = Duration::from_secs(5);
    // Give "a" a higher fence than "b", then hold "b".
    for _ in 0..3 {
        holder.try_lock("mq-fence-a", ttl).await?.release().await?;
    }
    let a_fence = holder.try_lock("mq-fence-a", ttl).await?;
    let a_token = a_fence.fencing_token().ok_or("no fencing token")?;
    a_fence.release().await?;
    let b = holder.try_lock("mq-fence-b", ttl).await?;
    let b_token = b.fencing_token().ok_or("no fencing token")?;
    let m = tokio::spawn(async move { multi.lock_many(["mq-fence-a", "mq-fence-b"], ttl).await });
    queued(&cluster, "mq-fence-b", 1).await?;
    b.release().await?;
    let lock = tokio::time::timeout(Duration::from_secs(5), m).await???;
    let token = lock.fencing_token().ok_or("no fencing token")?;
    assert!(
        token > a_token && token > b_token,
        "{token} vs {a_token}, {b_token}"
    );
    lock.release().await?;
    for r in ["mq-fence-a", "mq-fence-b"] {
        let next = holder.try_lock(r, ttl).await?;
        let t = next.fencing_token().ok_or("no fencing token")?;
        assert!(t > token, "{r}: {t} after {token}");
        next.release().await?;
    }
    Ok(())
}

/// A node paused (SIGSTOP) while the waiter is queued: the release still reaches a
/// quorum, the waiter ends up holding both resources on the others, and no one else can
/// take either while it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_while_queued_does_not_stop_the_waiter() -> TestResult {
    let cluster = LocalCluster::builder(5).launch().await?;
    let client = || {
        Redlock::builder(cluster.urls())
            .node_timeout(Duration::from_millis(200))
            .build()
    };
    let holder = client().await?;
    let multi = client().await?;
    let other = client().await?;
    let ttl = Duration::from_secs(5);
    let b = holder.try_lock("mq-pause-b", ttl).await?;
    let m = tokio::spawn(async move { multi.lock_many(["mq-pause-a", "mq-pause-b"], ttl).await });
    queued(&cluster, "mq-pause-b", 1).await?;
    cluster.pause(4).await?;
    let outcome = async {
        b.release().await?;
        let lock = tokio::time::timeout(Duration::from_secs(8), m).await???;
        assert!(lock.is_valid());
        for r in ["mq-pause-a", "mq-pause-b"] {
            assert!(
                other.try_lock(r, ttl).await.is_err(),
                "{r} taken while held"
            );
            let on = count_key(&cluster, 0..4, &lock_key(r)).await;
            assert!(on >= 3, "{r} held on {on} of the 4 running nodes");
        }
        lock.release().await?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    cluster.resume(4).await?;
    outcome
}

/// `attempts(1)` makes `lock_many` a single all-or-nothing attempt, as `try_lock_many`:
/// refused at once, with nothing reserved or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attempt_is_one_all_or_nothing_round() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let once = Redlock::builder(cluster.urls())
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let b = holder
        .try_lock("mq-once-b", Duration::from_secs(10))
        .await?;
    let started = Instant::now();
    let r = once
        .lock_many(["mq-once-a", "mq-once-b"], Duration::from_secs(10))
        .await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(once.flush(Duration::from_secs(5)).await);
    assert_eq!(count_key(&cluster, 0..3, &lock_key("mq-once-a")).await, 0);
    assert!(
        zcards(&cluster, "quorumlock:queue:mq-once-b")
            .await
            .iter()
            .all(|n| *n == 0)
    );
    b.release().await?;
    Ok(())
}

/// A holder planted behind the library's back (whose release no one will announce) is
/// waited for until its key expires; then the caller gets the whole set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_holder_is_waited_for_until_it_expires() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let locks = Redlock::builder(cluster.urls()).build().await?;
    plant_everywhere(&cluster, &lock_key("mq-plant-b"), "someone", 800).await;
    let started = Instant::now();
    let lock = locks
        .lock_many(["mq-plant-a", "mq-plant-b"], Duration::from_secs(5))
        .await?;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    lock.release().await?;
    Ok(())
}

/// After a conversion, the caller's next `lock()` of one of the resources, with no one
/// waiting, takes it at once: letting go of the reservations is not a release that makes
/// the client yield (join the queue first, then wait for its fallback timer). Checked in
/// every node's command log: nothing touches the resource's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_does_not_make_the_callers_next_lock_yield() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(5);
    let b = holder.try_lock("mq-yield-b", ttl).await?;
    let m = tokio::spawn(async move {
        let lock = multi.lock_many(["mq-yield-a", "mq-yield-b"], ttl).await?;
        lock.release().await?;
        Ok::<Redlock, Error>(multi)
    });
    queued(&cluster, "mq-yield-b", 1).await?;
    b.release().await?;
    let multi = tokio::time::timeout(Duration::from_secs(5), m).await???;
    assert!(multi.flush(Duration::from_secs(5)).await);
    log_every_command(&cluster).await?;
    let again = multi.lock("mq-yield-a", ttl).await?;
    let queue = "quorumlock:queue:mq-yield-a";
    for (i, node) in commands_run(&cluster).await.iter().enumerate() {
        for cmd in node {
            assert!(!cmd.iter().any(|a| a == queue), "node {i} ran {cmd:?}");
        }
    }
    again.release().await?;
    Ok(())
}

/// A node that refused the conversion (a foreign key of the second resource there) still
/// holds the reservation of the first when the conversion is granted elsewhere: letting go
/// of it there must not hand that resource to its next waiter while the converted lock
/// holds it on a quorum (the waiter would count that node and claim against a held lock).
/// The waiter gets the resource once the converted lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_left_on_a_refusing_node_is_not_handed_on() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(cluster.urls()).build().await?;
    let single = Redlock::builder(cluster.urls()).build().await?;
    let ttl = Duration::from_secs(10);
    let (a, b) = ("mq-left-a", "mq-left-b");
    let _: () = redis::cmd("SET")
        .arg(lock_key(b))
        .arg("foreign")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut raw(&cluster, 2).await)
        .await?;
    let held = holder.try_lock(a, ttl).await?;
    let m = tokio::spawn(async move {
        let lock = multi.lock_many([a, b], ttl).await?;
        Ok::<(Redlock, quorumlock::Lock), Error>((multi, lock))
    });
    queued(&cluster, a, 1).await?;
    let s = tokio::spawn(async move { single.lock(a, ttl).await });
    queued(&cluster, a, 2).await?;
    held.release().await?;
    let (multi, lock) = tokio::time::timeout(Duration::from_secs(5), m).await???;
    assert!(multi.flush(Duration::from_secs(5)).await);
    let on_2 = get(&cluster, 2, &lock_key(a)).await;
    assert!(
        on_2.is_none() || on_2.as_deref() == Some(lock.token()),
        "node 2 handed the converted lock's resource to another token: {on_2:?}"
    );
    assert!(
        !s.is_finished(),
        "the single waiter holds while the converted lock does"
    );
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), s).await???;
    assert_eq!(count_key(&cluster, 0..3, &lock_key(a)).await, 3);
    got.release().await?;
    Ok(())
}

/// A reservation whose extension misses a quorum (the links to two of three nodes cut,
/// every connection reset, for 800 ms around the moment it is due) is tried again rather
/// than given up: the first resource never becomes free while the second is awaited, and
/// the caller ends up with both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_extension_misses_a_quorum_is_tried_again() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(&direct).build().await?;
    let other = Redlock::builder(&direct).build().await?;
    let multi = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .build()
        .await?;
    let ttl = Duration::from_secs(4);
    let (a, b) = ("mq-retry-a", "mq-retry-b");
    let held = holder.try_lock(b, Duration::from_secs(30)).await?;
    let m = tokio::spawn(async move { multi.lock_many([a, b], ttl).await });
    queued(&cluster, b, 1).await?;
    // The reservation of `a` was taken before this, so its extension is due (a third of
    // the TTL before its deadline) by 2.67 s from here: inside the cut.
    let reserved = Instant::now();
    tokio::time::sleep_until((reserved + Duration::from_millis(2200)).into()).await;
    for i in [0, 1] {
        cluster.proxy(i)?.set_mode(ProxyMode::Reset);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for i in [0, 1] {
        cluster.proxy(i)?.set_mode(ProxyMode::Pass);
    }
    while reserved.elapsed() < Duration::from_millis(5500) {
        assert!(
            other.try_lock(a, ttl).await.is_err(),
            "the reservation lapsed {:?} after the waiter queued",
            reserved.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await?;
    let lock = tokio::time::timeout(Duration::from_secs(5), m).await???;
    assert!(lock.is_valid());
    assert_eq!(lock.resources(), [a, b]);
    lock.release().await?;
    Ok(())
}

/// After a granted conversion, letting go of a reservation also takes its queue entries
/// off every node, so that a release landing late on a node that refused the conversion
/// does not hand the key to the reservation's token, which no one waits with any more (the
/// key would then be held by no one for a whole TTL). Here the previous holder's release
/// is held back on node 2 (its link stalled) until the caller has converted; the single
/// waiter queued behind the caller then ends up holding the resource on every node soon
/// after the caller releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_does_not_hand_the_key_to_a_let_go_reservation() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let multi = Redlock::builder(&direct).build().await?;
    let single = Redlock::builder(&direct).build().await?;
    let ttl = Duration::from_secs(10);
    let (a, b) = ("mq-late-a", "mq-late-b");
    let held = holder.try_lock(a, ttl).await?;
    let m = tokio::spawn(async move {
        let lock = multi.lock_many([a, b], ttl).await?;
        Ok::<(Redlock, quorumlock::Lock), Error>((multi, lock))
    });
    queued(&cluster, a, 1).await?;
    let s = tokio::spawn(async move { single.lock(a, ttl).await });
    queued(&cluster, a, 2).await?;
    cluster.proxy(2)?.set_mode(ProxyMode::Stall);
    let released = held.release().await;
    let converted = tokio::time::timeout(Duration::from_secs(5), m).await;
    cluster.proxy(2)?.set_mode(ProxyMode::Pass);
    released?;
    let (multi, lock) = converted???;
    assert!(multi.flush(Duration::from_secs(5)).await);
    assert!(holder.flush(Duration::from_secs(5)).await);
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(8), s).await???;
    let key = lock_key(a);
    let values = || async {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(get(&cluster, i, &key).await);
        }
        v
    };
    let everywhere = eventually(Duration::from_secs(3), || async {
        values()
            .await
            .iter()
            .all(|v| v.as_deref() == Some(got.token()))
    })
    .await;
    let on = values().await;
    assert!(
        everywhere,
        "the waiter's token {} vs the nodes' {on:?}",
        got.token()
    );
    got.release().await?;
    Ok(())
}
