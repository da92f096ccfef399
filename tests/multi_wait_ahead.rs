//! Joins that do not count blocked multi-resource entries as ahead: an entry is blocked
//! only by keys of its set other than the queue's own (which the release being waited for
//! frees), and enough entries are looked at that a caller holding a key is not kept behind
//! a long line of blocked waiters.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::LocalCluster;
use support::settle;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn client(urls: &[String], retry: Retry) -> Result<Redlock, quorumlock::Error> {
    Redlock::builder(urls).retry(retry).build().await
}

/// Were the queue's own lock key counted as blocking: while H holds `a`, every 'm' entry
/// in a's queue would be "blocked" (a holds H's token), even M {a,b} whose other key is
/// free and which the release will serve. W, second in line behind M, would be told
/// ahead == 0 and become a second head, claiming on every fallback tick while `a` is held:
/// with attempts(5) it burnt them all within ~0.2 s and gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_in_line_behind_unblocked_multi_waiter_claims_and_gives_up() -> TestResult {
    second_in_line(false).await
}

/// The same with H holding both `a` and `b` (one `lock_many`): M's other key is held, but
/// by the holder of `a`, whose release frees both; M is not blocked, and W is second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_in_line_behind_a_waiter_for_the_holders_whole_set() -> TestResult {
    second_in_line(true).await
}

/// H holds `a` (or `a` and `b`), M waits for {a, b}, W for `a` behind M; W must not claim
/// while `a` is held, and gets it after M.
async fn second_in_line(holder_of_both: bool) -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let m = client(&urls, Retry::new().max_wait(Duration::from_secs(20))).await?;
    let w = client(
        &urls,
        Retry::new()
            .attempts(5)
            .delay(Duration::from_millis(10), Duration::from_millis(20))
            .max_wait(Duration::from_secs(20)),
    )
    .await?;
    let (a, b) = if holder_of_both {
        ("ra1m-a", "ra1m-b")
    } else {
        ("ra1-a", "ra1-b")
    };
    let ttl = Duration::from_secs(20);
    let a_lock = if holder_of_both {
        h.try_lock_many([a, b], ttl).await?
    } else {
        h.try_lock(a, ttl).await?
    };
    let mh = tokio::spawn(async move { m.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let started = Instant::now();
    let wh = tokio::spawn(async move { w.lock(a, ttl).await });
    settle(&cluster, a, 2).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let w_done = wh.is_finished();
    a_lock.release().await?;
    let m_lock = tokio::time::timeout(Duration::from_secs(5), mh).await???;
    println!(
        "M got {{a,b}}; W finished while a was held: {w_done} ({:?})",
        started.elapsed()
    );
    m_lock.release().await?;
    let w_res = wh.await?;
    assert!(
        !w_done && w_res.is_ok(),
        "W (2nd in a's queue, behind M whose set was free) spent its attempts claiming a \
         held lock: {:?}",
        w_res.map(|l| l.token().to_owned())
    );
    Ok(())
}

/// Same cause, fairness: H crashes holding `a`. M {a,b} (b free) arrived first; W
/// (single) second. Were W a head too (M "blocked" by H's token on a), its 10..100 ms
/// fallback claims would beat M's (about 1 s) once `a` expires: W overtook M.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_waiter_overtakes_earlier_multi_waiter_after_holder_crash() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let m = client(
        &urls,
        Retry::new()
            .delay(Duration::from_millis(900), Duration::from_millis(1000))
            .max_wait(Duration::from_secs(20)),
    )
    .await?;
    let w = client(&urls, Retry::new().max_wait(Duration::from_secs(20))).await?;
    let (a, b) = ("ra2-a", "ra2-b");
    let ttl = Duration::from_secs(20);
    let a_lock = h.try_lock(a, Duration::from_millis(2500)).await?;
    let mut mh = tokio::spawn(async move { m.lock_many([a, b], ttl).await });
    settle(&cluster, a, 1).await?;
    let mut wh = tokio::spawn(async move { w.lock(a, ttl).await });
    settle(&cluster, a, 2).await?;
    std::mem::forget(a_lock); // H crashes
    let first = tokio::select! {
        r = &mut mh => { let _ = r??; "M" }
        r = &mut wh => { let _ = r??; "W" }
    };
    println!("first: {first}");
    mh.abort();
    wh.abort();
    assert_eq!(
        first, "M",
        "W (arrived second) overtook M, whose whole set was free"
    );
    Ok(())
}

/// A 16-entry look-ahead only moved the cliff of multi_wait_backfill's nine-waiter case: with
/// 17 blocked {a,b} waiters ahead, Y (holding b) was told ahead == 1, never the head, and
/// the release of `a` (backfill 8: none servable) was a plain release Y ignored. `a`
/// stayed free for Y's whole max_wait while Y held the b they all wait for. Joins now look
/// at 64 entries ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_holder_behind_seventeen_blocked_multi_waiters() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let urls = cluster.urls();
    let h = client(&urls, Retry::new().max_wait(Duration::from_secs(1))).await?;
    let y = client(&urls, Retry::new().max_wait(Duration::from_secs(6))).await?;
    let (a, b) = ("ra3-a", "ra3-b");
    let ttl = Duration::from_secs(30);
    let a_lock = h.try_lock(a, ttl).await?;
    let b_lock = y.try_lock(b, ttl).await?;
    let mut waiters = Vec::new();
    for i in 0..17u64 {
        let w = client(&urls, Retry::new().max_wait(Duration::from_secs(40))).await?;
        waiters.push(tokio::spawn(async move { w.lock_many([a, b], ttl).await }));
        settle(&cluster, a, i + 1).await?;
    }
    let y2 = y.clone();
    let nested = tokio::spawn(async move { y2.lock(a, ttl).await });
    settle(&cluster, a, 18).await?;
    let released = Instant::now();
    a_lock.release().await?;
    let got = nested.await?;
    println!(
        "Y: {:?} after {:?}",
        got.as_ref().map(|l| l.token().to_owned()),
        released.elapsed()
    );
    for w in waiters {
        w.abort();
    }
    assert!(got.is_ok(), "Y (18th in a's queue) never got the free `a`");
    b_lock.release().await?;
    Ok(())
}
