//! Counted semaphores across the quorum: [`Semaphore`], at most `P` holders at a time.
//!
//! Each node keeps, per name, a sorted set of holders (`quorumlock:sem:{name}`, permit
//! token → expiry by the node's clock) and admits a new holder while it has fewer than `c`
//! live entries, the *per-node limit*. A holder needs `Q` grants (a majority by default).
//! Since every node holds at most `c` live entries and every holder has live entries on at
//! least `Q` nodes, at most `⌊c·N / Q⌋` holders coexist; `c` is the largest limit that
//! keeps this at or below `P` ([`per_node_limit`](Semaphore::per_node_limit),
//! [`capacity`](Semaphore::capacity); the arithmetic is in `protocol::semaphore`). The
//! pigeonhole bound costs capacity: with a majority quorum `P − 1` or `P` holders fit
//! with every node up, fewer with nodes down ([`capacity_with_down`](Semaphore::capacity_with_down)).
//! [`with_quorum`](Semaphore::with_quorum) trades fault tolerance for capacity.
//!
//! The capacity is reached when holders' entries are spread evenly: a new holder keeps its
//! entries on the least loaded of the nodes that granted it. Acquisitions that overlap
//! with one another's give-back can see loads that are out of date and be refused below
//! the capacity (never admitted above it).
//!
//! A holder keeps its entry on exactly `Q` nodes: once every node has answered its acquire
//! (each bounded by the per-node timeout), it decides which (the least loaded grants) and
//! gives the others back (and any unknown answer), in the background, so they do not take
//! slots others could use. The give-back never touches a kept node. No extension is sent
//! or counted before that decision ([`Lock::extend`] waits for it, briefly; the watchdog
//! does not extend the permit until then), and from then on extensions go to the kept
//! nodes only and need all `Q` of them: a node outside the kept set may be about to lose
//! its entry to the give-back, so its confirmation proves nothing. So a permit is extended
//! only while all `Q` of its nodes answer; a kept permit whose node fails is reported lost.
//! Its release still goes to every node (compare-based, harmless where it has no entry).
//!
//! Every client of one semaphore must agree on `P`, `c`, `Q` and `N`: each node stores
//! them (`quorumlock:semcfg:{name}`, expiring with the last holder) and refuses, without
//! writing anything, an acquire that names different ones
//! ([`Error::PermitsMismatch`]).
//!
//! One resource per semaphore (no `_many` forms); its keys are their own namespace,
//! independent of the mutex and the read-write lock of the same name.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Error;
use crate::base::resource::{Kind, Resources, SemKeys};
use crate::client::acquire::{Ask, acquire_as};
use crate::client::lock::Lock;
use crate::client::redlock::Redlock;
use crate::client::shared::Inner;
use crate::client::wait::acquire_polling;
use crate::protocol::semaphore::{self, MAX_PERMITS};

/// A counted semaphore: at most [`permits`](Semaphore::permits) holders of
/// `name` at a time, across the quorum. Made by [`Redlock::semaphore`].
///
/// Each permit is a [`Lock`] ([`LockMode::Permit`](crate::LockMode::Permit)): extend it,
/// release it, keep it alive with the watchdog, or drop it, as a mutex. Cheap to clone;
/// clones share the client's connections.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// let locks = quorumlock::Redlock::builder([
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
///     "redis://127.0.0.1:7004",
///     "redis://127.0.0.1:7005",
/// ])
/// .build()
/// .await?;
/// let pool = locks.semaphore("api-quota", 10)?;
/// assert_eq!(pool.per_node_limit(), 6); // c = ⌈11·3/5⌉ − 1
/// assert_eq!(pool.capacity(), 10); // ⌊6·5/3⌋
/// assert_eq!(pool.capacity_with_down(2), 6); // ⌊6·3/3⌋
/// let permit = pool.acquire(Duration::from_secs(30)).await?;
/// // ... call the API ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
    res: Resources,
    keys: Arc<SemKeys>,
    permits: u32,
    limit: u32,
    quorum: usize,
    /// The test kit's negative control: `c = P`, whatever the quorum.
    naive: bool,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.res.label())
            .field("permits", &self.permits)
            .field("per_node_limit", &self.limit)
            .field("quorum", &self.quorum)
            .field("nodes", &self.inner.nodes.len())
            .field("capacity", &self.capacity())
            .field("naive", &self.naive)
            .finish()
    }
}

impl Redlock {
    /// A semaphore of `permits` permits named `name`, on this client's nodes. No I/O:
    /// nodes are only asked when a permit is acquired.
    ///
    /// Its quorum is the smallest at or above the majority that lets exactly `permits`
    /// holders in with every node up ([`Semaphore::capacity`] is `permits`). Where the
    /// majority cannot give `permits` (5 nodes and 2 permits, say), that quorum is larger,
    /// and fewer nodes may be down ([`Semaphore::capacity_with_down`]); choose another
    /// with [`Semaphore::with_quorum`], or trade permits for availability with
    /// [`Semaphore::with_quorum_allowing_fewer`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty or too long name, or `permits` outside
    /// `1..=1_000_000`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let pool = locks.semaphore("db-connections", 4)?;
    /// let permit = pool.try_acquire(Duration::from_secs(10)).await?;
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        Semaphore::new(self, name, permits, false)
    }
}

