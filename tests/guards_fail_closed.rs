//! The guards that protect safety fail closed, against real Redis servers: when a guard
//! cannot decide (a slow, paused or dead minority; a command the ACL refuses; a voter that
//! is not what its URL says) it refuses and says why, and it never waits longer than the
//! node timeout to decide.
//!
//! * The group-map record: a client whose record lapsed, with one node of its group paused,
//!   is refused when the nodes that answer record another map (it used to wait for the
//!   paused node past its patience, and lock).
//! * A voter's identity: one store given twice is refused at build while another voter is
//!   paused (the identities used to be read under one timeout, and thrown away together),
//!   and refused when the ACL user may not run `INFO` (it used to be accepted, silently);
//!   a voter not read at build does not vote until it is read.
//! * Cluster topology: plain masters given as `redis+cluster://` voters are refused at build
//!   with the reason.

mod support;

use std::time::Duration;

use quorumlock::{Error, NodeOutcome, Redlock};
use quorumlock_testkit::LocalCluster;

const NODE_TIMEOUT: Duration = Duration::from_millis(100);

async fn nodes(n: usize) -> LocalCluster {
    LocalCluster::launch(n)
        .await
        .expect("start redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
}

/// The URL of node `i` of `cluster`, on database `db`.
fn on_db(cluster: &LocalCluster, i: usize, db: u8) -> String {
    format!("{}/{db}", cluster.url(i).expect("node index"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_record_lapsed_is_refused_beside_a_paused_node() {
    let (g1, g2) = (nodes(3).await, nodes(3).await);
    // A: one group (g1), a short per-node timeout.
    let a = Redlock::builder(g1.urls())
        .node_timeout(NODE_TIMEOUT)
        .build()
        .await
        .expect("build A");
    // A's record lapses (as after a pause past its lease); B starts with two groups.
    support::forget_group_map(&g1).await;
    let b = support::grouped(&[&g1, &g2], Some(1))
        .await
        .expect("build B");
    let name = (0..200)
        .map(|i| format!("acct-{i}"))
        .find(|n| b.group_of(n) == 1)
        .expect("a name in B's second group");
    let held = b
        .try_lock(&name, Duration::from_secs(20))
        .await
        .expect("B locks in its second group");
    // A minority of g1 is slow: one node paused.
    g1.pause(2).await.expect("pause");
    // A asks for longer than its last write covers, so it must write its record now.
    let got = a.try_lock(&name, Duration::from_secs(60)).await;
    g1.resume(2).await.expect("resume");
    match got {
        Err(Error::GroupMapMismatch(m)) => assert!(m.recorded().starts_with("v1/2/"), "{m}"),
        Ok(lock) => panic!(
            "A was granted {name} in its one group while B holds it in another ({:?} left)",
            lock.remaining()
        ),
        Err(e) => panic!("expected a group map mismatch, got {e}"),
    }
    // And every later call of A is refused too.
    assert!(matches!(
        a.try_lock("other", Duration::from_secs(5)).await,
        Err(Error::GroupMapMismatch(_))
    ));
    assert!(held.remaining() > Duration::ZERO);
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_not_confirmed_on_a_quorum_refuses_the_lock() {
    let g = nodes(3).await;
    let a = Redlock::builder(g.urls())
        .node_timeout(NODE_TIMEOUT)
        .build()
        .await
        .expect("build");
    // Two of three nodes cannot take the record (a value of another kind is unreadable
    // and refuses for good; a replica's READONLY says "not now"): make them replicas of
    // the third, so the record cannot be confirmed on a quorum while the lock keys
    // themselves cannot be written either; then check that the refusal is a no-quorum
    // naming the record, not a grant.
    let port = g.port(0).expect("port");
    for i in [1, 2] {
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(port)
            .query_async(&mut support::raw(&g, i).await)
            .await
            .expect("REPLICAOF");
    }
    let got = a.try_lock("job", Duration::from_secs(60)).await;
    for i in [1, 2] {
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut support::raw(&g, i).await)
            .await
            .expect("REPLICAOF NO ONE");
    }
    match got {
        Err(Error::NoQuorum(votes)) => {
            let text = format!("{votes:#}");
            assert!(text.contains("group map record not confirmed"), "{text}");
            assert!(votes.granted() < votes.quorum(), "{text}");
        }
        Ok(_) => panic!("locked with the record confirmed on one node of three"),
        Err(e) => panic!("expected no quorum for the record, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_given_twice_is_refused_while_another_voter_is_paused() {
    let c = nodes(2).await;
    let urls = [on_db(&c, 0, 0), on_db(&c, 0, 1), on_db(&c, 1, 0)];
    c.pause(1).await.expect("pause");
    let mut accepted = 0;
    for _ in 0..5 {
        match Redlock::builder(urls.clone())
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await
        {
            Err(Error::Config(e)) => {
                let text = e.to_string();
                assert!(
                    text.contains("voters #1") && text.contains("and #2"),
                    "{text}"
                );
            }
            Ok(_) => accepted += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    c.resume(1).await.expect("resume");
    assert_eq!(accepted, 0, "one store given twice was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_run_info_is_refused_at_build() {
    let c = nodes(3).await;
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER", "noinfo", "on", ">secret", "~*", "&*", "+@all", "-info",
            ])
            .query_async(&mut support::raw(&c, i).await)
            .await
            .expect("ACL SETUSER");
    }
    let urls: Vec<String> = (0..3)
        .map(|i| {
            format!(
                "redis://noinfo:secret@127.0.0.1:{}",
                c.port(i).expect("port")
            )
        })
        .collect();
    match Redlock::builder(urls).build().await {
        Err(Error::Config(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("NOPERM") || text.contains("permission"),
                "{text}"
            );
            assert!(text.contains("INFO"), "{text}");
            assert!(!text.contains("secret"), "the password leaked: {text}");
        }
        Ok(_) => panic!("a client that cannot tell its voters apart was built"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_not_read_at_build_votes_only_once_read() {
    let c = nodes(2).await;
    // Voters #1 and #2 are one server (n0, databases 0 and 1); #3 is n1.
    let urls = [on_db(&c, 0, 0), on_db(&c, 0, 1), on_db(&c, 1, 0)];
    c.pause(0).await.expect("pause");
    let built = Redlock::builder(urls)
        .connect_timeout(Duration::from_millis(300))
        .node_timeout(Duration::from_millis(200))
        .build()
        .await;
    let locks = match built {
        Ok(locks) => locks,
        Err(e) => {
            c.resume(0).await.expect("resume");
            panic!("build with a paused voter failed: {e}");
        }
    };
    c.resume(0).await.expect("resume");
    // n0 answers now: its two voters are read before they vote; the second one read is
    // found to be the first one's store and never counts.
    let mut held = None;
    for _ in 0..50 {
        if let Ok(lock) = locks.try_lock("job", Duration::from_secs(10)).await {
            held = Some(lock);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lock = held.expect("a lock once the paused server answers (n0 once and n1)");
    lock.release().await.expect("release");
    // Pause n1: n0 alone (two voters, one store) must not grant a quorum of three.
    c.pause(1).await.expect("pause");
    let alone = locks.try_lock("alone", Duration::from_secs(10)).await;
    c.resume(1).await.expect("resume");
    match alone {
        Err(Error::NoQuorum(votes)) => {
            let refused = votes
                .iter()
                .filter(|v| {
                    matches!(&v.outcome, NodeOutcome::Failed(t) if t.contains("one Redis server"))
                })
                .count();
            assert_eq!(refused, 1, "{votes:#}");
            assert_eq!(votes.granted(), 1, "{votes:#}");
        }
        Ok(_) => panic!("one server granted a quorum of three as two voters"),
        Err(e) => panic!("expected no quorum, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_masters_given_as_cluster_voters_are_refused_at_build() {
    let c = nodes(3).await;
    let urls: Vec<String> = (0..3)
        .map(|i| format!("redis+cluster://127.0.0.1:{}", c.port(i).expect("port")))
        .collect();
    let built = Redlock::builder(urls)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    match built {
        Err(Error::Config(e)) => {
            let text = e.to_string();
            assert!(text.contains("not a Redis Cluster"), "{text}");
            assert!(text.contains("redis://"), "{text}");
        }
        Ok(_) => panic!("plain masters were accepted as Redis Cluster voters"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// One server is two voters: #1 directly on database 0, #2 through a proxy on database 1.
/// #2 is silent at build; the server then restarts, so its `run_id` changes. #2 is read
/// when it first votes, and compared with what #1 answers then: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_read_after_its_server_restarted_is_refused() {
    let c = LocalCluster::builder(2)
        .proxies(true)
        .launch()
        .await
        .expect("launch");
    let urls = [
        format!("{}/0", c.direct_url(0).expect("url")),
        format!("{}/1", c.url(0).expect("url")),
        format!("{}/0", c.direct_url(1).expect("url")),
    ];
    c.disconnect(0).await.expect("cut #2's path");
    let locks = Redlock::builder(urls)
        .connect_timeout(Duration::from_millis(300))
        .node_timeout(Duration::from_millis(200))
        .build()
        .await
        .expect("build with #2 silent");
    c.restart(0, Duration::from_millis(200))
        .await
        .expect("restart n0");
    c.reconnect(0).await.expect("restore #2's path");
    // Requests until one is granted (n0 once and n1): by then #2 has been read.
    let mut granted = false;
    for _ in 0..50 {
        if let Ok(lock) = locks.try_lock("probe", Duration::from_secs(5)).await {
            lock.release().await.expect("release");
            granted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(granted, "no lock once n0 answered again");
    // n1 paused: n0 alone, as two voters, must not grant a quorum of three.
    c.pause(1).await.expect("pause");
    let alone = locks.try_lock("alone", Duration::from_secs(10)).await;
    c.resume(1).await.expect("resume");
    match alone {
        Err(Error::NoQuorum(votes)) => assert!(votes.granted() <= 1, "{votes:#}"),
        Ok(lock) => panic!(
            "one server granted a quorum of three as two voters ({:?} left)",
            lock.remaining()
        ),
        Err(e) => panic!("expected no quorum, got {e}"),
    }
}

/// Two groups, the second behind proxies (its links can be cut), and a client B of both
/// with a fixed per-node timeout; a name B routes to the first group; and when B's build
/// started.
async fn two_groups() -> (
    LocalCluster,
    LocalCluster,
    Redlock,
    String,
    std::time::Instant,
) {
    let g1 = nodes(3).await;
    let g2 = LocalCluster::builder(3)
        .proxies(true)
        .launch()
        .await
        .expect("launch");
    let started = std::time::Instant::now();
    let b = Redlock::builder(g1.urls())
        .group(g2.urls())
        .groups_version(1)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build B");
    let name = (0..500)
        .map(|i| format!("acct-{i}"))
        .find(|n| b.group_of(n) == 0)
        .expect("a name in g1");
    (g1, g2, b, name, started)
}

/// B (groups g1, g2) holds a name in g1 and loses its links to a majority of g2: an
/// extension past what its record covers is refused (the record on g2 may lapse, and a
/// client with another map could then lock the name elsewhere), and the lock keeps the
/// validity it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_past_the_records_coverage_is_refused() {
    let (_g1, g2, b, name, _) = two_groups().await;
    let mut held = b
        .try_lock(&name, Duration::from_secs(5))
        .await
        .expect("B locks in g1");
    g2.disconnect(0).await.expect("cut");
    g2.disconnect(1).await.expect("cut");
    let extended = held.extend(Duration::from_secs(60)).await;
    let left = held.remaining();
    g2.reconnect(0).await.expect("reconnect");
    g2.reconnect(1).await.expect("reconnect");
    match extended {
        Err(Error::NoQuorum(votes)) => {
            let text = format!("{votes:#}");
            assert!(text.contains("group map record"), "{text}");
        }
        Ok(()) => panic!("extended to 60 s past the group map record's coverage"),
        Err(e) => panic!("expected no quorum for the record, got {e}"),
    }
    assert!(left <= Duration::from_secs(5), "{left:?}");
    held.release().await.expect("release");
}

/// The watchdog keeps a lock only within the record's coverage: B's kept lock in g1, with
/// its links to a majority of g2 cut, is reported lost once the record it confirmed can
/// no longer cover an extension, so that a client with another map that locks the name
/// after the record lapsed never overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_lock_only_within_the_records_coverage() {
    let (_g1, g2, b, name, before_build) = two_groups().await;
    let kept = b
        .try_lock(&name, Duration::from_secs(3))
        .await
        .expect("B locks in g1")
        .keep_alive(quorumlock::Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    g2.disconnect(0).await.expect("cut");
    g2.disconnect(1).await.expect("cut");
    // The record B wrote at build covers 30 s; its refreshes no longer reach a majority of
    // g2, so the kept lock must be lost before that (bounded wait on its lost signal).
    let lost = tokio::time::timeout(Duration::from_secs(40), kept.lost()).await;
    let lost_at = before_build.elapsed();
    g2.reconnect(0).await.expect("reconnect");
    g2.reconnect(1).await.expect("reconnect");
    assert!(lost.is_ok(), "the kept lock was still held after 40 s");
    assert!(kept.is_lost());
    // Its validity never passed the record's coverage: the build's write, 30 s.
    assert!(
        lost_at < quorumlock::GROUP_MAP_LEASE,
        "reported lost {lost_at:?} after the build, past the record's lease"
    );
}
