//! The client: [`Redlock`] holds the nodes and the configuration, and runs one
//! acquisition attempt ([`acquire_once`]); waiting between attempts lives in
//! [`wait`](crate::wait), the guard in [`lock`](crate::lock).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tracing::{Instrument, field};

use crate::config::{Config, RedlockBuilder, Retry};
use crate::error::Error;
use crate::fanout::{Cleanup, InFlight, Round};
use crate::lock::Lock;
use crate::node::{Node, NodeAddr, NodeSpec, Request};
use crate::protocol::reply::{holder_ids, largest_holder};
use crate::protocol::{Ballot, Decision, Reply, Verdict, tally, verdict};
use crate::resource::Resources;
use crate::token::Token;
use crate::wait::Notifier;

/// How long each start-up check query may take at the least (they run in the background).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A Redlock client: a set of independent Redis masters and the settings to lock on them.
///
/// Cheap to clone (an `Arc` inside); clones share the connections. `Send + Sync`.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// let locks = Redlock::builder([
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
/// ])
/// .build()
/// .await?;
///
/// let lock = locks.lock("orders:42", Duration::from_secs(10)).await?;
/// // ... the critical section, within lock.remaining() ...
/// lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

/// What every clone of a [`Redlock`] and every [`Lock`] shares.
pub(crate) struct Inner {
    pub(crate) nodes: Arc<[Node]>,
    pub(crate) addrs: Vec<NodeAddr>,
    pub(crate) quorum: usize,
    pub(crate) config: Config,
    pub(crate) notifier: Option<Notifier>,
    /// The watchdog's registry of kept locks and its task, started on first use.
    pub(crate) watchdog: std::sync::OnceLock<crate::watchdog::Registry>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.inner.addrs)
            .field("quorum", &self.inner.quorum)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Redlock {
    /// Starts building a client for these node URLs.
    ///
    /// URLs follow redis-rs: `redis://[user:password@]host:port[/db]`, `rediss://…` for
    /// TLS (with a TLS feature), `redis+unix:///path/to/socket`. Nothing is checked or
    /// connected until [`RedlockBuilder::build`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(vec![
    ///     "redis://127.0.0.1:7001".to_string(),
    ///     "redis://127.0.0.1:7002".to_string(),
    ///     "redis://127.0.0.1:7003".to_string(),
    /// ])
    /// .build()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder<I>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        RedlockBuilder::new(urls)
    }

    pub(crate) async fn connect(specs: Vec<NodeSpec>, config: Config) -> Result<Redlock, Error> {
        let nodes = specs
            .iter()
            .map(|s| Node::new(s, config.connect_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        let n = nodes.len();
        if n % 2 == 0 {
            tracing::warn!(
                nodes = n,
                "quorumlock: an even number of nodes tolerates no more failures than one node fewer; use 3, 5 or 7"
            );
        }
        // Open every connection concurrently, waiting at most the connect timeout; then
        // check each reachable node against the deployment contract in the background.
        let ping = redis::cmd("PING");
        let warmup: FuturesUnordered<_> = nodes
            .iter()
            .map(|node| node.query(&ping, config.connect_timeout))
            .collect();
        let _ = tokio::time::timeout(config.connect_timeout, warmup.collect::<Vec<_>>()).await;
        // The checks run in the background and only warn: give each query more patience
        // than a lock request gets, so that a busy machine does not hide a warning.
        let check_timeout = config.connect_timeout.max(CHECK_TIMEOUT);
        for node in &nodes {
            let node = node.clone();
            let t = check_timeout;
            let fencing = config.fencing;
            crate::fanout::spawn(
                async move { crate::node::check_deployment(&node, t, fencing).await },
            );
        }
        let addrs = nodes.iter().map(|n| n.addr.clone()).collect();
        let nodes: Arc<[Node]> = nodes.into();
        let notifier = if config.notify {
            Some(Notifier::new(&specs))
        } else {
            None
        };
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                addrs,
                quorum: tally::quorum(n),
                config,
                notifier,
                watchdog: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The nodes, as configured (passwords redacted).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// for node in locks.nodes() {
    ///     println!("{node}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.inner.addrs
    }

    /// Waits until the background work of this process has finished, at most `within`:
    /// the slower nodes of a release (which returns at the quorum), the clean-up of failed
    /// or cancelled attempts, locks dropped without `release`. Returns whether everything
    /// finished.
    ///
    /// Call it before a short-lived process exits (a CLI, a cron job): otherwise the slower
    /// nodes may keep a released lock's key until its TTL, which delays the next holder on
    /// those nodes (never safety). The work of every `Redlock` in the process counts.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("cron:nightly", Duration::from_secs(60)).await?;
    /// // ... the job ...
    /// lock.release().await?;
    /// locks.flush(Duration::from_secs(1)).await; // before exiting
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self, within: Duration) -> bool {
        crate::fanout::flush(within).await
    }

    /// [`flush`](Redlock::flush) without a client at hand (the work is per process anyway).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() {
    /// quorumlock::Redlock::flush_background(std::time::Duration::from_secs(1)).await;
    /// # }
    /// ```
    pub async fn flush_background(within: Duration) -> bool {
        crate::fanout::flush(within).await
    }

    /// The checks every acquiring call makes before any I/O: a runtime, valid resource
    /// names, a valid TTL.
    fn prepare<S: AsRef<str>>(&self, names: &[S], ttl: Duration) -> Result<Resources, Error> {
        Error::ensure_runtime()?;
        let res = Resources::new(names)?;
        self.inner.config.check_ttl(ttl)?;
        Ok(res)
    }

    /// The number of nodes that must grant: `N / 2 + 1`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).build().await?;
    /// assert_eq!(locks.quorum(), 2);
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Tries once to take the lock on `resource` for `ttl`. Never waits or retries.
    ///
    /// The lock is held when a quorum of nodes granted and validity is left after
    /// subtracting the time the attempt took and the clock drift allowance; the returned
    /// [`Lock`]'s [`remaining`](Lock::remaining) says how much.
    ///
    /// # Errors
    ///
    /// * [`Error::Held`]: another owner holds it;
    /// * [`Error::NoQuorum`]: too few nodes answered;
    /// * [`Error::Timeout`]: the quorum came too late, no validity was left;
    /// * [`Error::InvalidInput`]: an empty or too long resource name, a zero TTL, a TTL
    ///   above the maximum or too small for the drift allowance.
    ///
    /// A failed attempt leaves no key behind: it is released on every node that may
    /// hold it, including nodes that timed out (their `SET` may land late).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. If the future is dropped, no [`Lock`] is returned and every key the
    /// attempt may have set is released in the background.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// match locks.try_lock("cron:nightly", Duration::from_secs(60)).await {
    ///     Ok(lock) => { /* run the job */ lock.release().await?; }
    ///     Err(e) if e.is_held() => println!("another machine runs it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let res = self.prepare(&[resource], ttl)?;
        acquire_once(&self.inner, &res, ttl, 1).await
    }

    /// Takes the lock on `resource`, waiting per the retry policy (and, unless turned
    /// off with [`RedlockBuilder::notify`], waking as soon as a release is announced).
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Redlock::try_lock), except that [`Error::Held`] and
    /// [`Error::NoQuorum`] are retried; when the policy's attempts or maximum wait run
    /// out, [`Error::Timeout`] carries the last attempt's votes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Redlock::try_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.lock("orders:42", Duration::from_secs(10)).await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let res = self.prepare(&[resource], ttl)?;
        crate::wait::acquire_waiting(&self.inner, &res, ttl, &self.inner.config.retry).await
    }

    /// As [`lock`](Redlock::lock), with a retry policy for this call only.
    ///
    /// # Errors
    ///
    /// As [`lock`](Redlock::lock); [`Error::InvalidInput`] for an invalid policy.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::Retry;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks
    ///     .lock_with("report", Duration::from_secs(30), Retry::new().max_wait(Duration::from_secs(60)))
    ///     .await?;
    /// # drop(lock);
    /// # Ok(()) }
    /// ```
    pub async fn lock_with(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> Result<Lock, Error> {
        let res = self.prepare(&[resource], ttl)?;
        retry.validate().map_err(|e| match e {
            Error::Config(c) => Error::invalid("retry", c.to_string()),
            other => other,
        })?;
        crate::wait::acquire_waiting(&self.inner, &res, ttl, &retry).await
    }

    /// Tries once to take every resource in the list, all-or-nothing: on each node one
    /// script sets every key or none. The list is a set: order does not matter and
    /// duplicates are refused.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Redlock::try_lock); [`Error::InvalidInput`] also for an empty
    /// list or a duplicate name.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Redlock::try_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock_many(&["stock:1", "stock:2"], Duration::from_secs(5)).await?;
    /// assert_eq!(lock.resources(), ["stock:1", "stock:2"]);
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_lock_many<I>(&self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names: Vec<I::Item> = resources.into_iter().collect();
        let res = self.prepare(&names, ttl)?;
        acquire_once(&self.inner, &res, ttl, 1).await
    }

    /// Takes every resource in the list, all-or-nothing, waiting per the retry policy.
    ///
    /// # Errors
    ///
    /// As [`lock`](Redlock::lock) and [`try_lock_many`](Redlock::try_lock_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Redlock::try_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let mut lock = locks.lock_many(["account:1", "account:2"], Duration::from_secs(5)).await?;
    /// lock.extend(Duration::from_secs(5)).await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_many<I>(&self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names: Vec<I::Item> = resources.into_iter().collect();
        let res = self.prepare(&names, ttl)?;
        crate::wait::acquire_waiting(&self.inner, &res, ttl, &self.inner.config.retry).await
    }
}

