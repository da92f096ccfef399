//! Held locks that look after themselves: the [`Watchdog`] policy, the [`KeptLock`]
//! guard, the [`LostSignal`] future, and scoped use ([`Redlock::with_lock`]).
//!
//! # How it works
//!
//! ```text
//!  Lock::keep_alive ──▶ KeptLock ──registers──▶ Registry (one per Redlock)
//!                                                   │  one task, woken at the earliest due time
//!                                                   ▼
//!                     per node: one pipeline  SCRIPT LOAD; EVALSHA extend × k   (one round per tick)
//!                                                   │  replies counted per lock (Tally)
//!                                                   ▼
//!                     quorum ⇒ deadline = start + ttl − elapsed − drift;  else retry next tick
//!
//!  LostSignal: a timer at (deadline − safety margin), re-armed whenever the deadline moves;
//!              it fires whatever the extension requests are doing (even if they hang).
//! ```
//!
//! A failed extension never deletes anything (the extend script only sets a TTL where our
//! token still is); it is retried while validity remains. Once the lost signal fired, the
//! lock is never extended again: [`KeptLock::is_lost`] never goes back to `false`.
//!
//! This module is the guards and the policy; the rules (when a lock is due, what a round
//! did to it, when the signal fires and why) are the protocol's
//! ([`protocol::keep`](crate::protocol::keep)), and the rounds run in
//! [`extender`](crate::io::extender).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::base::error::{Error, Lost, LostReason};
use crate::client::lock::Lock;
use crate::client::redlock::Redlock;
use crate::io::extender::{Changed, Entry, Registry};
use crate::locks::semaphore::Semaphore;
use crate::protocol::keep;

/// Policy for keeping a lock alive: when to extend it, when to stop, and how early the
/// lost signal fires.
///
/// * **Refresh point**: the lock is extended (by its own TTL) once its guaranteed validity
///   left drops below `ttl × fraction`. The default fraction is **0.5** (extend at half-life:
///   a failed extension still leaves half a TTL of retries).
/// * **Safety margin**: the [`LostSignal`] fires at `deadline − margin` if no extension
///   confirmed by then. The default is **`ttl / 10`**, capped at half the refresh window
///   (`ttl × fraction / 2`) so that there is always time to extend before the signal
///   fires; a margin you choose must fit in that half window.
///
/// A policy is checked against the lock's TTL where the two meet
/// ([`keep_alive`](crate::Lock::keep_alive), the scoped wrappers), or by
/// [`check`](Watchdog::check): a fraction outside `0.05..=0.95`, or a chosen margin that
/// does not fit, is an [`Error::Config`], never adjusted silently.
/// * **Caps**: [`max_hold`](Watchdog::max_hold) (total time since the watchdog started) and
///   [`max_extensions`](Watchdog::max_extensions). When a cap stops extension, the lost
///   signal fires with a "cap reached" [`Lost`](crate::Lost) error. No cap by default.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::{Redlock, Watchdog};
///
/// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let lock = locks.lock("report", Duration::from_secs(10)).await?;
/// let kept = lock.keep_alive(
///     Watchdog::new()
///         .refresh_at(0.5)
///         .max_hold(Duration::from_secs(3600))
///         .safety_margin(Duration::from_secs(1)),
/// )?;
/// // ... work while !kept.is_lost() ...
/// kept.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watchdog {
    fraction: f64,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
    margin: Option<Duration>,
}

impl Default for Watchdog {
    fn default() -> Watchdog {
        Watchdog {
            fraction: 0.5,
            max_hold: None,
            max_extensions: None,
            margin: None,
        }
    }
}

impl Watchdog {
    /// The default policy: extend at half the TTL, margin `ttl / 10`, no caps.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::Watchdog::new(), quorumlock::Watchdog::default());
    /// ```
    pub fn new() -> Watchdog {
        Watchdog::default()
    }

