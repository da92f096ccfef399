//! Read-write locks against real redis-server processes: readers share, a writer excludes
//! readers and writers, every kind's lifecycle (extend, release, drop, keep alive), the
//! clean-up of refused attempts, fencing tokens, writer preference and its intent.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Error, LockMode, Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use support::{eventually, raw, zcards};

const TTL: Duration = Duration::from_secs(10);

async fn cluster3() -> LocalCluster {
    LocalCluster::launch(3)
        .await
        .expect("start 3 redis-server nodes")
}

/// A client with a fixed per-node timeout (the derived one is tight on a loaded machine).
async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .retry(Retry::new().max_wait(Duration::from_secs(10)))
        .build()
        .await
        .expect("build")
}

fn writer_key(name: &str) -> String {
    format!("quorumlock:rw:{name}")
}
fn readers_key(name: &str) -> String {
    format!("quorumlock:readers:{name}")
}
fn intent_key(name: &str) -> String {
    format!("quorumlock:wintent:{name}")
}

fn is_held<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(e) if e.is_held())
}

/// On how many of the cluster's nodes `token` is a member of the readers' set.
async fn reader_entries(c: &LocalCluster, name: &str, token: &str) -> usize {
    let mut n = 0;
    for i in 0..c.len() {
        let score: Option<f64> = raw(c, i)
            .await
            .zscore(readers_key(name), token)
            .await
            .expect("ZSCORE");
        n += usize::from(score.is_some());
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_exclude_writers_in_both_orders() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;

    // Readers first: they share; a writer is refused (Held, as try_lock when busy).
    let r1 = a.try_read_lock("rw:orders", TTL).await.expect("reader 1");
    let r2 = b.try_read_lock("rw:orders", TTL).await.expect("reader 2");
    assert_eq!((r1.mode(), r2.mode()), (LockMode::Read, LockMode::Read));
    assert_eq!(r1.fencing_token(), None);
    match b.try_write_lock("rw:orders", TTL).await {
        Err(Error::Held(votes)) => assert_eq!(votes.granted(), 0, "{votes:#}"),
        other => panic!("a writer got in beside readers: {other:?}"),
    }
    // The mutex of the same name is independent.
    a.try_lock("rw:orders", TTL)
        .await
        .expect("mutex")
        .release()
        .await
        .expect("release");
    r1.release().await.expect("release reader 1");
    assert!(
        is_held(&b.try_write_lock("rw:orders", TTL).await),
        "one reader is left"
    );
    r2.release().await.expect("release reader 2");

    // Writer first: readers and a second writer are refused.
    let w = b.try_write_lock("rw:orders", TTL).await.expect("writer");
    assert_eq!(w.mode(), LockMode::Write);
    assert!(is_held(&a.try_read_lock("rw:orders", TTL).await));
    assert!(is_held(&a.try_write_lock("rw:orders", TTL).await));
    w.release().await.expect("release writer");
    let r = a.try_read_lock("rw:orders", TTL).await.expect("free again");
    r.release().await.expect("release");
    assert!(a.flush(Duration::from_secs(2)).await);
    for i in 0..3 {
        let mut conn = raw(&c, i).await;
        let exists: bool = conn.exists(writer_key("rw:orders")).await.expect("EXISTS");
        let readers: usize = conn.zcard(readers_key("rw:orders")).await.expect("ZCARD");
        assert!(
            !exists && readers == 0,
            "node {i} kept state after every release"
        );
    }
}

/// A refused attempt leaves nothing behind: a writer granted by one node but refused by
/// the majority is deleted there; a refused reader's entry is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_attempts_are_cleaned_up() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    // Live readers on nodes 1 and 2 only (written directly).
    for i in [1, 2] {
        let far = 4_102_444_800_000i64; // the year 2100, in ms
        let _: () = raw(&c, i)
            .await
            .zadd(readers_key("rw:c"), "someone", far)
            .await
            .expect("ZADD");
    }
    assert!(is_held(&a.try_write_lock("rw:c", TTL).await));
    // Decided at the second refusal: node 0 may still be answering; its clean-up follows
    // its answer, in the background.
    assert!(a.flush(Duration::from_secs(2)).await);
    assert_eq!(
        support::count_key(&c, 0..3, &writer_key("rw:c")).await,
        0,
        "node 0's grant is cleaned up"
    );

    // A writer key on nodes 0 and 1: a reader is granted by node 2 only, and removed there.
    for i in [0, 1] {
        let _: () = raw(&c, i)
            .await
            .set(writer_key("rw:d"), "other")
            .await
            .expect("SET");
    }
    assert!(is_held(&a.try_read_lock("rw:d", TTL).await));
    assert!(a.flush(Duration::from_secs(2)).await);
    let left: usize = raw(&c, 2)
        .await
        .zcard(readers_key("rw:d"))
        .await
        .expect("ZCARD");
    assert_eq!(left, 0, "node 2's reader entry is cleaned up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_release_each_kind() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let short = Duration::from_secs(2);

    let mut r = a.try_read_lock("rw:e", short).await.expect("reader");
    r.extend(TTL).await.expect("extend reader");
    assert!(r.remaining() > short, "{:?}", r.remaining());
    // The readers' set expires with its last entry (PEXPIREAT max score, not -1), moved by
    // the extension (decided at the quorum: the last node may follow a moment later).
    let c2 = &c;
    let extended = eventually(Duration::from_secs(2), || async move {
        let mut all = true;
        for i in 0..3 {
            let pttl: i64 = raw(c2, i)
                .await
                .pttl(readers_key("rw:e"))
                .await
                .expect("PTTL");
            assert!(pttl > 0 && pttl <= 10_000, "node {i}: PTTL {pttl}");
            all &= pttl > 2_000;
        }
        all
    })
    .await;
    assert!(
        extended,
        "every node's readers' set expires with the extended entry"
    );
    let token = r.token().to_owned();
    r.release().await.expect("release reader");
    assert!(a.flush(Duration::from_secs(2)).await);
    assert_eq!(reader_entries(&c, "rw:e", &token).await, 0);

    let mut w = a.try_write_lock("rw:e", short).await.expect("writer");
    w.extend(TTL).await.expect("extend writer");
    assert!(w.remaining() > short);
    assert!(
        a.flush(Duration::from_secs(2)).await,
        "the last node's extension"
    );
    for i in 0..3 {
        let pttl: i64 = raw(&c, i)
            .await
            .pttl(writer_key("rw:e"))
            .await
            .expect("PTTL");
        assert!(
            pttl > 2_000,
            "node {i}: the writer key was extended: {pttl}"
        );
    }
    w.release().await.expect("release writer");

    // A released reader lets a writer in; a released writer lets readers in.
    let r = a.try_read_lock("rw:e", TTL).await.expect("reader");
    r.release().await.expect("release");
    a.try_write_lock("rw:e", TTL)
        .await
        .expect("writer after a released reader")
        .release()
        .await
        .expect("release");

    // An extension never re-creates an entry that is gone.
    let mut r = a.try_read_lock("rw:e", TTL).await.expect("reader");
    for i in 0..3 {
        let _: () = raw(&c, i)
            .await
            .del(readers_key("rw:e"))
            .await
            .expect("DEL");
    }
    match r.extend(TTL).await {
        Err(e) if e.is_lost() => {}
        other => panic!("extending a vanished reader: {other:?}"),
    }
    assert_eq!(reader_entries(&c, "rw:e", r.token()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_expired_readers_stop_blocking_writers() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let r = a.try_read_lock("rw:drop", TTL).await.expect("reader");
    drop(r);
    assert!(a.flush(Duration::from_secs(2)).await);
    let w = a
        .try_write_lock("rw:drop", TTL)
        .await
        .expect("writer after a dropped reader");
    drop(w);
    assert!(a.flush(Duration::from_secs(2)).await);
    a.try_read_lock("rw:drop", TTL)
        .await
        .expect("reader after a dropped writer")
        .release()
        .await
        .expect("release");

    // A reader that expires (no release): its entry no longer blocks once lapsed, although
    // the set still holds another live reader's entry (no key-level expiry helps here).
    let ttl = Duration::from_millis(300);
    let long = a.try_read_lock("rw:exp", TTL).await.expect("long reader");
    let short = a.try_read_lock("rw:exp", ttl).await.expect("short reader");
    std::mem::forget(short); // never released: it must lapse by itself
    long.release().await.expect("release the long reader");
    assert!(
        is_held(&a.try_write_lock("rw:exp", TTL).await),
        "the short reader is live"
    );
    tokio::time::sleep(ttl).await;
    let w = a
        .try_write_lock("rw:exp", TTL)
        .await
        .expect("the lapsed reader no longer blocks");
    w.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_readers_and_writers_outlive_their_ttl() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let ttl = Duration::from_millis(400);
    let kept = a
        .try_read_lock("rw:keep", ttl)
        .await
        .expect("reader")
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let other = b
        .try_read_lock("rw:keep", ttl)
        .await
        .expect("a second reader");
    drop(other);
    let start = Instant::now();
    let mut refused = 0;
    while start.elapsed() < ttl * 3 {
        refused += usize::from(is_held(&b.try_write_lock("rw:keep", ttl).await));
        assert!(!kept.is_lost(), "lost while every node is up");
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(
        refused >= 5,
        "the kept reader blocked writers ({refused} refusals)"
    );
    kept.release().await.expect("release the kept reader");
    assert!(a.flush(Duration::from_secs(2)).await);

    let kept = b
        .try_write_lock("rw:keep", ttl)
        .await
        .expect("writer")
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    tokio::time::sleep(ttl * 3).await;
    assert!(!kept.is_lost());
    assert!(
        is_held(&a.try_read_lock("rw:keep", ttl).await),
        "the kept writer still excludes readers"
    );
    kept.release().await.expect("release the kept writer");
    a.try_read_lock("rw:keep", ttl)
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_read_and_write_locks() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let seen = a
        .with_read_lock("rw:scoped", TTL, Watchdog::new(), |_ctx| async {
            // Another reader shares it; a writer does not.
            let r = b.try_read_lock("rw:scoped", TTL).await.expect("shared");
            let w = b.try_write_lock("rw:scoped", TTL).await;
            r.release().await.expect("release");
            is_held(&w)
        })
        .await
        .expect("with_read_lock");
    assert!(seen, "a writer got in during a scoped read");
    let b2 = b.clone();
    let token = a
        .with_write_lock("rw:scoped", TTL, Watchdog::new(), |ctx| async move {
            (
                is_held(&b2.try_read_lock("rw:scoped", TTL).await),
                ctx.fencing_token(),
            )
        })
        .await
        .expect("with_write_lock");
    assert_eq!(token, (true, None));
    b.try_write_lock("rw:scoped", TTL)
        .await
        .expect("released after the scope")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_fencing_tokens_rise() {
    let c = cluster3().await;
    let a = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(250))
        .fencing(true)
        .build()
        .await
        .expect("build");
    let mut last = 0;
    for round in 0..5 {
        let w = a.try_write_lock("rw:fence", TTL).await.expect("writer");
        let t = w.fencing_token().expect("fencing is on");
        assert!(t > last, "round {round}: token {t} after {last}");
        last = t;
        w.release().await.expect("release");
        let r = a.try_read_lock("rw:fence", TTL).await.expect("reader");
        assert_eq!(r.fencing_token(), None, "readers carry no token");
        r.release().await.expect("release");
    }
    // The last token was committed to the writer's own counter on a quorum (the commit
    // counts once a quorum confirmed; a minority may have seen the release first), and
    // the mutex's counter of the same name was never touched.
    assert!(a.flush(Duration::from_secs(2)).await);
    let mut committed = 0;
    for i in 0..3 {
        let mut conn = raw(&c, i).await;
        let counter: Option<u64> = conn.get("quorumlock:rwfence:rw:fence").await.expect("GET");
        committed += usize::from(counter.is_some_and(|v| v >= last));
        let mutex: bool = conn
            .exists("quorumlock:fence:rw:fence")
            .await
            .expect("EXISTS");
        assert!(!mutex, "node {i}: the mutex's counter is untouched");
    }
    assert!(committed >= 2, "committed on {committed} of 3 nodes");
}

/// A steady stream of readers (each holding briefly, always overlapping another) would
/// keep a writer out forever without writer preference. The waiting writer's intent makes
/// new readers wait, so it gets in within bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_gets_in_under_a_stream_of_readers() {
    let c = cluster3().await;
    let urls = c.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let writer_waiting = Arc::new(AtomicBool::new(false));
    let refused_while_waiting = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let locks = client(&urls).await;
        let (stop, waiting) = (stop.clone(), writer_waiting.clone());
        let (refused, granted) = (refused_while_waiting.clone(), granted.clone());
        readers.push(tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                match locks
                    .try_read_lock("rw:stream", Duration::from_secs(2))
                    .await
                {
                    Ok(r) => {
                        granted.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(60)).await;
                        let _ = r.release().await;
                    }
                    Err(e) if e.is_held() && waiting.load(Ordering::SeqCst) => {
                        refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    // Let the stream establish itself: readers overlap, so the lock is never free.
    assert!(
        eventually(Duration::from_secs(5), || async {
            granted.load(Ordering::SeqCst) >= 10
        })
        .await,
        "the readers did not start"
    );
    let w_client = client(&urls).await;
    assert!(
        is_held(&w_client.try_write_lock("rw:stream", TTL).await),
        "no intent: readers keep it busy"
    );
    writer_waiting.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let w = w_client
        .write_lock("rw:stream", TTL)
        .await
        .expect("the waiting writer gets in");
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(
        refused_while_waiting.load(Ordering::SeqCst) > 0,
        "new readers were refused while the writer's intent was live"
    );
    stop.store(true, Ordering::SeqCst);
    w.release().await.expect("release the writer");
    for r in readers {
        r.await.expect("reader task");
    }
}

/// Whether the sorted set `key` has a member on every node within 3 s.
async fn on_every_node(c: &LocalCluster, key: &str) -> bool {
    eventually(Duration::from_secs(3), || async {
        zcards(c, key).await.iter().all(|n| *n > 0)
    })
    .await
}

/// A waiting writer that is cancelled stops blocking readers: its intent is removed in
/// the background, and would lapse within the intent lease anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiting_writer_stops_blocking_readers() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let reader = a.try_read_lock("rw:cancel", TTL).await.expect("reader");
    // The read lock is decided at a quorum; wait until the slowest node has the reader
    // too, or the writer's attempt could be granted there (no reader yet), never leave an
    // intent there, and keep winning that node and cleaning it up while it waits.
    assert!(
        on_every_node(&c, &readers_key("rw:cancel")).await,
        "the reader is on every node"
    );
    let waiting = tokio::spawn(async move { b.write_lock("rw:cancel", TTL).await });
    // The intent is registered on every node once the writer's first attempt is refused.
    assert!(
        on_every_node(&c, &intent_key("rw:cancel")).await,
        "the waiting writer's intent is on every node"
    );
    // Its intent's key expires with the lease (PEXPIREAT max score, not -1).
    let pttl: i64 = raw(&c, 0)
        .await
        .pttl(intent_key("rw:cancel"))
        .await
        .expect("PTTL");
    assert!(
        pttl > 0 && pttl <= quorumlock::QUEUE_LEASE.as_millis() as i64,
        "PTTL {pttl}"
    );
    assert!(
        is_held(&a.try_read_lock("rw:cancel", TTL).await),
        "new readers wait behind the writer"
    );
    waiting.abort();
    let _ = waiting.await;
    let start = Instant::now();
    let limit = quorumlock::QUEUE_LEASE + Duration::from_secs(1);
    let mut second = None;
    while start.elapsed() < limit {
        if let Ok(r) = a.try_read_lock("rw:cancel", TTL).await {
            second = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = second.expect("readers get in again within the intent lease");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "removed in the background, not by lapsing: {:?}",
        start.elapsed()
    );
    second.release().await.expect("release");
    reader.release().await.expect("release");
}

/// A waiting writer's intent stays live even when its retry policy waits longer than the
/// intent's lease between attempts: a waiting writer tries again within a third of the
/// lease, renewing the intent. So a reader that comes after the first lease would have
/// lapsed is still refused, and the writer gets in within a third of the lease of the
/// last reader leaving (not after the policy's 4 to 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_renews_its_intent_under_a_slow_retry_policy() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let slow = Redlock::builder(c.urls())
        .node_timeout(Duration::from_millis(250))
        .retry(
            Retry::new()
                .delay(Duration::from_secs(4), Duration::from_secs(5))
                .max_wait(Duration::from_secs(20)),
        )
        .build()
        .await
        .expect("build");
    let name = "rw:slow-retry";
    let reader = a.try_read_lock(name, TTL).await.expect("reader");
    let waiting = tokio::spawn(async move {
        let w = slow.write_lock(name, TTL).await;
        (w, Instant::now())
    });
    assert!(
        eventually(Duration::from_secs(3), || async {
            let mut n = 0;
            for i in 0..3 {
                let live: usize = raw(&c, i)
                    .await
                    .zcard(intent_key(name))
                    .await
                    .expect("ZCARD");
                n += usize::from(live > 0);
            }
            n == 3
        })
        .await,
        "the waiting writer's intent is on every node"
    );
    // Past the first lease: without a renewal the intent would have lapsed by now.
    tokio::time::sleep(quorumlock::QUEUE_LEASE + Duration::from_millis(700)).await;
    assert!(
        is_held(&a.try_read_lock(name, TTL).await),
        "the intent was renewed: new readers still wait behind the writer"
    );
    let released = Instant::now();
    reader.release().await.expect("release the reader");
    let (w, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer is done within the policy's wait")
        .expect("writer task");
    let w = w.expect("the waiting writer gets in");
    let after = at.saturating_duration_since(released);
    assert!(
        after < Duration::from_secs(3),
        "the writer tried again {after:?} after the reader left: its delays are capped at a third of the lease"
    );
    w.release().await.expect("release the writer");
}

/// One client's watchdog keeps a mutex, a reader, a writer and a semaphore permit in the
/// same pipelined rounds (one extension script per kind in each node's pipeline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watchdog_keeps_every_kind_at_once() {
    let c = cluster3().await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let ttl = Duration::from_millis(400);
    let w = Watchdog::new();
    let kept = [
        a.try_lock("mix:m", ttl)
            .await
            .expect("mutex")
            .keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
        a.try_read_lock("mix:r", ttl)
            .await
            .expect("reader")
            .keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
        a.try_write_lock("mix:w", ttl)
            .await
            .expect("writer")
            .keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
        a.semaphore("mix:s", 1)
            .expect("semaphore")
            .try_acquire(ttl)
            .await
            .expect("permit")
            .keep_alive(w)
            .expect("a watchdog policy that fits the TTL"),
    ];
    tokio::time::sleep(ttl * 3).await;
    assert!(
        kept.iter()
            .all(|k| !k.is_lost() && k.remaining() > Duration::ZERO)
    );
    assert!(is_held(&b.try_lock("mix:m", ttl).await));
    assert!(is_held(&b.try_write_lock("mix:r", ttl).await));
    assert!(is_held(&b.try_read_lock("mix:w", ttl).await));
    let s = b.semaphore("mix:s", 1).expect("semaphore");
    assert!(is_held(&s.try_acquire(ttl).await));
    for k in kept {
        k.release().await.expect("release");
    }
    assert!(a.flush(Duration::from_secs(2)).await);
    s.try_acquire(ttl)
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
}
