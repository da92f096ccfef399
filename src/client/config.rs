//! Configuration: the builder, the retry policy, the defaults, and validation.
//!
//! Everything is validated in [`RedlockBuilder::build`] before any I/O, so a bad
//! configuration fails at start-up with an [`Error::Config`] naming the field, never
//! later on a request.
//!
//! # Timing, a rule of thumb
//!
//! ```text
//!   node_timeout  ≪  ttl × (1 − drift_factor) − 2 ms
//!   e.g. ttl 10 s, drift 1 %  →  node_timeout ≤ 200 ms (the default: 2 % of the TTL)
//! ```
//!
//! The per-node timeout bounds what one slow or paused node can cost an attempt; it must
//! be small against the TTL, or a slow quorum uses the whole validity up. By default it is
//! derived from each call's TTL (2 % of it, between 20 ms and 250 ms).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Error;
use crate::io::node::{IntoConnectionInfo, NodeInput, NodeSpec};

/// The most nodes one [`Redlock`](crate::Redlock) may use.
pub const MAX_NODES: usize = 64;

/// The most lock groups one client takes ([`RedlockBuilder::group`]).
pub const MAX_GROUPS: usize = 64;

/// The default values of every setting, in one place.
///
/// # Example
///
/// ```
/// use quorumlock::DEFAULTS;
/// assert_eq!(DEFAULTS.drift_factor, 0.01);
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Defaults {
    /// Clock drift allowance as a fraction of the TTL: `0.01`.
    pub drift_factor: f64,
    /// Minimum validity for a lock to count as held: zero (any positive validity).
    pub min_validity: Duration,
    /// The derived per-node timeout as a fraction of the TTL: `0.02`.
    pub node_timeout_fraction: f64,
    /// Lower bound of the derived per-node timeout: 20 ms (below that, a busy machine's
    /// scheduling delays alone time requests out).
    pub node_timeout_min: Duration,
    /// Upper bound of the derived per-node timeout: 250 ms.
    pub node_timeout_max: Duration,
    /// Time allowed to open a connection to a node: 1 s.
    pub connect_timeout: Duration,
    /// Shortest random delay between attempts of [`Redlock::lock`](crate::Redlock::lock): 10 ms.
    pub retry_delay_min: Duration,
    /// Longest random delay between attempts: 100 ms.
    pub retry_delay_max: Duration,
    /// Longest total wait of [`Redlock::lock`](crate::Redlock::lock): 10 s.
    pub retry_max_wait: Duration,
    /// Longest TTL accepted: 24 h.
    pub max_ttl: Duration,
}

/// The largest [`max_ttl`](RedlockBuilder::max_ttl) accepted: half of `i64::MAX` ms, so
/// that the node's clock plus any TTL (or the group-map record's lease) stays a valid
/// expiry.
pub(crate) const LONGEST_TTL_BOUND: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The defaults. See [`Defaults`].
pub const DEFAULTS: Defaults = Defaults {
    drift_factor: 0.01,
    min_validity: Duration::ZERO,
    node_timeout_fraction: 0.02,
    node_timeout_min: Duration::from_millis(20),
    node_timeout_max: Duration::from_millis(250),
    connect_timeout: Duration::from_secs(1),
    retry_delay_min: Duration::from_millis(10),
    retry_delay_max: Duration::from_millis(100),
    retry_max_wait: Duration::from_secs(10),
    max_ttl: Duration::from_secs(24 * 3600),
};

/// How [`Redlock::lock`](crate::Redlock::lock) waits between attempts: a random delay in a range, bounded by
/// a number of attempts and/or a total wait.
///
/// Every policy is bounded: at least one of [`attempts`](Retry::attempts) and
/// [`max_wait`](Retry::max_wait) is set (the default sets the maximum wait to 10 s and
/// leaves the count open).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use quorumlock::Retry;
///
/// let retry = Retry::new()
///     .attempts(20)
///     .delay(Duration::from_millis(5), Duration::from_millis(50))
///     .max_wait(Duration::from_secs(2));
/// assert_eq!(retry.max_attempts(), Some(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    pub(crate) attempts: Option<u32>,
    pub(crate) delay_min: Duration,
    pub(crate) delay_max: Duration,
    pub(crate) max_wait: Option<Duration>,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry::new()
    }
}

impl Retry {
    /// The default policy: random delay of 10–100 ms, give up after 10 s.
    ///
    /// # Example
    ///
    /// ```
    /// let r = quorumlock::Retry::new();
    /// assert_eq!(r.max_wait_time(), Some(std::time::Duration::from_secs(10)));
    /// ```
    pub const fn new() -> Retry {
        Retry {
            attempts: None,
            delay_min: DEFAULTS.retry_delay_min,
            delay_max: DEFAULTS.retry_delay_max,
            max_wait: Some(DEFAULTS.retry_max_wait),
        }
    }