    /// Extends once the validity left is below `ttl × fraction`, a fraction in
    /// `0.05..=0.95`. The default for this is 0.5. A fraction outside that range (or NaN)
    /// is refused by [`check`](Watchdog::check), and so by
    /// [`keep_alive`](crate::Lock::keep_alive) and the scoped wrappers, with
    /// [`Error::Config`].
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// let w = quorumlock::Watchdog::new().refresh_at(0.7); // extend with 70 % left
    /// assert!(w.check(Duration::from_secs(10)).is_ok());
    /// assert!(quorumlock::Watchdog::new().refresh_at(1.5).check(Duration::from_secs(10)).is_err());
    /// ```
    pub fn refresh_at(mut self, fraction: f64) -> Watchdog {
        self.fraction = fraction;
        self
    }

    /// Stops extending once this much time has passed since
    /// [`keep_alive`](crate::Lock::keep_alive); the lost signal fires then (or earlier, at
    /// `deadline − margin`, if the last extension does not reach that far). No cap by
    /// default.
    ///
    /// # Example
    ///
    /// ```
    /// let w = quorumlock::Watchdog::new().max_hold(std::time::Duration::from_secs(600));
    /// # let _ = w;
    /// ```
    pub fn max_hold(mut self, d: Duration) -> Watchdog {
        self.max_hold = Some(d);
        self
    }

    /// Extends at most `n` times; when the next extension is due after that, the lost
    /// signal fires. No cap by default.
    ///
    /// # Example
    ///
    /// ```
    /// let w = quorumlock::Watchdog::new().max_extensions(100);
    /// # let _ = w;
    /// ```
    pub fn max_extensions(mut self, n: u32) -> Watchdog {
        self.max_extensions = Some(n);
        self
    }

    /// How long before the end of the guaranteed validity the lost signal fires when no
    /// extension confirmed. The default for this is `ttl / 10`, capped at half the refresh
    /// window (`ttl × fraction / 2`). A margin you choose must fit in that half window, so
    /// that there is time to extend before the signal fires: a longer one is refused by
    /// [`check`](Watchdog::check), and so by [`keep_alive`](crate::Lock::keep_alive) and
    /// the scoped wrappers, with [`Error::Config`].
    ///
    /// [`KeptLock::is_lost`] turns `true` exactly at `deadline − margin`; the
    /// [`LostSignal`] future completes no earlier, but its timer has 1 ms resolution and
    /// the task that awaits it must still be scheduled: with a margin of a few milliseconds
    /// or less (zero included) the signal can arrive at or after the deadline. Choose a
    /// margin larger than your scheduling delays.
    ///
    /// # Example
    ///
    /// ```
    /// let w = quorumlock::Watchdog::new().safety_margin(std::time::Duration::from_millis(500));
    /// # let _ = w;
    /// ```
    pub fn safety_margin(mut self, d: Duration) -> Watchdog {
        self.margin = Some(d);
        self
    }

