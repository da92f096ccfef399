//! Semaphores against real redis-server processes: holders up to the capacity and no
//! more, the surplus given back, mixed configurations refused without a write, every
//! permit's lifecycle, nodes down, and the test kit's naive semaphore as the negative
//! control.

mod support;

use std::time::Duration;

use quorumlock::{Error, Lock, LockMode, Redlock, Semaphore, Watchdog};
use quorumlock_testkit::{LocalCluster, naive_semaphore};
use redis::AsyncCommands;
use support::raw;

const TTL: Duration = Duration::from_secs(10);
const FLUSH: Duration = Duration::from_secs(3);

async fn cluster(n: usize) -> LocalCluster {
    LocalCluster::launch(n)
        .await
        .expect("start redis-server nodes")
}

async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build")
}

fn holders_key(name: &str) -> String {
    format!("quorumlock:sem:{name}")
}

/// On which nodes `token` is a live member of the semaphore's holders.
async fn entries(c: &LocalCluster, nodes: &[usize], name: &str, token: &str) -> Vec<usize> {
    let mut on = Vec::new();
    for &i in nodes {
        let score: Option<f64> = raw(c, i)
            .await
            .zscore(holders_key(name), token)
            .await
            .expect("ZSCORE");
        if score.is_some() {
            on.push(i);
        }
    }
    on
}

/// Every node's number of entries.
async fn loads(c: &LocalCluster, nodes: &[usize], name: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for &i in nodes {
        out.push(
            raw(c, i)
                .await
                .zcard(holders_key(name))
                .await
                .expect("ZCARD"),
        );
    }
    out
}

