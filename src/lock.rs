//! The lock guard: what a held lock knows (its token, its deadline) and what it can do
//! (extend, release), and what happens when it is dropped.
//!
//! A [`Lock`]'s deadline is the instant until which a quorum is guaranteed to hold it
//! (under the deployment contract): the time the acquisition or the last extension
//! *started*, plus the TTL, minus the time that round took, minus the drift allowance.
//! [`Lock::remaining`] never over-reports: the deadline only moves after a quorum
//! confirmed an extension.
//!
//! One guard serves every kind of lock ([`LockMode`]): the mutex, a read-write lock's
//! reader or writer, a semaphore's permit. The kind selects the requests (which keys an
//! extension or a release names, which script runs) and the quorum; the rules (validity,
//! verdicts, the never-shortening extension, clean-up) are the same.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::{Instrument, field};

use crate::error::{Error, LostReason};
use crate::fanout::{InFlight, KeptNodes, Round};
use crate::node::Request;
use crate::protocol::contention::release_queued;
use crate::protocol::semaphore::NodeSet;
use crate::protocol::{Loss, Reply, Verdict, verdict};
use crate::resource::{Kind, Resources};
use crate::shared::Inner;
use crate::time::log_ms;
use crate::token::Token;

/// What kind of lock a [`Lock`] is ([`Lock::mode`]).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::LockMode;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let reader = locks.try_read_lock("catalog", Duration::from_secs(10)).await?;
/// assert_eq!(reader.mode(), LockMode::Read);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockMode {
    /// The mutex: [`Redlock::try_lock`](crate::Redlock::try_lock) and friends.
    Exclusive,
    /// A reader of a read-write lock ([`Redlock::read_lock`](crate::Redlock::read_lock)):
    /// shared with other readers, never with a writer.
    Read,
    /// The writer of a read-write lock ([`Redlock::write_lock`](crate::Redlock::write_lock)):
    /// excludes readers and other writers.
    Write,
    /// A permit of a [`Semaphore`](crate::Semaphore).
    Permit,
}