    /// Give up after `n` attempts in total (the first one included). The default is no
    /// count limit (the maximum wait bounds the loop).
    ///
    /// # Example
    ///
    /// ```
    /// let r = quorumlock::Retry::new().attempts(3);
    /// assert_eq!(r.max_attempts(), Some(3));
    /// ```
    pub const fn attempts(mut self, n: u32) -> Retry {
        self.attempts = Some(n);
        self
    }

    /// The delay before each retry is drawn uniformly from `min..=max` (jitter keeps
    /// contenders from retrying in lock-step). `max` must be positive and `min ≤ max`.
    /// The default is 10 ms to 100 ms.
    ///
    /// One exception: a waiting writer of a read-write lock retries at least every third
    /// of [`QUEUE_LEASE`](crate::QUEUE_LEASE) (1 s), whatever `max` says, so that its
    /// intent, which holds new readers back, never lapses while it waits. With
    /// [`attempts`](Retry::attempts) set, such a writer therefore gives up after at most
    /// `n` delays of at most 1 s each.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// let r = quorumlock::Retry::new().delay(Duration::ZERO, Duration::from_millis(20));
    /// assert_eq!(r.delay_range(), (Duration::ZERO, Duration::from_millis(20)));
    /// ```
    pub const fn delay(mut self, min: Duration, max: Duration) -> Retry {
        self.delay_min = min;
        self.delay_max = max;
        self
    }

    /// Give up once this much time has passed since the call began. The default is 10 s.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// let r = quorumlock::Retry::new().max_wait(Duration::from_secs(30));
    /// assert_eq!(r.max_wait_time(), Some(Duration::from_secs(30)));
    /// ```
    pub const fn max_wait(mut self, d: Duration) -> Retry {
        self.max_wait = Some(d);
        self
    }

    /// Removes the total-wait bound; then [`attempts`](Retry::attempts) must be set.
    ///
    /// # Example
    ///
    /// ```
    /// let r = quorumlock::Retry::new().attempts(5).no_max_wait();
    /// assert_eq!(r.max_wait_time(), None);
    /// ```
    pub const fn no_max_wait(mut self) -> Retry {
        self.max_wait = None;
        self
    }

    /// The attempt limit, if any.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::Retry::new().max_attempts(), None);
    /// ```
    pub const fn max_attempts(&self) -> Option<u32> {
        self.attempts
    }

    /// The delay range.
    ///
    /// # Example
    ///
    /// ```
    /// let (min, max) = quorumlock::Retry::new().delay_range();
    /// assert!(min <= max);
    /// ```
    pub const fn delay_range(&self) -> (Duration, Duration) {
        (self.delay_min, self.delay_max)
    }

    /// The total-wait limit, if any.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::Retry::new().max_wait_time().is_some());
    /// ```
    pub const fn max_wait_time(&self) -> Option<Duration> {
        self.max_wait
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.delay_max.is_zero() {
            return Err(Error::config(
                "retry.delay",
                "the longest retry delay is zero; contenders would spin (use at least 1 ms)",
            ));
        }
        if self.delay_min > self.delay_max {
            return Err(Error::config(
                "retry.delay",
                format!(
                    "min {:?} is greater than max {:?}",
                    self.delay_min, self.delay_max
                ),
            ));
        }
        if self.attempts == Some(0) {
            return Err(Error::config(
                "retry.attempts",
                "zero attempts; use at least 1",
            ));
        }
        match (self.attempts, self.max_wait) {
            (None, None) => Err(Error::config(
                "retry",
                "neither an attempt count nor a maximum wait: the wait would be unbounded",
            )),
            (_, Some(w)) if w.is_zero() => Err(Error::config(
                "retry.max_wait",
                "zero; use try_lock for a single attempt",
            )),
            _ => Ok(()),
        }
    }
}

/// The settings of a [`Redlock`](crate::Redlock), validated.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) drift_factor: f64,
    pub(crate) min_validity: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) retry: Retry,
    pub(crate) fencing: bool,
    pub(crate) max_ttl: Duration,
    pub(crate) notify: bool,
    /// Whether `build()` fails when a node refuses our credentials (see
    /// [`RedlockBuilder::strict`]).
    pub(crate) strict: bool,
    /// The first part of every key and channel (checked in `validate`).
    pub(crate) namespace: Arc<str>,
    /// Certificate authorities trusted for `rediss://` nodes; `None`: the system's.
    #[cfg(feature = "tls-rustls")]
    pub(crate) tls_root_ca: Option<crate::io::node::tls::RootCa>,
    /// The client certificate and key shown to `rediss://` nodes; `None`: none.
    #[cfg(feature = "tls-rustls")]
    pub(crate) tls_client_auth: Option<crate::io::node::tls::ClientAuth>,
}

impl Config {
    /// The per-node timeout for a call with this TTL.
    pub(crate) fn node_timeout_for(&self, ttl: Duration) -> Duration {
        match self.node_timeout {
            Some(t) => t,
            None => Duration::try_from_secs_f64(ttl.as_secs_f64() * DEFAULTS.node_timeout_fraction)
                .unwrap_or(DEFAULTS.node_timeout_max)
                .clamp(DEFAULTS.node_timeout_min, DEFAULTS.node_timeout_max),
        }
    }

