//! Fault scenarios for read-write locks and semaphores, written once against the `Faults`
//! trait: `tests/shared_faults.rs` runs them on local `redis-server` processes and
//! `tests/compose.rs` on the Docker Compose harness. Every hold a client believes is recorded
//! with its mode (writer exclusive, reader shared, permit of P) and judged by the history
//! checker: no reader with a writer, no two writers, never more than P permit holders.
//!
//! `direct` is one URL per node that bypasses any fault proxy (for reading and planting keys
//! the way another client would); on Compose it is the nodes' own URLs.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Error, Lock, LockMode, Redlock, Retry, Semaphore};
use quorumlock_testkit::nemesis::{FaultKind, NemesisLog, RandomNemesis};
use quorumlock_testkit::{ClientRecorder, Faults, History, HoldMode, Report};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::aio::MultiplexedConnection;

/// Per-node timeout of every client here (the Compose port proxy adds latency; a loaded
/// 2-core machine too).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// Bound for anything that should happen "soon".
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client with the scenarios' settings: bounded waits with short jittered retries.
pub async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .retry(
            Retry::new()
                .delay(ms(5), ms(50))
                .max_wait(Duration::from_secs(3)),
        )
        .build()
        .await
        .expect("build Redlock")
}

/// The mode the checker should see for a lock, from what the lock says it is.
fn hold_mode(lock: &Lock, permits: u32) -> HoldMode {
    match lock.mode() {
        LockMode::Read => HoldMode::Shared,
        LockMode::Permit => HoldMode::Permit { permits },
        _ => HoldMode::Exclusive,
    }
}

/// One client (its own `Redlock`, as a separate service would have) and its recorder.
pub struct Actor {
    pub locks: Redlock,
    pub rec: ClientRecorder,
}

impl Actor {
    pub async fn new(history: &History, id: u64, urls: &[String]) -> Actor {
        Actor {
            locks: client(urls).await,
            rec: history.client(id),
        }
    }

    /// Records an acquisition attempt and its outcome; checks the lock's mode.
    async fn recorded(
        &self,
        res: &str,
        want: LockMode,
        permits: u32,
        attempt: impl std::future::Future<Output = Result<Lock, Error>>,
    ) -> Result<Lock, Error> {
        self.rec.acquire_invoked(res);
        let result = attempt.await;
        match &result {
            Ok(lock) => {
                assert_eq!(lock.mode(), want, "{res}: the lock's mode");
                if want != LockMode::Write {
                    assert_eq!(
                        lock.fencing_token(),
                        None,
                        "{res}: readers and permits carry no token"
                    );
                }
                self.rec.acquired_as(
                    res,
                    lock.deadline(),
                    lock.fencing_token(),
                    hold_mode(lock, permits),
                );
            }
            Err(_) => {
                self.rec.acquire_failed(res);
            }
        }
        result
    }

    pub async fn try_read(&self, res: &str, ttl: Duration) -> Result<Lock, Error> {
        self.recorded(res, LockMode::Read, 0, self.locks.try_read_lock(res, ttl))
            .await
    }

    pub async fn read(&self, res: &str, ttl: Duration) -> Result<Lock, Error> {
        self.recorded(res, LockMode::Read, 0, self.locks.read_lock(res, ttl))
            .await
    }

    pub async fn try_write(&self, res: &str, ttl: Duration) -> Result<Lock, Error> {
        self.recorded(res, LockMode::Write, 0, self.locks.try_write_lock(res, ttl))
            .await
    }

    pub async fn write(&self, res: &str, ttl: Duration) -> Result<Lock, Error> {
        self.recorded(res, LockMode::Write, 0, self.locks.write_lock(res, ttl))
            .await
    }

    pub async fn try_permit(&self, pool: &Pool, ttl: Duration) -> Result<Lock, Error> {
        let attempt = pool.sem.try_acquire(ttl);
        self.recorded(&pool.name, LockMode::Permit, pool.sem.permits(), attempt)
            .await
    }

    pub async fn permit(&self, pool: &Pool, ttl: Duration) -> Result<Lock, Error> {
        let attempt = pool.sem.acquire(ttl);
        self.recorded(&pool.name, LockMode::Permit, pool.sem.permits(), attempt)
            .await
    }

    /// `extend`, recorded; a failure keeps the deadline (checked here).
    pub async fn extend(&self, res: &str, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.rec.extend_invoked(res);
        let before = lock.deadline();
        let result = lock.extend(ttl).await;
        match &result {
            Ok(()) => {
                self.rec.extended(res, lock.deadline());
            }
            Err(Error::Lost(_)) => {
                self.rec.lost(res);
            }
            Err(_) => {
                assert_eq!(
                    lock.deadline(),
                    before,
                    "a failed extension keeps the deadline"
                );
                self.rec.extend_failed(res);
            }
        }
        result
    }