    /// Checks this policy for a lock of `ttl`: the refresh fraction is in `0.05..=0.95`,
    /// and a chosen safety margin fits in half the refresh window (`ttl × fraction / 2`).
    /// [`keep_alive`](crate::Lock::keep_alive) and the scoped wrappers
    /// ([`Redlock::with_lock`], …) run this first; call it yourself to find a bad policy
    /// where it is configured.
    ///
    /// # Errors
    ///
    /// [`Error::Config`], naming the setting (`watchdog.refresh_at`,
    /// `watchdog.safety_margin`) and the bound.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::Watchdog;
    ///
    /// let w = Watchdog::new().safety_margin(Duration::from_secs(2));
    /// assert!(w.check(Duration::from_secs(10)).is_ok()); // half of 5 s
    /// let e = w.check(Duration::from_secs(1)).unwrap_err(); // longer than the TTL
    /// assert!(e.to_string().contains("watchdog.safety_margin"));
    /// ```
    pub fn check(&self, ttl: Duration) -> Result<(), Error> {
        let f = self.fraction;
        if !(f.is_finite() && (keep::FRACTIONS).contains(&f)) {
            return Err(Error::config(
                "watchdog.refresh_at",
                format!(
                    "{f} is not in {}..={}",
                    keep::FRACTIONS.start(),
                    keep::FRACTIONS.end()
                ),
            ));
        }
        let longest = keep::longest_margin(keep::refresh_window(ttl, f));
        match self.margin {
            Some(m) if m > longest => Err(Error::config(
                "watchdog.safety_margin",
                format!(
                    "{m:?} does not fit a lock of {ttl:?} refreshed at {f}: at most {longest:?} \
                     (half the refresh window), so that an extension can be tried before the \
                     lost signal fires"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// A future that completes with an [`Error::Lost`] when a [`KeptLock`] is lost: no
/// extension confirmed by `deadline − safety margin`, a quorum no longer holds the lock, or
/// a [`Watchdog`] cap stopped extension.
///
/// It fires **before** the guaranteed validity ends, driven by its own timer, so hanging
/// extension requests cannot delay it. Once the lock is released (or the [`KeptLock`]
/// dropped) without having been lost, it completes with [`LostReason::Released`](crate::LostReason::Released): code
/// that outlives the guard (a spawned task waiting on a [`LockContext`]'s signal) stops
/// either way. `Send + 'static`; clone it freely (each clone is an independent future).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Watchdog;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let kept = locks.lock("job", Duration::from_secs(10)).await?.keep_alive(Watchdog::new())?;
/// tokio::select! {
///     () = tokio::time::sleep(Duration::from_secs(60)) => kept.release().await?,
///     e = kept.lost() => eprintln!("stop: {e}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct LostSignal {
    entry: Arc<Entry>,
    resources: Arc<[String]>,
    fut: Option<BoxFuture<'static, Lost>>,
}

impl LostSignal {
    fn new(entry: &Arc<Entry>, resources: &Arc<[String]>) -> LostSignal {
        LostSignal {
            entry: entry.clone(),
            resources: resources.clone(),
            fut: None,
        }
    }
}

impl Clone for LostSignal {
    fn clone(&self) -> LostSignal {
        LostSignal::new(&self.entry, &self.resources)
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal").finish_non_exhaustive()
    }
}

impl Future for LostSignal {
    type Output = Lost;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Lost> {
        let this = &mut *self;
        let fut = this.fut.get_or_insert_with(|| {
            let (entry, names) = (this.entry.clone(), this.resources.clone());
            async move { as_lost(entry.wait_lost().await.about(&names)) }.boxed()
        });
        fut.as_mut().poll(cx)
    }
}

/// The watchdog's verdict as the [`Lost`] it always is (a state it cannot read is a
/// failed watchdog: it fails closed).
fn as_lost(e: Error) -> Lost {
    match e {
        Error::Lost(l) => l,
        other => {
            tracing::warn!(error = %other, "quorumlock: the lost signal carried another error");
            Lost {
                reason: LostReason::WatchdogFailed,
                votes: None,
                resources: Vec::new(),
            }
        }
    }
}

/// Scoped-use context handed to the closure of [`Redlock::with_lock`]: the fencing token,
/// the validity left and the lost signal. Cheap to clone.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Watchdog;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// locks.with_lock("job", Duration::from_secs(10), Watchdog::new(), |ctx| async move {
///     println!("fencing token {:?}, {:?} left", ctx.fencing_token(), ctx.remaining());
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockContext {
    entry: Arc<Entry>,
    fencing: Option<u64>,
    resources: Arc<[String]>,
}

impl fmt::Debug for LockContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockContext")
            .field("remaining", &self.remaining())
            .field("fencing_token", &self.fencing)
            .finish()
    }
}

impl LockContext {
    /// The fencing token, when fencing is on (see [`Lock::fencing_token`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(ctx: quorumlock::LockContext) { let t: Option<u64> = ctx.fencing_token(); }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing
    }

    /// The guaranteed validity left (it grows with each extension); zero once the lock is
    /// lost with no validity left, released, or its [`KeptLock`] dropped.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(ctx: quorumlock::LockContext) { let _ = ctx.remaining(); }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.entry
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the lock is lost (see [`KeptLock::is_lost`]), or no longer held through
    /// this context at all: released, or its [`KeptLock`] dropped (a context can outlive
    /// its guard, e.g. in a task the closure of [`Redlock::with_lock`] spawned). Once
    /// `true`, stays `true`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(ctx: quorumlock::LockContext) { if ctx.is_lost() { return; } }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.entry.check(Instant::now()).is_some() || self.entry.is_stopped()
    }

    /// The lost signal (see [`KeptLock::lost`]). Like every [`LostSignal`], it never
    /// completes once the lock was released without being lost: a task that may outlive
    /// the guard should also check [`is_lost`](LockContext::is_lost), which turns `true`
    /// on release.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(ctx: quorumlock::LockContext) { let e = ctx.lost().await; }
    /// ```
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(&self.entry, &self.resources)
    }
}