/// One acquisition attempt: fan out, decide at quorum, compute the validity, and either
/// return the lock or clean up every node.
pub(crate) async fn acquire_once(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    attempt: u32,
) -> Result<Lock, Error> {
    let config = &inner.config;
    let token = Token::generate()?;
    let node_timeout = config.node_timeout_for(ttl);
    let ttl_ms = crate::node::millis_ceil(ttl);
    let span = tracing::debug_span!(
        "quorumlock.acquire",
        resource = %res.label(),
        nodes = inner.nodes.len(),
        quorum = inner.quorum,
        ttl_ms,
        attempt,
        token = %token,
        granted = field::Empty,
        elapsed_us = field::Empty,
        validity_ms = field::Empty,
        outcome = field::Empty,
    );
    async move {
        if config.fencing {
            return crate::fencing::acquire_fenced(inner, res, ttl, token, node_timeout).await;
        }
        let request = Arc::new(Request::acquire(res.lock_keys(), &token, ttl));
        let round = Round::start(&inner.nodes, inner.quorum, |_, node| {
            let node = node.clone();
            let request = request.clone();
            async move { node.send(&request, node_timeout).await }
        });
        let mut attempt = Attempt::new(inner.clone(), res.clone(), token, node_timeout, round);
        let decision = attempt.round.decide().await;
        attempt.finish(decision, ttl, None).await
    }
    .instrument(span)
    .await
}