    pub async fn release(&self, res: &str, lock: Lock) -> Result<(), Error> {
        self.rec.release_invoked(res);
        let result = lock.release().await;
        match &result {
            Ok(()) => self.rec.released(res),
            Err(_) => self.rec.release_failed(res),
        };
        result
    }
}

/// A semaphore and the name the history records it under.
#[derive(Clone)]
pub struct Pool {
    pub sem: Semaphore,
    pub name: String,
}

impl Pool {
    pub fn new(locks: &Redlock, name: &str, permits: u32) -> Pool {
        Pool {
            sem: locks.semaphore(name, permits).expect("semaphore"),
            name: name.to_owned(),
        }
    }

    /// The test kit's naive semaphore (per-node limit c = P): the negative control.
    pub fn naive(locks: &Redlock, name: &str, permits: u32) -> Pool {
        Pool {
            sem: quorumlock_testkit::naive_semaphore(locks, name, permits)
                .expect("naive semaphore"),
            name: name.to_owned(),
        }
    }
}

/// Whether an acquisition was refused the way a busy resource (or too few answering nodes)
/// is: `Held`, or `NoQuorum` when failed nodes were among the first answers.
pub fn refused(r: &Result<Lock, Error>) -> bool {
    matches!(r, Err(Error::Held(_) | Error::NoQuorum(_)))
}

#[track_caller]
pub fn assert_refused(r: &Result<Lock, Error>, what: &str) {
    assert!(refused(r), "{what}: expected Held or NoQuorum, got {r:?}");
}

#[track_caller]
pub fn assert_clean(report: &Report, history: &History) {
    assert!(report.is_clean(), "checker: {report}\nhistory:\n{history}");
}

/// Prints a scenario's outcome (visible with `--nocapture`; docs/testing.md quotes these).
pub fn observed(row: &str, what: impl std::fmt::Display) {
    println!("[{row}] {what}");
}

// ---------------------------------------------------------------------------------------
// Raw access to one node, the way another client (or an operator) would see it.
// ---------------------------------------------------------------------------------------

pub fn rw_key(name: &str) -> String {
    format!("quorumlock:rw:{name}")
}
pub fn readers_key(name: &str) -> String {
    format!("quorumlock:readers:{name}")
}
pub fn sem_key(name: &str) -> String {
    format!("quorumlock:sem:{name}")
}

/// A connection to `url`, bounded: 5 tries within 10 s.
pub async fn raw(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).expect("url");
    let mut last = String::new();
    for _ in 0..5 {
        match tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(conn)) => return conn,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".to_owned(),
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("connect to {url}: {last}")
}

/// Live members (score above the node's own clock) of a holders set on the node at `url`.
pub async fn live_members(url: &str, key: &str) -> Vec<String> {
    let mut con = raw(url).await;
    redis::cmd("EVAL")
        .arg(
            "local t = redis.call('TIME'); local now = t[1] * 1000 + math.floor(t[2] / 1000); \
             return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')",
        )
        .arg(1)
        .arg(key)
        .query_async(&mut con)
        .await
        .expect("ZRANGEBYSCORE")
}

/// Per node: the live members of a holders set.
pub async fn live_per_node(direct: &[String], key: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for url in direct {
        out.push(live_members(url, key).await);
    }
    out
}

/// Another owner's writer key on `nodes` (so a reader or writer is refused there).
pub async fn occupy_writer(direct: &[String], nodes: &[usize], name: &str) {
    for &i in nodes {
        let mut con = raw(&direct[i]).await;
        let _: () = redis::cmd("SET")
            .arg(rw_key(name))
            .arg("another-owner")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut con)
            .await
            .expect("SET");
    }
}

pub async fn vacate_writer(direct: &[String], nodes: &[usize], name: &str) {
    for &i in nodes {
        let mut con = raw(&direct[i]).await;
        let _: () = redis::cmd("DEL")
            .arg(rw_key(name))
            .query_async(&mut con)
            .await
            .expect("DEL");
    }
}

/// The nodes whose writer key holds `token`.
pub async fn writer_nodes(direct: &[String], name: &str, token: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, url) in direct.iter().enumerate() {
        let mut con = raw(url).await;
        let v: Option<String> = redis::cmd("GET")
            .arg(rw_key(name))
            .query_async(&mut con)
            .await
            .expect("GET");
        if v.as_deref() == Some(token) {
            out.push(i);
        }
    }
    out
}

/// Polls `check` every 20 ms until it holds, at most `limit`. Returns whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(ms(20)).await;
    }
}

/// Waits until every holder's permit sits on exactly its quorum's nodes (the surplus grants
/// given back) and returns the live entries per node.
pub async fn settled_permits(direct: &[String], pool: &Pool, holders: &[&Lock]) -> Vec<usize> {
    let key = sem_key(&pool.name);
    let q = pool.sem.quorum();
    let settled = eventually(PATIENCE, || async {
        let per_node = live_per_node(direct, &key).await;
        holders.iter().all(|l| {
            per_node
                .iter()
                .filter(|m| m.iter().any(|t| t == l.token()))
                .count()
                == q
        })
    })
    .await;
    let per_node = live_per_node(direct, &key).await;
    assert!(
        settled,
        "each permit should end on exactly {q} nodes (surplus given back); live entries per node: {per_node:?}"
    );
    per_node.iter().map(Vec::len).collect()
}