/// A lock kept alive by a [`Watchdog`]: extended in the background (batched with every
/// other kept lock of the same [`Redlock`]) until released, lost or capped.
///
/// Created by [`Lock::keep_alive`]. Dropping it stops the watchdog and releases the lock
/// in the background (as dropping a [`Lock`]).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Watchdog;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let kept = locks.try_lock("job", Duration::from_secs(5)).await?.keep_alive(Watchdog::new())?;
/// let lost = kept.lost();
/// tokio::select! {
///     () = tokio::time::sleep(Duration::from_secs(30)) => {}
///     lost = lost => return Err(lost.into()),
/// }
/// kept.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a KeptLock dropped at once stops its watchdog and is released in the background"]
pub struct KeptLock {
    entry: Arc<Entry>,
    lock: Option<Lock>,
}

impl fmt::Debug for KeptLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptLock")
            .field("lock", &self.lock)
            .field("remaining", &self.remaining())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Lock {
    /// Hands the lock to the [`Redlock`]'s watchdog, which extends it (by its TTL) before
    /// its validity runs out, per `policy`.
    ///
    /// A lock whose validity has already run out (or is inside the safety margin) is never
    /// extended: the returned guard is lost at once ([`LostReason::Expired`](crate::LostReason::Expired) or
    /// [`LostReason::ExtendFailed`](crate::LostReason::ExtendFailed)), and releasing or dropping it deletes whatever keys
    /// still hold its token.
    ///
    /// # Errors
    ///
    /// [`PolicyRefused`] when `policy` does not fit this lock's TTL (see
    /// [`Watchdog::check`]): it holds the [`Error::Config`] and the lock, still held, which
    /// [`PolicyRefused::into_lock`] gives back. Dropping it, or `?` into an [`Error`],
    /// releases the lock, as dropping the lock does.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::Watchdog;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.lock("job", Duration::from_secs(10)).await?;
    /// let kept = lock.keep_alive(Watchdog::new().max_extensions(10))?;
    /// kept.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(self, policy: Watchdog) -> Result<KeptLock, PolicyRefused> {
        // A policy that does not fit this lock's TTL is a configuration error, said now
        // rather than as a lost signal later; the lock is handed back with it.
        if let Err(error) = policy.check(self.ttl()) {
            return Err(PolicyRefused {
                inner: Box::new((error, self)),
            });
        }
        let now = Instant::now();
        let hold_end = policy.max_hold.and_then(|h| now.checked_add(h));
        // A lock spanning several lock groups: one entry per part, each kept by its own
        // group's watchdog; the first part's reports for every part.
        let changed = Entry::channel();
        let linked: Vec<Arc<Entry>> = self
            .parts()
            .iter()
            .skip(1)
            .map(|part| part_entry(part, &policy, now, hold_end, changed.clone(), Vec::new()))
            .collect();
        let first = self.parts().first().unwrap_or(&self);
        let entry = part_entry(first, &policy, now, hold_end, changed, linked);
        if entry.lost_at_start(now) {
            // Already past its deadline (or its lost signal's time): extending now could
            // only refresh keys that are no longer a quorum's. Reported lost at once and
            // never registered; release or drop still deletes whatever keys are left.
            return Ok(KeptLock {
                entry,
                lock: Some(self),
            });
        }
        let mut parts: Vec<&Lock> = self.parts().iter().collect();
        if parts.is_empty() {
            parts.push(&self);
        }
        let entries = std::iter::once(&entry).chain(entry.linked_entries());
        for (part, e) in parts.into_iter().zip(entries) {
            let inner = part.inner();
            let registry = inner.watchdog.get_or_init(|| {
                let config = inner.config.clone();
                let node_timeout = Arc::new(move |ttl| config.node_timeout_for(ttl));
                Registry::start(&inner.nodes, inner.quorum, node_timeout, inner.map.clone())
            });
            registry.add(e.clone());
        }
        Ok(KeptLock {
            entry,
            lock: Some(self),
        })
    }
}

