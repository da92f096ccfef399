//! Fencing tokens against real Redis servers: ordering across successive and concurrent
//! holders, multi-resource locks, a soak under the random nemesis, the paused holder, nodes
//! that lost their counters (delayed restarts without persistence), availability with a
//! bare quorum, a node stalling between the two rounds, and mixed fenced/plain clients.
#![cfg(feature = "testkit")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock::testkit::nemesis::FaultKind;
use quorumlock::testkit::{History, LocalCluster, Persistence, RandomNemesis, ViolationKind};
use redis::AsyncCommands;
use support::{lock_key, occupy, raw, vacate};

const NODES: usize = 5;

async fn cluster() -> LocalCluster {
    LocalCluster::launch(NODES)
        .await
        .expect("launch redis-server")
}

/// Fixed per-node timeout: these tests are about token order, not latency, and the
/// derived default (2 % of a 500 ms TTL) is tight on a loaded 2-core CI machine.
async fn client(cluster: &LocalCluster, fencing: bool) -> Redlock {
    support::client(cluster.urls(), Duration::from_millis(150), fencing).await
}

/// A fenced store: accepts a write only with a token ≥ the largest it has seen, checked and
/// written under one mutex (atomically).
#[derive(Default)]
struct FencedStore {
    inner: Mutex<(u64, Vec<(u64, String)>)>,
}

