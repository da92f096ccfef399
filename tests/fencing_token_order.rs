//! The order and uniqueness of fencing tokens against real Redis servers: where the clock
//! floor's assumption really lies (a clock that once ran ahead), counters that Lua reads as
//! numbers but `INCR` refuses, and cancellation between the two rounds.
#![cfg(feature = "testkit")]

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;
use redis::AsyncCommands;
use support::{del_on, fence_key, lock_key, raw};

const NODES: usize = 5;

async fn cluster() -> LocalCluster {
    LocalCluster::launch(NODES)
        .await
        .expect("launch redis-server")
}

async fn fenced(cluster: &LocalCluster) -> Redlock {
    support::client(cluster.urls(), Duration::from_millis(150), true).await
}

/// Microseconds since the Unix epoch by this machine's clock (the nodes' clock too: they
/// run here).
fn now_us() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn set_on(cluster: &LocalCluster, nodes: &[usize], key: &str, value: &str) {
    for &i in nodes {
        let mut c = raw(cluster, i).await;
        let _: () = c.set(key, value).await.unwrap();
    }
}

/// `try_lock` a few times: a request to a freshly restarted node may find the connection
/// the restart broke (the client reconnects on the next one). A refusal because the lock
/// is held is never retried.
async fn try_lock_retrying(
    locks: &Redlock,
    name: &str,
    ttl: Duration,
) -> Result<quorumlock::Lock, quorumlock::Error> {
    let mut got = locks.try_lock(name, ttl).await;
    for _ in 0..5 {
        match &got {
            Ok(_) => break,
            Err(e) if e.is_held() => break,
            Err(_) => got = locks.try_lock(name, ttl).await,
        }
    }
    got
}

/// The clock floor's real assumption is about every clock reading that ever went into a
/// token, not about the clocks at the time of the restart.
///
/// Node 0's clock runs one hour fast while it grants holder A (simulated: its counter
/// holds exactly the value its fast `TIME` would have written), and is then stepped back
/// to the right time; it keeps its counter, which by itself is harmless. A's commit puts
/// that hour-ahead token on nodes 1 and 2 too. Later node 2 crashes and is restarted
/// without persistence after more than the TTL: at that moment every node's clock is
/// right, so "the restarted node's clock is not behind any other node's clock by the
/// downtime or more" holds. Yet B, granted by {2, 3, 4}, gets a token an hour *below*
/// A's: node 2's floor is today's clock, and nodes 3 and 4 never saw A.
///
/// This pins the limit: the assumption must read "no clock ever reads ahead of true time
/// by more than the restart delay allows, even briefly, and a restarted node's clock is
/// right before it serves". A clock that ran ahead and was stepped back, or a host that
/// starts `redis-server` before its clock is synchronised, breaks fencing after a later
/// delayed restart of another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_that_once_ran_ahead_breaks_order_after_a_later_delayed_restart() {
    let cluster = cluster().await;
    let locks = fenced(&cluster).await;
    let ttl = Duration::from_millis(500);
    let name = "skew";
    let hour_ahead = now_us() + 3_600_000_000;

    // A is granted by {0, 1, 2} only (3 and 4 hold someone else's key), while node 0's
    // clock reads an hour ahead.
    set_on(&cluster, &[3, 4], &lock_key(name), "someone-else").await;
    set_on(&cluster, &[0], &fence_key(name), &hour_ahead.to_string()).await;
    let a = locks.try_lock(name, ttl).await.unwrap();
    let ta = a.fencing_token().unwrap();
    assert!(
        ta >= hour_ahead,
        "A's token {ta} should carry node 0's fast clock"
    );
    a.release().await.unwrap();
    del_on(&cluster, &[3, 4], &[lock_key(name)]).await;

    // Node 2 crashes and comes back empty after more than the TTL; every clock is right.
    cluster
        .restart(2, ttl + Duration::from_millis(200))
        .await
        .unwrap();
    // Nodes 0 and 1 stall: {2, 3, 4} is the only quorum that answers.
    cluster.pause(0).await.unwrap();
    cluster.pause(1).await.unwrap();
    let got = try_lock_retrying(&locks, name, ttl).await;
    cluster.resume(0).await.unwrap();
    cluster.resume(1).await.unwrap();
    let b = got.expect("{2, 3, 4} answered");
    let tb = b.fencing_token().unwrap();
    b.release().await.unwrap();
    eprintln!(
        "clock once ahead by 1 h, later delayed restart of another node: A {ta}, B {tb} ({} s below)",
        ta.saturating_sub(tb) / 1_000_000
    );
    // The documented limit: the token went backwards by about the hour node 0 ran ahead.
    assert!(
        tb < ta,
        "expected the token to go backwards (a clock that ran ahead is outside the assumption): {tb} after {ta}"
    );
}