    /// Checks a TTL given to a call.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), Error> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "zero"));
        }
        if ttl > self.max_ttl {
            return Err(Error::invalid(
                "ttl",
                format!("{ttl:?} is longer than the maximum of {:?}", self.max_ttl),
            ));
        }
        if ttl < Duration::from_millis(1) {
            return Err(Error::invalid(
                "ttl",
                format!("{ttl:?}: Redis expires keys in whole milliseconds; use at least 1 ms"),
            ));
        }
        let drift = crate::protocol::tally::drift(ttl, self.drift_factor);
        let best = crate::protocol::tally::validity(ttl, Duration::ZERO, drift);
        if best <= self.min_validity {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} leaves no validity: the clock drift allowance alone is {drift:?}{}",
                    if self.min_validity.is_zero() {
                        String::new()
                    } else {
                        format!(" and the minimum validity is {:?}", self.min_validity)
                    }
                ),
            ));
        }
        Ok(())
    }
}

/// Builds a [`Redlock`](crate::Redlock). Created by [`Redlock::builder`](crate::Redlock::builder).
///
/// Every setter consumes and returns the builder, says its default, and is checked in
/// [`build`](RedlockBuilder::build).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::{Redlock, Retry};
///
/// let locks = Redlock::builder([
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
/// ])
/// .node_timeout(Duration::from_millis(50))
/// .drift_factor(0.01)
/// .retry(Retry::new().max_wait(Duration::from_secs(5)))
/// .build()
/// .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until .build().await"]
#[derive(Clone)]
pub struct RedlockBuilder {
    urls: Vec<NodeInput>,
    /// The lock groups after the first (whose nodes are `urls`).
    more_groups: Vec<Vec<NodeInput>>,
    /// The group map's version, when set by [`RedlockBuilder::groups_version`].
    map_version: Option<u16>,
    config: Config,
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, u)| match u.spec(i) {
                Ok(spec) => spec.addr.to_string(),
                Err(_) => "<invalid URL>".to_owned(),
            })
            .collect();
        f.debug_struct("RedlockBuilder")
            .field("nodes", &nodes)
            .field("more_groups", &self.more_groups.len())
            .field("map_version", &self.map_version)
            .field("config", &self.config)
            .finish()
    }
}

/// Every lock group's validated node specs, the group given to `builder` first.
pub(crate) type GroupSpecs = Vec<Vec<NodeSpec>>;