/// Acquires a permit of `pool` (by name and permits) for each actor, one after another, each
/// through its own client (waiting, bounded). With
/// `settle` (every node's direct URL, all up), each holder's surplus grants are given back
/// before the next one asks: holders that arrive while the previous one still has entries
/// on every node can all keep the same 3 nodes, and then fewer than `capacity()` fit (a
/// known limit of the give-back, reproduced by
/// `sem_back_to_back_acquisitions_reach_the_capacity`).
pub async fn take_permits(
    actors: &[Actor],
    pool: &Pool,
    ttl: Duration,
    settle: Option<&[String]>,
) -> Vec<Lock> {
    let mut out = Vec::new();
    for (i, a) in actors.iter().enumerate() {
        // Each actor through its own client, as separate services would.
        let own = Pool::new(&a.locks, &pool.name, pool.sem.permits());
        let lock = a
            .permit(&own, ttl)
            .await
            .unwrap_or_else(|e| panic!("permit {} of {}: {e:?}", i + 1, actors.len()));
        out.push(lock);
        if let Some(direct) = settle {
            settled_permits(direct, pool, &out.iter().collect::<Vec<_>>()).await;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Rows, each against any `Faults` backend with five nodes. Each uses its own resource names.
// ---------------------------------------------------------------------------------------

/// Kill 1, then 2 nodes while a writer holds, then while readers hold: nobody else gets in,
/// the holders extend, and with 2 nodes down readers share and writers wait their turn.
pub async fn rw_kill_mid_lease<F: Faults>(f: &F) {
    let urls = f.urls();
    let h = History::new();
    let (w, w2) = (
        Actor::new(&h, 1, &urls).await,
        Actor::new(&h, 2, &urls).await,
    );
    let (r1, r2) = (
        Actor::new(&h, 3, &urls).await,
        Actor::new(&h, 4, &urls).await,
    );
    let res = "shared:rw-kill";
    let ttl = Duration::from_secs(10);

    let mut wl = w.try_write(res, ttl).await.expect("writer acquires");
    for node in [0, 1] {
        f.kill(node).await.expect("kill");
        let down = node + 1;
        assert_refused(
            &r1.try_read(res, ttl).await,
            &format!("a reader, {down} down, writer holds"),
        );
        assert_refused(
            &w2.try_write(res, ttl).await,
            &format!("a writer, {down} down, writer holds"),
        );
        w.extend(res, &mut wl, ttl)
            .await
            .unwrap_or_else(|e| panic!("writer extends with {down} down: {e:?}"));
    }
    w.release(res, wl)
        .await
        .expect("writer releases with 2 down");

    let mut l1 = r1.try_read(res, ttl).await.expect("reader 1 with 2 down");
    let l2 = r2
        .try_read(res, ttl)
        .await
        .expect("reader 2 shares with 2 down");
    assert_refused(
        &w2.try_write(res, ttl).await,
        "a writer while 2 readers hold, 2 down",
    );
    r1.extend(res, &mut l1, ttl)
        .await
        .expect("reader extends with 2 down");
    r1.release(res, l1).await.expect("reader 1 releases");
    assert_refused(
        &w2.try_write(res, ttl).await,
        "a writer while 1 reader holds, 2 down",
    );
    r2.release(res, l2).await.expect("reader 2 releases");
    let wl = w2
        .try_write(res, ttl)
        .await
        .expect("the writer once the readers left");
    w2.release(res, wl).await.expect("release");
    f.start(0).await.expect("start");
    f.start(1).await.expect("start");

    let report = h.check();
    assert_clean(&report, &h);
    observed(
        "rw-kill",
        format!(
            "safe: readers and writers refused while the other held with 1 and 2 down; holders extended; {report}"
        ),
    );
}

/// A semaphore of 3 permits (c = 2, capacity 3): 3 holders; a 4th is refused; kill a node:
/// still refused, and each holder's extension succeeds iff its quorum's nodes all answer;
/// after the releases exactly `capacity_with_down(1)` permits fit with the node down.
pub async fn sem_kill_mid_lease<F: Faults>(f: &F, direct: &[String]) {
    let urls = f.urls();
    let h = History::new();
    let mut actors = Vec::new();
    for id in 0..4 {
        actors.push(Actor::new(&h, id, &urls).await);
    }
    let pool = Pool::new(&actors[0].locks, "shared:sem-kill", 3);
    assert_eq!((pool.sem.per_node_limit(), pool.sem.capacity()), (2, 3));
    let ttl = Duration::from_secs(10);

    let mut held = take_permits(&actors[..3], &pool, ttl, Some(direct)).await;
    let per_node = settled_permits(direct, &pool, &held.iter().collect::<Vec<_>>()).await;
    assert_eq!(
        per_node.iter().sum::<usize>(),
        9,
        "3 holders × 3 nodes: {per_node:?}"
    );
    assert_refused(&actors[3].try_permit(&pool, ttl).await, "a 4th holder");

    // The killed node: one that holds entries of some holders (every node does but one).
    let victim = per_node.iter().position(|&n| n == 2).expect("a full node");
    let entries = live_per_node(direct, &sem_key(&pool.name)).await;
    f.kill(victim).await.expect("kill");
    assert_refused(
        &actors[3].try_permit(&pool, ttl).await,
        "a 4th holder, 1 down",
    );
    let mut extended = 0;
    for (i, lock) in held.iter_mut().enumerate() {
        let on_victim = entries[victim].iter().any(|t| t == lock.token());
        let r = actors[i].extend(&pool.name, lock, ttl).await;
        assert_eq!(
            r.is_ok(),
            !on_victim,
            "holder {i} (on the killed node: {on_victim}) extending with 1 down: {r:?}"
        );
        extended += usize::from(r.is_ok());
    }
    // A permit sits on exactly Q nodes: one whose node is down cannot confirm its release on
    // a quorum (NoQuorum, like a mutex held on 3 nodes with one down); its entry there
    // expires with its TTL. The others release normally.
    for (i, lock) in held.drain(..).enumerate() {
        let on_victim = entries[victim].iter().any(|t| t == lock.token());
        let r = actors[i].release(&pool.name, lock).await;
        assert!(
            r.is_ok() || (on_victim && matches!(r, Err(Error::NoQuorum(_)))),
            "holder {i} (on the killed node: {on_victim}) releasing with 1 down: {r:?}"
        );
    }
    let cap = pool.sem.capacity_with_down(1) as usize;
    assert_eq!(cap, 2);
    let again = take_permits(&actors[..cap], &pool, ttl, None).await;
    assert_refused(
        &actors[cap].try_permit(&pool, ttl).await,
        "one more than capacity_with_down(1)",
    );
    for (i, lock) in again.into_iter().enumerate() {
        actors[i].release(&pool.name, lock).await.expect("release");
    }
    f.start(victim).await.expect("start");

    let report = h.check();
    assert_clean(&report, &h);
    assert!(report.permit_peak(&pool.name) <= Some(3), "{report}");
    observed(
        "sem-kill",
        format!(
            "safe: 3 holders on 9 entries, a 4th refused before and after killing node {victim}; {extended} of 3 extended (those not on it); {cap} permits fit with 1 down, one more refused; {report}"
        ),
    );
}

/// Pause one node and cut another's link (a faulty minority): read, write and permit
/// acquisitions decide without them, within a node timeout; nobody shares with a writer;
/// with 2 nodes faulty exactly `capacity_with_down(2)` permits fit. After the heal the
/// grants that reached the paused node late are given back, and 3 permits fit again.
pub async fn pause_and_cut<F: Faults>(f: &F, direct: &[String]) {
    let urls = f.urls();
    let h = History::new();
    let (a, b, c) = (
        Actor::new(&h, 1, &urls).await,
        Actor::new(&h, 2, &urls).await,
        Actor::new(&h, 3, &urls).await,
    );
    let res = "shared:rw-pause";
    let name = "shared:sem-pause";
    let pools = [
        Pool::new(&a.locks, name, 3),
        Pool::new(&b.locks, name, 3),
        Pool::new(&c.locks, name, 3),
    ];
    let ttl = Duration::from_secs(10);
    let floor = ttl - ttl / 100 - ms(2) - NODE_TIMEOUT;

    f.pause(1).await.expect("pause");
    f.disconnect(2).await.expect("cut");
    let w = a
        .try_write(res, ttl)
        .await
        .expect("a writer with 1 paused, 1 cut off");
    assert!(
        w.remaining() >= floor,
        "decided within a node timeout: {:?} left",
        w.remaining()
    );
    assert_refused(
        &b.try_read(res, ttl).await,
        "a reader while the writer holds",
    );
    a.release(res, w).await.expect("release");
    let r1 = b.try_read(res, ttl).await.expect("reader 1");
    let r2 = c.try_read(res, ttl).await.expect("reader 2");
    assert!(
        r1.remaining() >= floor && r2.remaining() >= floor,
        "readers decided within a node timeout"
    );
    assert_refused(&a.try_write(res, ttl).await, "a writer while readers hold");
    b.release(res, r1).await.expect("release");
    c.release(res, r2).await.expect("release");

    let short = Duration::from_secs(3);
    assert_eq!(pools[0].sem.capacity_with_down(2), 2);
    let p1 = a.permit(&pools[0], short).await.expect("permit 1");
    let p2 = b.permit(&pools[1], short).await.expect("permit 2");
    assert_refused(
        &c.try_permit(&pools[2], short).await,
        "a third permit with 2 faulty",
    );
    a.release(name, p1).await.expect("release");
    b.release(name, p2).await.expect("release");

    f.resume(1).await.expect("resume");
    f.reconnect(2).await.expect("reconnect");
    let key = sem_key(name);
    let drained = eventually(PATIENCE, || async {
        live_per_node(direct, &key).await.iter().all(Vec::is_empty)
    })
    .await;
    assert!(
        drained,
        "entries left after the heal: {:?}",
        live_per_node(direct, &key).await
    );
    let actors = [a, b, c];
    let all = take_permits(&actors, &pools[0], short, Some(direct)).await;
    for (actor, lock) in actors.iter().zip(all) {
        actor.release(name, lock).await.expect("release");
    }

    let report = h.check();
    assert_clean(&report, &h);
    observed(
        "pause-cut",
        format!(
            "safe: a writer, 2 readers and 2 permits decided within a node timeout with node 1 paused and node 2 cut off; a 3rd permit refused; no entry left after the heal, 3 permits fit again; {report}"
        ),
    );
}

/// What a contender saw while it probed a resource during a fault.
pub struct Probe {
    pub refusals: usize,
    /// The last refusal, for failure messages.
    pub last: Option<String>,
    /// When the fault began (set by the scenario): a row whose holders had expired by then
    /// would prove nothing.
    pub faulted_at: Option<Instant>,
    /// When each of its acquisitions came back.
    pub wins: Vec<Instant>,
}

/// One boxed acquisition attempt.
pub type Attempt = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Lock, Error>> + Send>>;

/// When a probe stops: the instant in it. It starts a minute away (a bound) and the scenario
/// sets it once its fault is over (it cannot know beforehand how long a restart takes).
pub type Until = Arc<std::sync::Mutex<Instant>>;

fn until_now(until: &Until) -> Instant {
    *until.lock().unwrap_or_else(|p| p.into_inner())
}

/// A probe's stop a minute from now, to be set by [`stop_at`].
pub fn until_later() -> Until {
    Arc::new(std::sync::Mutex::new(
        Instant::now() + Duration::from_secs(60),
    ))
}

/// Stops the probe at `at`.
pub fn stop_at(until: &Until, at: Instant) {
    *until.lock().unwrap_or_else(|p| p.into_inner()) = at;
}

/// Tries `attempt` every 20 ms until `until`, or 3 wins, at most 2 000 times; releases
/// each win at once.
pub async fn probe(
    actor: Arc<Actor>,
    res: String,
    until: Until,
    attempt: impl Fn(Arc<Actor>) -> Attempt + Send + 'static,
) -> Probe {
    let mut out = Probe {
        refusals: 0,
        last: None,
        faulted_at: None,
        wins: Vec::new(),
    };
    for _ in 0..2_000 {
        if Instant::now() >= until_now(&until) || out.wins.len() >= 3 {
            break;
        }
        match attempt(actor.clone()).await {
            Ok(l) => {
                out.wins.push(Instant::now());
                // Held a little, so that an overlap is not a matter of microseconds.
                tokio::time::sleep(ms(50).min(l.remaining())).await;
                let _ = actor.release(&res, l).await;
            }
            Err(e) => {
                out.refusals += 1;
                out.last = Some(format!("{e:?}"));
            }
        }
        tokio::time::sleep(ms(20)).await;
    }
    out
}

/// A writer holding only nodes 0, 1 and 2 (another owner's writer key on 3 and 4 during its
/// acquisition, removed right after node 0's restart); node 0 is killed and started again
/// after `delay`, while a reader probes until half a second past the later of the writer's
/// deadline and the end of the restart.
/// Returns the history, the writer's lock and the reader's probe.
pub async fn rw_restart<F: Faults>(
    f: &F,
    direct: &[String],
    res: &str,
    delay: Duration,
    ttl: Duration,
) -> (History, Lock, Probe) {
    let urls = f.urls();
    let h = History::new();
    let w = Actor::new(&h, 1, &urls).await;
    let reader = Arc::new(Actor::new(&h, 2, &urls).await);

    occupy_writer(direct, &[3, 4], res).await;
    let lock = w
        .try_write(res, ttl)
        .await
        .expect("writer acquires with 3 grants");
    assert_eq!(
        writer_nodes(direct, res, lock.token()).await,
        [0, 1, 2],
        "k = 3"
    );
    let until = until_later();
    let name = res.to_owned();
    let probing = tokio::spawn(probe(
        reader,
        res.to_owned(),
        until.clone(),
        move |a: Arc<Actor>| {
            let name = name.clone();
            Box::pin(async move { a.try_read(&name, ttl).await })
        },
    ));
    let faulted_at = Instant::now();
    f.restart(0, delay).await.expect("restart");
    vacate_writer(direct, &[3, 4], res).await;
    stop_at(&until, lock.deadline().max(Instant::now()) + ms(500));
    let mut probe = probing.await.expect("probe task");
    probe.faulted_at = Some(faulted_at);
    (h, lock, probe)
}

/// In contract: the writer's node restarts with AOF `always` at once, or after more than
/// the writer's TTL. No reader while the writer holds; one after it.
pub async fn rw_restart_in_contract<F: Faults>(
    f: &F,
    direct: &[String],
    row: &str,
    delay: Duration,
    ttl: Duration,
) {
    let res = format!("shared:{row}");
    let (h, lock, probe) = rw_restart(f, direct, &res, delay, ttl).await;
    assert!(
        probe.faulted_at < Some(lock.deadline()),
        "the writer had expired before the fault: the row proves nothing (machine too loaded?)"
    );
    let report = h.check();
    assert_clean(&report, &h);
    assert!(
        probe.wins.iter().all(|t| *t >= lock.deadline()),
        "a reader got in during the writer's validity"
    );
    assert!(
        !probe.wins.is_empty(),
        "no reader after the writer's deadline; last refusal: {:?}",
        probe.last
    );
    assert!(probe.refusals >= 1, "the reader was never refused");
    observed(
        row,
        format!(
            "safe: writer on [0, 1, 2], node 0 back after {delay:?}; the reader refused {} times, never in during the writer's validity, in after it; {report}",
            probe.refusals
        ),
    );
}

/// Three holders of a 3-permit semaphore (9 entries on 5 nodes with c = 2: four nodes
/// full, one with a free slot); `victims` full nodes are killed and started again after
/// `delay`, while a 4th contender probes until half a second past the later of the holders'
/// first deadline and the end of the restart. Returns the history, the holders and the probe.
pub async fn sem_restart<F: Faults>(
    f: &F,
    direct: &[String],
    name: &str,
    victims: usize,
    delay: Duration,
    ttl: Duration,
) -> (History, Vec<Lock>, Probe) {
    let urls = f.urls();
    let h = History::new();
    let mut actors = Vec::new();
    for id in 0..3 {
        actors.push(Actor::new(&h, id, &urls).await);
    }
    let fourth = Arc::new(Actor::new(&h, 3, &urls).await);
    let pool = Pool::new(&actors[0].locks, name, 3);
    let held = take_permits(&actors, &pool, ttl, Some(direct)).await;
    let per_node = settled_permits(direct, &pool, &held.iter().collect::<Vec<_>>()).await;
    let full: Vec<usize> = (0..per_node.len()).filter(|&i| per_node[i] == 2).collect();
    assert_eq!(full.len(), 4, "{per_node:?}");
    let first = held.iter().map(Lock::deadline).min().expect("holders");
    let until = until_later();
    let own = Pool::new(&fourth.locks, name, 3);
    let probing = tokio::spawn(probe(
        fourth,
        name.to_owned(),
        until.clone(),
        move |a: Arc<Actor>| {
            let own = own.clone();
            Box::pin(async move { a.try_permit(&own, ttl).await })
        },
    ));
    let faulted_at = Instant::now();
    for &v in &full[..victims] {
        f.kill(v).await.expect("kill");
    }
    tokio::time::sleep(delay).await;
    for &v in &full[..victims] {
        f.start(v).await.expect("start");
    }
    stop_at(&until, first.max(Instant::now()) + ms(500));
    let mut probe = probing.await.expect("probe task");
    probe.faulted_at = Some(faulted_at);
    (h, held, probe)
}

/// In contract: two full nodes restart with AOF `always` at once, or after more than the
/// TTL. No 4th holder while the 3 hold; one after.
pub async fn sem_restart_in_contract<F: Faults>(
    f: &F,
    direct: &[String],
    row: &str,
    delay: Duration,
    ttl: Duration,
) {
    let name = format!("shared:{row}");
    let (h, held, probe) = sem_restart(f, direct, &name, 2, delay, ttl).await;
    let first = held.iter().map(Lock::deadline).min().expect("holders");
    assert!(
        probe.faulted_at < Some(first),
        "the holders had expired before the fault: the row proves nothing (machine too loaded?)"
    );
    let report = h.check();
    assert_clean(&report, &h);
    assert!(report.permit_peak(&name) <= Some(3), "{report}");
    assert!(
        probe.wins.iter().all(|t| *t >= first),
        "a 4th holder got in while 3 held"
    );
    assert!(
        !probe.wins.is_empty(),
        "no 4th holder after the holders' deadline; last refusal: {:?}",
        probe.last
    );
    observed(
        row,
        format!(
            "safe: two full nodes back after {delay:?}; a 4th contender refused {} times, never in while 3 held, in after; {report}",
            probe.refusals
        ),
    );
    drop(held);
}

// ---------------------------------------------------------------------------------------
// Contention under a random minority nemesis.
// ---------------------------------------------------------------------------------------

/// What one contender does, and counters of a run.
#[derive(Default)]
pub struct LoopStats {
    pub acquired: AtomicU64,
    pub refused: AtomicU64,
    pub unknown: AtomicU64,
    pub extended: AtomicU64,
    pub extend_failed: AtomicU64,
}

impl LoopStats {
    pub fn line(&self) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst);
        format!(
            "{} acquired, {} refused, {} timed out, {} extended, {} extensions failed",
            n(&self.acquired),
            n(&self.refused),
            n(&self.unknown),
            n(&self.extended),
            n(&self.extend_failed)
        )
    }
}

/// The role of a contender.
#[derive(Clone)]
pub enum Role {
    /// `try_read_lock` and `read_lock` in turn.
    Reader(String),
    /// `write_lock` (waiting, with an intent) and `try_write_lock` in turn.
    Writer(String),
    /// `try_acquire` (and `acquire` in turn when `wait`) on the client's own `Semaphore`;
    /// `naive`: the test kit's negative control.
    Permit {
        name: String,
        permits: u32,
        naive: bool,
        wait: bool,
    },
}

/// Times of one contender's loop (ms, drawn uniformly).
#[derive(Clone, Copy)]
pub struct LoopPlan {
    pub ttl: (u64, u64),
    pub hold: (u64, u64),
    pub think: (u64, u64),
    /// Extra think time of a writer after each of its holds (writers are preferred: a
    /// steady stream of them keeps readers out).
    pub writer_rest: (u64, u64),
    /// Chance (%) that a hold extends once, halfway.
    pub extend_percent: u64,
}

/// Loops acquire / hold / (extend) / release until `stop`, at most 100 000 rounds; every
/// call bounded by a 3 s caller timeout (a timed-out acquisition is recorded as unknown).
pub async fn contend(
    actor: Actor,
    role: Role,
    plan: LoopPlan,
    seed: u64,
    stop: Arc<AtomicBool>,
    stats: Arc<LoopStats>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let limit = Duration::from_secs(3);
    let pool = match &role {
        Role::Permit {
            name,
            permits,
            naive: true,
            ..
        } => Some(Pool::naive(&actor.locks, name, *permits)),
        Role::Permit { name, permits, .. } => Some(Pool::new(&actor.locks, name, *permits)),
        _ => None,
    };
    for round in 0..100_000u64 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let ttl = ms(rng.random_range(plan.ttl.0..=plan.ttl.1));
        let (res, attempt) = match &role {
            Role::Reader(res) if round % 2 == 0 => (
                res.clone(),
                tokio::time::timeout(limit, actor.try_read(res, ttl)).await,
            ),
            Role::Reader(res) => (
                res.clone(),
                tokio::time::timeout(limit, actor.read(res, ttl)).await,
            ),
            Role::Writer(res) if round % 2 == 0 => (
                res.clone(),
                tokio::time::timeout(limit, actor.write(res, ttl)).await,
            ),
            Role::Writer(res) => (
                res.clone(),
                tokio::time::timeout(limit, actor.try_write(res, ttl)).await,
            ),
            Role::Permit { name, wait, .. } => {
                let Some(pool) = &pool else { break };
                let attempt = if *wait && round % 2 == 1 {
                    tokio::time::timeout(limit, actor.permit(pool, ttl)).await
                } else {
                    tokio::time::timeout(limit, actor.try_permit(pool, ttl)).await
                };
                (name.clone(), attempt)
            }
        };
        let mut lock = match attempt {
            Err(_) => {
                // Cancelled by the caller's timeout: not a hold (the attempt's own recording
                // was cut short; mark the outcome unknown).
                actor.rec.acquire_unknown(&res);
                stats.unknown.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Err(_)) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(ms(rng.random_range(plan.think.0..=plan.think.1))).await;
                continue;
            }
            Ok(Ok(lock)) => lock,
        };
        stats.acquired.fetch_add(1, Ordering::Relaxed);
        let hold = ms(rng.random_range(plan.hold.0..=plan.hold.1));
        if rng.random_range(0..100) < plan.extend_percent {
            tokio::time::sleep(hold / 2).await;
            let new_ttl = ms(rng.random_range(plan.ttl.0..=plan.ttl.1));
            match tokio::time::timeout(limit, actor.extend(&res, &mut lock, new_ttl)).await {
                Ok(Ok(())) => stats.extended.fetch_add(1, Ordering::Relaxed),
                Ok(Err(_)) => stats.extend_failed.fetch_add(1, Ordering::Relaxed),
                Err(_) => {
                    actor.rec.extend_unknown(&res);
                    stats.extend_failed.fetch_add(1, Ordering::Relaxed)
                }
            };
            tokio::time::sleep(hold / 2).await;
        } else {
            tokio::time::sleep(hold).await;
        }
        let _ = tokio::time::timeout(limit, actor.release(&res, lock)).await;
        let mut think = ms(rng.random_range(plan.think.0..=plan.think.1));
        if matches!(role, Role::Writer(_)) {
            think += ms(rng.random_range(plan.writer_rest.0..=plan.writer_rest.1));
        }
        tokio::time::sleep(think).await;
    }
}

