//! Read-write locks and semaphores under exact interleavings: an extension or a watchdog
//! round racing a permit's give-back, a kept node dying, and very long or refused TTLs.
//! Each test sets up one interleaving against real redis-server processes and asserts the
//! safety invariant the proofs in `docs/safety.md` rely on.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{Error, LostReason, Redlock};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use support::{client, node_ms, proxied, raw};

const FLUSH: Duration = Duration::from_secs(5);

/// The nodes among `nodes` where `member` is a live member of `key` (score > node now).
async fn live_on(c: &LocalCluster, nodes: &[usize], key: &str, member: &str) -> Vec<usize> {
    let mut on = Vec::new();
    for &i in nodes {
        let now = node_ms(c, i).await;
        let score: Option<f64> = raw(c, i).await.zscore(key, member).await.expect("ZSCORE");
        if score.is_some_and(|s| s > now as f64) {
            on.push(i);
        }
    }
    on
}

/// Loads every script on every node (an `EVALSHA` that meets `NOSCRIPT` costs a second
/// round trip, which would skew the timings of a delayed link), and the connections.
async fn warm_up(a: &Redlock) {
    let s = a.semaphore("rwsem:warm-up", 3).expect("semaphore");
    let mut p = s.try_acquire(Duration::from_secs(5)).await.expect("permit");
    p.extend(Duration::from_secs(5)).await.expect("extend");
    p.release().await.expect("release");
    let mut r = a
        .try_read_lock("rwsem:warm-up", Duration::from_secs(5))
        .await
        .expect("read");
    r.extend(Duration::from_secs(5)).await.expect("extend");
    r.release().await.expect("release");
    let mut w = a
        .try_write_lock("rwsem:warm-up", Duration::from_secs(5))
        .await
        .expect("write");
    w.extend(Duration::from_secs(5)).await.expect("extend");
    w.release().await.expect("release");
    assert!(a.flush(FLUSH).await);
}

/// A permit extended while its give-back is still waiting for a slow node must not count
/// the grant it is about to give back: an extension that reached a quorum with a node
/// whose entry the give-back then removes leaves the holder believing itself valid for the
/// new TTL while fewer than `Q` of its entries live that long. (With N = 5, P = 3, c = 2,
/// Q = 3 one such holder left with one entry plus three fresh ones are four holders of
/// three permits.)
///
/// Interleaving (N = 3, P = 3, c = 2, Q = 2; another holder's entry on node 1):
/// nodes 0 (load 1) and 1 (load 2) grant at once, node 2 is slow; the permit is returned;
/// the link to node 0 is cut. The extension waits for the give-back, decided when node 2's
/// grant (load 1) lands: it keeps nodes 0 and 2 (least loaded) and removes node 1's entry.
/// The extension then counts nodes 0 and 2 only, and fails (node 0 is cut) instead of
/// succeeding on nodes 1 and 2. Once the link heals, it succeeds on both kept nodes; after the first
/// TTL the holder is valid with live entries on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_racing_the_give_back_keeps_a_quorum_of_entries() {
    let c = proxied(3).await;
    let a = client(c.urls(), Duration::from_secs(2), false).await;
    let name = "rwsem:giveback";
    let key = format!("quorumlock:sem:{name}");
    let s = a.semaphore(name, 3).expect("semaphore");
    assert_eq!((s.per_node_limit(), s.quorum()), (2, 2));
    warm_up(&a).await;
    // Another holder's entry on node 1 (as a permit kept there would be).
    let now = node_ms(&c, 1).await;
    let mut conn = raw(&c, 1).await;
    let _: () = conn
        .zadd(&key, "other-holder", now + 60_000)
        .await
        .expect("ZADD");
    let _: () = conn
        .pexpire_at(&key, (now + 60_000) as i64)
        .await
        .expect("PEXPIREAT");
    // Node 2 is slow: its grant lands after the permit is returned.
    c.delay(2, Duration::from_millis(300)).expect("delay");
    let ttl = Duration::from_millis(4000);
    let started = Instant::now();
    let mut permit = s.try_acquire(ttl).await.expect("permit on nodes 0 and 1");
    c.disconnect(0).await.expect("cut node 0");
    let first = permit.extend(Duration::from_secs(10)).await;
    assert!(
        matches!(first, Err(Error::NoQuorum(_))),
        "the kept nodes are 0 and 2, and node 0 is cut: {first:?}"
    );
    // The give-back (decided before the extension was sent) removed node 1's entry.
    let given_back = support::eventually(FLUSH, || async {
        let score: Option<f64> = raw(&c, 1)
            .await
            .zscore(&key, permit.token())
            .await
            .expect("ZSCORE");
        score.is_none()
    })
    .await;
    assert!(given_back, "node 1's entry was given back");
    c.reconnect(0).await.expect("heal node 0");
    c.reconnect(2).await.expect("node 2 fast again");
    // The healed link's first request may meet the reset connection: a few tries.
    let mut extended = false;
    for _ in 0..10 {
        if permit.extend(Duration::from_secs(10)).await.is_ok() {
            extended = true;
            break;
        }
    }
    assert!(extended, "extended on the kept nodes once node 0 is back");
    // The first TTL has passed on every node.
    let wait = (ttl + Duration::from_millis(500)).saturating_sub(started.elapsed());
    tokio::time::sleep(wait).await;
    assert!(permit.is_valid(), "the holder holds its permit");
    let live = live_on(&c, &[0, 1, 2], &key, permit.token()).await;
    assert!(
        live.len() >= s.quorum(),
        "a valid permit has live entries on {live:?} only, fewer than Q = {}",
        s.quorum()
    );
    assert_eq!(live, [0, 2], "the kept nodes");
}