/// A counter that Lua's `tonumber` reads as an integer but that `INCR` refuses (`1e16`)
/// passes the script's check; the script then sets the lock keys and raises the first
/// resource's counter before `INCR` fails on the second (resources are taken in name
/// order: `ok`, then `zz-bad`). The node fails its vote, as it
/// should, but not "without any write": `fence:ok` is left raised on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_incr_refuses_fails_the_vote_without_any_write() {
    let cluster = cluster().await;
    let locks = fenced(&cluster).await;
    let ttl = Duration::from_secs(2);
    let all: Vec<usize> = (0..NODES).collect();
    set_on(&cluster, &all, &fence_key("zz-bad"), "1e16").await;
    let err = locks
        .try_lock_many(["ok", "zz-bad"], ttl)
        .await
        .expect_err("a token from a counter INCR refuses");
    assert!(!err.is_held(), "{err}");
    for i in 0..NODES {
        let mut c = raw(&cluster, i).await;
        let ok: Option<String> = c.get(fence_key("ok")).await.unwrap();
        let bad: String = c.get(fence_key("zz-bad")).await.unwrap();
        assert_eq!((ok, bad.as_str()), (None, "1e16"), "node {i}");
    }
}

/// Above 2^53 a Lua number cannot hold every integer: `INCR` returns 2^53 + 3, Lua rounds
/// it to 2^53 + 4 and hands that out; the next holder's `INCR` really gives 2^53 + 4, and
/// two successive holders share a token. Counters at or above 2^53 (only reachable by a
/// clock centuries ahead or a counter written by hand) must fail the node's vote instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_above_2_pow_53_never_repeat_a_token() {
    let cluster = cluster().await;
    let locks = fenced(&cluster).await;
    let ttl = Duration::from_secs(2);
    let all: Vec<usize> = (0..NODES).collect();
    let above: u64 = (1 << 53) + 2;
    set_on(&cluster, &all, &fence_key("huge"), &above.to_string()).await;
    let mut last = 0;
    for round in 0..3 {
        match locks.try_lock("huge", ttl).await {
            Ok(l) => {
                let t = l.fencing_token().unwrap();
                l.release().await.unwrap();
                assert!(t > last, "holder {round}: token {t} after {last}");
                last = t;
            }
            Err(e) => assert!(!e.is_held(), "{e}"),
        }
    }
    for i in 0..NODES {
        let mut c = raw(&cluster, i).await;
        let key: Option<String> = c.get(lock_key("huge")).await.unwrap();
        assert_eq!(key, None, "node {i} kept a lock key");
    }
}

