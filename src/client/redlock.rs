//! The client: [`Redlock`], the public entry points. It validates each call's input and
//! hands the work down: one attempt to [`acquire`](crate::client::acquire), waiting between
//! attempts to [`wait`](crate::client::wait); the guard is in [`lock`](crate::client::lock), what clones
//! share in [`shared`](crate::client::shared).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Error;
use crate::base::resource::Resources;
use crate::client::acquire::acquire_once;
use crate::client::config::{RedlockBuilder, Retry};
use crate::client::groups::Groups;
use crate::client::lock::Lock;
use crate::client::shared::Inner;
use crate::io::node::{IntoConnectionInfo, NodeAddr, NodeInput};

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
    pub(crate) groups: Arc<Groups>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Redlock");
        d.field("nodes", &self.groups.addrs())
            .field("quorum", &self.quorum());
        if self.groups() > 1 || self.groups.map() != crate::io::groupmap::UNSHARDED {
            d.field("groups", &self.groups())
                .field("group_map", &self.groups.map());
        }
        if let Some(first) = self.groups.first() {
            d.field("config", &first.config);
        }
        d.finish()
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

    /// Starts building a client for these nodes, each given as anything redis-rs connects
    /// with ([`redis::IntoConnectionInfo`]): a [`redis::ConnectionInfo`] you built or got
    /// from your own configuration, a `(host, port)` pair, or a URL. Each is one master
    /// (a Redis Cluster voter is given as a `redis+cluster://` URL to
    /// [`builder`](Redlock::builder)); each is checked as a URL is, at
    /// [`RedlockBuilder::build`], where one that redis-rs could not convert is reported.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
    ///
    /// let info: ConnectionInfo = ConnectionAddr::Tcp("127.0.0.1".into(), 7003)
    ///     .into_connection_info()
    ///     .expect("an address is always valid");
    /// let locks = quorumlock::Redlock::builder_from_info([
    ///     "redis://127.0.0.1:7001".into_connection_info(),
    ///     ("127.0.0.1", 7002).into_connection_info(),
    ///     Ok(info),
    /// ].into_iter().flatten())
    /// .build()
    /// .await?;
    /// assert_eq!(locks.nodes().len(), 3);
    /// # Ok(()) }
    /// ```
    pub fn builder_from_info<I>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        RedlockBuilder::of(nodes.into_iter().map(NodeInput::info).collect())
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
        self.groups.addrs()
    }

    /// The number of lock groups ([`RedlockBuilder::group`]); 1 unless sharded.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .group(["redis://127.0.0.1:7101"])
    ///     .build()
    ///     .await?;
    /// assert_eq!(locks.groups(), 2);
    /// assert_eq!(locks.nodes().len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn groups(&self) -> usize {
        self.groups.members().len()
    }

    /// The lock group `resource` is locked in (`0` for the nodes given to
    /// [`Redlock::builder`], then the groups in the order they were added). Decided by the
    /// name's hash tag when it has one (`order:{42}:stock` by `42`), else by the whole
    /// name; the same on every client with the same groups. No I/O.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"])
    ///     .group(["redis://127.0.0.1:7101"])
    ///     .build()
    ///     .await?;
    /// assert_eq!(locks.group_of("order:{42}:stock"), locks.group_of("order:{42}:invoice"));
    /// # Ok(()) }
    /// ```
    pub fn group_of(&self, resource: &str) -> usize {
        self.groups.group_of(resource)
    }

    /// The nodes of lock group `group` (as numbered by [`group_of`](Redlock::group_of)),
    /// `None` past the last group.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let home = locks.group_nodes(locks.group_of("orders:42")).unwrap_or_default();
    /// assert_eq!(home.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn group_nodes(&self, group: usize) -> Option<&[NodeAddr]> {
        self.groups.members().get(group).map(|m| m.addrs.as_slice())
    }

    /// The group map this client routes with and records on its nodes:
    /// `v<version>/<groups>/<hash of the groups' nodes>`, or `unsharded` for one group
    /// without a [`groups_version`](RedlockBuilder::groups_version).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.group_map(), "unsharded");
    /// # Ok(()) }
    /// ```
    pub fn group_map(&self) -> &str {
        self.groups.map()
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
        crate::io::background::flush(within).await
    }

    /// The checks every acquiring call makes before any I/O: a runtime, valid resource
    /// names in one lock group, a valid TTL, no group map mismatch seen. Hands out the
    /// resources and their group.
    pub(crate) fn prepare<S: AsRef<str>>(
        &self,
        names: &[S],
        ttl: Duration,
    ) -> Result<(Resources, &Arc<Inner>), Error> {
        Error::ensure_runtime()?;
        if let [name] = names {
            // One name (the common case): its keys built once, in its group's layout.
            let inner = self.groups.member_of(name.as_ref())?;
            let res = Resources::in_space(names, &inner.keys)?;
            self.groups.usable()?;
            inner.config.check_ttl(ttl)?;
            return Ok((res, inner));
        }
        let res = Resources::new(names)?;
        let inner = self.groups.route(&res)?;
        inner.config.check_ttl(ttl)?;
        Ok((inner.resources(&res)?, inner))
    }

    /// Validates a multi-resource mutex and splits it by lock group.
    fn prepare_many<S: AsRef<str>>(&self, names: &[S], ttl: Duration) -> Result<Many, Error> {
        Error::ensure_runtime()?;
        let res = Resources::new(names)?;
        let mut parts = self.groups.split(&res)?;
        for (inner, part) in &mut parts {
            inner.config.check_ttl(ttl)?;
            *part = inner.resources(part)?;
        }
        if parts.len() == 1
            && let Some((inner, res)) = parts.pop()
        {
            return Ok(Many::Within(res, inner));
        }
        Ok(Many::Spanning(parts, res.names().into()))
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
        self.groups.first().map_or(0, |g| g.quorum)
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
        let (res, inner) = self.prepare(&[resource], ttl)?;
        acquire_once(inner, &res, ttl, 1)
            .await
            .map_err(|e| e.about(&[resource]))
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
        let (res, inner) = self.prepare(&[resource], ttl)?;
        crate::client::wait::acquire_waiting(inner, &res, ttl, &inner.config.retry)
            .await
            .map_err(|e| e.about(&[resource]))
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
        let (res, inner) = self.prepare(&[resource], ttl)?;
        retry.validate().map_err(|e| match e {
            Error::Config(c) => Error::invalid("retry", c.to_string()),
            other => other,
        })?;
        crate::client::wait::acquire_waiting(inner, &res, ttl, &retry)
            .await
            .map_err(|e| e.about(&[resource]))
    }

    /// Tries once to take every resource in the list, all-or-nothing: on each node one
    /// script sets every key or none. The list is a set: order does not matter and
    /// duplicates are refused.
    ///
    /// With [lock groups](RedlockBuilder::group), a set whose names fall in several groups
    /// is taken group by group, in the groups' order, with one token: one round per group
    /// (each an ordinary multi-resource lock of that group), all or nothing. A part that
    /// is refused undoes the parts already taken before the error is returned. The
    /// returned [`Lock`] covers every part: its deadline is the earliest part's, and
    /// `extend`, `release`, drop and `keep_alive` act on every part. Its fencing token is
    /// committed to every part, so it is valid for every resource of the set. Names with
    /// a common hash tag share a group and need one round.
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
        let got = match self.prepare_many(&names, ttl)? {
            Many::Within(res, inner) => acquire_once(&inner, &res, ttl, 1).await,
            Many::Spanning(parts, all) => {
                crate::client::spanning::acquire_once(&parts, &all, ttl, 1).await
            }
        };
        got.map_err(|e| e.about(&names))
    }

    /// Takes every resource in the list, all-or-nothing, waiting per the retry policy.
    ///
    /// With notify waiting (the default), fenced or not, the caller marks its resources on
    /// every node so their releases are announced, is woken by them and tries again, every
    /// key or none: it never holds part of the set while it waits, so callers waiting for
    /// overlapping sets never deadlock, and nothing is kept for it (a caller that holds one
    /// key and waits for another is never stuck behind it). It has no place in the
    /// resources' wait queues: a release hands a key to a waiter queued for that resource
    /// alone first, so under sustained contention on its keys this wait has no bound but
    /// the retry policy's maximum wait.
    ///
    /// A set across [lock groups](RedlockBuilder::group) (see
    /// [`try_lock_many`](Redlock::try_lock_many)) waits by polling: an attempt at every
    /// part, then a random delay from the retry policy's range. It holds no part while
    /// it waits, so callers waiting for overlapping sets never deadlock; but it has no
    /// place in the wait queues, so waiters queued for one of its resources alone can keep
    /// that resource busy until its maximum wait runs out. Resources locked together
    /// belong in one group (a common hash tag).
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
        let got = match self.prepare_many(&names, ttl)? {
            Many::Within(res, inner) => {
                crate::client::wait::acquire_waiting(&inner, &res, ttl, &inner.config.retry).await
            }
            Many::Spanning(parts, all) => {
                let retry = parts
                    .first()
                    .map(|(inner, _)| inner.config.retry)
                    .unwrap_or_default();
                crate::client::spanning::acquire_waiting(&parts, &all, ttl, &retry).await
            }
        };
        got.map_err(|e| e.about(&names))
    }
}