/// A [`Watchdog`] policy that [`Lock::keep_alive`] refused for the lock's TTL: the
/// configuration error, and the lock, still held and not kept alive.
///
/// Dropping it releases the lock (as dropping a [`Lock`] does); `?` turns it into its
/// [`Error::Config`], releasing the lock. To go on with the lock, take it back with
/// [`into_lock`](PolicyRefused::into_lock).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Watchdog;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let lock = locks.lock("job", Duration::from_secs(2)).await?;
/// let kept = match lock.keep_alive(Watchdog::new().safety_margin(Duration::from_secs(5))) {
///     Ok(kept) => kept,
///     Err(refused) => {
///         eprintln!("{}", refused.error()); // the margin does not fit a 2 s lock
///         refused.into_lock().keep_alive(Watchdog::new())?
///     }
/// };
/// kept.release().await?;
/// # Ok(()) }
/// ```
pub struct PolicyRefused {
    /// Boxed: a lock is large, and the error travels in a `Result`.
    inner: Box<(Error, Lock)>,
}

impl PolicyRefused {
    /// Why the policy was refused (an [`Error::Config`] naming the setting).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(refused: &quorumlock::PolicyRefused) {
    /// println!("{}", refused.error());
    /// # }
    /// ```
    pub fn error(&self) -> &Error {
        &self.inner.0
    }

    /// The lock, still held (and not kept alive).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(refused: quorumlock::PolicyRefused) -> Result<(), quorumlock::Error> {
    /// refused.into_lock().release().await?;
    /// # Ok(()) }
    /// ```
    pub fn into_lock(self) -> Lock {
        self.inner.1
    }
}

impl fmt::Debug for PolicyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyRefused")
            .field("error", &self.inner.0)
            .field("lock", &self.inner.1)
            .finish()
    }
}

impl fmt::Display for PolicyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; the lock is still held and not kept alive (dropping this error releases it)",
            self.inner.0
        )
    }
}

impl std::error::Error for PolicyRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.inner.0)
    }
}

impl From<PolicyRefused> for Error {
    /// The configuration error; the lock is released (dropped).
    fn from(refused: PolicyRefused) -> Error {
        refused.inner.0
    }
}

/// The watchdog's entry for one lock within one group (a whole lock, or one part of a
/// spanning lock), announcing on `changed` and reporting for `linked` too.
fn part_entry(
    part: &Lock,
    policy: &Watchdog,
    now: Instant,
    hold_end: Option<Instant>,
    changed: Changed,
    linked: Vec<Arc<Entry>>,
) -> Arc<Entry> {
    let ttl = part.ttl();
    let refresh = keep::refresh_window(ttl, policy.fraction);
    let rules = keep::Policy {
        ttl,
        refresh,
        margin: keep::margin(ttl, refresh, policy.margin),
        max_extensions: policy.max_extensions,
        drift_factor: part.inner().config.drift_factor,
    };
    Entry::linked(
        rules,
        (part.extend_request(ttl), part.quorum(), part.kept_nodes()),
        (part.deadline(), now, hold_end),
        changed,
        linked,
    )
}

