//! Kept locks under adversarial timing, against real `redis-server`s: a released lock is
//! never reported valid through a context that outlived it, keys found gone from a quorum
//! leave no validity even when the lost signal had already fired for another reason, and
//! a node that does not answer cannot starve one kept lock behind another's round.
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, LostReason, Redlock, Retry, Watchdog};
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Why a lock was lost, if `e` is a lost-lock error.
fn reason(e: &Error) -> Option<LostReason> {
    match e {
        Error::Lost(l) => Some(l.reason()),
        _ => None,
    }
}

/// A context cloned out of a scoped use (or kept by a task the closure spawned) must not
/// report validity once the scope released the lock: another client may hold it by then.
/// Before, it kept reporting the old deadline (and `is_lost() == false`) after the release.
#[ignore = "finding: a released lock's context reports validity"]
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
    other.release().await?;

    // The same through a kept lock that is dropped.
    let kept = a
        .try_lock("kept:ctx2", ttl)
        .await?
        .keep_alive(Watchdog::new());
    let ctx = kept.context();
    assert!(ctx.remaining() > Duration::ZERO && !ctx.is_lost());
    drop(kept);
    assert_eq!(ctx.remaining(), Duration::ZERO);
    assert!(ctx.is_lost());
    Ok(())
}

/// The lost signal fires for one reason (here the hold cap) while an extension round is
/// still waiting on paused nodes; when they resume, they answer that none of them holds
/// the key any more. That answer must still take the validity away: before, the round's
/// result was ignored once the lock was marked lost, and `remaining()` kept reporting
/// seconds of validity on a lock no node held.
#[ignore = "finding: refusals after the lost signal leave validity"]
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
    let kept = lock.keep_alive(Watchdog::new().max_hold(Duration::from_millis(2300)));
    let ctx = kept.context();
    for i in 0..3 {
        let mut c = support::raw(&cluster, i).await;
        let _: i64 = c.del(&key).await?;
    }
    for i in 0..3 {
        cluster.pause(i).await?;
    }
    let e = tokio::time::timeout(Duration::from_secs(5), kept.lost()).await?;
    assert_eq!(reason(&e), Some(LostReason::MaxHold), "{e}");
    for i in 0..3 {
        cluster.resume(i).await?;
    }
    let left = ctx.remaining();
    eprintln!(
        "lost (max hold) after {:?}; {left:?} of validity reported with the keys gone",
        start.elapsed()
    );
    // The round waiting on the resumed nodes now hears three refusals.
    let zeroed =
        support::eventually(Duration::from_secs(1), || async { ctx.remaining().is_zero() })
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

/// One node of three is paused (a tolerated fault). A long lock's extension round waits
/// out that node's timeout (250 ms with the default timeouts) even though the two live
/// nodes decided it at once. A short kept lock that falls due during that wait must not
/// be blocked behind it until its lost signal fires: before, the watchdog waited for
/// every node of a round before starting the next, and the short lock was reported lost
/// although two healthy nodes held it.
#[ignore = "finding: a watchdog round waits for stragglers and starves other locks"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_does_not_starve_a_short_kept_lock_behind_a_long_one() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    // Default timeouts: 2 % of the TTL, between 20 and 250 ms.
    let a = Redlock::builder(cluster.urls())
        .retry(Retry::new().attempts(1))
        .build()
        .await?;
    cluster.pause(2).await?;
    // Long lock: 20 s TTL, extended whenever less than 95 % is left (~every 0.8 s); each
    // of its rounds waits 250 ms for the paused node.
    let long = a
        .try_lock("kept:long", Duration::from_secs(20))
        .await?
        .keep_alive(Watchdog::new().refresh_at(0.95));
    // Short lock: 400 ms TTL, due at half-life, lost signal 100 ms before its deadline.
    // Taken ~0.7 s later, so that its first due time falls ~100 ms into the long lock's
    // first round (later ones drift, and each overlap is another chance to starve).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let short = a
        .try_lock("kept:short", Duration::from_millis(400))
        .await?
        .keep_alive(Watchdog::new().safety_margin(Duration::from_millis(100)));
    let watch = tokio::time::timeout(Duration::from_secs(3), short.lost()).await;
    if let Ok(e) = &watch {
        panic!(
            "the short lock was reported lost ({e}) while two of three nodes were healthy; \
             long lock lost: {}",
            long.is_lost()
        );
    }
    assert!(!long.is_lost());
    cluster.resume(2).await?;
    short.release().await?;
    long.release().await?;
    Ok(())
}