/// A validated multi-resource mutex: within one lock group, or spanning several (its
/// parts in the groups' order, and every name).
enum Many {
    Within(Resources, Arc<Inner>),
    Spanning(Vec<crate::client::spanning::Part>, Arc<[String]>),
}

impl RedlockBuilder {
    /// Validates the configuration and creates the client.
    ///
    /// Connections are opened concurrently; `build` waits for them at most the connect
    /// timeout and never fails because a node is unreachable: unreachable nodes are
    /// retried on every request, so a service can start while a minority (or even all)
    /// of its Redis nodes are down. Each reachable node is checked against the deployment
    /// contract in the background, with warnings through `tracing`.
    ///
    /// Must be called within a Tokio runtime.
    ///
    /// With `rediss://` nodes (feature `tls-rustls`), `build` also makes sure rustls has a
    /// process-level crypto provider: it installs rustls's `aws-lc-rs` provider unless one
    /// is installed already. An application that wants another provider installs it before
    /// calling `build`. The feature turns on rustls's `aws-lc-rs` provider; if your
    /// application also turns on rustls's `ring` provider and builds rustls configurations
    /// of its own before `build` without installing a default, rustls can no longer pick one
    /// for it: install a default provider at the start of `main`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid configuration: no nodes, more than 64, a malformed
    /// URL, a `rediss://` URL without the `tls-rustls` feature or with `#insecure`, the same
    /// node twice, a drift factor outside `0.0..0.5`, a zero node or connect timeout, an
    /// invalid retry policy, a `tls_root_ca` that holds no usable certificate, a
    /// `tls_client_auth` without a certificate, without a private key, or whose key is not
    /// the certificate's.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<Redlock, Error> {
        Error::ensure_runtime()?;
        crate::base::metrics::built();
        let (groups, version, config) = self.into_parts()?;
        let groups = Groups::connect(groups, version, config).await?;
        Ok(Redlock {
            groups: Arc::new(groups),
        })
    }
}