/// Takes permits one at a time (letting each give back its surplus) until refused or
/// `limit` are held.
async fn fill(locks: &Redlock, s: &Semaphore, limit: usize) -> (Vec<Lock>, Result<Lock, Error>) {
    let mut held = Vec::new();
    loop {
        let next = s.try_acquire(TTL).await;
        assert!(locks.flush(FLUSH).await, "background work finished");
        match next {
            Ok(p) if held.len() < limit => held.push(p),
            other => return (held, other),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_fill_the_capacity_then_are_refused() {
    let c = cluster(5).await;
    let a = client(&c.urls()).await;
    let s = a.semaphore("sem:cap", 3).expect("semaphore");
    assert_eq!((s.permits(), s.per_node_limit(), s.quorum()), (3, 2, 3));
    assert_eq!(s.capacity(), 3);
    let (held, next) = fill(&a, &s, 10).await;
    assert_eq!(held.len(), 3, "capacity holders coexist");
    match next {
        Err(Error::Held(votes)) => assert!(votes.granted() < 3, "{votes:#}"),
        other => panic!("a fourth holder: {other:?}"),
    }
    assert!(
        held.iter()
            .all(|p| p.mode() == LockMode::Permit && p.fencing_token().is_none())
    );
    // Each node holds at most c entries; every holder is on exactly Q nodes.
    let all: Vec<usize> = (0..5).collect();
    assert!(loads(&c, &all, "sem:cap").await.iter().all(|&l| l <= 2));
    for p in &held {
        assert_eq!(entries(&c, &all, "sem:cap", p.token()).await.len(), 3);
    }
    // A released permit frees a slot for another holder.
    let mut held = held.into_iter();
    if let Some(p) = held.next() {
        p.release().await.expect("release");
    }
    assert!(a.flush(FLUSH).await);
    let again = s.try_acquire(TTL).await.expect("a freed slot");
    again.release().await.expect("release");
    for p in held {
        p.release().await.expect("release");
    }
    assert!(a.flush(FLUSH).await);
    assert_eq!(
        loads(&c, &all, "sem:cap").await,
        vec![0; 5],
        "every entry released"
    );
    for i in 0..5 {
        let cfg: bool = raw(&c, i)
            .await
            .exists("quorumlock:semcfg:sem:cap")
            .await
            .expect("EXISTS");
        assert!(
            !cfg,
            "node {i}: the configuration leaves with the last holder"
        );
    }
}

/// After an acquisition at quorum, the entries beyond the quorum are given back: the
/// permit's token is on exactly Q nodes, and the holders' set expires with its entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_surplus_is_given_back() {
    let c = cluster(5).await;
    let a = client(&c.urls()).await;
    // The majority quorum (3 of 5), so that two nodes' grants are surplus.
    let s = a
        .semaphore("sem:surplus", 4)
        .and_then(|s| s.with_quorum_allowing_fewer(3))
        .expect("semaphore");
    let all: Vec<usize> = (0..5).collect();
    let mut permits = Vec::new();
    for _ in 0..3 {
        let p = s.try_acquire(TTL).await.expect("permit");
        assert!(a.flush(FLUSH).await);
        assert_eq!(
            entries(&c, &all, "sem:surplus", p.token()).await.len(),
            3,
            "on exactly Q nodes"
        );
        permits.push(p);
    }
    // Balanced: 3 holders × 3 entries on 5 nodes, no node more than one above another.
    let l = loads(&c, &all, "sem:surplus").await;
    assert_eq!(l.iter().sum::<usize>(), 9);
    assert!(
        l.iter().max().unwrap_or(&0) - l.iter().min().unwrap_or(&0) <= 1,
        "{l:?}"
    );
    for (i, load) in l.iter().enumerate() {
        let pttl: i64 = raw(&c, i)
            .await
            .pttl(holders_key("sem:surplus"))
            .await
            .expect("PTTL");
        assert!(
            *load == 0 || (pttl > 0 && pttl <= 10_000),
            "node {i}: PTTL {pttl}"
        );
    }
    for p in permits {
        p.release().await.expect("release");
    }
}

/// Clients that disagree on the permits are refused with the precise error, and nothing
/// is written on the nodes that refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_permits_are_refused_and_nothing_is_written() {
    let c = cluster(3).await;
    let a = client(&c.urls()).await;
    let b = client(&c.urls()).await;
    let three = a.semaphore("sem:mixed", 3).expect("semaphore");
    let held = three.try_acquire(TTL).await.expect("permit");
    assert!(a.flush(FLUSH).await);
    let all: Vec<usize> = (0..3).collect();
    let before = loads(&c, &all, "sem:mixed").await;
    let four = b.semaphore("sem:mixed", 4).expect("semaphore");
    match four.try_acquire(TTL).await {
        Err(Error::PermitsMismatch(m)) => {
            assert_eq!(m.stored(), "3:2:2:3");
            assert_eq!(m.requested(), "4:3:2:3");
            // The holder is on Q = 2 nodes: they refuse; the third has no holder (and no
            // stored configuration) and may grant, which the clean-up takes back.
            assert_eq!(m.votes().held(), 2, "{}", m.votes());
        }
        other => panic!("mixed permits: {other:?}"),
    }
    assert!(b.flush(FLUSH).await);
    assert_eq!(
        loads(&c, &all, "sem:mixed").await,
        before,
        "nothing written"
    );
    // A naive client (another per-node limit) is refused too; so is another quorum.
    let naive = naive_semaphore(&b, "sem:mixed", 3).expect("naive");
    assert!(matches!(
        naive.try_acquire(TTL).await,
        Err(Error::PermitsMismatch(_))
    ));
    let wider = b
        .semaphore("sem:mixed", 3)
        .and_then(|s| s.with_quorum(3))
        .expect("quorum 3");
    let r = wider.try_acquire(TTL).await;
    assert!(
        matches!(&r, Err(e) if e.kind() == quorumlock::ErrorKind::PermitsMismatch),
        "{r:?}"
    );
    held.release().await.expect("release");
    assert!(a.flush(FLUSH).await);
    // Once the last holder left, another configuration may start afresh.
    four.try_acquire(TTL)
        .await
        .expect("free again")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_extend_drop_expire_and_keep_alive() {
    let c = cluster(3).await;
    let a = client(&c.urls()).await;
    let s = a.semaphore("sem:life", 1).expect("semaphore");
    assert_eq!(s.capacity(), 1);
    let mut p = s.try_acquire(Duration::from_secs(2)).await.expect("permit");
    p.extend(TTL).await.expect("extend");
    assert!(p.remaining() > Duration::from_secs(2));
    assert!(s.try_acquire(TTL).await.is_err_and(|e| e.is_held()));
    drop(p);
    assert!(a.flush(FLUSH).await);
    // A dropped permit frees its slot; an expired one too.
    let short = Duration::from_millis(300);
    let p = s.try_acquire(short).await.expect("after a dropped permit");
    std::mem::forget(p);
    assert!(a.flush(FLUSH).await);
    assert!(s.try_acquire(TTL).await.is_err_and(|e| e.is_held()));
    tokio::time::sleep(short).await;
    let kept = s
        .try_acquire(short)
        .await
        .expect("after an expired permit")
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    tokio::time::sleep(short * 3).await;
    assert!(!kept.is_lost(), "kept alive while every node is up");
    assert!(s.try_acquire(TTL).await.is_err_and(|e| e.is_held()));
    kept.release().await.expect("release");
    let n = s
        .with_permit(TTL, Watchdog::new(), |_ctx| async { 7 })
        .await
        .expect("scoped permit");
    assert_eq!(n, 7);
    s.try_acquire(TTL)
        .await
        .expect("released after the scope")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_still_works_three_down_refuse() {
    let c = cluster(5).await;
    let a = client(&c.urls()).await;
    let s = a.semaphore("sem:down", 3).expect("semaphore");
    c.kill(0).await.expect("kill");
    assert_eq!(s.capacity_with_down(1), 2);
    let (held, next) = fill(&a, &s, 10).await;
    assert_eq!(held.len(), 2, "capacity with one node down: {next:?}");
    assert!(next.is_err());
    let up: Vec<usize> = (1..5).collect();
    for p in &held {
        assert_eq!(entries(&c, &up, "sem:down", p.token()).await.len(), 3);
    }
    for p in held {
        p.release().await.expect("release");
    }
    assert!(a.flush(FLUSH).await);
    c.kill(1).await.expect("kill");
    c.kill(2).await.expect("kill");
    match s.try_acquire(TTL).await {
        Err(Error::NoQuorum(votes)) => assert!(votes.granted() <= 2, "{votes:#}"),
        other => panic!("granted with 3 of 5 nodes down: {other:?}"),
    }
    assert!(a.flush(FLUSH).await);
    assert_eq!(
        loads(&c, &[3, 4], "sem:down").await,
        vec![0, 0],
        "the refused attempt cleaned up"
    );
}

/// A semaphore of P gives P: two permits on five nodes take the quorum 4 (the majority
/// would fit one), both are held at once, with every node up and with one down; a quorum
/// that fits fewer is refused unless asked for explicitly; all five fit P and no node down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_quorum_fits_every_permit() {
    let c = cluster(5).await;
    let a = client(&c.urls()).await;
    let s = a.semaphore("sem:q", 2).expect("semaphore");
    assert_eq!(
        (
            s.quorum(),
            s.per_node_limit(),
            s.capacity(),
            s.capacity_with_down(1)
        ),
        (4, 2, 2, 2)
    );
    assert!(s.clone().with_quorum(2).is_err() && s.clone().with_quorum(6).is_err());
    match s.clone().with_quorum(3) {
        Err(Error::InvalidInput(e)) => {
            assert!(e.to_string().contains("lets only 1 of 2 permit(s)"), "{e}")
        }
        other => panic!("quorum 3 fits one of two: {other:?}"),
    }
    let majority = s.clone().with_quorum_allowing_fewer(3).expect("asked for");
    assert_eq!(
        (majority.capacity(), majority.capacity_with_down(2)),
        (1, 1)
    );
    let all = s.clone().with_quorum(5).expect("quorum 5");
    assert_eq!((all.capacity(), all.capacity_with_down(1)), (2, 0));

    let (held, next) = fill(&a, &s, 10).await;
    assert_eq!(held.len(), 2, "P holders at once");
    assert!(next.is_err_and(|e| e.is_held()));
    for p in held {
        p.release().await.expect("release");
    }
    assert!(a.flush(FLUSH).await);
    c.kill(4).await.expect("kill");
    let (held, next) = fill(&a, &s, 10).await;
    assert_eq!(held.len(), 2, "P holders with one node down");
    assert!(next.is_err_and(|e| e.is_held()));
    for p in held {
        p.release().await.expect("release");
    }
    assert!(
        all.try_acquire(TTL).await.is_err(),
        "quorum 5 with a node down"
    );
}

/// The negative control: the naive semaphore (c = P, majority quorum) lets more than P
/// holders coexist, which the checks above would catch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_semaphore_admits_too_many() {
    let c = cluster(5).await;
    let a = client(&c.urls()).await;
    let naive = naive_semaphore(&a, "sem:naive", 2).expect("naive");
    assert_eq!((naive.per_node_limit(), naive.capacity()), (2, 3));
    let (held, _) = fill(&a, &naive, 10).await;
    assert_eq!(held.len(), 3, "three holders of a two-permit semaphore");
    for p in held {
        p.release().await.expect("release");
    }
}