/// Runs `roles` (one actor each) until `run` completes, then stops them (bounded) and
/// returns the history.
pub async fn with_contenders<Fut, T>(
    urls: &[String],
    roles: Vec<Role>,
    plan: LoopPlan,
    seed: u64,
    run: Fut,
) -> (History, T, Arc<LoopStats>)
where
    Fut: std::future::Future<Output = T>,
{
    let h = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(LoopStats::default());
    let mut tasks = Vec::new();
    for (id, role) in roles.into_iter().enumerate() {
        let actor = Actor::new(&h, id as u64, urls).await;
        let seed = seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        tasks.push(tokio::spawn(contend(
            actor,
            role,
            plan,
            seed,
            stop.clone(),
            stats.clone(),
        )));
    }
    let out = run.await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("contender stops within bound")
            .expect("contender task");
    }
    (h, out, stats)
}

/// The most shared holds of `res` that overlapped at one instant.
pub fn max_concurrent(h: &History, res: &str, mode: HoldMode) -> usize {
    let holds: Vec<_> = quorumlock_testkit::checker::holds(&h.events())
        .into_iter()
        .filter(|x| &*x.resource == res && x.mode == mode && !x.is_empty())
        .collect();
    holds
        .iter()
        .map(|a| {
            holds
                .iter()
                .filter(|b| b.start <= a.start && a.start < b.end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The random nemesis of the shared rows: kill, restart (after up to 400 ms), pause and
/// cut links, on a minority at a time. Needs nodes that persist with AOF `always` (restarts
/// are immediate) and a backend that can cut links.
pub fn minority_nemesis(secs: u64) -> RandomNemesis {
    RandomNemesis::from_env()
        .duration(Duration::from_secs(secs))
        .interval(ms(100), ms(400))
        .kinds(&[
            FaultKind::Kill,
            FaultKind::Restart,
            FaultKind::Pause,
            FaultKind::Disconnect,
        ])
}

/// Readers and writers of one resource under the random minority nemesis: no reader with a
/// writer, no two writers; both kinds make progress.
pub async fn rw_under_nemesis<F: Faults>(f: &F, secs: u64) -> (Report, NemesisLog) {
    let res = "shared:rw-nemesis".to_owned();
    let mut roles: Vec<Role> = (0..5).map(|_| Role::Reader(res.clone())).collect();
    roles.extend((0..3).map(|_| Role::Writer(res.clone())));
    let plan = LoopPlan {
        ttl: (300, 1_000),
        hold: (10, 150),
        think: (1, 20),
        writer_rest: (100, 300),
        extend_percent: 30,
    };
    let nemesis = minority_nemesis(secs);
    let seed = nemesis.seed();
    let (h, log, stats) = with_contenders(&f.urls(), roles, plan, seed, async {
        nemesis.run(f).await.expect("nemesis")
    })
    .await;
    let report = h.check();
    let count = |mode: HoldMode| {
        quorumlock_testkit::checker::holds(&h.events())
            .iter()
            .filter(|x| x.mode == mode)
            .count()
    };
    let (reads, writes) = (count(HoldMode::Shared), count(HoldMode::Exclusive));
    let readers_at_once = max_concurrent(&h, &res, HoldMode::Shared);
    observed(
        "rw-nemesis",
        format!(
            "seed {seed} ({secs} s, {} faults): {}; {reads} read holds (up to {readers_at_once} at once), {writes} write holds; {report}",
            log.entries.len(),
            stats.line()
        ),
    );
    assert_clean(&report, &h);
    assert!(
        reads >= 1 && writes >= 1,
        "progress: {reads} reads, {writes} writes\n{log}"
    );
    (report, log)
}

/// Contenders of a 3-permit semaphore under the random minority nemesis: never more than 3
/// holders; progress.
pub async fn sem_under_nemesis<F: Faults>(f: &F, secs: u64) -> (Report, NemesisLog) {
    let urls = f.urls();
    let name = "shared:sem-nemesis".to_owned();
    let roles: Vec<Role> = (0..8)
        .map(|i| Role::Permit {
            name: name.clone(),
            permits: 3,
            naive: false,
            wait: i % 2 == 0,
        })
        .collect();
    let plan = LoopPlan {
        ttl: (300, 1_000),
        hold: (10, 150),
        think: (1, 20),
        writer_rest: (0, 0),
        extend_percent: 30,
    };
    let nemesis = minority_nemesis(secs);
    let seed = nemesis.seed();
    let (h, log, stats) = with_contenders(&urls, roles, plan, seed, async {
        nemesis.run(f).await.expect("nemesis")
    })
    .await;
    let report = h.check();
    let peak = report.permit_peak(&name).unwrap_or(0);
    observed(
        "sem-nemesis",
        format!(
            "seed {seed} ({secs} s, {} faults): {}; peak {peak} of 3 permits; {report}",
            log.entries.len(),
            stats.line()
        ),
    );
    assert_clean(&report, &h);
    assert!(peak <= 3, "{report}");
    assert!(
        stats.acquired.load(Ordering::SeqCst) >= 1,
        "progress\n{log}"
    );
    (report, log)
}