/// The watchdog's form of the race: a kept permit whose first round falls before its
/// give-back is decided. N = 5, P = 3 (c = 2, Q = 3); other holders on nodes 1, 2 and 3,
/// node 4 slow. The permit is granted at once by nodes 0 to 3 and keeps nodes 0 and 4
/// (load 1) and one of 1 to 3 (load 2); the link to node 0 is cut. Counting the three
/// fast nodes would extend it while the give-back removes two of their entries and node
/// 0's lapses: a valid holder on two nodes. Sampled throughout: whenever the kept permit
/// is valid (before and after each sample), its token is live on at least `Q` nodes; and
/// it reports `lost` before its deadline (unless node 0's grant was cut off on its way
/// back: then node 0 is not kept, and the permit lives on its other kept nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_racing_the_give_back_keeps_a_quorum_of_entries() {
    let c = proxied(5).await;
    let a = client(c.urls(), Duration::from_secs(2), false).await;
    let name = "rwsem:giveback-watchdog";
    let key = format!("quorumlock:sem:{name}");
    let s = a.semaphore(name, 3).expect("semaphore");
    assert_eq!((s.per_node_limit(), s.quorum()), (2, 3));
    warm_up(&a).await;
    for i in 1..=3 {
        let now = node_ms(&c, i).await;
        let mut conn = raw(&c, i).await;
        let _: () = conn
            .zadd(&key, "other-holder", now + 60_000)
            .await
            .expect("ZADD");
        let _: () = conn
            .pexpire_at(&key, (now + 60_000) as i64)
            .await
            .expect("PEXPIREAT");
    }
    c.delay(4, Duration::from_millis(300)).expect("delay");
    let ttl = Duration::from_millis(3000);
    let permit = s.try_acquire(ttl).await.expect("permit on nodes 0 to 3");
    let tok = permit.token().to_owned();
    c.disconnect(0).await.expect("cut node 0");
    // Due at once (5 % of the TTL left to refresh), lost 100 ms before the deadline (a
    // margin the test's own wake-up on a loaded 2-core machine fits in; 10 ms did not,
    // once in a full run).
    let kept = permit
        .keep_alive(
            quorumlock::Watchdog::new()
                .refresh_at(0.95)
                .safety_margin(Duration::from_millis(100)),
        )
        .expect("a watchdog policy that fits the TTL");
    let ctx = kept.context();
    let mut lost = std::pin::pin!(kept.lost());
    let end = Instant::now() + ttl + Duration::from_secs(2);
    let mut samples = 0;
    let fired = loop {
        let until = Instant::now() + ctx.remaining();
        let live = live_on(&c, &[0, 1, 2, 3, 4], &key, &tok).await;
        if !ctx.is_lost() && Instant::now() < until {
            samples += 1;
            assert!(
                live.len() >= s.quorum(),
                "a valid kept permit has live entries on {live:?} only, fewer than Q = {}",
                s.quorum()
            );
        }
        if Instant::now() > end {
            break None;
        }
        tokio::select! {
            e = &mut lost => break Some(e),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    };
    assert!(samples > 10, "sampled {samples} times while valid");
    match fired {
        // Node 0 kept (the usual case): no extension can reach all three kept nodes.
        Some(e) => {
            assert!(
                matches!(e.reason(), LostReason::NotHeld | LostReason::ExtendFailed),
                "{e:?}"
            );
            assert!(
                kept.remaining() > Duration::ZERO,
                "lost was reported before the deadline"
            );
        }
        // Node 0's grant was still on its way when the link was cut: it timed out, was
        // given back, and the permit lives on its three other kept nodes.
        None => {
            let live = live_on(&c, &[0, 1, 2, 3, 4], &key, &tok).await;
            assert!(kept.remaining() > Duration::ZERO, "still kept");
            assert!(
                live.len() >= s.quorum() && !live.contains(&0),
                "kept without node 0, on {live:?}"
            );
        }
    }
}