/// The acquisition is cancelled (its future dropped) while the commit waits on a node
/// that stalled between the rounds. The stalled node later applies the stale commit
/// (our key is still there, so it raises its counter: harmless, counters only rise),
/// then the clean-up's release queued behind it: no lock key is left anywhere, and the
/// next holder's token is above every token issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_during_the_commit_leaves_no_key_and_tokens_keep_rising() {
    let cluster = support::cluster5().await;
    let locks = support::client(cluster.urls(), Duration::from_millis(1500), true).await;
    let ttl = Duration::from_secs(10);
    let name = "cancel";
    // Warm every connection up (and load the scripts) before the links are slowed.
    let l = locks.try_lock(name, ttl).await.unwrap();
    let t0 = l.fencing_token().unwrap();
    l.release().await.unwrap();

    // Only {0, 1, 2} can grant; 0 and 1 are slow, so node 2 grants first and is paused
    // before the commit reaches it. The commit then needs node 2, and the caller gives up.
    set_on(&cluster, &[3, 4], &lock_key(name), "someone-else").await;
    cluster.delay(0, Duration::from_millis(150)).unwrap();
    cluster.delay(1, Duration::from_millis(150)).unwrap();
    let attempt = {
        let locks = locks.clone();
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(1000), locks.try_lock(name, ttl)).await
        })
    };
    let granted = support::eventually(Duration::from_secs(2), || async {
        support::get(&cluster, 2, &lock_key(name)).await.is_some()
    })
    .await;
    assert!(granted, "node 2 never granted");
    cluster.pause(2).await.unwrap();
    let outcome = attempt.await.unwrap();
    // The commit on 0 and 1 landed before the caller gave up: their counters carry t.
    let c0 = support::get(&cluster, 0, &fence_key(name)).await;
    cluster.resume(2).await.unwrap();
    cluster.delay(0, Duration::ZERO).unwrap();
    cluster.delay(1, Duration::ZERO).unwrap();
    if let Ok(r) = outcome {
        panic!(
            "the attempt finished without node 2's confirmation: {:?}",
            r.map(|l| l.fencing_token())
        );
    }
    assert!(
        locks.flush(Duration::from_secs(5)).await,
        "clean-up never finished"
    );
    let ours_gone = support::eventually(Duration::from_secs(5), || async {
        support::count_key(&cluster, [0, 1, 2], &lock_key(name)).await == 0
    })
    .await;
    assert!(ours_gone, "the cancelled attempt left a lock key");
    let c2 = support::get(&cluster, 2, &fence_key(name)).await;
    eprintln!("cancelled during the commit: node 0 counter {c0:?}, node 2 counter {c2:?}");
    assert_eq!(
        c0, c2,
        "the stale commit should have raised node 2 to t as well"
    );

    del_on(&cluster, &[3, 4], &[lock_key(name)]).await;
    let l = locks.lock(name, ttl).await.unwrap();
    let t = l.fencing_token().unwrap();
    assert!(t > t0, "{t} after {t0}");
    l.release().await.unwrap();
}

/// Two attempts that overlap in time are ordered by the moment they return. B starts
/// first and is granted by {0, 1, 2} at once, but its commit confirmation from node 2
/// comes back only after B's TTL. Meanwhile B's keys on 0 and 1 expire and A (another
/// client, direct links) is granted by {0, 1, 3, 4}, commits, and returns with `t_A`.
/// B's token was computed before A's grants, so it is smaller: B must not return a lock
/// after A did. It does not: its validity is measured over both rounds, and none is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlapping_attempt_returning_after_a_later_grant_gets_no_lock() {
    let cluster = support::cluster5().await;
    let b = support::client(cluster.urls(), Duration::from_secs(4), true).await;
    let direct: Vec<String> = (0..NODES).map(|i| cluster.direct_url(i).unwrap()).collect();
    let a = Redlock::builder(direct)
        .node_timeout(Duration::from_millis(300))
        .fencing(true)
        .build()
        .await
        .expect("build client A");
    let ttl = Duration::from_secs(2);
    let name = "overlap";
    // Warm B's connections up (and load the scripts) before the links are slowed.
    let l = b.try_lock(name, ttl).await.unwrap();
    l.release().await.unwrap();

    set_on(&cluster, &[3, 4], &lock_key(name), "someone-else").await;
    cluster.delay(0, Duration::from_millis(150)).unwrap();
    cluster.delay(1, Duration::from_millis(150)).unwrap();
    let attempt_b = tokio::spawn(async move {
        let r = b.try_lock(name, ttl).await;
        (r, std::time::Instant::now())
    });
    let granted = support::eventually(Duration::from_secs(2), || async {
        support::get(&cluster, 2, &lock_key(name)).await.is_some()
    })
    .await;
    assert!(granted, "node 2 never granted B");
    // B's commit to node 2 (sent once 0 and 1 granted) lands within B's TTL, but its
    // answer comes back after it.
    cluster.delay(2, Duration::from_millis(1200)).unwrap();
    let b_decided = support::eventually(Duration::from_secs(2), || async {
        support::count_key(&cluster, [0, 1], &lock_key(name)).await == 2
    })
    .await;
    assert!(b_decided, "nodes 0 and 1 never granted B");
    del_on(&cluster, &[3, 4], &[lock_key(name)]).await;

    // A: granted by {0, 1, 3, 4} once B's keys on 0 and 1 expired.
    let mut got_a = None;
    for _ in 0..100 {
        if let Ok(l) = a.try_lock(name, ttl).await {
            got_a = Some((l.fencing_token().unwrap(), std::time::Instant::now(), l));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ta, a_returned, la) = got_a.expect("A never got the lock");
    let (rb, b_returned) = attempt_b.await.unwrap();
    cluster.delay(0, Duration::ZERO).unwrap();
    cluster.delay(1, Duration::ZERO).unwrap();
    cluster.delay(2, Duration::ZERO).unwrap();
    eprintln!(
        "overlapping attempts: A {ta} returned {:?} before B's outcome {:?}",
        b_returned.saturating_duration_since(a_returned),
        rb.as_ref().map(|l| l.fencing_token())
    );
    if let Ok(lb) = &rb {
        let tb = lb.fencing_token().unwrap();
        assert!(
            b_returned < a_returned || tb > ta,
            "B returned after A with a smaller token: {tb} after {ta} (B's remaining {:?})",
            lb.remaining()
        );
    }
    assert!(
        rb.is_err(),
        "B's attempt outlived its TTL and still returned a lock"
    );
    // A's lock may have expired meanwhile (B's failed attempt waits for its clean-up).
    drop(la);
}