/// One acquisition attempt in progress. If it is dropped before [`Attempt::finish`]
/// decides, every node that may hold its key is released in the background.
pub(crate) struct Attempt {
    inner: Arc<Inner>,
    res: Resources,
    token: Token,
    node_timeout: Duration,
    pub(crate) round: Round,
    armed: bool,
}

impl Attempt {
    pub(crate) fn new(
        inner: Arc<Inner>,
        res: Resources,
        token: Token,
        node_timeout: Duration,
        round: Round,
    ) -> Attempt {
        Attempt {
            inner,
            res,
            token,
            node_timeout,
            round,
            armed: true,
        }
    }

    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// Decides the attempt: a lock, or an error after cleaning up.
    pub(crate) async fn finish(
        mut self,
        decision: Decision,
        ttl: Duration,
        fencing_token: Option<u64>,
    ) -> Result<Lock, Error> {
        let config = &self.inner.config;
        let (elapsed, validity) = self.round.measure(ttl, config.drift_factor);
        let span = tracing::Span::current();
        let tally = self.round.tally();
        let verdict = verdict::acquire(decision, tally, validity, config.min_validity);
        span.record("outcome", verdict.label("acquired"));
        if let Verdict::Held { validity } = verdict {
            self.armed = false;
            let deadline = crate::time::earlier_of_overflow(self.round.started(), validity);
            let inflight = InFlight::track(&mut self.round);
            return Ok(Lock::new(
                self.inner.clone(),
                self.res.clone(),
                self.token.clone(),
                ttl,
                deadline,
                inflight,
                fencing_token,
            ));
        }
        let mut votes = self.round.votes(&self.inner.nodes);
        votes.largest_holder = largest_holder(self.round.replies().map(|(_, r)| r));
        votes.holder_ids = holder_ids(self.round.replies().map(|(_, r)| r));
        let err = match verdict {
            Verdict::Timeout => Error::no_validity(elapsed, votes),
            Verdict::HeldByOther => Error::Held(votes),
            _ => Error::NoQuorum(votes),
        };
        let granted_released = self.clean_up(true);
        // Awaited so that a failed attempt's keys on the granting nodes are gone when it
        // returns (bounded by the node timeout). Dropping this future does not stop it.
        let _ = granted_released.await;
        Err(err)
    }

    /// Gives the attempt up with `err`, after releasing the granting nodes.
    pub(crate) async fn abandon(mut self, err: Error) -> Result<Lock, Error> {
        tracing::Span::current().record("outcome", "abandoned");
        let granted_released = self.clean_up(true);
        let _ = granted_released.await;
        Err(err)
    }

    /// Starts the clean-up in the background: the granting nodes first, then every node
    /// that failed or timed out, then each node still running its request once it
    /// finishes. Returns a receiver that completes once the granting nodes are released.
    pub(crate) fn clean_up(
        &mut self,
        wait_for_granted: bool,
    ) -> tokio::sync::oneshot::Receiver<()> {
        self.armed = false;
        let mut first = Vec::new();
        let mut now = Vec::new();
        for (i, r) in self.round.replies() {
            match r.ballot() {
                Ballot::Granted if wait_for_granted => first.push(i),
                Ballot::Granted | Ballot::Failed => now.push(i),
                Ballot::Refused => {}
            }
        }
        let cleanup = Cleanup {
            first,
            now,
            later: self.round.take_pending(),
        };
        let inner = self.inner.clone();
        let call = Arc::new(Request::release(&self.res, &self.token, false, &[]));
        let timeout = self.node_timeout;
        cleanup.spawn(move |i: usize| {
            let node = inner.nodes.get(i).cloned();
            let call = call.clone();
            async move {
                match node {
                    Some(node) => node.send(&call, timeout).await,
                    None => Reply::TimedOut,
                }
            }
        })
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(resource = %self.res.label(), token = %self.token,
                "quorumlock: attempt cancelled; releasing in the background");
            drop(self.clean_up(false));
        }
    }
}