/// A kept permit whose kept node is killed reports `lost` before its deadline: it is
/// extended only while all `Q` of its kept nodes confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_permit_reports_lost_before_its_deadline_when_a_kept_node_dies() {
    let c = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes");
    let a = client(c.urls(), Duration::from_millis(200), false).await;
    let name = "rwsem:kept-node-killed";
    let key = format!("quorumlock:sem:{name}");
    let s = a.semaphore(name, 3).expect("semaphore");
    let permit = s.try_acquire(Duration::from_secs(2)).await.expect("permit");
    assert!(a.flush(FLUSH).await, "the give-back is done");
    let on = live_on(&c, &[0, 1, 2], &key, permit.token()).await;
    assert_eq!(on.len(), s.quorum(), "kept on exactly Q nodes: {on:?}");
    let kept = permit
        .keep_alive(quorumlock::Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    c.kill(on[0]).await.expect("kill a kept node");
    let e = tokio::time::timeout(Duration::from_secs(5), kept.lost())
        .await
        .expect("lost within the TTL");
    assert!(
        matches!(e.reason(), LostReason::NotHeld | LostReason::ExtendFailed),
        "{e:?}"
    );
    assert!(
        kept.remaining() > Duration::ZERO,
        "lost was reported before the deadline"
    );
}

/// A TTL the client accepts (the builder allows a maximum up to `i64::MAX / 2` ms) but
/// whose expiry, `now + ttl`, Redis formats as `1.0…e+17`: `read_acquire.lua` adds the
/// reader, then `PEXPIREAT` refuses the score text and the script errors after its write.
/// The mutex takes the same TTL (`SET … PX`). Either both kinds work, or the client
/// refuses the TTL up front: a node failure is neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_ttl_the_mutex_accepts_is_not_a_node_failure_for_readers() {
    let c = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes");
    let a = Redlock::builder(c.urls())
        .max_ttl(Duration::from_millis(i64::MAX as u64 / 2))
        .build()
        .await
        .expect("build");
    let ttl = Duration::from_millis(100_000_000_000_000_000);
    let mutex = a.try_lock("rwsem:long-ttl", ttl).await;
    let reader = a.try_read_lock("rwsem:long-ttl", ttl).await;
    match (&mutex, &reader) {
        (Ok(_), Ok(_)) => {}
        (Err(Error::InvalidInput(_)), Err(Error::InvalidInput(_))) => {}
        _ => panic!("mutex: {mutex:?}; reader: {reader:?}"),
    }
}

