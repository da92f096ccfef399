//! Kept locks under adversarial timing, against real `redis-server`s: a released lock is
//! never reported valid through a context that outlived it, keys found gone from a quorum
//! leave no validity even when the lost signal had already fired for another reason, and
//! a node that does not answer cannot starve one kept lock behind another's round.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Error, LostReason, Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A context cloned out of a scoped use (or kept by a task the closure spawned) must not
/// report validity once the scope released the lock: another client may hold it by then.
/// Before, it kept reporting the old deadline (and `is_lost() == false`) after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_that_outlives_its_scope_reports_the_lock_gone() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = Redlock::builder(&urls)
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let b = Redlock::builder(&urls)
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let ttl = Duration::from_secs(30);
    let ctx = a
        .try_with_lock("kept:ctx", ttl, Watchdog::new(), |ctx| async move { ctx })
        .await?;
    // The scope released the lock: another client takes it at once.
    let other = b.try_lock("kept:ctx", ttl).await?;
    assert_eq!(
        ctx.remaining(),
        Duration::ZERO,
        "a released lock's context still reports validity while another client holds it"
    );
    assert!(ctx.is_lost(), "a released lock's context reads as held");
    // A task waiting only on the signal is told too (it never completed before).
    let e = tokio::time::timeout(Duration::from_secs(1), ctx.lost()).await?;
    assert_eq!(e.reason(), quorumlock::LostReason::Released, "{e}");
    other.release().await?;

    // The same through a kept lock that is dropped.
    let kept = a
        .try_lock("kept:ctx2", ttl)
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let ctx = kept.context();
    assert!(ctx.remaining() > Duration::ZERO && !ctx.is_lost());
    drop(kept);
    assert_eq!(ctx.remaining(), Duration::ZERO);
    assert!(ctx.is_lost());
    let e = tokio::time::timeout(Duration::from_secs(1), ctx.lost()).await?;
    assert_eq!(e.reason(), quorumlock::LostReason::Released, "{e}");
    Ok(())
}

/// The lost signal fires for one reason (here the hold cap) while an extension round is
/// still waiting on paused nodes; when they resume, they answer that none of them holds
/// the key any more. That answer must still take the validity away: before, the round's
/// result was ignored once the lock was marked lost, and `remaining()` kept reporting
/// seconds of validity on a lock no node held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_found_gone_after_the_lost_signal_still_leave_no_validity() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(1500))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let key = support::lock_key("kept:gone");
    let ttl = Duration::from_secs(4);
    let lock = a.try_lock("kept:gone", ttl).await?;
    let start = Instant::now();
    // Extension due at half-life (~2 s); the hold cap fires in the middle of that round.
    let kept = lock
        .keep_alive(Watchdog::new().max_hold(Duration::from_millis(2300)))
        .expect("a watchdog policy that fits the TTL");
    let ctx = kept.context();
    for i in 0..3 {
        let mut c = support::raw(&cluster, i).await;
        let _: i64 = c.del(&key).await?;
    }
    for i in 0..3 {
        cluster.pause(i).await?;
    }
    let e = tokio::time::timeout(Duration::from_secs(5), kept.lost()).await?;
    assert_eq!(e.reason(), LostReason::MaxHold, "{e}");
    for i in 0..3 {
        cluster.resume(i).await?;
    }
    let left = ctx.remaining();
    eprintln!(
        "lost (max hold) after {:?}; {left:?} of validity reported with the keys gone",
        start.elapsed()
    );
    // The round waiting on the resumed nodes now hears three refusals.
    let zeroed = support::eventually(Duration::from_secs(1), || async {
        ctx.remaining().is_zero()
    })
    .await;
    assert!(
        zeroed,
        "three nodes refused the extension (no key anywhere), yet the lock still reports \
         {:?} left ({left:?} when the nodes resumed)",
        ctx.remaining()
    );
    let r = kept.release().await;
    assert!(matches!(&r, Err(Error::Lost(_))), "{r:?}");
    Ok(())
}

/// One node of three is paused (a tolerated fault). Another kept lock's extension round
/// waits out that node's timeout even though the two live nodes decided it at once. A
/// kept lock that falls due during that wait must not be blocked behind it until its lost
/// signal fires: before, the watchdog waited for every node of a round before starting
/// the next, and the lock was reported lost although two healthy nodes held it. (With
/// the default timeouts the same happens to kept locks of a few hundred milliseconds that
/// share a client with locks of 12.5 s or more, whose node timeout is 250 ms; a fixed
/// 500 ms timeout makes the overlap wide enough to hit on purpose.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_does_not_starve_one_kept_lock_behind_another() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    cluster.pause(2).await?;
    let t0 = Instant::now();
    // First lock: 2 s TTL, due at half-life (~0.98 s); its round then waits 500 ms for
    // the paused node.
    let first = a
        .try_lock("kept:first", Duration::from_secs(2))
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    // Second lock: 1 s TTL, due at half-life, lost signal 250 ms before its deadline.
    // Taken at ~0.68 s, it falls due ~190 ms into the first lock's round: too late to be
    // swept into it, and its lost signal comes ~60 ms before that round's wait ends.
    tokio::time::sleep_until((t0 + Duration::from_millis(680)).into()).await;
    let second = a
        .try_lock("kept:second", Duration::from_secs(1))
        .await?
        .keep_alive(Watchdog::new().safety_margin(Duration::from_millis(250)))
        .expect("a watchdog policy that fits the TTL");
    let watch = tokio::time::timeout(Duration::from_secs(3), second.lost()).await;
    if let Ok(e) = &watch {
        panic!(
            "the second lock was reported lost ({e}) while two of three nodes were healthy; \
             first lock lost: {}",
            first.is_lost()
        );
    }
    assert!(!first.is_lost());
    cluster.resume(2).await?;
    second.release().await?;
    first.release().await?;
    Ok(())
}