impl KeptLock {
    /// The lost signal: completes with [`Error::Lost`] before the guaranteed validity ends
    /// when the lock could not be extended, a quorum no longer holds it, or a cap was
    /// reached. See [`LostSignal`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(kept: quorumlock::KeptLock) {
    /// let lost = kept.lost().await;
    /// println!("stop: {:?} lost because {}", lost.resources(), lost.reason());
    /// # }
    /// ```
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(&self.entry, &self.resources().into())
    }

    /// Whether the lost signal has fired (or its time has come). Once `true`, stays
    /// `true`. Cheap: a mutex and a clock read.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(kept: &quorumlock::KeptLock) {
    /// while !kept.is_lost() { /* one step of work */ break; }
    /// # }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.entry.check(Instant::now()).is_some()
    }

    /// The guaranteed validity left; grows with each extension.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(kept: &quorumlock::KeptLock) { let _ = kept.remaining(); }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.entry
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// The fencing token (see [`Lock::fencing_token`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(kept: &quorumlock::KeptLock) { let _ = kept.fencing_token(); }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.as_ref().and_then(Lock::fencing_token)
    }

    /// The resource names, sorted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(kept: &quorumlock::KeptLock) { println!("{:?}", kept.resources()); }
    /// ```
    pub fn resources(&self) -> &[String] {
        self.lock.as_ref().map(Lock::resources).unwrap_or(&[])
    }

    /// The context [`Redlock::with_lock`] hands its closure.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(kept: &quorumlock::KeptLock) { let ctx = kept.context(); let _ = ctx.remaining(); }
    /// ```
    pub fn context(&self) -> LockContext {
        LockContext {
            entry: self.entry.clone(),
            fencing: self.fencing_token(),
            resources: self.resources().into(),
        }
    }

    /// Stops the watchdog for this lock and returns the deadline it had, for the release
    /// that follows; from then on the entry (and every context) reports no validity.
    fn stop(&self) -> Instant {
        self.entry.stop()
    }

    /// Stops the watchdog and releases the lock (see [`Lock::release`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Lost`] when the watchdog had found the lock lost (its [`LostReason`](crate::LostReason)
    ///   says why: a quorum no longer held it, an extension failed, a cap was reached);
    ///   the keys still holding our token are deleted all the same;
    /// * otherwise as [`Lock::release`]: [`Error::Lost`] when the validity had run out,
    ///   [`Error::NoQuorum`] when too few nodes confirmed.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::release`]: the watchdog is stopped at once; if dropped midway the
    /// release continues in the background.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(kept: quorumlock::KeptLock) -> Result<(), quorumlock::Error> {
    /// kept.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<(), Error> {
        let names = self.resources().to_vec();
        let lost = self.entry.check(Instant::now()).map(|e| e.about(&names));
        let deadline = self.stop();
        let released = match self.lock.take() {
            Some(mut lock) => {
                lock.set_deadline(deadline);
                lock.release().await
            }
            None => Ok(()),
        };
        // A lock the watchdog found lost is reported lost, whatever the clean-up found.
        match lost {
            Some(e) => Err(e),
            None => released,
        }
    }
}

impl Drop for KeptLock {
    fn drop(&mut self) {
        let deadline = self.stop();
        if let Some(mut lock) = self.lock.take() {
            lock.set_deadline(deadline);
            drop(lock); // released in the background
        }
    }
}

impl Redlock {
    /// Scoped use: takes the lock on `resource` (waiting per the retry policy, as
    /// [`lock`](Redlock::lock)), keeps it alive with `watchdog`, and runs `f`.
    ///
    /// * If the lock is lost while `f` runs, `f`'s future is **dropped** (cancelled) and
    ///   [`Error::Lost`] is returned.
    /// * At the end the lock is released. A release error never hides `f`'s result: `f`'s
    ///   value is returned and the release error is logged (`tracing::warn`).
    /// * A panic in `f` propagates after the lock was released (best effort).
    ///
    /// # Errors
    ///
    /// The acquisition errors of [`lock`](Redlock::lock), or [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, `f`'s future is dropped and the lock is released in
    /// the background.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::{Redlock, Watchdog};
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let n = locks
    ///     .with_lock("orders:42", Duration::from_secs(10), Watchdog::new(), |ctx| async move {
    ///         // work; ctx.fencing_token() for the storage
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(n, 42);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        watchdog: Watchdog,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped(self.lock(resource, ttl), (watchdog, ttl), f).await
    }

    /// As [`with_lock`](Redlock::with_lock), with one attempt ([`try_lock`](Redlock::try_lock)).
    ///
    /// # Errors
    ///
    /// The errors of [`try_lock`](Redlock::try_lock) (e.g. [`Error::Held`]), or
    /// [`Error::Lost`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::{Redlock, Watchdog};
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// match locks.try_with_lock("cron", Duration::from_secs(30), Watchdog::new(), |_| async {}).await {
    ///     Err(e) if e.is_held() => println!("running elsewhere"),
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        watchdog: Watchdog,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped(self.try_lock(resource, ttl), (watchdog, ttl), f).await
    }
}