/// A held lock.
///
/// Created by [`Redlock::try_lock`](crate::Redlock::try_lock) and friends. It is held
/// until [`remaining`](Lock::remaining) reaches zero, unless [`extend`](Lock::extend)ed.
///
/// # Dropping
///
/// Release it with [`release`](Lock::release). A `Lock` dropped without `release` is
/// released **in the background** on the current Tokio runtime (best effort, never
/// blocking the executor); outside a runtime, or if the runtime shuts down first, its keys
/// simply expire after the TTL. Either way, no one else can take the resource before the
/// keys are gone: drop is never *unsafe*, only possibly slow to free the resource.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let mut lock = locks.try_lock("orders:42", Duration::from_secs(10)).await?;
/// assert!(lock.is_valid());
/// if lock.remaining() < Duration::from_secs(5) {
///     lock.extend(Duration::from_secs(10)).await?;
/// }
/// lock.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a Lock dropped at once is released in the background; keep it while the work runs"]
pub struct Lock {
    inner: Arc<Inner>,
    res: Resources,
    token: Token,
    ttl: Duration,
    deadline: Instant,
    inflight: Option<InFlight>,
    fencing: Option<u64>,
    released: bool,
    /// The wait-queue id this lock was waited for under, if any (see `wait::Ticket`).
    waiter: Option<Vec<u8>>,
    /// What kind of lock it is: selects the extend and release requests.
    kind: Kind,
    /// The grants an extension or a release needs (a semaphore's may exceed a majority).
    quorum: usize,
    /// A semaphore permit's kept nodes (decided by its give-back): the only nodes its
    /// extensions are sent to and counted from. `None` for every other kind.
    kept: Option<KeptNodes>,
    /// The nodes known to have granted the acquisition (its round's answers; a node not
    /// awaited is not in it). Empty for a lock taken by transfer.
    granted: Vec<usize>,
    /// A lock spanning several lock groups: one part per group, in the groups' order,
    /// each an ordinary lock of that group, all with this lock's token. The spanning lock
    /// itself holds no keys (its own fields describe the first part, and it is marked
    /// released so that dropping it sends nothing of its own): extending, releasing and
    /// dropping it do so to every part, and its deadline is the earliest part's. Empty
    /// for a lock within one group.
    parts: Vec<Lock>,
    /// Every resource of a spanning lock, sorted (each part knows only its own).
    names: Option<Arc<[String]>>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.resources())
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .field("mode", &self.mode())
            .field("fencing_token", &self.fencing)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(
        inner: Arc<Inner>,
        res: Resources,
        token: Token,
        ttl: Duration,
        deadline: Instant,
        inflight: Option<InFlight>,
        fencing: Option<u64>,
    ) -> Lock {
        let quorum = inner.quorum;
        Lock {
            inner,
            res,
            token,
            ttl,
            deadline,
            inflight,
            fencing,
            released: false,
            waiter: None,
            kind: Kind::Exclusive,
            quorum,
            kept: None,
            granted: Vec::new(),
            parts: Vec::new(),
            names: None,
        }
    }

    /// A lock spanning several lock groups, from its parts (one per group, in the
    /// groups' order, all taken with one token: `first`, then `rest`) and its fencing
    /// token (`None` when fencing is off; otherwise one committed to every part, see
    /// `spanning`).
    pub(crate) fn spanning(
        first: Lock,
        rest: Vec<Lock>,
        names: Arc<[String]>,
        fencing: Option<u64>,
    ) -> Lock {
        let mut lock = Lock::new(
            first.inner.clone(),
            first.res.clone(),
            first.token.clone(),
            first.ttl,
            first.deadline,
            None,
            fencing,
        );
        lock.released = true;
        lock.parts = Vec::with_capacity(rest.len().saturating_add(1));
        lock.parts.push(first);
        lock.parts.extend(rest);
        lock.names = Some(names);
        lock
    }

    /// Whether this lock spans several lock groups.
    pub(crate) fn is_spanning(&self) -> bool {
        !self.parts.is_empty()
    }

    /// A spanning lock's parts (empty for a lock within one group).
    pub(crate) fn parts(&self) -> &[Lock] {
        &self.parts
    }

    /// The lock with the nodes known to have granted its acquisition.
    pub(crate) fn with_granted(mut self, granted: Vec<usize>) -> Lock {
        self.granted = granted;
        self
    }

    /// The nodes known to have granted the acquisition (see [`Lock::with_granted`]).
    pub(crate) fn granted_nodes(&self) -> &[usize] {
        &self.granted
    }

    /// The lock as a `kind` needing `quorum` grants (set once, at acquisition).
    pub(crate) fn with_kind(mut self, kind: Kind, quorum: usize) -> Lock {
        self.kind = kind;
        self.quorum = quorum;
        self
    }

    /// A semaphore permit with its kept nodes, decided (now or later) by its give-back.
    pub(crate) fn with_kept(mut self, kept: KeptNodes) -> Lock {
        self.kept = Some(kept);
        self
    }

    /// A permit's kept nodes (`None` for every other kind).
    pub(crate) fn kept_nodes(&self) -> Option<KeptNodes> {
        self.kept.clone()
    }

    /// The grants an extension or a release needs.
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// The prepared extension of this lock by `ttl` (the watchdog sends it every round).
    pub(crate) fn extend_request(&self, ttl: Duration) -> Request {
        Request::extend_held(&self.kind, &self.res, &self.token, ttl)
    }

    /// What kind of lock this is: the mutex, a reader or the writer of a read-write lock,
    /// or a semaphore's permit.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::LockMode;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// assert_eq!(lock.mode(), LockMode::Exclusive);
    /// # Ok(()) }
    /// ```
    pub fn mode(&self) -> LockMode {
        match self.kind {
            Kind::Exclusive => LockMode::Exclusive,
            Kind::Read(_) => LockMode::Read,
            Kind::Write(_) => LockMode::Write,
            Kind::Permit(_) => LockMode::Permit,
        }
    }

    /// Records the wait-queue id this lock was acquired under.
    pub(crate) fn set_waiter(&mut self, id: Vec<u8>) {
        self.waiter = Some(id);
    }

    /// The guaranteed validity left; zero once expired.
    ///
    /// Measured on the process's monotonic clock ([`Instant`]). On Linux that clock does not
    /// advance while the host is suspended (a laptop asleep, a VM suspended), while the
    /// nodes' keys keep expiring: after the client host resumes, the lock can report
    /// validity its keys no longer have. A suspended client host is outside what the
    /// validity accounts for, like a clock that jumps rather than slews.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// assert!(lock.remaining() <= Duration::from_secs(10));
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// `remaining() > 0`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// assert!(lock.is_valid());
    /// # Ok(()) }
    /// ```
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// The instant the guaranteed validity ends.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// tokio::time::sleep_until(lock.deadline().into()).await; // the lock has now expired
    /// # Ok(()) }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.parts
            .iter()
            .map(Lock::deadline)
            .min()
            .unwrap_or(self.deadline)
    }

    /// The TTL of the acquisition or the last extension.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(10));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The resource names, sorted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock_many(["b", "a"], Duration::from_secs(10)).await?;
    /// assert_eq!(lock.resources(), ["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub fn resources(&self) -> &[String] {
        match &self.names {
            Some(names) => names,
            None => self.res.names(),
        }
    }

    /// The lock's token, the random value stored on every node (32 hex characters); one
    /// token for every part of a lock across lock groups.
    ///
    /// Anyone who knows it can release or extend the lock: do not log it. `Debug` shows
    /// only its first 8 characters.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// assert_eq!(lock.token().len(), 32);
    /// # Ok(()) }
    /// ```
    pub fn token(&self) -> &str {
        std::str::from_utf8(self.token.as_bytes()).unwrap_or("")
    }

    /// The fencing token, when the client was built with
    /// [`fencing(true)`](crate::RedlockBuilder::fencing): a number that strictly
    /// increases across successive holders of each of this lock's resources. Pass it to
    /// the storage the lock protects, which must refuse writes with a token below the
    /// largest it has seen. `None` when fencing is off.
    ///
    /// A multi-resource lock has one token that is valid for every one of its resources:
    /// larger than every earlier holder's token of each of them, and smaller than every
    /// later holder's. That holds across lock groups too: the largest of the groups'
    /// tokens is committed to every group's part before the lock is returned.
    ///
    /// A read-write lock's writer gets a token from the writer's own counter (ordered among
    /// the writers of that name, independent of the mutex of the same name); readers and
    /// semaphore permits have none (`None`): they do not exclude one another.
    ///
    /// Only the order of tokens means something. (They read like microseconds since the
    /// Unix epoch by the nodes' clocks, because each grant takes the node's clock as a
    /// floor; do not rely on that.)
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).fencing(true).build().await?;
    /// let lock = locks.try_lock("ledger", Duration::from_secs(10)).await?;
    /// let token: u64 = lock.fencing_token().expect("fencing is on");
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing
    }

    /// Moves the deadline (the watchdog confirmed extensions the guard did not see).
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
        for part in &mut self.parts {
            part.set_deadline(deadline);
        }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Extends the lock: pushes the expiry of every node that still holds our token out to
    /// at least `ttl` from now. The new validity is measured from the start of this call.
    ///
    /// On success the deadline moves to `start + ttl − elapsed − drift`, or stays where it
    /// was if that is later: an extension **never shortens** the lock, on any node
    /// (`PEXPIRE … GT`), so a shorter `ttl` than the time left is a no-op and a lock
    /// cannot be shortened behind the holder's back by an extension that reached only some
    /// nodes, timed out, was cancelled, or finished late in the background. To give a lock
    /// up early, [`release`](Lock::release) it. If fewer than a quorum confirm, nothing is
    /// deleted anywhere and the lock keeps its old deadline.
    ///
    /// In every case [`remaining`](Lock::remaining) never exceeds the time for which a
    /// quorum of nodes holds our token (under the deployment contract).
    ///
    /// # Errors
    ///
    /// * [`Error::Lost`]: the lock had already expired, or a quorum of nodes no longer
    ///   holds our token (the lock is then marked expired);
    /// * [`Error::NoQuorum`]: too few nodes answered; the lock keeps its old deadline
    ///   and may be extended again;
    /// * [`Error::Timeout`]: the quorum confirmed too late for any validity;
    /// * [`Error::InvalidInput`]: an invalid TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the deadline moves only after a quorum confirmed, so
    /// [`remaining`](Lock::remaining) never over-reports; some nodes may already have
    /// been extended (never shortened), and requests already sent may still land later,
    /// which can only lengthen those nodes' hold.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let mut lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// lock.extend(Duration::from_secs(30)).await?;
    /// assert!(lock.remaining() > Duration::from_secs(10));
    /// # Ok(()) }
    /// ```
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let names = self.resources().to_vec();
        self.extend_whole(ttl).await.map_err(|e| e.about(&names))
    }

    /// [`extend`](Lock::extend), every part of the lock.
    async fn extend_whole(&mut self, ttl: Duration) -> Result<(), Error> {
        Error::ensure_runtime()?;
        self.inner.config.check_ttl(ttl)?;
        if !self.is_valid() {
            return Err(Error::lost(LostReason::Expired, None));
        }
        if self.is_spanning() {
            // Every group's part at once; each moves only its own deadline, and this
            // lock's is the earliest of theirs.
            let extended = join_all(self.parts.iter_mut().map(|p| p.extend_part(ttl))).await;
            if extended.iter().all(Result::is_ok) {
                self.ttl = ttl;
            }
            return first_failure(extended);
        }
        self.extend_part(ttl).await
    }

    /// Extends a lock within one group (a whole lock, or one part of a spanning lock).
    async fn extend_part(&mut self, ttl: Duration) -> Result<(), Error> {
        if !self.is_valid() {
            return Err(Error::lost(LostReason::Expired, None));
        }
        let span = tracing::debug_span!(
            "quorumlock.extend",
            resource = %self.res.label(),
            mode = self.kind.label(),
            nodes = self.inner.nodes.len(),
            quorum = self.quorum,
            ttl_ms = log_ms(ttl),
            token = %self.token,
            granted = field::Empty,
            elapsed_us = field::Empty,
            validity_ms = field::Empty,
            outcome = field::Empty,
            votes = field::Empty,
        );
        self.extend_inner(ttl, &span).instrument(span.clone()).await
    }

    /// The extension round; its fields are recorded on `span`, the extension's own span
    /// (never `Span::current()`: with the span disabled that is the caller's).
    async fn extend_inner(&mut self, ttl: Duration, span: &tracing::Span) -> Result<(), Error> {
        let inner = self.inner.clone();
        // The group-map record must outlive the extended lock: an extension it does not
        // cover (and cannot be written to cover now) is refused, and the lock keeps its
        // current validity. A mismatch does not revoke the lock, but it is extended only
        // within the coverage it has.
        if let Err(e) = inner.cover_held(ttl).await {
            span.record("outcome", "group map record not confirmed");
            return Err(e);
        }
        let node_timeout = inner.config.node_timeout_for(ttl);
        let call = Arc::new(self.extend_request(ttl));
        let inflight = self.inflight.clone();
        let send = |i: usize, node: &crate::node::Node| {
            let node = node.clone();
            let call = call.clone();
            let inflight = inflight.clone();
            ordered(i, inflight, node_timeout, node, call)
        };
        let mut round = match &self.kept {
            None => Round::start(&inner.nodes, self.quorum, send),
            Some(kept) => match self.kept_set(kept).await {
                Some(set) => Round::start_on(&inner.nodes, set, self.quorum, send),
                None => {
                    // Never decided: nothing was sent; the old deadline stands.
                    let none = Round::start_on(&inner.nodes, NodeSet::default(), self.quorum, send);
                    span.record("outcome", "kept nodes undecided");
                    return Err(Error::NoQuorum(none.votes(&inner.nodes)));
                }
            },
        };
        let decision = round.decide().await;
        let (elapsed, validity) = round.measure(ttl, inner.config.drift_factor, span);
        if !span.is_disabled() {
            span.record("votes", round.votes(&inner.nodes).per_node());
        }
        let tally = *round.tally();
        let started = round.started();
        let min = inner.config.min_validity;
        // Never past the group-map record's coverage (checked before the round).
        let validity = validity.min(inner.map.coverage_from(started));
        let verdict = verdict::extend(decision, &tally, validity, min, self.is_valid());
        span.record("outcome", verdict.label("extended"));
        self.inner.metrics.extend(verdict, elapsed);
        if let Verdict::Held { validity } = verdict {
            round.detach();
            self.deadline = verdict::extended_deadline(self.deadline, started, validity);
            self.ttl = ttl;
            return Ok(());
        }
        // Only a failure reports every node's vote.
        let votes = round.votes(&inner.nodes);
        round.detach();
        match verdict {
            Verdict::Timeout => Err(Error::no_validity(elapsed, votes)),
            Verdict::Lost(Loss::NotHeld) => {
                // Fewer than a quorum can still hold our token: the lock is gone.
                tracing::warn!(resource = %self.res.label(), %votes, "quorumlock: lock lost: a quorum no longer holds its token");
                self.deadline = Instant::now();
                Err(Error::lost(LostReason::NotHeld, Some(votes)))
            }
            Verdict::Lost(_) => Err(Error::lost(LostReason::ExtendFailed, Some(votes))),
            _ => Err(Error::NoQuorum(votes)),
        }
    }

    /// A permit's kept nodes, waiting for its give-back to decide them: at most twice the
    /// acquire's per-node timeout (which bounds every request the decision waits for), and
    /// never past the deadline.
    async fn kept_set(&self, kept: &KeptNodes) -> Option<NodeSet> {
        if let Some(set) = kept.get() {
            return Some(set);
        }
        let acquire_timeout = self.inner.config.node_timeout_for(self.ttl);
        let limit = acquire_timeout.saturating_mul(2).min(self.remaining());
        kept.wait(limit).await
    }

    /// Releases the lock on every node: deletes each key only where it still holds our
    /// token (never another owner's), and announces the release to waiters.
    ///
    /// Returns as soon as a quorum confirmed; the other nodes are released in the
    /// background.
    ///
    /// # Errors
    ///
    /// * [`Error::Lost`]: the lock had already expired (its keys were still deleted
    ///   where they held our token), or a quorum no longer held our token;
    /// * [`Error::NoQuorum`]: too few nodes confirmed; their keys expire by TTL.
    ///
    /// # Cancel safety
    ///
    /// The guard is consumed. If the future is dropped before a quorum confirmed, the
    /// release is sent again in the background (as on drop); nodes that cannot be reached
    /// keep the key until its TTL.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("job", Duration::from_secs(10)).await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<(), Error> {
        let names = self.resources().to_vec();
        self.release_whole().await.map_err(|e| e.about(&names))
    }

    /// [`release`](Lock::release), every part of the lock.
    async fn release_whole(mut self) -> Result<(), Error> {
        Error::ensure_runtime()?;
        if self.is_spanning() {
            // Every group's part at once. A part whose release is cancelled with this
            // future is dropped, so released in the background.
            let parts = std::mem::take(&mut self.parts);
            return first_failure(join_all(parts.into_iter().map(Lock::release_part)).await);
        }
        self.release_part().await
    }

    /// Releases a lock within one group (a whole lock, or one part of a spanning lock).
    async fn release_part(mut self) -> Result<(), Error> {
        let span = tracing::debug_span!(
            "quorumlock.release",
            resource = %self.res.label(),
            mode = self.kind.label(),
            nodes = self.inner.nodes.len(),
            quorum = self.quorum,
            token = %self.token,
            granted = field::Empty,
            elapsed_us = field::Empty,
            outcome = field::Empty,
            votes = field::Empty,
        );
        let expired = !self.is_valid();
        let mut round = self.release_round();
        let decision = round.decide().instrument(span.clone()).await;
        self.released = true;
        let inner = self.inner.clone();
        if let (Some(n), Kind::Exclusive) = (&inner.notifier, &self.kind) {
            let listeners = round
                .replies()
                .map(|(_, r)| r.listeners())
                .max()
                .unwrap_or(0);
            // Only the heralds keep the queue and count its waiters: a release decided
            // without either of them cannot tell that no one waits.
            let n_nodes = inner.nodes.len();
            let herald_answered = round.replies().any(|(i, r)| {
                self.res.is_herald(i, n_nodes) && matches!(r, Reply::Released { .. })
            });
            let single = self.res.len() == 1;
            let queued = release_queued(single, self.waiter.is_some(), herald_answered);
            n.released(&self.res, listeners, queued);
        }
        if !span.is_disabled() {
            span.record("votes", round.votes(&inner.nodes).per_node());
        }
        let tally = *round.tally();
        span.record("granted", tally.granted());
        let elapsed = round.elapsed();
        span.record("elapsed_us", crate::time::log_us(elapsed));
        let verdict = verdict::release(decision, &tally, expired);
        span.record("outcome", verdict.label("released"));
        self.inner.metrics.release(verdict, elapsed);
        if verdict == Verdict::Released {
            round.detach();
            return Ok(());
        }
        // Only a failure reports every node's vote.
        let votes = round.votes(&inner.nodes);
        round.detach();
        match verdict {
            Verdict::Lost(Loss::Expired) => Err(Error::lost(LostReason::Expired, Some(votes))),
            Verdict::Released => Ok(()),
            Verdict::Lost(_) => Err(Error::lost(LostReason::NotHeld, Some(votes))),
            _ => Err(Error::NoQuorum(votes)),
        }
    }

    fn release_round(&self) -> Round {
        let announce = self.inner.config.notify;
        let waiter = self.waiter.as_deref().unwrap_or_default();
        let release = |loud| {
            Arc::new(Request::release_held(
                &self.kind,
                &self.res,
                &self.token,
                waiter,
                loud,
            ))
        };
        let (loud, quiet) = (release(announce), release(false));
        let timeout = self.inner.config.node_timeout_for(self.ttl);
        let inflight = self.inflight.clone();
        let n = self.inner.nodes.len();
        let res = &self.res;
        Round::start(&self.inner.nodes, self.quorum, |i, node| {
            // Only the nodes that announce the lock's releases announce (and name).
            let call = if res.announces_on(i, n) {
                loud.clone()
            } else {
                quiet.clone()
            };
            ordered(i, inflight.clone(), timeout, node.clone(), call)
        })
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        crate::metrics::dropped();
        if !self.is_valid() {
            // Expired: nothing of ours is guaranteed to be left, but clean up anyway.
            tracing::debug!(resource = %self.res.label(), "quorumlock: expired lock dropped");
        }
        let mut round = self.release_round();
        let spawned = crate::background::spawn(async move {
            let _ = round.decide().await;
            round.detach();
        });
        if !spawned {
            tracing::debug!(resource = %self.res.label(), "quorumlock: lock dropped outside a Tokio runtime; its keys expire by TTL");
        }
    }
}