impl Semaphore {
    fn new(locks: &Redlock, name: &str, permits: u32, naive: bool) -> Result<Semaphore, Error> {
        let res = Resources::new(&[name])?;
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::invalid(
                "permits",
                format!("{permits}; a semaphore has 1 to {MAX_PERMITS} permits"),
            ));
        }
        let inner = locks.groups.route(&res)?.clone();
        let res = inner.resources(&res)?;
        let quorum = if naive {
            inner.quorum
        } else {
            semaphore::default_quorum(permits, inner.nodes.len())
        };
        let mut s = Semaphore {
            keys: Arc::new(SemKeys::new(name, &inner.keys)),
            inner,
            res,
            permits,
            limit: 0,
            quorum,
            naive,
        };
        s.limit = s.limit_for(quorum);
        Ok(s)
    }

    /// A **deliberately unsafe** semaphore, a negative control for tests: `c = P` with the
    /// majority quorum (up to `⌊P·N / Q⌋` holders at once, more than `P`). Never use it
    /// to guard anything: it exists so that a test, or a history checker, can show it
    /// catches a semaphore that admits too many holders. Every request is the real
    /// semaphore's; only `c` differs. (`quorumlock-testkit`'s `naive_semaphore` is this.)
    /// Built only with the feature `negative-controls`.
    ///
    /// # Errors
    ///
    /// As [`Redlock::semaphore`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let unsafe_pool = quorumlock::Semaphore::naive(&locks, "negative-control", 2)?;
    /// assert_eq!(unsafe_pool.per_node_limit(), 2);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "negative-controls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "negative-controls")))]
    pub fn naive(locks: &Redlock, name: &str, permits: u32) -> Result<Semaphore, Error> {
        Semaphore::new(locks, name, permits, true)
    }

    fn limit_for(&self, quorum: usize) -> u32 {
        if self.naive {
            self.permits
        } else {
            semaphore::per_node_limit(self.permits, self.inner.nodes.len(), quorum)
        }
    }

    /// The same semaphore with quorum `q`: a permit needs `q` grants. The quorum must still
    /// let [`permits`](Semaphore::permits) holders in with every node up; a larger quorum
    /// lowers the number of nodes that may be down (`N − q`): compare
    /// [`capacity_with_down`](Semaphore::capacity_with_down). Every client of the semaphore
    /// must use the same quorum (the nodes refuse a different one, see
    /// [`Error::PermitsMismatch`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] unless `q` is between the majority (`N / 2 + 1`) and `N`, or
    /// when `q` lets fewer than `P` holders in (the message says how many, and
    /// [`with_quorum_allowing_fewer`](Semaphore::with_quorum_allowing_fewer) accepts it).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder([
    ///     "redis://127.0.0.1:7001",
    ///     "redis://127.0.0.1:7002",
    ///     "redis://127.0.0.1:7003",
    ///     "redis://127.0.0.1:7004",
    ///     "redis://127.0.0.1:7005",
    /// ])
    /// .build()
    /// .await?;
    /// let pool = locks.semaphore("pool", 2)?;
    /// assert_eq!((pool.quorum(), pool.capacity()), (4, 2)); // the default: P holders
    /// assert_eq!(pool.capacity_with_down(1), 2);
    /// let pool = pool.with_quorum(5)?; // also P holders, but no node may be down
    /// assert_eq!(pool.capacity_with_down(1), 0);
    /// assert!(pool.with_quorum(3).is_err()); // the majority fits only 1 of 2
    /// # Ok(()) }
    /// ```
    pub fn with_quorum(self, q: usize) -> Result<Semaphore, Error> {
        let s = self.with_quorum_allowing_fewer(q)?;
        let capacity = s.capacity();
        if capacity < s.permits {
            let n = s.inner.nodes.len();
            return Err(Error::invalid(
                "quorum",
                format!(
                    "{q} of {n} nodes lets only {capacity} of {} permit(s) be held at once; \
                     the default quorum ({}) gives all of them, or accept fewer with \
                     with_quorum_allowing_fewer",
                    s.permits,
                    semaphore::default_quorum(s.permits, n)
                ),
            ));
        }
        Ok(s)
    }

    /// As [`with_quorum`](Semaphore::with_quorum), accepting a quorum that lets fewer than
    /// `P` holders in: an explicit trade of permits for availability. With the majority
    /// quorum, [`capacity`](Semaphore::capacity) is `P` or `P − 1`, and a minority of the
    /// nodes may be down. The bound on holders (never more than `P`) holds either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] unless `q` is between the majority (`N / 2 + 1`) and `N`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003", "redis://127.0.0.1:7004", "redis://127.0.0.1:7005"]).build().await?;
    /// let pool = locks.semaphore("pool", 2)?.with_quorum_allowing_fewer(3)?;
    /// assert_eq!(pool.capacity(), 1); // majority: c = 1, ⌊5/3⌋
    /// assert_eq!(pool.capacity_with_down(2), 1);
    /// # Ok(()) }
    /// ```
    pub fn with_quorum_allowing_fewer(mut self, q: usize) -> Result<Semaphore, Error> {
        let n = self.inner.nodes.len();
        if !semaphore::valid_quorum(n, q) {
            return Err(Error::invalid(
                "quorum",
                format!(
                    "{q} of {n} nodes; a semaphore's quorum is a majority ({}) to {n}",
                    n / 2 + 1
                ),
            ));
        }
        self.quorum = q;
        self.limit = self.limit_for(q);
        Ok(self)
    }

    /// The number of permits `P`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.semaphore("pool", 4)?.permits(), 4);
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The per-node limit `c`: how many live permits one node admits,
    /// `⌈(P + 1)·Q / N⌉ − 1`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).build().await?;
    /// assert_eq!(locks.semaphore("pool", 3)?.per_node_limit(), 2); // ⌈4·2/3⌉ − 1
    /// # Ok(()) }
    /// ```
    pub fn per_node_limit(&self) -> u32 {
        self.limit
    }

    /// The quorum `Q`: the grants a permit needs.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).build().await?;
    /// assert_eq!(locks.semaphore("pool", 3)?.quorum(), 2);
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The most holders that can coexist with every node up: `⌊c·N / Q⌋`, at most
    /// [`permits`](Semaphore::permits) (`P − 1` or `P` with a majority quorum).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).build().await?;
    /// let pool = locks.semaphore("pool", 3)?;
    /// assert!(pool.capacity() <= pool.permits());
    /// # Ok(()) }
    /// ```
    pub fn capacity(&self) -> u32 {
        semaphore::capacity(self.limit, self.inner.nodes.len(), self.quorum)
    }

    /// The most holders that can coexist with `f` nodes down: `⌊c·(N − f) / Q⌋`, or zero
    /// once fewer than `Q` nodes are up.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).build().await?;
    /// let pool = locks.semaphore("pool", 3)?;
    /// assert_eq!(pool.capacity_with_down(0), pool.capacity());
    /// assert_eq!(pool.capacity_with_down(2), 0); // 1 node left, quorum 2
    /// # Ok(()) }
    /// ```
    pub fn capacity_with_down(&self, f: usize) -> u32 {
        semaphore::capacity_with_down(self.limit, self.inner.nodes.len(), self.quorum, f)
    }

    /// What each attempt asks for.
    fn ask(&self) -> Ask {
        let mut ask = Ask::new(Kind::Permit(self.keys.clone()), self.quorum);
        let config = semaphore::config(
            self.permits,
            self.limit,
            self.quorum,
            self.inner.nodes.len(),
        );
        ask.permit = Some((config, self.limit));
        ask
    }

    /// Tries once to take a permit for `ttl`. Never waits or retries.
    ///
    /// # Errors
    ///
    /// * [`Error::Held`]: the permits are taken (too many nodes are full);
    /// * [`Error::PermitsMismatch`]: the semaphore is in use with another configuration
    ///   (nothing was written on the nodes that said so);
    /// * as [`Redlock::try_lock`]: [`Error::NoQuorum`], [`Error::Timeout`],
    ///   [`Error::InvalidInput`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: if dropped, every entry the attempt may have added is removed in the
    /// background.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let pool = locks.semaphore("pool", 4)?;
    /// match pool.try_acquire(Duration::from_secs(10)).await {
    ///     Ok(permit) => permit.release().await?,
    ///     Err(e) if e.is_held() => println!("all permits taken"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Lock, Error> {
        Error::ensure_runtime()?;
        self.inner.config.check_ttl(ttl)?;
        acquire_as(&self.inner, &self.res, &self.ask(), ttl, 1)
            .await
            .map_err(|e| e.about(self.res.names()))
    }

    /// Takes a permit for `ttl`, waiting per the client's retry policy (polling with the
    /// policy's random delays, bounded by its attempts or maximum wait).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Semaphore::try_acquire), except that [`Error::Held`] and
    /// [`Error::NoQuorum`] are retried; when the policy runs out, [`Error::Timeout`]
    /// carries the last attempt's votes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_acquire`](Semaphore::try_acquire).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let permit = locks.semaphore("pool", 4)?.acquire(Duration::from_secs(10)).await?;
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, ttl: Duration) -> Result<Lock, Error> {
        Error::ensure_runtime()?;
        self.inner.config.check_ttl(ttl)?;
        let retry = &self.inner.config.retry;
        acquire_polling(&self.inner, &self.res, &self.ask(), ttl, retry)
            .await
            .map_err(|e| e.about(self.res.names()))
    }
}
