//! quorumlock's fault-injection test kit: real Redis servers you can kill, pause and
//! cut off, a recorder of what lock clients believed, and a checker that says whether mutual
//! exclusion held.
//!
//! It is what quorumlock's own fault tests use, and it is meant for yours: add
//! `quorumlock-testkit` to your `[dev-dependencies]` and test your service's critical sections
//! against the failures of the fault matrix (a node crashing mid-lease, a restart without persistence,
//! a pause, a partition, a failover to a lagging replica, a paused holder).
//!
//! # Contents
//!
//! | problem | tool |
//! | --- | --- |
//! | N Redis masters on loopback, killed on drop | [`LocalCluster`] ([`LocalCluster::launch`], [`LocalCluster::builder`]) |
//! | crash, restart (now or later, with or without AOF), SIGSTOP/SIGCONT | [`LocalCluster::kill`], [`start`](LocalCluster::start), [`restart`](LocalCluster::restart), [`pause`](LocalCluster::pause), [`resume`](LocalCluster::resume) |
//! | delay, stall, blackhole (one way or both) or cut a client's link | [`FaultProxy`] with a [`ProxyMode`], via [`LocalCluster::proxy`]; [`Faults::slow`] / [`Faults::disconnect`] on any backend with proxies |
//! | a local Redis Cluster (slots assigned by the kit, replicas attached): fail a master over (gracefully or after a crash), migrate a slot (whole, or left half-way for `ASK`) | [`RedisCluster`] ([`redis_cluster`]) |
//! | a node that fails over to a replica which missed writes | [`LocalClusterBuilder::replicated`], [`LocalCluster::replication_link`], [`LocalCluster::promote_replica`] |
//! | the same faults on the Docker Compose harness (`compose/`) | [`compose::ComposeCluster`], through the [`Faults`] trait |
//! | scripted or seeded random fault schedules (a minority faulty at a time, or more with `allow_majority`) | [`nemesis::Schedule`], [`nemesis::RandomNemesis`] ([`allow_majority`](nemesis::RandomNemesis::allow_majority)) |
//! | what clients did and believed, on one clock | [`History`], [`ClientRecorder`] |
//! | were waiters served in the order they came? (overtakes and hand-offs waited per `lock()` call) | [`fairness::scores`], [`fairness::Distribution`] |
//! | did two holders overlap? a reader with a writer? more semaphore holders than permits? work outside a hold? fencing tokens going down? | [`checker::check`] → [`checker::Report`] ([`HoldMode`] says how each hold shares its resource) |
//!
//! # Requirements
//!
//! Linux (or another Unix), a tokio runtime, and `redis-server` 7.0 or newer: Debian's
//! `redis-server` package (`scripts/install-deps.sh` installs it), or any binary named by
//! `QUORUMLOCK_REDIS_SERVER`. When it is missing, [`LocalCluster::launch`] fails with a
//! `NotFound` error that says so.
//!
//! # Example
//!
//! Three nodes, one crashes and comes back empty, another is paused, a third is cut off:
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use quorumlock_testkit::{History, LocalCluster, ProxyMode};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
//! let urls = cluster.urls(); // hand these to the code under test
//!
//! cluster.kill(0).await?; // SIGKILL; node 0 stays down
//! cluster.start(0).await?; // same port, empty again (no persistence)
//! cluster.pause(1).await?; // SIGSTOP: connections open, no answers
//! cluster.resume(1).await?;
//! cluster.proxy(2)?.set_mode(ProxyMode::Delay(Duration::from_millis(20)));
//! cluster.disconnect(2).await?; // blackhole both ways
//! cluster.reconnect(2).await?;
//!
//! // Record what each client believed, then check it.
//! let history = History::new();
//! let client = history.client(1);
//! client.acquired("orders:42", Instant::now() + Duration::from_secs(1), None);
//! client.work_started("orders:42");
//! client.work_ended("orders:42");
//! client.release_invoked("orders:42");
//! let report = history.check();
//! assert!(report.is_clean(), "{report}");
//! # let _ = urls;
//! # Ok(())
//! # }
//! ```
//!
//! # Writing your own backend
//!
//! Implement [`Faults`]; [`nemesis`] schedules then run against it unchanged.