/// A's whole commit quorum ({0, 1, 2}: 3 and 4 refused A) crashes at once and comes
/// back empty after more than the TTL; nodes 3 and 4 never saw a counter. No node
/// remembers anything, and B's token still rises: every floor is a clock reading taken
/// after A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_commit_quorum_restarted_at_once_keeps_tokens_rising() {
    let cluster = cluster().await;
    let locks = fenced(&cluster).await;
    let ttl = Duration::from_millis(500);
    let name = "quorum-lost";
    set_on(&cluster, &[3, 4], &lock_key(name), "someone-else").await;
    let a = locks.try_lock(name, ttl).await.unwrap();
    let ta = a.fencing_token().unwrap();
    a.release().await.unwrap();
    del_on(&cluster, &[3, 4], &[lock_key(name)]).await;
    for i in 0..3 {
        cluster.kill(i).await.unwrap();
    }
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    for i in 0..3 {
        cluster.start(i).await.unwrap();
    }
    for i in 0..NODES {
        let fence = support::get(&cluster, i, &fence_key(name)).await;
        assert_eq!(fence, None, "node {i} still has a counter");
    }
    let b = try_lock_retrying(&locks, name, ttl)
        .await
        .expect("all nodes are up");
    let tb = b.fencing_token().unwrap();
    b.release().await.unwrap();
    eprintln!("whole commit quorum restarted at once: A {ta}, B {tb}");
    assert!(tb > ta, "{tb} after {ta}");
}

/// Multi-resource and single-resource locks overlapping on some resources, with a plain
/// (unfenced) client in between: the plain client never touches a counter, and every
/// fenced token exceeds the tokens of the earlier holders of each of its resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_multi_and_single_locks_with_a_plain_client_between() {
    let cluster = cluster().await;
    let locks = fenced(&cluster).await;
    let plain = Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(150))
        .build()
        .await
        .expect("build plain client");
    let ttl = Duration::from_secs(2);
    let token = |l: &quorumlock::Lock| l.fencing_token().unwrap();

    let l = locks.try_lock_many(["x", "y"], ttl).await.unwrap();
    let t_xy = token(&l);
    l.release().await.unwrap();

    let mut before = Vec::new();
    for i in 0..NODES {
        before.push(support::get(&cluster, i, &fence_key("y")).await);
    }
    for names in [vec!["y"], vec!["y", "w"]] {
        let l = plain.try_lock_many(names, ttl).await.unwrap();
        assert_eq!(l.fencing_token(), None);
        l.release().await.unwrap();
    }
    for (i, b) in before.iter().enumerate() {
        let now = support::get(&cluster, i, &fence_key("y")).await;
        assert_eq!(&now, b, "the plain client changed node {i}'s counter");
    }

    let l = locks.try_lock("y", ttl).await.unwrap();
    let t_y = token(&l);
    l.release().await.unwrap();
    let l = locks.try_lock("x", ttl).await.unwrap();
    let t_x = token(&l);
    l.release().await.unwrap();
    assert!(
        t_y > t_xy && t_x > t_xy,
        "x {t_x}, y {t_y} after x+y {t_xy}"
    );
    let l = locks.try_lock_many(["z", "y", "x"], ttl).await.unwrap();
    let t_xyz = token(&l);
    l.release().await.unwrap();
    assert!(
        t_xyz > t_x && t_xyz > t_y,
        "x+y+z {t_xyz} after x {t_x}, y {t_y}"
    );
    let l = locks.try_lock("z", ttl).await.unwrap();
    assert!(token(&l) > t_xyz);
    l.release().await.unwrap();
}
