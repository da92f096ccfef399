//! The client: [`Redlock`] holds the nodes and the configuration, and runs one
//! acquisition attempt ([`acquire_once`]); waiting between attempts lives in
//! [`wait`](crate::wait), the guard in [`lock`](crate::lock).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::Value;
use tracing::{Instrument, field};

use crate::config::{Config, RedlockBuilder, Retry};
use crate::error::{Error, NodeOutcome, Timeout, TimeoutBudget};
use crate::fanout::{Cleanup, InFlight, Round};
use crate::lock::Lock;
use crate::node::{ACQUIRE_MANY, Node, NodeAddr, NodeSpec, Reply, Request, ScriptCall};
use crate::quorum::{self, Ballot, Decision};
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
                quorum: quorum::quorum(n),
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

/// Measures a decided round: the time it took and the validity left for `ttl`, recorded on
/// the current span (`granted`, `elapsed_us`, `validity_ms`).
pub(crate) fn record_vote(round: &Round, ttl: Duration, config: &Config) -> (Duration, Duration) {
    let elapsed = round.elapsed();
    let validity = quorum::validity(ttl, elapsed, quorum::drift(ttl, config.drift_factor));
    let span = tracing::Span::current();
    span.record("granted", round.tally().granted());
    span.record(
        "elapsed_us",
        u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
    );
    span.record(
        "validity_ms",
        u64::try_from(validity.as_millis()).unwrap_or(u64::MAX),
    );
    (elapsed, validity)
}

/// How an acquire reply counts.
///
/// One resource is taken with `SET key token NX PX ttl GET` (Redis ≥ 7.0): nil means there
/// was no key and ours is set; a string is the current holder's token (not set). The
/// multi-resource script answers 1/0, the fenced one `{1, …}`/`{0}`.
pub(crate) fn acquire_ballot(r: &Reply) -> Ballot {
    match r {
        Reply::Value(Value::Nil | Value::Okay | Value::Int(1)) => Ballot::Granted,
        Reply::Value(Value::BulkString(_) | Value::Int(0)) => Ballot::Refused,
        Reply::Value(Value::Array(a)) if matches!(a.first(), Some(Value::Int(0))) => {
            Ballot::Refused
        }
        Reply::Value(Value::Array(a)) if matches!(a.first(), Some(Value::Int(1))) => {
            Ballot::Granted
        }
        _ => Ballot::Failed,
    }
}

/// The largest number of nodes one other owner holds, from `SET … GET` replies (each
/// refusal names the holder's token). `None` when a refusal did not name its holder.
fn largest_holder(round: &Round) -> Option<usize> {
    let mut owners: Vec<(&[u8], usize)> = Vec::new();
    for (_, r) in round.replies() {
        match r {
            Reply::Value(Value::BulkString(owner)) => {
                match owners.iter_mut().find(|(o, _)| *o == owner.as_slice()) {
                    Some((_, n)) => *n += 1,
                    None => owners.push((owner.as_slice(), 1)),
                }
            }
            r if acquire_ballot(r) == Ballot::Refused => return None,
            _ => {}
        }
    }
    Some(owners.iter().map(|(_, n)| *n).max().unwrap_or(0))
}

/// The release ids of the owners named by `SET … GET` refusals: each token's first eight
/// characters, as a release announcement names its lock (distinct, in node order).
fn holder_ids(round: &Round) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for (_, r) in round.replies() {
        if let Reply::Value(Value::BulkString(owner)) = r {
            let id = String::from_utf8_lossy(owner.get(..8).unwrap_or(owner)).into_owned();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// What an acquire reply says, for votes and tracing.
pub(crate) fn outcome(ballot: fn(&Reply) -> Ballot) -> impl Fn(&Reply) -> NodeOutcome {
    move |r| match (r, ballot(r)) {
        (_, Ballot::Granted) => NodeOutcome::Granted,
        (_, Ballot::Refused) => NodeOutcome::HeldByOther,
        (Reply::TimedOut, _) => NodeOutcome::TimedOut,
        (Reply::Error(e), _) => NodeOutcome::Failed(Reply::error_text(e)),
        (Reply::Value(v), _) => {
            NodeOutcome::Failed(format!("unexpected reply: {}", short_value(v)))
        }
    }
}

fn short_value(v: &Value) -> String {
    let s = format!("{v:?}");
    if s.len() > 80 {
        let mut cut = 80;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

pub(crate) fn release_call(
    res: &Resources,
    token: &Token,
    announce: bool,
    waiter: &[u8],
) -> ScriptCall {
    if res.len() == 1 {
        let [queue, expiry] = res.queue_keys();
        let mut keys = res.lock_keys().to_vec();
        keys.push(queue);
        keys.push(expiry);
        let channel = if announce {
            res.channels().into_iter().next().unwrap_or_default()
        } else {
            Vec::new()
        };
        return ScriptCall::new(
            &crate::node::RELEASE_ONE,
            keys,
            vec![token.as_bytes().to_vec(), channel, waiter.to_vec()],
        );
    }
    let mut args = vec![token.as_bytes().to_vec()];
    if announce {
        args.extend(res.channels());
    }
    ScriptCall::new(&crate::node::RELEASE, res.lock_keys().to_vec(), args)
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
    let ttl_ms = quorum::millis_ceil(ttl);
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
        let request = Arc::new(if res.len() == 1 {
            let mut set = redis::cmd("SET");
            set.arg(res.lock_keys()[0].as_slice())
                .arg(token.as_bytes())
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .arg("GET");
            Request::Cmd(set)
        } else {
            Request::Script(Arc::new(ScriptCall::new(
                &ACQUIRE_MANY,
                res.lock_keys().to_vec(),
                vec![token.as_bytes().to_vec(), ttl_ms.to_string().into_bytes()],
            )))
        });
        let round = Round::start(&inner.nodes, inner.quorum, |_, node| {
            let node = node.clone();
            let request = request.clone();
            async move { node.request(&request, node_timeout).await }
        });
        let mut attempt = Attempt::new(inner.clone(), res.clone(), token, node_timeout, round);
        let decision = attempt.round.decide(acquire_ballot).await;
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
        let (elapsed, validity) = record_vote(&self.round, ttl, &self.inner.config);
        let span = tracing::Span::current();
        if quorum::is_held(decision, validity, self.inner.config.min_validity) {
            span.record("outcome", "acquired");
            self.armed = false;
            let deadline = self.round.started() + validity;
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
        let mut votes = self.round.votes(&self.inner.nodes, outcome(acquire_ballot));
        votes.largest_holder = largest_holder(&self.round);
        votes.holder_ids = holder_ids(&self.round);
        let err = if decision == Decision::Reached {
            span.record("outcome", "no validity left");
            Error::Timeout(Timeout {
                budget: TimeoutBudget::Validity,
                waited: elapsed,
                attempts: 1,
                votes: Some(votes),
            })
        } else if self.round.tally().blocked_by_holder() {
            span.record("outcome", "held");
            Error::Held(votes)
        } else {
            span.record("outcome", "no quorum");
            Error::NoQuorum(votes)
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
            match acquire_ballot(r) {
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
        let call = Arc::new(release_call(&self.res, &self.token, false, &[]));
        let timeout = self.node_timeout;
        cleanup.spawn(
            |r| acquire_ballot(r) == Ballot::Refused,
            move |i: usize| {
                let node = inner.nodes.get(i).cloned();
                let call = call.clone();
                async move {
                    match node {
                        Some(node) => node.eval(&call, timeout).await,
                        None => Reply::TimedOut,
                    }
                }
            },
        )
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