/// `(EVALSHA calls, SCRIPT LOAD calls)` on a node, from `INFO commandstats`.
async fn command_calls(cluster: &LocalCluster, i: usize) -> (u64, u64) {
    let mut c = support::raw(cluster, i).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    let calls = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (calls("evalsha"), calls("script|load"))
}

/// A lock kept with a late refresh point (`refresh_at(0.95)`: extend whenever less than
/// 95 % is left) is extended about once per 5 % of its TTL. Before, the batching window
/// (a quarter of the refresh window) was wider than the time between two extensions, so
/// every lock with `refresh_at` of 0.8 or more was due again the moment it was extended:
/// the watchdog ran rounds back to back, thousands per second, for one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_refresh_point_does_not_make_the_watchdog_spin() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let ttl = Duration::from_secs(2);
    let kept = a
        .try_lock("kept:spin", ttl)
        .await?
        .keep_alive(Watchdog::new().refresh_at(0.95))
        .expect("a watchdog policy that fits the TTL");
    let (before, _) = command_calls(&cluster, 0).await;
    let window = Duration::from_secs(1);
    tokio::time::sleep(window).await; // a measuring window, not synchronization
    let (after, _) = command_calls(&cluster, 0).await;
    let rounds = after.saturating_sub(before);
    eprintln!("refresh_at(0.95), 2 s TTL: {rounds} extensions in {window:?} on node 0");
    assert!(!kept.is_lost());
    // Once per ~5 % of the TTL (100 ms) is ~10 per second; allow a wide slack.
    assert!(
        rounds <= 40,
        "{rounds} extension rounds in {window:?} for one lock: the watchdog spins"
    );
    kept.release().await?;
    Ok(())
}

/// A kept lock whose extensions miss the quorum is retried at a bounded pace until its
/// lost signal, not in back-to-back rounds. Before, a missed round was retried
/// `refresh / 8` later (`ttl / 16` by default), inside the batching window (`ttl / 8`),
/// so the lock was due again the moment the round ended: with two of three nodes refusing
/// connections at once, the watchdog ran hundreds of rounds (each a reconnect to the dead
/// nodes and a pipeline to the live one) in the time before the lost signal fired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_rounds_are_retried_at_a_bounded_pace_not_back_to_back() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let a = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    let ttl = Duration::from_secs(2);
    let kept = a
        .try_lock("kept:retry-pace", ttl)
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let (before, _) = command_calls(&cluster, 0).await;
    // Nodes 1 and 2 now reset every connection at once: each round misses the quorum fast.
    cluster.proxy(1)?.reset();
    cluster.proxy(2)?.reset();
    let lost = tokio::time::timeout(Duration::from_secs(5), kept.lost()).await;
    let (after, _) = command_calls(&cluster, 0).await;
    let rounds = after.saturating_sub(before);
    let accepted = cluster.proxy(1)?.accepted_connections();
    eprintln!("missed rounds: {rounds} extension rounds on node 0, {accepted} connects to node 1");
    let e = lost.map_err(|_| "the lost signal never fired")?;
    assert_eq!(e.reason(), LostReason::ExtendFailed, "{e}");
    // Due at half-life, lost at `deadline − ttl / 10`: about 0.9 s of retries at one per
    // `ttl / 16` (125 ms) is ~8 rounds; allow a wide slack.
    assert!(
        rounds <= 30,
        "{rounds} extension rounds before the lost signal: missed rounds run back to back"
    );
    drop(kept);
    Ok(())
}

/// The watchdog extends every key of a multi-resource lock (one `EVALSHA` with all its
/// keys), so the lock outlives many TTLs and each resource stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_every_key_of_a_multi_resource_lock() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let client = || {
        Redlock::builder(&urls)
            .node_timeout(Duration::from_millis(100))
            .retry(Retry::new().attempts(1))
            .build()
    };
    let a = client().await?;
    let b = client().await?;
    let ttl = Duration::from_millis(400);
    let kept = a
        .try_lock_many(["kept:m1", "kept:m2"], ttl)
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let deadline = Instant::now() + ttl * 4;
    let mut refused = 0;
    while Instant::now() < deadline {
        for r in ["kept:m1", "kept:m2"] {
            match b.try_lock(r, ttl).await {
                Ok(_) => panic!("{r} was taken while the multi-resource lock was kept"),
                Err(e) if e.is_held() => refused += 1,
                Err(e) => assert!(e.is_retryable(), "{e}"),
            }
        }
        assert!(!kept.is_lost(), "the multi-resource lock was lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 10, "only {refused} refusals");
    kept.release().await?;
    b.try_lock_many(["kept:m1", "kept:m2"], ttl)
        .await?
        .release()
        .await?;
    Ok(())
}