impl RedlockBuilder {
    pub(crate) fn new<I>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        RedlockBuilder::of(
            urls.into_iter()
                .map(|u| NodeInput::Url(u.as_ref().to_owned()))
                .collect(),
        )
    }

    pub(crate) fn of(urls: Vec<NodeInput>) -> RedlockBuilder {
        RedlockBuilder {
            urls,
            more_groups: Vec::new(),
            map_version: None,
            config: Config {
                node_timeout: None,
                drift_factor: DEFAULTS.drift_factor,
                min_validity: DEFAULTS.min_validity,
                connect_timeout: DEFAULTS.connect_timeout,
                retry: Retry::new(),
                fencing: false,
                max_ttl: DEFAULTS.max_ttl,
                notify: true,
                strict: false,
                namespace: Arc::from(crate::base::resource::DEFAULT_NAMESPACE),
                #[cfg(feature = "tls-rustls")]
                tls_root_ca: None,
                #[cfg(feature = "tls-rustls")]
                tls_client_auth: None,
            },
        }
    }

    /// The time one node may take to answer one request before it counts as timed out.
    ///
    /// The default is derived from each call's TTL: 2 % of it, between 20 ms and 250 ms.
    /// Keep it small against the TTL (see the module docs on timing).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .node_timeout(std::time::Duration::from_millis(20))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn node_timeout(mut self, timeout: std::time::Duration) -> RedlockBuilder {
        self.config.node_timeout = Some(timeout);
        self
    }

    /// The clock drift allowance as a fraction of the TTL; the validity of a lock is
    /// `TTL − elapsed − (TTL × drift_factor + 2 ms)`. Must be in `0.0..0.5`.
    ///
    /// The default is `0.01`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .drift_factor(0.02)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn drift_factor(mut self, factor: f64) -> RedlockBuilder {
        self.config.drift_factor = factor;
        self
    }

    /// A lock counts as held only if its validity after acquisition is above this.
    /// Useful when the work needs a known minimum time.
    ///
    /// The default is zero (any positive validity).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .min_validity(std::time::Duration::from_millis(500))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn min_validity(mut self, min: std::time::Duration) -> RedlockBuilder {
        self.config.min_validity = min;
        self
    }

    /// How [`Redlock::lock`](crate::Redlock::lock) and [`Redlock::lock_many`](crate::Redlock::lock_many) wait between attempts.
    ///
    /// The default is [`Retry::new()`]: 10–100 ms random delay, up to 10 s in total.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use quorumlock::Retry;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .retry(Retry::new().attempts(10))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn retry(mut self, retry: Retry) -> RedlockBuilder {
        self.config.retry = retry;
        self
    }

    /// Whether waiting callers subscribe to release announcements and retry as soon as a
    /// release is published (falling back to the retry delay if a message is lost).
    /// With `false`, waiting is plain polling with the retry delay.
    ///
    /// The default is `true`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .notify(false)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn notify(mut self, on: bool) -> RedlockBuilder {
        self.config.notify = on;
        self
    }

    /// The namespace: the first part of every Redis key and pub/sub channel the client
    /// uses (`<namespace>:lock:<name>`, `<namespace>:released:<name>`, …; see
    /// `docs/operations.md`, "Sharing Redis with other applications"), so that an ACL user
    /// confined to `~<namespace>:* &<namespace>:*` can use every feature, and applications
    /// sharing the nodes keep apart: two namespaces never share a key or a channel, so
    /// the same resource name is two independent locks in two namespaces.
    ///
    /// Every client of a resource must use the same namespace. A namespace is 1 to
    /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes of `:`-separated, non-empty
    /// segments, without `{`, `}` (they would make a Redis Cluster hash tag), whitespace
    /// or control characters; no segment after the first may be a word the library puts
    /// right after the namespace (`lock`, `fence`, `released`, `queue`, `qlease`,
    /// `qattrs`, `qset`, `rw`, `readers`, `wintent`, `rwfence`, `sem`, `semcfg`,
    /// `groupmap`), or `a` and `a:lock` could spell the same key. Checked in
    /// [`build`](RedlockBuilder::build): an [`Error::Config`] naming the field `namespace`.
    ///
    /// The default for this is `quorumlock`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// // The ACL user `orders` has `~orders:locks:* &orders:locks:*`.
    /// let locks = quorumlock::Redlock::builder([
    ///     "redis://orders:secret@10.0.0.1:6379",
    ///     "redis://orders:secret@10.0.0.2:6379",
    ///     "redis://orders:secret@10.0.0.3:6379",
    /// ])
    /// .namespace("orders:locks")
    /// .build()
    /// .await?;
    /// let lock = locks
    ///     .try_lock("invoice:7", std::time::Duration::from_secs(10))
    ///     .await?; // the key orders:locks:lock:invoice:7
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> RedlockBuilder {
        self.config.namespace = Arc::from(namespace.into());
        self
    }

    /// Issue a fencing token with every lock (see [`Lock::fencing_token`](crate::Lock::fencing_token)
    /// and `docs/safety.md`). Costs one more round trip per acquisition.
    ///
    /// Tokens strictly increase across successive holders of a resource whenever the
    /// deployment contract holds: each node persists every write (AOF, `appendfsync
    /// always`), or a crashed node is restarted only after the longest TTL, in which case
    /// the nodes' wall clocks must agree to within that restart delay at every moment, and
    /// a restarted node's clock must be synchronised before its server starts (a node that
    /// lost its counters takes its floor from its clock, and that floor must pass every
    /// clock reading that went into an earlier token: a clock that once ran ahead, even if
    /// corrected since, left tokens that far ahead). A token is issued whenever a quorum
    /// of nodes grants, including for a resource no node has seen.
    ///
    /// The default is `false`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .fencing(true)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, on: bool) -> RedlockBuilder {
        self.config.fencing = on;
        self
    }

    /// Makes [`build`](RedlockBuilder::build) fail when any node refuses this client's
    /// credentials at start: a failed authentication (a wrong password or user), or a
    /// failed TLS handshake (a server certificate not trusted, a client certificate
    /// refused). The error names the node and its cause.
    ///
    /// The default is off: such a node is reported with a warning and counted as a failed
    /// vote, read again before each request that votes (so a password fixed on the server
    /// is picked up), and the client locks on the others while they are a quorum. A
    /// node that is down, paused or slow at start never fails a build, strict or not:
    /// that is a fault the quorum exists to survive, not a misconfiguration. Either way,
    /// an ACL user that may not run `INFO`, and one store given twice, refuse the build.
    /// The `quorumlock` CLI builds strictly unless given `--lenient`.
    ///
    /// On a Redis Cluster voter (`redis+cluster://`), a missing password is found, but a
    /// wrong one is not told apart from an unreachable cluster (redis-rs's cluster client
    /// reports only that it found no connection): it counts as no answer.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder([
    ///     "redis://:s3cret@127.0.0.1:7001",
    ///     "redis://:s3cret@127.0.0.1:7002",
    ///     "redis://:s3cret@127.0.0.1:7003",
    /// ])
    /// .strict(true) // a wrong password on any node fails here, not at the first lock
    /// .build()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn strict(mut self, on: bool) -> RedlockBuilder {
        self.config.strict = on;
        self
    }

    /// The time allowed to open a connection to a node.
    ///
    /// The default is 1 s.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .connect_timeout(std::time::Duration::from_millis(200))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> RedlockBuilder {
        self.config.connect_timeout = timeout;
        self
    }

    /// The longest TTL a call may ask for.
    ///
    /// The default is 24 h.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .max_ttl(std::time::Duration::from_secs(60))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn max_ttl(mut self, ttl: std::time::Duration) -> RedlockBuilder {
        self.config.max_ttl = ttl;
        self
    }

    /// Trust these certificate authorities, and only these, for the `rediss://` nodes: a PEM
    /// bundle of one or more `-----BEGIN CERTIFICATE-----` blocks (e.g. the contents of the
    /// file given to Redis as `tls-ca-cert-file`). Use it when the servers' certificates are
    /// signed by a private CA. `redis://` and `redis+unix://` nodes are not affected.
    ///
    /// Each server's certificate must be signed by one of them and name the host of its URL
    /// (a DNS name, or an IP address subject alternative name for `rediss://10.0.0.5:6380`).
    /// A node whose certificate does not verify fails on every request with the TLS error as
    /// its [`NodeOutcome::Failed`](crate::NodeOutcome::Failed) text (so a lock attempt on
    /// such nodes ends in [`Error::NoQuorum`]); it never panics.
    ///
    /// The default is the system's trust store (read through `rustls-native-certs`: on
    /// Debian `/etc/ssl/certs`, from the `ca-certificates` package; the `SSL_CERT_FILE` and
    /// `SSL_CERT_DIR` environment variables override it).
    ///
    /// Checked in [`build`](RedlockBuilder::build): a PEM without a certificate, or with one
    /// that does not parse, is an [`Error::Config`] naming the field `tls_root_ca`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt")?;
    /// let locks = quorumlock::Redlock::builder([
    ///     "rediss://redis-a.internal:6380",
    ///     "rediss://redis-b.internal:6380",
    ///     "rediss://redis-c.internal:6380",
    /// ])
    /// .tls_root_ca(ca)
    /// .build()
    /// .await?;
    /// # let _ = locks;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> RedlockBuilder {
        self.config.tls_root_ca = Some(crate::io::node::tls::RootCa::new(pem.into()));
        self
    }

    /// Show this client certificate, with its private key, to the `rediss://` nodes: for
    /// Redis servers that require TLS client authentication (`tls-auth-clients yes`).
    /// `cert_pem` is a PEM bundle whose first `-----BEGIN CERTIFICATE-----` block is the
    /// client's certificate (intermediate certificates may follow); `key_pem` is its private
    /// key (`BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`; RSA,
    /// ECDSA or Ed25519). The certificate must be signed by a certificate authority the
    /// servers trust (their `tls-ca-cert-file`). Every connection to a `rediss://` or
    /// `rediss+cluster://` node shows it: commands, release notifications, and every node of
    /// a Redis Cluster voter. `redis://` and `redis+unix://` nodes are not affected. It
    /// combines with [`tls_root_ca`](RedlockBuilder::tls_root_ca), which says which servers
    /// this client trusts.
    ///
    /// A server that refuses the certificate (or wants one and gets none) fails that node
    /// on every request, with the TLS error as its
    /// [`NodeOutcome::Failed`](crate::NodeOutcome::Failed) text, `TLS handshake failed,
    /// client certificate refused by the server (see tls_client_auth): …` (so a lock attempt
    /// on such nodes ends in [`Error::NoQuorum`]); it never panics.
    ///
    /// Checked in [`build`](RedlockBuilder::build): a certificate PEM without a certificate,
    /// a key PEM without a private key, PEM that does not parse, or a key that is not the
    /// certificate's is an [`Error::Config`] naming the field `tls_client_auth`. The key
    /// never appears in an error, a log line or a `Debug` output (which shows the
    /// certificate's size only).
    ///
    /// The default for this is none: no client certificate is shown.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt")?;
    /// let cert = std::fs::read("/etc/quorumlock/client.crt")?;
    /// let key = std::fs::read("/etc/quorumlock/client.key")?;
    /// let locks = quorumlock::Redlock::builder([
    ///     "rediss://redis-a.internal:6380",
    ///     "rediss://redis-b.internal:6380",
    ///     "rediss://redis-c.internal:6380",
    /// ])
    /// .tls_root_ca(ca)
    /// .tls_client_auth(cert, key)
    /// .build()
    /// .await?;
    /// # let _ = locks;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn tls_client_auth(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> RedlockBuilder {
        self.config.tls_client_auth = Some(crate::io::node::tls::ClientAuth::new(
            cert_pem.into(),
            key_pem.into(),
        ));
        self
    }

    /// Adds a lock group: `urls` are the nodes of another, independent group of masters.
    /// The nodes given to [`Redlock::builder`](crate::Redlock::builder) are the first
    /// group. With several groups, every resource lives in exactly one group, chosen by a
    /// stable hash of its name (rendezvous hashing), so the lock rate grows with the number
    /// of groups while each lock keeps its own majority quorum.
    ///
    /// Every group has as many nodes as the first; no node is in two groups. A name's
    /// group is decided by its hash tag when it has one, as in Redis Cluster: the part
    /// between the first `{` and the next `}`, if not empty. Give the resources of one
    /// multi-resource lock a common tag (`order:{42}:stock`, `order:{42}:invoice`) so that
    /// they share a group: a multi-resource lock across groups is taken group by group
    /// (see [`Redlock::try_lock_many`](crate::Redlock::try_lock_many)), which costs one
    /// round per group and waits by polling.
    ///
    /// Every client of the same resources must use the same groups, in the same order,
    /// with the same [`groups_version`](RedlockBuilder::groups_version): each records its
    /// group map on its nodes, and a client that finds another map refuses to lock
    /// ([`Error::GroupMapMismatch`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder([
    ///     "redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379",
    /// ])
    /// .group(["redis://10.0.1.1:6379", "redis://10.0.1.2:6379", "redis://10.0.1.3:6379"])
    /// .groups_version(1)
    /// .build()
    /// .await?;
    /// assert_eq!(locks.groups(), 2);
    /// let lock = locks.try_lock("orders:42", Duration::from_secs(10)).await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn group<I>(mut self, urls: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.more_groups.push(
            urls.into_iter()
                .map(|u| NodeInput::Url(u.as_ref().to_owned()))
                .collect(),
        );
        self
    }

    /// As [`group`](RedlockBuilder::group), with the nodes given as anything redis-rs
    /// connects with ([`redis::IntoConnectionInfo`]: a [`redis::ConnectionInfo`], a URL,
    /// a `(host, port)` pair), as [`Redlock::builder_from_info`](crate::Redlock::builder_from_info).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder_from_info([
    ///     ("10.0.0.1", 6379), ("10.0.0.2", 6379), ("10.0.0.3", 6379),
    /// ])
    /// .group_from_info([("10.0.1.1", 6379), ("10.0.1.2", 6379), ("10.0.1.3", 6379)])
    /// .groups_version(1)
    /// .build()
    /// .await?;
    /// assert_eq!(locks.groups(), 2);
    /// # Ok(()) }
    /// ```
    pub fn group_from_info<I>(mut self, nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        self.more_groups
            .push(nodes.into_iter().map(NodeInput::info).collect());
        self
    }

    /// The version of the group map (see [`group`](RedlockBuilder::group)), `0..=65535`.
    /// Raise it whenever the groups change, so that clients of the old and the new map
    /// tell each other apart even where the fingerprints of their groups would not.
    ///
    /// The default is no version: a client with one group and no version is *unsharded*
    /// and records the map `unsharded`, so that it and a sharding client refuse each other
    /// in either order. Setting a version, even with one group, makes it a map of its own.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .group(["redis://127.0.0.1:7101"])
    ///     .groups_version(3)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn groups_version(mut self, version: u16) -> RedlockBuilder {
        self.map_version = Some(version);
        self
    }

    /// Validates the configuration (before any I/O) and hands out what
    /// [`build`](RedlockBuilder::build) connects with: each group's node specs, the
    /// group map's version (`None`: unsharded), the configuration. With `rediss://` nodes,
    /// makes sure rustls has a process-level crypto provider.
    pub(crate) fn into_parts(self) -> Result<(GroupSpecs, Option<u16>, Config), Error> {
        let groups = self.validate_groups()?;
        #[cfg(feature = "tls-rustls")]
        if groups.iter().flatten().any(NodeSpec::is_tls) {
            crate::io::node::tls::ensure_crypto_provider();
        }
        let version = match (self.map_version, groups.len()) {
            (None, 1) => None,
            (v, _) => Some(v.unwrap_or(0)),
        };
        Ok((groups, version, self.config))
    }

    /// Every group's validated specs: the first group checked as ever, each further one
    /// alike, with as many nodes as the first and no node shared between groups.
    pub(crate) fn validate_groups(&self) -> Result<GroupSpecs, Error> {
        let first = self.validate()?;
        let mut groups = vec![first];
        for (g, urls) in self.more_groups.iter().enumerate() {
            let group = RedlockBuilder {
                urls: urls.clone(),
                more_groups: Vec::new(),
                map_version: None,
                config: self.config.clone(),
            }
            .validate()
            .map_err(|e| match e {
                Error::Config(c) => Error::config(
                    "groups",
                    format!("group #{}: {}: {}", g + 2, c.field(), c.detail),
                ),
                other => other,
            })?;
            if group.len() != groups[0].len() {
                return Err(Error::config(
                    "groups",
                    format!(
                        "group #{} has {} nodes, the first group {}; every group has as many nodes",
                        g + 2,
                        group.len(),
                        groups[0].len()
                    ),
                ));
            }
            for spec in &group {
                for (h, other) in groups.iter().enumerate() {
                    if other.iter().any(|o| o.same_node(spec)) {
                        return Err(Error::config(
                            "groups",
                            format!(
                                "{} is in group #{} and group #{}; groups must be independent",
                                spec.addr,
                                h + 1,
                                g + 2
                            ),
                        ));
                    }
                }
            }
            groups.push(group);
        }
        if groups.len() > MAX_GROUPS {
            return Err(Error::config(
                "groups",
                format!("{} groups; at most {MAX_GROUPS}", groups.len()),
            ));
        }
        Ok(groups)
    }

    pub(crate) fn validate(&self) -> Result<Vec<NodeSpec>, Error> {
        let c = &self.config;
        if self.urls.is_empty() {
            return Err(Error::config("nodes", "no nodes given"));
        }
        if self.urls.len() > MAX_NODES {
            return Err(Error::config(
                "nodes",
                format!("{} nodes; at most {MAX_NODES}", self.urls.len()),
            ));
        }
        let specs = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, u)| u.spec(i))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, a) in specs.iter().enumerate() {
            if let Some(j) = specs[..i].iter().position(|b| b.same_node(a)) {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} and node #{} are the same node ({})",
                        j + 1,
                        i + 1,
                        a.addr
                    ),
                ));
            }
        }
        if !(c.drift_factor.is_finite() && (0.0..0.5).contains(&c.drift_factor)) {
            return Err(Error::config(
                "drift_factor",
                format!("{} is not in 0.0..0.5", c.drift_factor),
            ));
        }
        if c.node_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config("node_timeout", "zero"));
        }
        if c.connect_timeout.is_zero() {
            return Err(Error::config("connect_timeout", "zero"));
        }
        if c.max_ttl.is_zero() || c.max_ttl > LONGEST_TTL_BOUND {
            return Err(Error::config(
                "max_ttl",
                format!("{:?} is not a usable TTL bound", c.max_ttl),
            ));
        }
        c.retry.validate()?;
        crate::base::resource::check_namespace(&c.namespace)?;
        #[cfg(feature = "tls-rustls")]
        let specs = {
            if let Some(ca) = &c.tls_root_ca {
                ca.validate()?;
            }
            if let Some(auth) = &c.tls_client_auth {
                auth.validate()?;
            }
            let field = if c.tls_client_auth.is_some() {
                "tls_client_auth"
            } else {
                "tls_root_ca"
            };
            match crate::io::node::tls::certificates(
                c.tls_root_ca.as_ref(),
                c.tls_client_auth.as_ref(),
            ) {
                Some(certs) => specs
                    .into_iter()
                    .map(|s| s.with_tls(&certs, field))
                    .collect::<Result<Vec<_>, _>>()?,
                None => specs,
            }
        };
        Ok(specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(urls: &[&str]) -> RedlockBuilder {
        RedlockBuilder::new(urls.iter().copied())
    }

    #[test]
    fn rejects_bad_configs() {
        let field = |r: Result<Vec<NodeSpec>, Error>| match r {
            Err(Error::Config(c)) => c.field().to_owned(),
            other => panic!("expected a config error, got {:?}", other.map(|v| v.len())),
        };
        assert_eq!(field(b(&[]).validate()), "nodes");
        assert_eq!(field(b(&["nope"]).validate()), "nodes");
        assert_eq!(field(b(&["http://127.0.0.1:1"]).validate()), "nodes");
        assert_eq!(
            field(b(&["redis://127.0.0.1:1", "redis://127.0.0.1:1"]).validate()),
            "nodes"
        );
        let ok = ["redis://127.0.0.1:1"];
        assert_eq!(
            field(b(&ok).drift_factor(f64::NAN).validate()),
            "drift_factor"
        );
        assert_eq!(field(b(&ok).drift_factor(-0.1).validate()), "drift_factor");
        for bad in ["", "a:lock", "{a}", "a b", "a:", "x".repeat(300).as_str()] {
            assert_eq!(
                field(b(&ok).namespace(bad).validate()),
                "namespace",
                "{bad:?}"
            );
        }
        assert!(b(&ok).namespace("app:locks").validate().is_ok());
        assert_eq!(&*b(&ok).config.namespace, "quorumlock");
        assert_eq!(field(b(&ok).drift_factor(0.5).validate()), "drift_factor");
        assert_eq!(
            field(b(&ok).node_timeout(Duration::ZERO).validate()),
            "node_timeout"
        );
        assert_eq!(
            field(
                b(&ok)
                    .retry(Retry::new().delay(Duration::ZERO, Duration::ZERO))
                    .validate()
            ),
            "retry.delay"
        );
        assert_eq!(
            field(
                b(&ok)
                    .retry(Retry::new().delay(Duration::from_secs(2), Duration::from_secs(1)))
                    .validate()
            ),
            "retry.delay"
        );
        assert_eq!(
            field(b(&ok).retry(Retry::new().attempts(0)).validate()),
            "retry.attempts"
        );
        assert_eq!(
            field(b(&ok).retry(Retry::new().no_max_wait()).validate()),
            "retry"
        );
        let many: Vec<String> = (0..65)
            .map(|i| format!("redis://127.0.0.1:{}", 1000 + i))
            .collect();
        assert_eq!(field(RedlockBuilder::new(&many).validate()), "nodes");
    }

    #[test]
    fn accepts_good_configs_and_redacts() {
        let specs = b(&[
            "redis://user:hunter2@127.0.0.1:7001/2",
            "redis://:hunter2@127.0.0.1:7002",
            "redis+unix:///tmp/redis.sock",
            "redis://[::1]:7003",
        ])
        .validate()
        .unwrap();
        let shown: Vec<String> = specs.iter().map(|s| s.addr.to_string()).collect();
        assert_eq!(
            shown,
            [
                "redis://user:<redacted>@127.0.0.1:7001/2",
                "redis://:<redacted>@127.0.0.1:7002",
                "redis+unix:///tmp/redis.sock",
                "redis://[::1]:7003",
            ]
        );
        let dbg = format!("{:?}", b(&["redis://user:hunter2@127.0.0.1:7001"]));
        assert!(!dbg.contains("hunter2"), "{dbg}");
        // The same host and port with a different database is a different node.
        assert!(
            b(&["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/1"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn ttl_checks() {
        let c = b(&["redis://127.0.0.1:1"]).config;
        assert!(c.check_ttl(Duration::ZERO).is_err());
        assert!(
            c.check_ttl(Duration::from_millis(2)).is_err(),
            "2 ms is all drift"
        );
        assert!(c.check_ttl(Duration::from_millis(3)).is_ok());
        assert!(c.check_ttl(Duration::from_secs(25 * 3600)).is_err());
        assert!(c.check_ttl(Duration::MAX).is_err());
        assert!(c.check_ttl(Duration::from_micros(500)).is_err());
    }

    #[test]
    fn derived_node_timeout() {
        let c = b(&["redis://127.0.0.1:1"]).config;
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(10)),
            Duration::from_millis(200)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_millis(10)),
            Duration::from_millis(20)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(2)),
            Duration::from_millis(40)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(3600)),
            Duration::from_millis(250)
        );
        assert_eq!(
            c.node_timeout_for(Duration::MAX),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn validates_groups() {
        let field = |r: Result<Vec<Vec<NodeSpec>>, Error>| match r {
            Err(Error::Config(c)) => (c.field().to_owned(), c.to_string()),
            other => panic!("expected a config error, got {:?}", other.map(|v| v.len())),
        };
        let g1 = [
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ];
        let g2 = [
            "redis://127.0.0.1:4",
            "redis://127.0.0.1:5",
            "redis://127.0.0.1:6",
        ];
        // A group with another number of nodes.
        let (f, text) = field(b(&g1).group(&g2[..2]).validate_groups());
        assert_eq!(f, "groups");
        assert!(text.contains("group #2 has 2 nodes"), "{text}");
        // A node in two groups.
        let shared = [
            "redis://127.0.0.1:4",
            "redis://127.0.0.1:5",
            "redis://127.0.0.1:3/0",
        ];
        let (f, text) = field(b(&g1).group(shared).validate_groups());
        assert_eq!(f, "groups");
        assert!(text.contains("group #1 and group #2"), "{text}");
        // A bad URL in a later group names that group.
        let bad = ["redis://127.0.0.1:4", "nope", "redis://127.0.0.1:6"];
        let (f, text) = field(b(&g1).group(&g2).group(bad).validate_groups());
        assert_eq!(f, "groups");
        assert!(text.contains("group #3"), "{text}");
        // A duplicate inside a later group.
        let dup = [
            "redis://127.0.0.1:4",
            "redis://127.0.0.1:4",
            "redis://127.0.0.1:6",
        ];
        assert_eq!(field(b(&g1).group(dup).validate_groups()).0, "groups");
        // Too many groups.
        let mut many = b(&["redis://127.0.0.1:1"]);
        for port in 2..=(MAX_GROUPS as u16 + 1) {
            many = many.group([format!("redis://127.0.0.1:{port}")]);
        }
        let (f, text) = field(many.validate_groups());
        assert_eq!(f, "groups");
        assert!(text.contains("at most 64"), "{text}");
        // Good groups pass, in order.
        let ok = b(&g1).group(g2).validate_groups();
        assert_eq!(ok.as_ref().map(Vec::len).ok(), Some(2));
    }

    #[test]
    fn only_one_group_without_a_version_is_unsharded() {
        let one = ["redis://127.0.0.1:1"];
        let version = |b: RedlockBuilder| b.into_parts().ok().map(|(g, v, _)| (g.len(), v));
        assert_eq!(version(b(&one)), Some((1, None)));
        assert_eq!(version(b(&one).groups_version(0)), Some((1, Some(0))));
        assert_eq!(
            version(b(&one).group(["redis://127.0.0.1:2"])),
            Some((2, Some(0)))
        );
        assert_eq!(
            version(b(&one).group(["redis://127.0.0.1:2"]).groups_version(7)),
            Some((2, Some(7)))
        );
    }
}