impl Redlock {
    /// Scoped use of a read lock: as [`with_lock`](Redlock::with_lock), with
    /// [`read_lock`](Redlock::read_lock) (waiting per the retry policy). The closure runs
    /// while the read lock is kept alive; it is cancelled if the lock is lost.
    ///
    /// # Errors
    ///
    /// The acquisition errors of [`read_lock`](Redlock::read_lock), or [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// As [`with_lock`](Redlock::with_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::{Redlock, Watchdog};
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let rows = locks
    ///     .with_read_lock("catalog", Duration::from_secs(10), Watchdog::new(), |_ctx| async {
    ///         120 // read the catalog
    ///     })
    ///     .await?;
    /// # let _ = rows;
    /// # Ok(()) }
    /// ```
    pub async fn with_read_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        watchdog: Watchdog,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped(self.read_lock(resource, ttl), (watchdog, ttl), f).await
    }

    /// Scoped use of the write lock: as [`with_lock`](Redlock::with_lock), with
    /// [`write_lock`](Redlock::write_lock) (waiting per the retry policy, with a writer's
    /// intent). The context's [`fencing_token`](LockContext::fencing_token) is the
    /// writer's, when fencing is on.
    ///
    /// # Errors
    ///
    /// The acquisition errors of [`write_lock`](Redlock::write_lock), or [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// As [`with_lock`](Redlock::with_lock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::{Redlock, Watchdog};
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).fencing(true).build().await?;
    /// locks
    ///     .with_write_lock("catalog", Duration::from_secs(10), Watchdog::new(), |ctx| async move {
    ///         let _token = ctx.fencing_token(); // pass to the storage
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn with_write_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        watchdog: Watchdog,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped(self.write_lock(resource, ttl), (watchdog, ttl), f).await
    }
}

impl Semaphore {
    /// Scoped use of a permit: takes one ([`acquire`](Semaphore::acquire), waiting per the
    /// retry policy), keeps it alive with `watchdog`, runs `f`, and releases it, as
    /// [`Redlock::with_lock`] does for the mutex. The closure is cancelled if the permit
    /// is lost.
    ///
    /// # Errors
    ///
    /// The acquisition errors of [`acquire`](Semaphore::acquire), or [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// As [`Redlock::with_lock`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::{Redlock, Watchdog};
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let pool = locks.semaphore("api-quota", 8)?;
    /// let status = pool
    ///     .with_permit(Duration::from_secs(10), Watchdog::new(), |_ctx| async { 200 })
    ///     .await?;
    /// # let _ = status;
    /// # Ok(()) }
    /// ```
    pub async fn with_permit<F, Fut, T>(
        &self,
        ttl: Duration,
        watchdog: Watchdog,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        scoped(self.acquire(ttl), (watchdog, ttl), f).await
    }
}

