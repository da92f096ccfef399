//! quorumlock is **Redlock** for Rust: a mutual-exclusion lock held on a majority of N
//! independent Redis masters, so that it survives the crash of any minority of them.
//!
//! It decides as soon as the outcome is certain (it does not wait for a slow node),
//! cleans up every key a failed attempt may have left (even a `SET` that lands late),
//! never deletes a lock whose extension missed the quorum, never lets an extension shorten
//! a lock, and is tested under process kills, pauses, restarts, failovers and cut links
//! with a checker that can fail. `docs/safety.md` in the repository names the test behind
//! every guarantee.
//!
//! ```no_run
//! use std::time::Duration;
//! use quorumlock::{Error, Redlock};
//!
//! # async fn demo() -> Result<(), Error> {
//! let locks = Redlock::builder([
//!     "redis://127.0.0.1:7001",
//!     "redis://127.0.0.1:7002",
//!     "redis://127.0.0.1:7003",
//!     "redis://127.0.0.1:7004",
//!     "redis://127.0.0.1:7005",
//! ])
//! .build()
//! .await?;
//!
//! // One attempt; fails fast with Error::Held if someone else has it.
//! let mut lock = locks.try_lock("coupon:last", Duration::from_secs(10)).await?;
//! // ... work, strictly within lock.remaining() ...
//! lock.extend(Duration::from_secs(10)).await?;
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Contents
//!
//! * [Which method should you use?](#which-method-should-you-use)
//! * [Keeping a lock alive](#keeping-a-lock-alive)
//! * [When not to use Redlock](#when-not-to-use-redlock)
//! * [How the algorithm maps to the code](#how-the-algorithm-maps-to-the-code)
//! * [Cancel safety](#cancel-safety)
//! * [Deployment contract](#deployment-contract)
//! * [Crate features](#crate-features)
//!
//! # Which method should you use?
//!
//! | you want | call |
//! | --- | --- |
//! | one attempt, fail fast if busy (cron job on one machine) | [`Redlock::try_lock`] |
//! | wait until it is free, bounded (work queue, hand-off) | [`Redlock::lock`] (or [`Redlock::lock_with`] for a per-call [`Retry`]) |
//! | several resources atomically (move stock between two bins) | [`Redlock::try_lock_many`], [`Redlock::lock_many`] |
//! | many readers or one writer (a catalog read often, rebuilt rarely) | [`Redlock::read_lock`], [`Redlock::write_lock`] (and `try_`, `with_` forms); writers are preferred |
//! | at most P holders at a time (a connection pool, an API quota) | [`Redlock::semaphore`] → [`Semaphore::acquire`], [`Semaphore::with_permit`] |
//! | keep it alive while the work runs, stop when it is lost | [`Lock::keep_alive`] → [`KeptLock`] ([`KeptLock::lost`]), or scoped: [`Redlock::with_lock`] |
//! | a number the storage can check against stale writers | [`RedlockBuilder::fencing`] and [`Lock::fencing_token`] |
//! | exit right after releasing (CLI, cron) without leaving keys on slow nodes | [`Redlock::flush`] |
//! | see who holds it now, on which nodes, for how long (to look, not to decide) | [`Redlock::inspect`], [`Redlock::inspect_many`] |
//! | more lock throughput than one group of masters serves | [`RedlockBuilder::group`] (resources spread over independent groups; [`Redlock::group_of`]) |
//! | the Redis keys and channels of a resource (an ACL, `redis-cli`, which shard of a cluster holds it) | [`keys::Keys`], [`keys::key_slot`] |
//!
//! # Keeping a lock alive
//!
//! Work of unknown length: hand the lock to the watchdog ([`Lock::keep_alive`] with a
//! [`Watchdog`] policy). It is extended before its validity runs out (by default at half
//! its TTL; every kept lock of one [`Redlock`] is extended in one pipelined round per node
//! and tick), with optional caps on hold time and extension count. Its
//! [`lost`](KeptLock::lost) signal fires **before** the guaranteed validity ends
//! (deadline − safety margin) if no extension confirmed, even when the requests hang.
//! Or use it scoped: [`Redlock::with_lock`] runs a closure, cancels it if the lock is
//! lost, and releases at the end.
//!
//! ```no_run
//! use std::time::Duration;
//! use quorumlock::{Error, Redlock, Watchdog};
//!
//! # async fn demo() -> Result<(), Error> {
//! let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
//! let kept = locks
//!     .lock("reindex", Duration::from_secs(10))
//!     .await?
//!     .keep_alive(Watchdog::new().max_hold(Duration::from_secs(3600)))?;
//! tokio::select! {
//!     () = tokio::time::sleep(Duration::from_secs(30)) => kept.release().await?, // the work
//!     lost = kept.lost() => return Err(lost.into()), // stop: the lock may be gone
//! }
//!
//! // Scoped: the closure's future is dropped if the lock is lost.
//! let rows = locks
//!     .with_lock("reindex", Duration::from_secs(10), Watchdog::new(), |ctx| async move {
//!         let _token = ctx.fencing_token();
//!         1200
//!     })
//!     .await?;
//! # let _ = rows;
//! # Ok(()) }
//! ```
//!
//! # When not to use Redlock
//!
//! Redlock's safety rests on timing: bounded clock drift, and a holder that stops working
//! before its validity ends. A process that pauses (GC, swap, `SIGSTOP`) longer than its
//! validity can still act as if it held the lock. If correctness must not depend on
//! timing, use fencing tokens with a storage that checks them (this crate issues them),
//! or a consensus system (etcd, ZooKeeper). If one Redis instance is enough for you (a
//! crash may let two holders in), a single-instance lock is simpler and faster.
//!
//! # How the algorithm maps to the code
//!
//! The code is in five folders, one per layer, lowest first; a module uses only its own
//! folder and the folders below it (`tests/layering.rs` checks it).
//!
//! | layer (folder) | step | modules |
//! | --- | --- | --- |
//! | `protocol` (pure: no I/O, no clock) | vote counting, validity = TTL − elapsed − drift, typed replies, acquire/extend/release verdicts, the clean-up plan, fencing rules, contention and waiting rules, the kept lock's state, the semaphore's arithmetic | `tally`, `reply`, `verdict`, `cleanup`, `fencing`, `contention`, `handoff`, `keep`, `semaphore`, `groups`, `inspect`, `time` |
//! | `base` (plain data) | resource names → keys; hash slots; lock tokens; errors; saturating time; redacted node addresses; metric names and recording (feature `metrics`) | `resource`, `slot`, `token`, [`error`], `time`, `addr`, `metrics` |
//! | `io` (the nodes) | one node: connection, timeout, scripts, request builders (the one place a TTL becomes a `PX`/script argument), decoding replies | `node` |
//! | | parallel requests, early decision, stragglers, the clean-up run | `fanout` |
//! | | background work and `flush`; release subscriptions; the watchdog's batched rounds; the group-map record | `background`, `notifier`, `extender`, `groupmap` |
//! | | read-only reads of a resource's keys on one node, for inspection | `peek` |
//! | `client` (the mutex) | builder, defaults, validation; what clones share | `config`, `shared` |
//! | | one attempt and its clean-up; fencing's two rounds | `acquire`, `fencing` |
//! | | the held lock of every kind (mutex, reader, writer, permit): extend, release, drop | `lock` |
//! | | retry, notify and hand-off waiting; the public entry points | `wait`, `transfer`, `redlock` |
//! | | locks over several lock groups | `spanning`, `groups` |
//! | | read-only inspection of a resource on every node (its verdict rule: `protocol`) | [`inspect`] |
//! | `locks` (kinds on the mutex) | read-write locks (writer intents) and semaphores (their rules: `protocol`) | `rwlock`, `semaphore` |
//! | | watchdog policy, kept locks, lost signal, scoped use | `watchdog` |
//!
//! # Cancel safety
//!
//! * [`Redlock::try_lock`], [`Redlock::lock`] and the `_many` variants: cancel-safe. If
//!   dropped, no [`Lock`] is returned and every key the attempt may have set (a sent `SET`
//!   can still land) is released in the background.
//! * [`Lock::extend`]: cancel-safe; the deadline moves only after a quorum confirmed.
//! * [`Lock::release`]: consumes the guard; if dropped midway, the release is sent again in
//!   the background, and unreachable nodes keep the key until its TTL.
//! * Dropping a [`Lock`]: released in the background on the current runtime.
//! * [`KeptLock::release`]: as [`Lock::release`]; the watchdog stops at once. Dropping a
//!   [`KeptLock`] stops its watchdog and releases in the background.
//! * [`Redlock::with_lock`]: if dropped, the closure's future is dropped and the lock is
//!   released in the background.
//! * Read-write locks and semaphore permits ([`Redlock::read_lock`],
//!   [`Redlock::write_lock`], [`Semaphore::acquire`] and their `try_` and `with_` forms):
//!   as the mutex's; a waiting writer's intent is also removed in the background.
//!
//! # Deployment contract
//!
//! Redlock is safe only if the nodes are **independent masters** (not replicas of each
//! other), N is odd (3, 5, 7), `maxmemory-policy noeviction`, and a crashed node either
//! persists every write (`appendfsync always`) or restarts only after the longest TTL.
//! Clocks must not jump. With fencing tokens and restarts without persistence, the nodes'
//! wall clocks must also agree to within that restart delay at every moment, not only when
//! a node restarts, and a node's server starts only once its clock is synchronised (the
//! tokens carry a floor from the nodes' clocks; see `docs/safety.md`). [`RedlockBuilder::build`] checks what it can
//! and warns through `tracing`. See `docs/operations.md`.
//!
//! # Crate features
//!
//! * `sim`: [`sim`], a deterministic in-memory model of a Redis node (the Redis commands
//!   this crate's scripts call, and the scripts themselves run by an embedded Lua 5.1 as
//!   Redis runs them; time an input), and a simulator that runs this
//!   crate's protocol layer against N of them under seeded random faults, checking the
//!   safety invariants.
//! * `metrics`: metrics through the [`metrics`](https://docs.rs/metrics) facade, for any
//!   exporter (Prometheus, StatsD, OpenTelemetry, …): latency and outcome of acquire,
//!   extend and release rounds and of each node's requests, validity left at grant, lost
//!   locks by reason, split votes, hand-offs, wait time, watchdog rounds, background work
//!   at `flush`. No label holds a resource name, a token or a password. Without the
//!   feature no metric code is built. See `describe_metrics` and `docs/operations.md`
//!   ("Monitoring") for the metric table and how to install an exporter.
//! * `tls-rustls`: `rediss://` URLs through redis-rs and rustls. Servers are verified
//!   against the system's trust store, or against your own CA with
//!   `RedlockBuilder::tls_root_ca`; a client certificate for servers with
//!   `tls-auth-clients yes` with `RedlockBuilder::tls_client_auth`. `build` installs rustls's `aws-lc-rs` crypto provider as
//!   the process default unless one is installed already (install yours first to use
//!   another).
//! * `negative-controls`: deliberately unsafe variants that a test shows its checker
//!   catches (`Semaphore::naive`, which admits more than `P` holders). For tests only:
//!   `quorumlock-testkit` turns it on.
//!
//! Beside this crate, in the same repository: `quorumlock-testkit` (real `redis-server`
//! processes, fault proxies, local Redis Clusters and a history checker, for your own
//! tests too) and `quorumlock-cli`, the `quorumlock` command (`run`, `inspect`, `demo`;
//! `cargo install --path cli`).
//!
// The links to feature-gated modules: to docs.rs when the feature is off in this build.
#![cfg_attr(feature = "sim", doc = "[`sim`]: crate::sim")]
#![cfg_attr(
    not(feature = "sim"),
    doc = "[`sim`]: https://docs.rs/quorumlock/latest/quorumlock/sim/index.html"
)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, lowest first: a module uses only its own folder and the folders below it
// (`tests/layering.rs` checks it). Each folder's module doc says what it holds.
// 1. the rules, pure functions of what the nodes answered: no I/O, no clock;
mod protocol;
// 2. the vocabulary: resource keys, tokens, errors, time, addresses, metrics;
mod base;
// 3. talking to the nodes: connections, requests, rounds, subscriptions, background work;
mod io;
// 4. the client and the mutex: configuration, attempts, the guard, waiting;
mod client;
// 5. the lock kinds built on it: read-write locks, semaphores, kept locks.
mod locks;

#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;

/// The user guide (`docs/guide.md`): one section per feature, with examples.
pub mod guide {
    #![doc = include_str!("../docs/guide.md")]
}

pub use base::addr::NodeAddr;
pub use base::error;
pub use base::keys;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use base::metrics::describe as describe_metrics;
pub use base::resource::{DEFAULT_NAMESPACE, MAX_NAMESPACE_LEN, MAX_RESOURCE_LEN, MAX_RESOURCES};
pub use client::config::{DEFAULTS, Defaults, MAX_GROUPS, MAX_NODES, RedlockBuilder, Retry};
pub use client::inspect;
pub use client::lock::{Lock, LockMode};
pub use client::redlock::Redlock;
pub use client::wait::QUEUE_LEASE;
pub use error::{
    ConfigError, Error, ErrorKind, GroupMapMismatch, InvalidInput, Lost, LostReason, NodeOutcome,
    NodeVote, PermitsMismatch, RandomSourceError, Result, Timeout, Votes,
};
pub use inspect::Inspection;
pub use io::groupmap::GROUP_MAP_LEASE;
pub use locks::semaphore::Semaphore;
pub use locks::watchdog::{KeptLock, LockContext, LostSignal, PolicyRefused, Watchdog};