/// The same long TTL through every sorted-set script: a reader extended and released, a
/// permit acquired, extended and released, a waiting writer's intent. Every key each
/// leaves behind expires at an integral millisecond (`PEXPIRETIME` answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_ttl_works_for_every_sorted_set_script() {
    let c = LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes");
    let a = Redlock::builder(c.urls())
        .max_ttl(Duration::from_millis(i64::MAX as u64 / 2))
        .build()
        .await
        .expect("build");
    let long = Duration::from_millis(100_000_000_000_000_000);
    let name = "rwsem:long-ttl-all";
    let mut r = a.try_read_lock(name, long).await.expect("reader");
    r.extend(long).await.expect("extend the reader");
    let mut p = a
        .semaphore(name, 3)
        .expect("semaphore")
        .try_acquire(long)
        .await
        .expect("permit");
    p.extend(long).await.expect("extend the permit");
    // A waiting writer registers its intent (the readers' set holds it out) and gives up.
    let b = Redlock::builder(c.urls())
        .max_ttl(Duration::from_millis(i64::MAX as u64 / 2))
        .retry(quorumlock::Retry::new().max_wait(Duration::from_millis(300)))
        .build()
        .await
        .expect("build");
    let w = b.write_lock(name, long).await;
    assert!(
        matches!(w, Err(Error::Timeout(_))),
        "the writer waits while the reader holds: {w:?}"
    );
    for key in [
        format!("quorumlock:readers:{name}"),
        format!("quorumlock:sem:{name}"),
        format!("quorumlock:semcfg:{name}"),
    ] {
        let mut on = 0;
        for i in 0..3 {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut raw(&c, i).await)
                .await
                .expect("PEXPIRETIME");
            // -2: no such key (a permit's surplus entry was given back).
            if at != -2 {
                on += 1;
                assert!(
                    at > 100_000_000_000_000_000,
                    "{key} on node {i} expires at {at}"
                );
            }
        }
        assert!(on >= 2, "{key} is on {on} nodes, fewer than the quorum");
    }
    r.release().await.expect("release the reader");
    p.release().await.expect("release the permit");
    let w = a
        .try_write_lock(name, long)
        .await
        .expect("the writer, alone");
    w.release().await.expect("release the writer");
}

/// A sorted-set script that refuses its arguments writes nothing: each is run by hand
/// with a TTL whose expiry is beyond what `PEXPIREAT` takes (the client never sends one),
/// on a node that already holds other entries, and the keyspace is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_ttl_leaves_no_partial_write() {
    let c = LocalCluster::launch(1)
        .await
        .expect("start redis-server nodes");
    let mut conn = raw(&c, 0).await;
    // (script, keys, arguments); "k:w" is a writer key (absent), the others sorted sets.
    let scripts = [
        (
            include_str!("../src/scripts/read_acquire.lua"),
            vec!["k:w", "k:z", "k:i"],
            vec!["tok", "1e19"],
        ),
        (
            include_str!("../src/scripts/read_acquire.lua"),
            vec!["k:w", "k:z", "k:i"],
            vec!["tok", "1.5"],
        ),
        (
            include_str!("../src/scripts/sem_acquire.lua"),
            vec!["k:z", "k:f"],
            vec!["tok", "1e19", "3:2:2:3", "2"],
        ),
        (
            include_str!("../src/scripts/shared_extend.lua"),
            vec!["k:z", "k:f"],
            vec!["old", "1e19"],
        ),
        (
            include_str!("../src/scripts/write_acquire.lua"),
            vec!["k:w", "k:z", "k:i", "k:f"],
            vec!["tok", "1000", "intent", "1e19", "0"],
        ),
    ];
    for (src, keys, args) in scripts {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("FLUSHALL");
        // A lapsed entry and a live one in each set (the live reader holds the writer out).
        for key in ["k:z", "k:i"] {
            let _: () = redis::cmd("ZADD")
                .arg(key)
                .arg(1)
                .arg("lapsed")
                .arg(i64::MAX / 4)
                .arg("old")
                .query_async(&mut conn)
                .await
                .expect("ZADD");
        }
        let before = dump(&mut conn).await;
        let r: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(src)
            .arg(keys.len())
            .arg(&keys)
            .arg(&args)
            .query_async(&mut conn)
            .await;
        assert!(r.is_err(), "{args:?}: refused, got {r:?}");
        assert_eq!(
            dump(&mut conn).await,
            before,
            "{args:?} wrote before refusing"
        );
    }
}

/// Every key of the node with its members and scores (as text) and its expiry.
async fn dump(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, String, i64)> {
    let mut keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let members: Vec<String> = conn.zrange_withscores(&k, 0, -1).await.unwrap_or_default();
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(&k)
            .query_async(conn)
            .await
            .expect("PEXPIRETIME");
        out.push((k, members.join(","), at));
    }
    out
}