/// The one implementation of every scoped wrapper: takes the lock `acquire` gives, keeps it
/// alive with `watchdog` while `f` runs, cancels `f` if the lock is lost, and releases it.
///
/// The policy is checked against `ttl` before anything is taken: a policy that does not fit
/// fails without a request.
async fn scoped<A, F, Fut, T>(
    acquire: A,
    (watchdog, ttl): (Watchdog, Duration),
    f: F,
) -> Result<T, Error>
where
    A: Future<Output = Result<Lock, Error>>,
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = T>,
{
    use std::panic::AssertUnwindSafe;
    watchdog.check(ttl)?;
    let kept = acquire.await?.keep_alive(watchdog)?;
    let ctx = kept.context();
    let lost = kept.lost();
    let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| f(ctx))) {
        Err(panic) => Err(panic),
        Ok(fut) => {
            let fut = AssertUnwindSafe(fut).catch_unwind();
            tokio::select! {
                biased;
                r = fut => r,
                e = lost => {
                    // `fut` is dropped here: the closure's work is cancelled first.
                    if let Err(re) = kept.release().await {
                        tracing::debug!(error = %re, "quorumlock: release of a lost lock failed");
                    }
                    return Err(Error::Lost(e));
                }
            }
        }
    };
    let release = kept.release().await;
    match outcome {
        Ok(v) => {
            if let Err(e) = release {
                tracing::warn!(error = %e, "quorumlock: release after scoped use failed");
            }
            Ok(v)
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LostReason;

    fn field(r: Result<(), Error>) -> Option<String> {
        match r {
            Ok(()) => None,
            Err(Error::Config(c)) => Some(c.field().to_owned()),
            Err(other) => panic!("a configuration error, not {other:?}"),
        }
    }

    #[test]
    fn a_refresh_fraction_outside_its_range_is_refused() {
        let ttl = Duration::from_secs(10);
        for bad in [1.5, 0.96, 0.049, 0.0, -0.5, f64::NAN, f64::INFINITY] {
            assert_eq!(
                field(Watchdog::new().refresh_at(bad).check(ttl)).as_deref(),
                Some("watchdog.refresh_at"),
                "{bad}"
            );
        }
        for good in [0.05, 0.5, 2.0 / 3.0, 0.95] {
            assert_eq!(field(Watchdog::new().refresh_at(good).check(ttl)), None);
        }
        assert_eq!(field(Watchdog::new().check(ttl)), None, "the default fits");
    }

    #[test]
    fn a_safety_margin_longer_than_half_the_refresh_window_is_refused() {
        let ttl = Duration::from_secs(1);
        let margin = |ms: u64, f: f64| {
            field(
                Watchdog::new()
                    .refresh_at(f)
                    .safety_margin(Duration::from_millis(ms))
                    .check(ttl),
            )
        };
        assert_eq!(margin(250, 0.5), None, "exactly half of 500 ms");
        assert_eq!(margin(251, 0.5).as_deref(), Some("watchdog.safety_margin"));
        assert_eq!(
            margin(2_000, 0.5).as_deref(),
            Some("watchdog.safety_margin")
        );
        assert_eq!(margin(475, 0.95), None);
        assert_eq!(margin(0, 0.05), None, "a zero margin always fits");
        // The default margin (a tenth of the TTL) is capped, never refused, whatever the
        // fraction.
        assert_eq!(field(Watchdog::new().refresh_at(0.05).check(ttl)), None);
    }

    fn entry(deadline: Instant) -> Arc<Entry> {
        Entry::for_test(deadline, Entry::channel(), Vec::new())
    }

    /// A panic while the state's mutex is held poisons it. The lock must then read as
    /// lost, with no validity left, and its lost signal must fire: failing open (as
    /// before: `is_lost()` false, the signal never firing) would let work go on under a
    /// lock nobody extends.
    #[tokio::test]
    async fn a_poisoned_state_fails_closed() {
        let e = entry(Instant::now() + Duration::from_secs(60));
        assert!(e.check(Instant::now()).is_none(), "healthy before");
        e.poison();
        let lost = e.check(Instant::now());
        match &lost {
            Some(Error::Lost(l)) => assert_eq!(l.reason(), LostReason::WatchdogFailed),
            other => panic!("a poisoned state must read as lost: {other:?}"),
        }
        assert!(
            e.deadline() <= Instant::now(),
            "no validity on a poisoned state"
        );
        let signal = LostSignal::new(&e, &Arc::from(Vec::new()));
        let fired = tokio::time::timeout(Duration::from_secs(1), signal).await;
        assert!(
            fired.is_ok(),
            "the lost signal must fire on a poisoned state"
        );
    }
}
