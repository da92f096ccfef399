//! Read-write locks across the quorum: many readers, or one writer.
//!
//! Each node keeps, per name, a writer key (`quorumlock:rw:{name}`, a token with a TTL), a
//! sorted set of readers (`quorumlock:readers:{name}`, token → expiry by the node's clock)
//! and a sorted set of waiting writers' intents (`quorumlock:wintent:{name}`). On a node:
//!
//! * a reader is added unless the writer key exists or a live intent does;
//! * the writer key is set unless it exists or a live reader does.
//!
//! So at every node a live writer and a live reader never coexist (an entry only leaves,
//! or is extended while it is live). A reader or a writer holds the lock once a majority
//! granted, with the mutex's validity rule; two majorities share a node, so no reader
//! ever overlaps a writer and no two writers overlap (`docs/safety.md` has the argument).
//! Extensions, releases, drop, the watchdog and the clean-up of failed attempts work as
//! for the mutex, on the reader's entry or the writer key.
//!
//! **Writers are preferred.** A writer that waits ([`Redlock::write_lock`]) registers an
//! *intent* on every node that refuses it, renewed by each attempt for the wait queue's
//! lease ([`QUEUE_LEASE`](crate::QUEUE_LEASE); a waiting writer tries at least every third
//! of the lease, whatever its retry policy's delays); new readers are refused while it is live,
//! so readers already in finish, and the writer gets in even under a steady stream of
//! readers. The intent is removed when the writer gets the lock, gives up or is cancelled
//! (in the background); a writer that dies blocks new readers for at most the lease. In
//! turn a steady stream of writers can delay readers indefinitely, and a holder of a read
//! lock must not wait for a second one of the same name (with a writer waiting in
//! between, each would wait for the other).
//!
//! One resource per lock: there are no `_many` forms. The keys are their own namespace: a
//! read-write lock and the mutex of the same name do not exclude each other.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rand::RngExt;

use crate::base::error::Error;
use crate::base::resource::{Kind, Resources, RwKeys};
use crate::client::acquire::{Ask, acquire_as};
use crate::client::lock::Lock;
use crate::client::redlock::Redlock;
use crate::client::shared::Inner;
use crate::client::wait::acquire_polling;
use crate::io::node::Request;

/// A waiting writer's intent: its id, passed with every attempt (each refusal registers or
/// renews it), and removed from every node when dropped (acquired, gave up, cancelled), in
/// the background. A writer that cannot remove it leaves it to lapse with its lease.
struct Intent {
    inner: Arc<Inner>,
    keys: Arc<RwKeys>,
    id: Vec<u8>,
    timeout: Duration,
}

impl Intent {
    fn new(inner: &Arc<Inner>, keys: &Arc<RwKeys>, ttl: Duration) -> Intent {
        Intent {
            inner: inner.clone(),
            keys: keys.clone(),
            id: format!("{:016x}", rand::rng().random::<u64>()).into_bytes(),
            timeout: inner.config.node_timeout_for(ttl),
        }
    }
}

impl Drop for Intent {
    fn drop(&mut self) {
        let leave = Arc::new(Request::leave_intent(&self.keys, &self.id));
        let nodes = self.inner.nodes.clone();
        let timeout = self.timeout;
        crate::io::background::spawn(async move {
            let all: FuturesUnordered<_> = nodes
                .iter()
                .map(|node| node.send(&leave, timeout))
                .collect();
            all.collect::<Vec<_>>().await;
        });
    }
}

impl Redlock {
    /// The checks of a read-write lock call, and its keys.
    #[allow(clippy::type_complexity)]
    fn rw(
        &self,
        resource: &str,
        ttl: Duration,
    ) -> Result<(Resources, Arc<RwKeys>, &Arc<Inner>), Error> {
        let (res, inner) = self.prepare(&[resource], ttl)?;
        let keys = Arc::new(RwKeys::new(resource, &inner.keys));
        Ok((res, keys, inner))
    }

