//! Held-lock lifecycle against real `redis-server`s: the watchdog, the lost signal, caps,
//! scoped use, and drop without release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Error, LostReason, Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;

mod support;

/// Why a lock was lost, if `e` is a lost-lock error.
fn reason(e: &Error) -> Option<LostReason> {
    match e {
        Error::Lost(l) => Some(l.reason()),
        _ => None,
    }
}

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn client(urls: &[String]) -> Result<Redlock, Error> {
    // A fixed per-node timeout: the derived one (2 % of a 300 ms TTL = 6 ms) times out on
    // a loaded CI machine.
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(50))
        .retry(Retry::new().attempts(1))
        .build()
        .await
}

/// Sets a flag when dropped: proves a future was cancelled.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_lock_for_many_ttls_and_no_one_else_gets_it() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let ttl = Duration::from_millis(300);
    let kept = a
        .try_lock("lc:keep", ttl)
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let start = Instant::now();
    let mut refused = 0;
    while start.elapsed() < ttl * 6 {
        match b.try_lock("lc:keep", ttl).await {
            Err(e) if e.is_held() => refused += 1,
            // A slow machine may time out the other client's attempt: not a grant.
            Err(e) if e.is_retryable() => {}
            Err(e) => return Err(format!("unexpected error while held: {e}").into()),
            Ok(_) => return Err("a second client got a lock kept alive by the watchdog".into()),
        }
        assert!(!kept.is_lost(), "lost while all nodes are up");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(refused > 10, "only {refused} attempts");
    assert!(kept.remaining() > Duration::ZERO);
    kept.release().await?;
    // Released: the other client gets it at once.
    b.try_lock("lc:keep", ttl).await?.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_majority_fires_lost_before_the_deadline() -> TestResult {
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let a = client(&cluster.urls()).await?;
    let ttl = Duration::from_millis(600);
    let kept = a
        .try_lock("lc:lost", ttl)
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let lost = kept.lost();
    // Let at least one extension happen first (the deadline moves past the first one).
    let first = Instant::now() + kept.remaining();
    let t = Instant::now();
    while Instant::now() + kept.remaining() <= first && t.elapsed() < ttl * 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(Instant::now() + kept.remaining() > first, "never extended");
    let before = Instant::now() + kept.remaining();
    for i in 0..3 {
        cluster.disconnect(i).await?;
    }
    // An extension whose replies were already on their way may still land: take the
    // later of the deadlines seen before and right after the fault.
    let deadline = before.max(Instant::now() + kept.remaining());
    let e = tokio::time::timeout(ttl * 3, lost).await?;
    let fired = Instant::now();
    assert_eq!(e.reason(), LostReason::ExtendFailed, "{e}");
    assert!(
        fired < deadline,
        "lost fired {:?} after the deadline",
        fired - deadline
    );
    eprintln!(
        "lost fired {:?} before the deadline",
        deadline.saturating_duration_since(fired)
    );
    assert!(kept.is_lost());
    let _ = kept.release().await; // may fail: a majority is cut off
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_cancels_the_closure_when_the_lock_is_lost() -> TestResult {
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let a = client(&cluster.urls()).await?;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let flag = dropped.clone();
    let run = a.with_lock(
        "lc:scoped",
        Duration::from_millis(600),
        Watchdog::new(),
        move |_ctx| async move {
            let _guard = DropFlag(flag);
            let _ = started_tx.send(());
            std::future::pending::<u32>().await
        },
    );
    let fault = async {
        let _ = started_rx.await;
        for i in 0..3 {
            cluster.disconnect(i).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let (result, fault) =
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(run, fault) }).await?;
    fault?;
    match result {
        Err(e) if e.is_lost() => {}
        other => return Err(format!("expected Error::Lost, got {other:?}").into()),
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the closure was not cancelled"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_extensions_stops_extension_and_fires_lost() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let ttl = Duration::from_millis(300);
    let start = Instant::now();
    let kept = a
        .try_lock("lc:capn", ttl)
        .await?
        .keep_alive(Watchdog::new().max_extensions(2))
        .expect("a watchdog policy that fits the TTL");
    let e = tokio::time::timeout(Duration::from_secs(3), kept.lost()).await?;
    assert_eq!(e.reason(), LostReason::MaxExtensions, "{e}");
    assert!(e.to_string().contains("number of extensions"), "{e}");
    // Two extensions happened: the hold outlived the first TTL.
    assert!(start.elapsed() > ttl, "fired after {:?}", start.elapsed());
    // No more extensions: the lock expires by itself and someone else gets it.
    let t = Instant::now();
    let got = loop {
        match b.try_lock("lc:capn", ttl).await {
            Ok(l) => break l,
            Err(e) if e.is_held() && t.elapsed() < ttl * 4 => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => return Err(format!("never expired after the cap: {e}").into()),
        }
    };
    got.release().await?;
    drop(kept);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_extension_and_fires_lost() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = client(&cluster.urls()).await?;
    let ttl = Duration::from_millis(300);
    let start = Instant::now();
    let kept = a
        .try_lock("lc:caph", ttl)
        .await?
        .keep_alive(Watchdog::new().max_hold(Duration::from_millis(700)))
        .expect("a watchdog policy that fits the TTL");
    let e = tokio::time::timeout(Duration::from_secs(3), kept.lost()).await?;
    let held = start.elapsed();
    assert_eq!(e.reason(), LostReason::MaxHold, "{e}");
    assert!(e.to_string().contains("maximum hold time"), "{e}");
    assert!(held > ttl, "fired after {held:?}, before any extension");
    assert!(kept.is_lost());
    eprintln!("max_hold 700 ms: lost fired after {held:?}");
    drop(kept);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_error_does_not_hide_the_closure_result() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let flush_urls = urls.clone();
    let v = a
        .with_lock(
            "lc:relerr",
            Duration::from_secs(10),
            Watchdog::new(),
            |_ctx| async move {
                // Wipe the lock behind the client's back: the release will be refused.
                for u in &flush_urls {
                    let c = redis::Client::open(u.as_str()).ok()?;
                    let mut conn = c.get_multiplexed_async_connection().await.ok()?;
                    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.ok()?;
                }
                Some(7)
            },
        )
        .await?;
    assert_eq!(v, Some(7));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_closure_propagates_after_release() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let a2 = a.clone();
    let joined = tokio::spawn(async move {
        a2.with_lock(
            "lc:panic",
            Duration::from_secs(10),
            Watchdog::new(),
            |_| async {
                panic!("boom");
            },
        )
        .await
    })
    .await;
    let err = joined.err().ok_or("the panic did not propagate")?;
    assert!(err.is_panic());
    // Released before unwinding: free at once (the TTL is 10 s).
    b.try_lock("lc:panic", Duration::from_secs(1))
        .await?
        .release()
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_kept_lock_releases_it_in_the_background() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let kept = a
        .try_lock("lc:drop", Duration::from_secs(30))
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    drop(kept);
    let t = Instant::now();
    loop {
        match b.try_lock("lc:drop", Duration::from_secs(1)).await {
            Ok(l) => {
                l.release().await?;
                break;
            }
            Err(e) if e.is_held() && t.elapsed() < Duration::from_secs(2) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => return Err(format!("not released in the background: {e}").into()),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_kept_locks_share_one_batched_round() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let ttl = Duration::from_millis(400);
    let mut kept = Vec::new();
    for i in 0..50 {
        kept.push(
            a.try_lock(&format!("lc:many:{i}"), ttl)
                .await?
                .keep_alive(Watchdog::new())
                .expect("a watchdog policy that fits the TTL"),
        );
    }
    tokio::time::sleep(ttl * 3).await; // several refresh cycles (not synchronization)
    for (i, k) in kept.iter().enumerate() {
        assert!(!k.is_lost(), "lock {i} lost");
        assert!(b.try_lock(&format!("lc:many:{i}"), ttl).await.is_err());
    }
    // One pipelined round per tick carries every due extension: each round sends one
    // `SCRIPT LOAD` and one `EVALSHA` per lock, so EVALSHA calls far outnumber rounds.
    let (evalsha, rounds) = command_calls(&cluster.direct_url(0)?).await?;
    eprintln!("50 kept locks: {evalsha} EVALSHA in {rounds} pipelined rounds on node 0");
    assert!(rounds >= 2, "{rounds} rounds");
    assert!(
        evalsha >= 10 * rounds,
        "{evalsha} EVALSHA in {rounds} rounds: not batched"
    );
    for k in kept {
        k.release().await?;
    }
    Ok(())
}

/// A lock handed to the watchdog after its deadline is lost at once and never extended:
/// before, the watchdog ran one more round and refreshed the leftover keys to a whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_of_an_expired_lock_is_lost_at_once_and_refreshes_nothing() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = client(&cluster.urls()).await?;
    let key = support::lock_key("lc:expired");
    let lock = a.try_lock("lc:expired", Duration::from_secs(1)).await?;
    // Leftover keys: the nodes keep ours for 10 s, far past the guard's deadline (as a
    // slow extension that landed after the client gave up could leave them).
    for i in 0..3 {
        let mut c = support::raw(&cluster, i).await;
        let set: bool = c.pexpire(&key, 10_000).await?;
        assert!(set, "node {i} lost the key already");
    }
    tokio::time::sleep_until(lock.deadline().into()).await;
    assert!(!lock.is_valid());
    let mut before = Vec::new();
    for url in cluster.urls() {
        before.push(command_calls(&url).await?.0);
    }
    let kept = lock
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    // No extension round runs: give a round that would be due at once time to reach the
    // nodes (nothing to await for an absence; nothing here asks the guard first, which
    // would mark it lost before the watchdog's task looks), then count the scripts run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, url) in cluster.urls().iter().enumerate() {
        let after = command_calls(url).await?.0;
        assert_eq!(
            after, before[i],
            "node {i}: the watchdog sent an extension for an expired lock"
        );
    }
    assert!(kept.is_lost(), "an expired lock must be reported lost");
    let e = tokio::time::timeout(Duration::from_secs(1), kept.lost()).await?;
    assert_eq!(e.reason(), LostReason::Expired, "{e}");
    assert_eq!(kept.remaining(), Duration::ZERO);
    // Release still deletes the leftover keys (they hold our token), and reports the loss.
    let r = kept.release().await;
    assert!(matches!(&r, Err(Error::Lost(_))), "{r:?}");
    assert!(a.flush(Duration::from_secs(10)).await);
    assert_eq!(support::count_key(&cluster, 0..3, &key).await, 0);
    Ok(())
}

/// Once the watchdog finds the keys gone from a quorum, the guard reports no validity
/// left and its release reports the loss (before: `remaining()` stayed positive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_whose_keys_vanished_reports_no_validity_and_release_reports_lost() -> TestResult
{
    let cluster = LocalCluster::builder(3).launch().await?;
    let a = client(&cluster.urls()).await?;
    let key = support::lock_key("lc:vanished");
    let kept = a
        .try_lock("lc:vanished", Duration::from_secs(2))
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let ctx = kept.context();
    for i in 0..3 {
        let mut c = support::raw(&cluster, i).await;
        let _: i64 = c.del(&key).await?;
    }
    // The next extension (at half-life) finds no key anywhere.
    let e = tokio::time::timeout(Duration::from_secs(3), kept.lost()).await?;
    assert_eq!(e.reason(), LostReason::NotHeld, "{e}");
    assert!(kept.is_lost() && ctx.is_lost());
    assert_eq!(
        kept.remaining(),
        Duration::ZERO,
        "validity reported after the keys vanished"
    );
    assert_eq!(ctx.remaining(), Duration::ZERO);
    let r = kept.release().await;
    match &r {
        Err(e) => assert_eq!(reason(e), Some(LostReason::NotHeld), "{e}"),
        Ok(()) => panic!("the release of a lock found lost returned Ok"),
    }
    Ok(())
}

/// Durations at their maximum saturate instead of panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_durations_saturate_instead_of_panicking() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    // Nothing in the background: returns at once.
    let a = client(&urls).await?;
    assert!(a.flush(Duration::MAX).await);
    let held = a.try_lock("lc:huge", Duration::from_secs(5)).await?;
    let waiter = Redlock::builder(&urls)
        .node_timeout(Duration::from_millis(50))
        .retry(
            Retry::new()
                .attempts(5)
                .no_max_wait()
                .delay(Duration::MAX, Duration::MAX),
        )
        .build()
        .await?;
    // The attempts find it held; the retry delay is "forever". The call must still be
    // waiting (not panicked) when we stop looking.
    let r = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.lock("lc:huge", Duration::from_secs(1)),
    )
    .await;
    assert!(r.is_err(), "expected the call to be waiting: {r:?}");
    held.release().await?;
    Ok(())
}

/// `(EVALSHA calls, SCRIPT LOAD calls)` from `INFO commandstats`.
async fn command_calls(url: &str) -> Result<(u64, u64), redis::RedisError> {
    let c = redis::Client::open(url)?;
    let mut conn = c.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    let calls = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ok((calls("evalsha"), calls("script|load")))
}

#[test]
fn bounds() {
    fn send<T: Send>() {}
    fn send_static<T: Send + Sync + 'static>() {}
    fn send_future<F: std::future::Future + Send>(_: F) {}
    send::<quorumlock::KeptLock>();
    fn send_only_static<T: Send + 'static>() {}
    send_only_static::<quorumlock::LostSignal>();
    send_static::<quorumlock::LockContext>();
    send_static::<Watchdog>();
    // Type-checked, never run.
    let _ = |locks: Redlock, kept: quorumlock::KeptLock| {
        send_future(
            locks.with_lock("r", Duration::from_secs(1), Watchdog::new(), |_| async {
                1
            }),
        );
        send_future(kept.release());
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_with_lock_cancels_the_closure_and_releases() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let flag = dropped.clone();
    let run = a.with_lock(
        "lc:dropscope",
        Duration::from_secs(30),
        Watchdog::new(),
        move |_ctx| async move {
            let _guard = DropFlag(flag);
            let _ = started_tx.send(());
            std::future::pending::<()>().await
        },
    );
    tokio::select! {
        r = run => return Err(format!("with_lock returned: {r:?}").into()),
        _ = started_rx => {} // the closure runs under the lock: drop `run` now
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the closure was not cancelled"
    );
    let t = Instant::now();
    loop {
        match b.try_lock("lc:dropscope", Duration::from_secs(1)).await {
            Ok(l) => {
                l.release().await?;
                break;
            }
            Err(e) if e.is_retryable() && t.elapsed() < Duration::from_secs(2) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => return Err(format!("not released in the background: {e}").into()),
        }
    }
    Ok(())
}

/// A watchdog policy that does not fit the lock's TTL is a configuration error where it
/// meets the lock: `keep_alive` refuses it and hands the lock back, still held (another
/// client cannot take it); dropping the refusal releases it; a scoped wrapper refuses it
/// before taking anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_policy_that_does_not_fit_the_ttl_is_refused() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let a = client(&urls).await?;
    let b = client(&urls).await?;
    let ttl = Duration::from_secs(5);
    let lock = a.try_lock("lc:policy", ttl).await?;
    let margin = Watchdog::new().safety_margin(Duration::from_secs(6));
    let refused = match lock.keep_alive(margin) {
        Err(refused) => refused,
        Ok(_) => panic!("a margin longer than the TTL must be refused"),
    };
    assert!(
        matches!(refused.error(), Error::Config(c) if c.field() == "watchdog.safety_margin"),
        "{refused}"
    );
    assert!(refused.to_string().contains("still held"), "{refused}");
    // Still held: another client is refused, and the lock given back is kept alive with a
    // policy that fits.
    assert!(b.try_lock("lc:policy", ttl).await.is_err(), "still held");
    let kept = refused.into_lock().keep_alive(Watchdog::new())?;
    kept.release().await?;
    // `?` or a drop releases the lock: a waiting lock gets it long before its 5 s TTL
    // would have freed it.
    let again = a.try_lock("lc:policy", ttl).await?;
    let refused = again
        .keep_alive(Watchdog::new().refresh_at(1.5))
        .expect_err("a refresh point past the TTL must be refused");
    let error: Error = refused.into();
    assert!(
        matches!(&error, Error::Config(c) if c.field() == "watchdog.refresh_at"),
        "{error}"
    );
    let waiting = Redlock::builder(&urls)
        .node_timeout(Duration::from_millis(50))
        .retry(Retry::new().max_wait(Duration::from_secs(10)))
        .build()
        .await?;
    let started = Instant::now();
    let taken = waiting.lock("lc:policy", ttl).await?;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "released, not expired: {:?}",
        started.elapsed()
    );
    taken.release().await?;
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let scoped = a
        .with_lock("lc:policy-scoped", ttl, margin, |_| async move {
            flag.store(true, Ordering::SeqCst);
        })
        .await;
    assert!(
        matches!(&scoped, Err(Error::Config(c)) if c.field() == "watchdog.safety_margin"),
        "{scoped:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the closure never ran");
    let mut con = redis::Client::open(urls[0].as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = con.keys("*lc:policy-scoped*").await?;
    assert!(keys.is_empty(), "nothing was taken: {keys:?}");
    Ok(())
}