/// The outcome of an extension or a release of every part of a spanning lock: `Ok` when
/// every part succeeded; otherwise the first part's [`Error::Lost`] if any part was lost
/// (the lock as a whole is), else the first failure in the groups' order.
fn first_failure(outcomes: Vec<Result<(), Error>>) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    for outcome in outcomes {
        if let Err(e) = outcome {
            match &first {
                Some(f) if f.is_lost() || !e.is_lost() => {}
                _ => first = Some(e),
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Runs an idempotent script (release, extend) on node `i`, but only after that node's
/// acquire request finished, so it can never overtake the `SET`; the caller waits at most
/// `timeout`. If the acquire is still in flight then, the script is sent in the background
/// once it finishes (within [`LATE_LIMIT`](crate::node::LATE_LIMIT)): a node paused during
/// the acquisition still gets its release when it resumes.
async fn ordered(
    i: usize,
    inflight: Option<InFlight>,
    timeout: Duration,
    node: crate::node::Node,
    call: Arc<Request>,
) -> Reply {
    // A node whose acquire has already finished needs no waiting (nor a second timer).
    let Some(inflight) = inflight.filter(|f| !f.done(i)) else {
        return node.send(&call, timeout).await;
    };
    node.send_after(async move { inflight.wait(i).await }, call, timeout)
        .await
}