impl FencedStore {
    fn write(&self, token: u64, value: &str) -> bool {
        let mut g = self.inner.lock().unwrap();
        if token < g.0 {
            return false;
        }
        g.0 = token;
        g.1.push((token, value.to_string()));
        true
    }
    fn values(&self) -> Vec<String> {
        self.inner
            .lock()
            .unwrap()
            .1
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successive_holders_get_increasing_tokens() {
    let cluster = cluster().await;
    let locks = client(&cluster, true).await;
    let history = History::new();
    let rec = history.client(1);
    let mut last = 0;
    for _ in 0..20 {
        let lock = locks.try_lock("seq", Duration::from_secs(2)).await.unwrap();
        let t = lock.fencing_token().expect("fencing is on");
        rec.acquired("seq", lock.deadline(), Some(t));
        assert!(t > last, "token {t} after {last}");
        last = t;
        rec.release_invoked("seq");
        lock.release().await.unwrap();
    }
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    // Without fencing, no token.
    let plain = client(&cluster, false).await;
    let lock = plain
        .try_lock("plain", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(lock.fencing_token(), None);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_contenders_get_increasing_tokens() {
    let cluster = cluster().await;
    let history = History::new();
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let locks = client(&cluster, true).await;
        let rec = history.client(c);
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..6 {
                rec.acquire_invoked("hot");
                let lock = locks.lock("hot", Duration::from_secs(2)).await.unwrap();
                let t = lock.fencing_token().unwrap();
                rec.acquired("hot", lock.deadline(), Some(t));
                rec.work_started("hot");
                tokio::time::sleep(Duration::from_millis(1)).await;
                rec.work_ended("hot");
                rec.release_invoked("hot");
                lock.release().await.unwrap();
                rec.released("hot");
                tokens.push(t);
            }
            tokens
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a fencing token was handed out twice");
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds(), 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_token_exceeds_each_resource() {
    let cluster = cluster().await;
    let locks = client(&cluster, true).await;
    let ttl = Duration::from_secs(2);
    let mut last_a = 0;
    for _ in 0..3 {
        let l = locks.try_lock("a", ttl).await.unwrap();
        last_a = l.fencing_token().unwrap();
        l.release().await.unwrap();
    }
    let mut last_b = 0;
    for _ in 0..9 {
        let l = locks.try_lock("b", ttl).await.unwrap();
        last_b = l.fencing_token().unwrap();
        l.release().await.unwrap();
    }
    let both = locks.try_lock_many(["a", "b"], ttl).await.unwrap();
    let t = both.fencing_token().unwrap();
    assert!(t > last_a && t > last_b, "{t} vs a={last_a} b={last_b}");
    both.release().await.unwrap();
    // The commit raised both counters: the next holder of either resource is above it.
    let a = locks.try_lock("a", ttl).await.unwrap();
    assert!(a.fencing_token().unwrap() > t);
    a.release().await.unwrap();
    let b = locks.try_lock("b", ttl).await.unwrap();
    assert!(b.fencing_token().unwrap() > t);
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_random_nemesis_keeps_tokens_increasing() {
    let cluster = Arc::new(cluster().await);
    let history = History::new();
    // Kills stay down at least one step (≥ 1.2 s > the 1 s TTL): restarts are delayed,
    // so mutual exclusion holds too, and every restart loses the counters (no persistence),
    // which exercises the clock floor.
    let nemesis = RandomNemesis::from_env()
        .duration(Duration::from_secs(14))
        .interval(Duration::from_millis(1200), Duration::from_millis(2500))
        .kinds(&[FaultKind::Kill, FaultKind::Pause]);
    let stop = Instant::now() + Duration::from_secs(15);
    let mut tasks = Vec::new();
    for c in 0..4u64 {
        let locks = client(&cluster, true).await;
        let rec = history.client(c);
        tasks.push(tokio::spawn(async move {
            let mut ok = 0usize;
            while Instant::now() < stop {
                rec.acquire_invoked("soak");
                match tokio::time::timeout(
                    Duration::from_secs(3),
                    locks.lock("soak", Duration::from_secs(1)),
                )
                .await
                {
                    Ok(Ok(lock)) => {
                        rec.acquired("soak", lock.deadline(), lock.fencing_token());
                        assert!(lock.fencing_token().is_some());
                        rec.work_started("soak");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        rec.work_ended("soak");
                        rec.release_invoked("soak");
                        match lock.release().await {
                            Ok(()) => rec.released("soak"),
                            Err(_) => rec.release_failed("soak"),
                        };
                        ok += 1;
                    }
                    Ok(Err(_)) => {
                        rec.acquire_failed("soak");
                    }
                    Err(_) => {
                        rec.acquire_unknown("soak");
                    }
                }
            }
            ok
        }));
    }
    let log = nemesis.run(&*cluster).await.expect("nemesis");
    let mut acquired = 0;
    for t in tasks {
        acquired += t.await.unwrap();
    }
    let report = history.check();
    assert!(
        report.is_clean(),
        "seed {}: {report}\n{log}",
        nemesis.seed()
    );
    assert!(
        acquired > 50,
        "seed {}: only {acquired} acquisitions\n{log}",
        nemesis.seed()
    );
    eprintln!("soak: {acquired} fenced acquisitions; {log}");
}

/// Holder A pauses (a GC pause, simulated by sleeping) past its validity; B acquires and
/// writes; A wakes and writes with its old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_stale_write_is_rejected_with_fencing() {
    let cluster = cluster().await;
    let a = client(&cluster, true).await;
    let b = client(&cluster, true).await;
    let store = FencedStore::default();
    let history = History::new();
    let (ra, rb) = (history.client(1), history.client(2));

    let la = a
        .try_lock("acct", Duration::from_millis(500))
        .await
        .unwrap();
    let ta = la.fencing_token().unwrap();
    ra.acquired("acct", la.deadline(), Some(ta));
    // A "pauses" past its validity (and past the keys' TTL).
    tokio::time::sleep_until((la.deadline() + Duration::from_millis(100)).into()).await;

    let lb = b.lock("acct", Duration::from_secs(2)).await.unwrap();
    let tb = lb.fencing_token().unwrap();
    rb.acquired("acct", lb.deadline(), Some(tb));
    assert!(tb > ta, "{tb} ≤ {ta}");
    assert!(store.write(tb, "B"));
    rb.write_accepted("acct", Some(tb));
    rb.release_invoked("acct");
    lb.release().await.unwrap();

    // A wakes up and writes with its stale token: rejected, B's update survives.
    let accepted = store.write(ta, "A");
    assert!(!accepted, "the stale write was accepted");
    ra.write_rejected("acct", Some(ta));
    assert_eq!(store.values(), ["B"]);
    drop(la);

    let report = history.check();
    assert!(
        !report.has(ViolationKind::StaleWriteAccepted)
            && !report.has(ViolationKind::FencingNotIncreasing),
        "{report}"
    );
}

/// The same schedule without fencing: A's work lands outside its hold and the checker
/// says so (proof the checker can fail), and B's update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_without_fencing_is_flagged() {
    let cluster = cluster().await;
    let a = client(&cluster, false).await;
    let b = client(&cluster, false).await;
    let history = History::new();
    let (ra, rb) = (history.client(1), history.client(2));
    let mut store: Vec<&str> = Vec::new();

    let la = a
        .try_lock("acct", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(la.fencing_token(), None);
    ra.acquired("acct", la.deadline(), None);
    ra.work_started("acct");
    tokio::time::sleep_until((la.deadline() + Duration::from_millis(100)).into()).await;

    let lb = b.lock("acct", Duration::from_secs(2)).await.unwrap();
    rb.acquired("acct", lb.deadline(), None);
    rb.work_started("acct");
    store.push("B");
    rb.work_ended("acct");
    rb.release_invoked("acct");
    lb.release().await.unwrap();

    store.push("A"); // nothing to reject it with
    ra.work_ended("acct");
    ra.release_invoked("acct");
    drop(la);

    assert_eq!(store.last(), Some(&"A"), "B's update was overwritten");
    let report = history.check();
    assert!(report.has(ViolationKind::WorkOutsideHold), "{report}");
    assert_eq!(report.count(ViolationKind::WorkOutsideHold), 1, "{report}");
}

/// Holders of `name` granted by `nodes` only: every other node holds a foreign key for it.
/// Returns the last token.
async fn hold_on(cluster: &LocalCluster, locks: &Redlock, nodes: &[usize], name: &str) -> u64 {
    let others: Vec<usize> = (0..NODES).filter(|i| !nodes.contains(i)).collect();
    occupy(cluster, others.iter().copied(), name).await;
    let mut t = 0;
    for _ in 0..5 {
        let l = locks.lock(name, Duration::from_millis(500)).await.unwrap();
        let next = l.fencing_token().unwrap();
        assert!(next > t, "{next} after {t}");
        t = next;
        l.release().await.unwrap();
    }
    vacate(cluster, others.iter().copied(), name).await;
    t
}

/// Every node is restarted in turn, each down longer than the lock's TTL (a delayed
/// restart) and without persistence, so each comes back without any counter. The next
/// holder's token is still above the last one issued before the restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_restarts_of_every_node_keep_tokens_rising() {
    let cluster = cluster().await;
    let locks = client(&cluster, true).await;
    let ttl = Duration::from_millis(500);
    let mut ta = 0;
    for _ in 0..5 {
        let l = locks.lock("roll", ttl).await.unwrap();
        ta = l.fencing_token().unwrap();
        l.release().await.unwrap();
    }
    for i in 0..NODES {
        cluster
            .restart(i, ttl + Duration::from_millis(200))
            .await
            .unwrap();
        let mut c = raw(&cluster, i).await;
        let keys: Vec<String> = c.keys("quorumlock:*").await.unwrap();
        assert!(keys.is_empty(), "node {i} kept {keys:?}");
    }
    // lock() retries: the first request to each restarted node finds a broken connection.
    let l = locks.lock("roll", ttl).await.unwrap();
    let tb = l.fencing_token().unwrap();
    assert!(
        tb > ta,
        "token went backwards after rolling restarts: {tb} after {ta}"
    );
    eprintln!("rolling delayed restarts: token {ta} before, {tb} after");
    l.release().await.unwrap();
    let l = locks.lock("roll", ttl).await.unwrap();
    assert!(l.fencing_token().unwrap() > tb);
    l.release().await.unwrap();
}

/// The other half of the deployment contract: every node persists every write (AOF,
/// `appendfsync always`) and is restarted at once, one after the other, while a holder
/// holds the lock. The holder keeps it (no one else acquires) and the next holder's token
/// is above the first one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_restarts_with_aof_always_keep_tokens_rising() {
    let cluster = LocalCluster::builder(NODES)
        .persistence(Persistence::AofAlways)
        .launch()
        .await
        .expect("launch redis-server");
    let a = client(&cluster, true).await;
    let b = client(&cluster, true).await;
    let ttl = Duration::from_secs(10);
    let la = a.lock("aof", ttl).await.unwrap();
    let ta = la.fencing_token().unwrap();
    for i in 0..NODES {
        cluster.restart(i, Duration::ZERO).await.unwrap();
    }
    // The first requests after the restarts may find broken connections (NoQuorum while
    // the clients reconnect); a refusal because the lock is held must come within a few
    // tries, and B must never get the lock.
    if let Ok(l) = a.try_lock("warmup", ttl).await {
        l.release().await.unwrap();
    }
    let mut refused_as_held = false;
    for _ in 0..20 {
        match b.try_lock("aof", ttl).await {
            Ok(l) => panic!("B took a held lock (token {:?})", l.fencing_token()),
            Err(e) if e.is_held() => {
                refused_as_held = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(refused_as_held, "B never saw A's reloaded keys");
    la.release().await.unwrap();
    let lb = b.lock("aof", ttl).await.unwrap();
    let tb = lb.fencing_token().unwrap();
    assert!(tb > ta, "{tb} after {ta}");
    lb.release().await.unwrap();
}

/// A counter ahead of every node's clock (a clock stepped back, or a node whose clock
/// ran fast) still rises by one per holder: the clock is only a floor. A counter that is
/// not a number makes the node fail its vote without writing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_ahead_of_the_clock_rise_by_one_and_garbage_is_refused() {
    let cluster = cluster().await;
    let locks = client(&cluster, true).await;
    let ttl = Duration::from_secs(2);
    // Year 2128 in microseconds: above every node's clock, below 2^53.
    let ahead: u64 = 5_000_000_000_000_000;
    for i in 0..NODES {
        let mut c = raw(&cluster, i).await;
        let _: () = c.set("quorumlock:fence:ahead", ahead - 2).await.unwrap();
    }
    let _: () = raw(&cluster, 0)
        .await
        .set("quorumlock:fence:ahead", ahead)
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let l = locks.try_lock("ahead", ttl).await.unwrap();
        let t = l.fencing_token().unwrap();
        assert!(t > last && t >= ahead - 1, "{t} after {last}");
        last = t;
        l.release().await.unwrap();
    }
    assert!(
        last <= ahead + 3,
        "rose by more than one per holder: {last}"
    );

    for i in 0..NODES {
        let mut c = raw(&cluster, i).await;
        let _: () = c
            .set("quorumlock:fence:junk", "not-a-number")
            .await
            .unwrap();
    }
    let err = locks
        .try_lock("junk", ttl)
        .await
        .expect_err("a token from counters that are not numbers");
    assert!(!err.is_held(), "{err}");
    for i in 0..NODES {
        let mut c = raw(&cluster, i).await;
        let key: Option<String> = c.get(lock_key("junk")).await.unwrap();
        let fence: String = c.get("quorumlock:fence:junk").await.unwrap();
        assert_eq!((key, fence.as_str()), (None, "not-a-number"), "node {i}");
    }
}

/// A resource no node has seen gets a token while two of the five nodes are down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_resource_gets_a_token_with_two_nodes_down() {
    let cluster = cluster().await;
    cluster.kill(3).await.unwrap();
    cluster.kill(4).await.unwrap();
    let locks = client(&cluster, true).await;
    let ttl = Duration::from_secs(2);
    let l = match locks.try_lock("fresh", ttl).await {
        Ok(l) => l,
        Err(e) => panic!("no token for a new resource with 3 of 5 nodes up: {e}"),
    };
    let t1 = l.fencing_token().unwrap();
    l.release().await.unwrap();
    let l = locks.try_lock("fresh", ttl).await.unwrap();
    let t2 = l.fencing_token().unwrap();
    assert!(t2 > t1);
    eprintln!("new resource, nodes 3 and 4 down: tokens {t1}, {t2}");
    l.release().await.unwrap();
}

/// A naive two-round fencing client (plain `INCR` counters, no clock floor): on each
/// chosen node `SET NX` + `INCR`, take the max, commit it back. Returns the token.
async fn naive_acquire(cluster: &LocalCluster, nodes: &[usize], name: &str) -> u64 {
    let (lk, fk) = (format!("naive:lock:{name}"), format!("naive:fence:{name}"));
    let mut t = 0u64;
    let mut conns = Vec::new();
    for &i in nodes {
        let mut c = raw(cluster, i).await;
        let set: Option<String> = redis::cmd("SET")
            .arg(&lk)
            .arg("me")
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(set.is_some());
        let v: u64 = c.incr(&fk, 1).await.unwrap();
        t = t.max(v);
        conns.push(c);
    }
    for c in &mut conns {
        let cur: Option<u64> = c.get(&fk).await.unwrap();
        if cur.unwrap_or(0) < t {
            let _: () = c.set(&fk, t).await.unwrap();
        }
        let _: () = c.del(&lk).await.unwrap();
    }
    t
}

/// Earlier holders were granted by {0, 1, 2} only. Node 2 is restarted (down longer than
/// the TTL, no persistence) and loses its counters; then nodes 0 and 1 stall, so {2, 3, 4}
/// is the only quorum that answers, and node 2 is the only node it shares with the earlier
/// holders. A naive counter goes backwards there; quorumlock issues a token, and it is
/// larger than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_in_the_only_reachable_quorum_still_gets_a_larger_token() {
    let cluster = cluster().await;
    let locks = client(&cluster, true).await;
    let ttl = Duration::from_millis(500);

    let mut naive_a = 0;
    occupy(&cluster, [3, 4], "ledger").await;
    for _ in 0..5 {
        naive_a = naive_acquire(&cluster, &[0, 1, 2], "ledger").await;
    }
    vacate(&cluster, [3, 4], "ledger").await;
    let ta = hold_on(&cluster, &locks, &[0, 1, 2], "ledger").await;
    assert_eq!(naive_a, 5);

    cluster
        .restart(2, ttl + Duration::from_millis(200))
        .await
        .unwrap();
    // Let the client reconnect to the restarted node (its old connection broke).
    for _ in 0..3 {
        if let Ok(l) = locks.try_lock("warmup", ttl).await {
            l.release().await.unwrap();
        }
    }

    let naive_b = naive_acquire(&cluster, &[2, 3, 4], "ledger").await;
    assert!(
        naive_b <= naive_a,
        "expected the naive token to go backwards: {naive_b} after {naive_a}"
    );

    cluster.pause(0).await.unwrap();
    cluster.pause(1).await.unwrap();
    // A few tries: a request to node 2 may still find the connection the restart broke.
    let mut got = locks.try_lock("ledger", ttl).await;
    for _ in 0..4 {
        if got.is_ok() {
            break;
        }
        got = locks.try_lock("ledger", ttl).await;
    }
    cluster.resume(0).await.unwrap();
    cluster.resume(1).await.unwrap();
    let l = match got {
        Ok(l) => l,
        Err(e) => panic!("no token while the quorum {{2, 3, 4}} answered: {e}"),
    };
    let tb = l.fencing_token().unwrap();
    assert!(tb > ta, "token went backwards: {tb} after {ta}");
    l.release().await.unwrap();
    eprintln!(
        "restarted node 2 in the only reachable quorum: naive {naive_a} then {naive_b}; \
         quorumlock {ta} then {tb}"
    );

    let l = locks.lock("ledger", ttl).await.unwrap();
    assert!(l.fencing_token().unwrap() > tb);
    l.release().await.unwrap();
}

/// Node 2 answers the first round at once and then stalls (SIGSTOP) before the commit
/// reaches it; nodes 0 and 1 are slower (a delayed link) and node 3 slower still, node 4
/// is held by someone else. The commit is confirmed by {0, 1, 3}: the attempt succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stalling_between_the_rounds_does_not_fail_the_attempt() {
    let cluster = LocalCluster::builder(NODES)
        .proxies(true)
        .launch()
        .await
        .expect("launch redis-server");
    let locks = support::client(cluster.urls(), Duration::from_millis(1500), true).await;
    let ttl = Duration::from_secs(10);
    // Warm every connection up (and load the scripts) before the links are slowed.
    let l = locks.try_lock("stall", ttl).await.unwrap();
    let t0 = l.fencing_token().unwrap();
    l.release().await.unwrap();
    // A release returns once a quorum answered and finishes the other nodes in the
    // background; wait for it, or node 2 may still hold the warm-up lock's key when it is
    // watched below and be taken for the attempt's grant.
    assert!(
        locks.flush(Duration::from_secs(5)).await,
        "warm-up release never finished"
    );

    occupy(&cluster, [4], "stall").await;
    cluster.delay(0, Duration::from_millis(150)).unwrap();
    cluster.delay(1, Duration::from_millis(150)).unwrap();
    cluster.delay(3, Duration::from_millis(400)).unwrap();
    // Connected before the attempt starts, so that watching node 2 begins at once (a
    // connection opened on a loaded machine after the attempt could come too late).
    let mut c2 = raw(&cluster, 2).await;
    let attempt = tokio::spawn(async move {
        let r = locks.try_lock("stall", ttl).await;
        (locks, r)
    });
    // Node 2 grants first (its link is fast); the decision needs 0 and 1, ~300 ms later.
    let watch_until = std::time::Instant::now() + Duration::from_secs(5);
    let mut granted = false;
    while std::time::Instant::now() < watch_until {
        let v: Option<String> = c2.get(lock_key("stall")).await.unwrap();
        if v.is_some() {
            granted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(granted, "node 2 never granted");
    cluster.pause(2).await.unwrap();
    let (locks, got) = attempt.await.unwrap();
    cluster.resume(2).await.unwrap();
    for i in [0, 1, 3] {
        cluster.delay(i, Duration::ZERO).unwrap();
    }
    let l = match got {
        Ok(l) => l,
        Err(e) => panic!("a node stalling between the rounds failed the attempt: {e}"),
    };
    let t = l.fencing_token().unwrap();
    assert!(t > t0, "{t} after {t0}");
    l.release().await.unwrap();
    // The commit quorum was {0, 1, 3}: node 3 granted after the decision and confirmed.
    for i in [0, 1, 3] {
        let mut c = raw(&cluster, i).await;
        let v: Option<u64> = c.get("quorumlock:fence:stall").await.unwrap();
        assert!(v.is_some_and(|v| v >= t), "node {i}: counter {v:?} < {t}");
    }
    eprintln!("node 2 stalled between the rounds: token {t} committed on nodes 0, 1, 3");
    vacate(&cluster, [4], "stall").await;
    let l = locks.lock("stall", ttl).await.unwrap();
    assert!(l.fencing_token().unwrap() > t);
    l.release().await.unwrap();
}

/// Clients with and without fencing lock the same keys: each kind excludes the other,
/// for one resource and for a multi-resource lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_and_plain_clients_exclude_each_other() {
    let cluster = cluster().await;
    let fenced = client(&cluster, true).await;
    let plain = client(&cluster, false).await;
    let ttl = Duration::from_secs(5);
    let history = History::new();
    let (rf, rp) = (history.client(1), history.client(2));

    for (holder, other, rh, ro) in [(&fenced, &plain, &rf, &rp), (&plain, &fenced, &rp, &rf)] {
        rh.acquire_invoked("mixed");
        let held = holder.try_lock("mixed", ttl).await.unwrap();
        rh.acquired("mixed", held.deadline(), held.fencing_token());
        ro.acquire_invoked("mixed");
        match other.try_lock("mixed", ttl).await {
            Ok(l) => {
                ro.acquired("mixed", l.deadline(), l.fencing_token());
                panic!("both kinds hold \"mixed\"");
            }
            Err(e) => {
                ro.acquire_failed("mixed");
                assert!(e.is_held(), "{e}");
            }
        }
        let err = other
            .try_lock_many(["mixed", "other"], ttl)
            .await
            .expect_err("a multi-resource lock took a held resource");
        assert!(err.is_held(), "{err}");
        rh.release_invoked("mixed");
        held.release().await.unwrap();
        rh.released("mixed");

        let many = holder.try_lock_many(["mixed", "other"], ttl).await.unwrap();
        let err = other
            .try_lock("other", ttl)
            .await
            .expect_err("took a resource of a held multi-resource lock");
        assert!(err.is_held(), "{err}");
        many.release().await.unwrap();
    }
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

/// Rough cost of fencing: 2000 try_lock + release cycles with and without it.
/// `cargo test --release --features testkit --test fencing -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn fencing_cost() {
    let cluster = cluster().await;
    for fencing in [false, true, false, true] {
        let locks = client(&cluster, fencing).await;
        let n = 2000;
        let mut lat = Vec::with_capacity(n);
        let start = Instant::now();
        for _ in 0..n {
            let t0 = Instant::now();
            let l = locks
                .try_lock("bench", Duration::from_secs(5))
                .await
                .unwrap();
            lat.push(t0.elapsed());
            l.release().await.unwrap();
        }
        let total = start.elapsed();
        lat.sort_unstable();
        eprintln!(
            "fencing={fencing}: {n} cycles in {total:?} = {:.0} cycles/s; try_lock p50 {:?} p99 {:?}",
            n as f64 / total.as_secs_f64(),
            lat[n / 2],
            lat[n * 99 / 100]
        );
    }
}