pub mod checker;
pub mod cluster;
pub mod compose;
pub mod fairness;
pub mod history;
pub mod nemesis;
pub mod proxy;
pub mod redis_cluster;

mod resp;

use std::future::Future;
use std::io;
use std::time::Duration;

pub use checker::{PermitPeak, Report, Violation, ViolationKind};
pub use cluster::{LocalCluster, LocalClusterBuilder, Persistence, REDIS_SERVER_ENV};
pub use history::{ClientId, ClientRecorder, Event, EventKind, History, HoldMode};
pub use nemesis::{Fault, RandomNemesis, Schedule};
pub use proxy::{FaultProxy, ProxyMode};
pub use redis_cluster::{ClusterVoters, RedisCluster};

/// The test kit's **unsafe** semaphore, a negative control: per-node limit `c = P` with
/// the majority quorum, so up to `⌊P·N / Q⌋` holders (more than `P`) can coexist. Use it to
/// check that a test of your own, or a history checker, catches a semaphore that admits too
/// many holders. It runs exactly the real semaphore's code (only `c` differs). See
/// [`Semaphore::naive`](quorumlock::Semaphore::naive).
///
/// # Errors
///
/// As [`Redlock::semaphore`](quorumlock::Redlock::semaphore).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let unsafe_pool = quorumlock_testkit::naive_semaphore(&locks, "negative-control", 2)?;
/// assert_eq!(unsafe_pool.per_node_limit(), unsafe_pool.permits());
/// # Ok(()) }
/// ```
pub fn naive_semaphore(
    locks: &quorumlock::Redlock,
    name: &str,
    permits: u32,
) -> Result<quorumlock::Semaphore, quorumlock::Error> {
    quorumlock::Semaphore::naive(locks, name, permits)
}

/// The fault interface shared by every backend: [`LocalCluster`] (local processes) and
/// [`compose::ComposeCluster`] (Docker Compose) implement it, and so can yours. Nodes are
/// numbered `0..len()`.
///
/// Every operation returns `InvalidInput` for a node index out of range and
/// `Unsupported` when the backend cannot do it (e.g. [`disconnect`](Faults::disconnect)
/// without a proxy). Healing operations ([`start`](Faults::start),
/// [`resume`](Faults::resume), [`reconnect`](Faults::reconnect)) and
/// [`kill`](Faults::kill) are idempotent, so a nemesis can always heal.
///
/// The futures are `Send`, so faults can be injected from a spawned task while the code
/// under test runs.
pub trait Faults: Send + Sync {
    /// Node URLs clients should connect to, e.g. `redis://127.0.0.1:PORT` (through the node's
    /// proxy when the backend has one).
    fn urls(&self) -> Vec<String>;

    /// Number of nodes.
    fn len(&self) -> usize;

    /// Whether there are no nodes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Kills the node (SIGKILL); it stays down. A no-op when it is down.
    fn kill(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// (Re)starts a killed node on the same address and waits until it answers `PING`. A
    /// no-op when it is running.
    fn start(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// Kills the node, waits `delay`, starts it again.
    fn restart(&self, node: usize, delay: Duration) -> impl Future<Output = io::Result<()>> + Send;

    /// Pauses the node (SIGSTOP): connections stay open, nothing is answered.
    fn pause(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// Resumes a paused node (SIGCONT). A no-op when it is not paused.
    fn resume(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// Cuts the client's link to the node: nothing passes in either direction (blackhole).
    fn disconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// Restores the client's link to the node (a cut one, and a slowed one).
    fn reconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send;

    /// Slows the client's link to the node: every byte is delivered `delay` late, in each
    /// direction, in order; [`reconnect`](Faults::reconnect) makes it fast again (bytes
    /// already on their way still arrive). The default is `Unsupported`, for backends
    /// without a proxy.
    fn slow(&self, node: usize, delay: Duration) -> impl Future<Output = io::Result<()>> + Send {
        let _ = delay;
        async move {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("node {node}: this backend cannot slow a link"),
            ))
        }
    }
}