    /// Tries once to take a read lock on `resource` for `ttl`, shared with other readers.
    /// Never waits or retries.
    ///
    /// Refused while a writer holds the lock or a writer waits for it (writers are
    /// preferred, see [`write_lock`](Redlock::write_lock)). The returned [`Lock`] is a
    /// reader ([`LockMode::Read`](crate::LockMode::Read)): extend, release, drop and
    /// [`keep_alive`](Lock::keep_alive) work as for the mutex, on its own entry only.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Redlock::try_lock): [`Error::Held`] when a writer holds or waits
    /// for it, [`Error::NoQuorum`], [`Error::Timeout`], [`Error::InvalidInput`].
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
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let a = locks.try_read_lock("catalog", Duration::from_secs(10)).await?;
    /// let b = locks.try_read_lock("catalog", Duration::from_secs(10)).await?; // shared
    /// a.release().await?;
    /// b.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_read_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let (res, keys, inner) = self.rw(resource, ttl)?;
        let ask = Ask::new(Kind::Read(keys), inner.quorum);
        acquire_as(inner, &res, &ask, ttl, 1)
            .await
            .map_err(|e| e.about(&[resource]))
    }

    /// Takes a read lock on `resource`, waiting per the client's retry policy (polling
    /// with the policy's random delays; bounded by its attempts or maximum wait).
    ///
    /// # Errors
    ///
    /// As [`try_read_lock`](Redlock::try_read_lock), except that [`Error::Held`] and
    /// [`Error::NoQuorum`] are retried; when the policy runs out, [`Error::Timeout`]
    /// carries the last attempt's votes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_read_lock`](Redlock::try_read_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let reader = locks.read_lock("catalog", Duration::from_secs(10)).await?;
    /// reader.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let (res, keys, inner) = self.rw(resource, ttl)?;
        let ask = Ask::new(Kind::Read(keys), inner.quorum);
        acquire_polling(inner, &res, &ask, ttl, &inner.config.retry)
            .await
            .map_err(|e| e.about(&[resource]))
    }

    /// Tries once to take the write lock on `resource` for `ttl`: excludes readers and
    /// other writers. Never waits, and registers no intent (readers are not held back).
    ///
    /// With [`fencing(true)`](crate::RedlockBuilder::fencing) the lock carries a fencing
    /// token that rises across the writers of this name ([`Lock::fencing_token`]).
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Redlock::try_lock): [`Error::Held`] while a writer or a live reader
    /// holds it.
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
    /// match locks.try_write_lock("catalog", Duration::from_secs(10)).await {
    ///     Ok(writer) => writer.release().await?,
    ///     Err(e) if e.is_held() => println!("readers or a writer are in"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_write_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let (res, keys, inner) = self.rw(resource, ttl)?;
        let ask = Ask::new(Kind::Write(keys), inner.quorum);
        acquire_as(inner, &res, &ask, ttl, 1)
            .await
            .map_err(|e| e.about(&[resource]))
    }

    /// Takes the write lock on `resource`, waiting per the client's retry policy.
    ///
    /// While it waits, its intent is registered on the nodes that refuse it: new readers
    /// are refused there, so the readers already in finish and the writer gets in even
    /// under a steady stream of readers. The intent is removed when this call returns or
    /// is dropped; if the process dies, it lapses within
    /// [`QUEUE_LEASE`](crate::QUEUE_LEASE).
    ///
    /// # Errors
    ///
    /// As [`try_write_lock`](Redlock::try_write_lock), except that [`Error::Held`] and
    /// [`Error::NoQuorum`] are retried; when the policy runs out, [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: if dropped, the attempt's keys and the intent are removed in the
    /// background.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let writer = locks.write_lock("catalog", Duration::from_secs(10)).await?;
    /// // ... rewrite the catalog, within writer.remaining() ...
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn write_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let (res, keys, inner) = self.rw(resource, ttl)?;
        let intent = Intent::new(inner, &keys, ttl);
        let mut ask = Ask::new(Kind::Write(keys), inner.quorum);
        ask.intent = intent.id.clone();
        let got = acquire_polling(inner, &res, &ask, ttl, &inner.config.retry).await;
        drop(intent);
        got.map_err(|e| e.about(&[resource]))
    }
}
