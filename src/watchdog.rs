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

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{Notify, watch};

use crate::client::Redlock;
use crate::error::{Error, LostReason};
use crate::lock::Lock;
use crate::node::{ExtendBatch, Node, millis_ceil};
use crate::protocol::tally::{drift, validity};
use crate::protocol::{Decision, Loss, Tally, Verdict, verdict};

/// Policy for keeping a lock alive: when to extend it, when to stop, and how early the
/// lost signal fires.
///
/// * **Refresh point**: the lock is extended (by its own TTL) once its guaranteed validity
///   left drops below `ttl × fraction`. The default fraction is **0.5** (extend at half-life:
///   a failed extension still leaves half a TTL of retries).
/// * **Safety margin**: the [`LostSignal`] fires at `deadline − margin` if no extension
///   confirmed by then. The default is **`ttl / 10`**. The margin is capped at half the
///   refresh window (`ttl × fraction / 2`) so that there is always time to extend before the
///   signal fires.
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
/// );
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

    /// Extends once the validity left is below `ttl × fraction`. Values outside
    /// `0.05..=0.95` (and NaN) are clamped into it. The default for this is 0.5.
    ///
    /// # Example
    ///
    /// ```
    /// let w = quorumlock::Watchdog::new().refresh_at(0.7); // extend with 70 % left
    /// # let _ = w;
    /// ```
    pub fn refresh_at(mut self, fraction: f64) -> Watchdog {
        self.fraction = if fraction.is_nan() {
            0.5
        } else {
            fraction.clamp(0.05, 0.95)
        };
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
    /// extension confirmed. The default for this is `ttl / 10`; it is capped at
    /// `ttl × fraction / 2`.
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

    fn refresh_window(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.fraction)
    }

    fn margin_for(&self, ttl: Duration) -> Duration {
        let cap = self.refresh_window(ttl) / 2;
        self.margin.unwrap_or(ttl / 10).min(cap)
    }
}

/// What the watchdog task and the guard share about one kept lock.
struct Entry {
    state: Mutex<State>,
    /// Bumped whenever the deadline moves or the lock is lost or stopped.
    changed: watch::Sender<u64>,
    keys: Vec<Vec<u8>>,
    token: Vec<u8>,
    ttl: Duration,
    refresh: Duration,
    margin: Duration,
    max_extensions: Option<u32>,
    hold_end: Option<Instant>,
}

struct State {
    deadline: Instant,
    lost: Option<Error>,
    stopped: bool,
    extensions: u32,
    /// When the task should next try to extend.
    next_try: Instant,
    in_round: bool,
}

impl Entry {
    /// When the lost signal fires if nothing changes, and why.
    fn fire_at(&self, deadline: Instant) -> (Instant, LostReason) {
        let by_validity = deadline.checked_sub(self.margin).unwrap_or(deadline);
        match self.hold_end {
            Some(h) if h < by_validity => (h, LostReason::MaxHold),
            _ => (by_validity, LostReason::ExtendFailed),
        }
    }

    /// Marks the lock lost if its time is up; returns the error if it is lost.
    ///
    /// Fails closed: if the state's mutex was poisoned by a panic, the lock is reported
    /// lost (never trusted on a state that may be half-updated).
    fn check(&self, now: Instant) -> Option<Error> {
        let Ok(mut st) = self.state.lock() else {
            return Some(Error::lost(LostReason::WatchdogFailed, None));
        };
        if st.lost.is_none() && !st.stopped {
            let (at, reason) = self.fire_at(st.deadline);
            if now >= at {
                self.mark_lost(&mut st, Error::lost(reason, None));
            }
        }
        st.lost.clone()
    }

    fn mark_lost(&self, st: &mut State, e: Error) {
        if st.lost.is_none() {
            if matches!(&e, Error::Lost(l) if l.reason() == LostReason::NotHeld) {
                // The keys are gone from a quorum: no validity is left to report.
                st.deadline = st.deadline.min(Instant::now());
            }
            tracing::warn!(ttl_ms = millis_ceil(self.ttl), error = %e, "quorumlock: watchdog: lock lost");
            st.lost = Some(e);
            self.changed.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// The deadline the guard and its contexts report. Once the lock was released (or its
    /// [`KeptLock`] dropped) no validity is left to report: a context that outlived the
    /// guard must not call a lock valid that another client may hold by now.
    fn deadline(&self) -> Instant {
        self.state
            .lock()
            .map(|s| {
                if s.stopped {
                    s.deadline.min(Instant::now())
                } else {
                    s.deadline
                }
            })
            .unwrap_or_else(|_| Instant::now())
    }

    /// Whether the guard released the lock or was dropped (a poisoned state counts).
    fn is_stopped(&self) -> bool {
        self.state.lock().map(|s| s.stopped).unwrap_or(true)
    }
}

/// A future that completes with an [`Error::Lost`] when a [`KeptLock`] is lost: no
/// extension confirmed by `deadline − safety margin`, a quorum no longer holds the lock, or
/// a [`Watchdog`] cap stopped extension.
///
/// It fires **before** the guaranteed validity ends, driven by its own timer, so hanging
/// extension requests cannot delay it. Once the lock is released (or the [`KeptLock`]
/// dropped) without having been lost, it completes with [`LostReason::Released`]: code
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
/// let kept = locks.lock("job", Duration::from_secs(10)).await?.keep_alive(Watchdog::new());
/// tokio::select! {
///     () = tokio::time::sleep(Duration::from_secs(60)) => kept.release().await?,
///     e = kept.lost() => eprintln!("stop: {e}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct LostSignal {
    entry: Arc<Entry>,
    fut: Option<BoxFuture<'static, Error>>,
}

impl Clone for LostSignal {
    fn clone(&self) -> LostSignal {
        LostSignal {
            entry: self.entry.clone(),
            fut: None,
        }
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal").finish_non_exhaustive()
    }
}

impl Future for LostSignal {
    type Output = Error;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Error> {
        let this = &mut *self;
        let fut = this
            .fut
            .get_or_insert_with(|| wait_lost(this.entry.clone()).boxed());
        fut.as_mut().poll(cx)
    }
}

async fn wait_lost(entry: Arc<Entry>) -> Error {
    let mut rx = entry.changed.subscribe();
    loop {
        rx.borrow_and_update();
        if let Some(e) = entry.check(Instant::now()) {
            return e;
        }
        let read = entry
            .state
            .lock()
            .ok()
            .map(|st| (entry.fire_at(st.deadline).0, st.stopped));
        let Some((at, stopped)) = read else {
            return std::future::pending().await;
        };
        if stopped {
            // Released, or its guard dropped: whoever still waits on the signal (a task
            // that outlived the guard) must stop too.
            return Error::lost(LostReason::Released, None);
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { return std::future::pending().await },
            () = tokio::time::sleep_until(at.into()) => {}
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
        LostSignal {
            entry: self.entry.clone(),
            fut: None,
        }
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
/// let kept = locks.try_lock("job", Duration::from_secs(5)).await?.keep_alive(Watchdog::new());
/// let lost = kept.lost();
/// tokio::select! {
///     () = tokio::time::sleep(Duration::from_secs(30)) => {}
///     e = lost => return Err(e),
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
    /// extended: the returned guard is lost at once ([`LostReason::Expired`] or
    /// [`LostReason::ExtendFailed`]), and releasing or dropping it deletes whatever keys
    /// still hold its token.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// use quorumlock::Watchdog;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.lock("job", Duration::from_secs(10)).await?;
    /// let kept = lock.keep_alive(Watchdog::new().max_extensions(10));
    /// kept.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(self, policy: Watchdog) -> KeptLock {
        let ttl = self.ttl();
        let refresh = policy.refresh_window(ttl);
        let deadline = self.deadline();
        let now = Instant::now();
        let entry = Arc::new(Entry {
            state: Mutex::new(State {
                deadline,
                lost: None,
                stopped: false,
                extensions: 0,
                next_try: deadline.checked_sub(refresh).unwrap_or(now),
                in_round: false,
            }),
            changed: watch::channel(0).0,
            keys: self.resources_ref().lock_keys().to_vec(),
            token: self.token().as_bytes().to_vec(),
            ttl,
            refresh,
            margin: policy.margin_for(ttl),
            max_extensions: policy.max_extensions,
            hold_end: policy.max_hold.and_then(|h| now.checked_add(h)),
        });
        if now >= entry.fire_at(deadline).0 {
            // Already past its deadline (or its lost signal's time): extending now could
            // only refresh keys that are no longer a quorum's. Report it lost at once and
            // never register it; release or drop still deletes whatever keys are left.
            let reason = if self.is_valid() {
                entry.fire_at(deadline).1
            } else {
                LostReason::Expired
            };
            if let Ok(mut st) = entry.state.lock() {
                entry.mark_lost(&mut st, Error::lost(reason, None));
            }
            return KeptLock {
                entry,
                lock: Some(self),
            };
        }
        let inner = self.inner().clone();
        let registry = inner
            .watchdog
            .get_or_init(|| Registry::start(&inner.nodes, inner.quorum, &inner.config));
        registry.add(entry.clone());
        KeptLock {
            entry,
            lock: Some(self),
        }
    }
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
    /// let e = kept.lost().await;
    /// assert!(e.is_lost());
    /// # }
    /// ```
    pub fn lost(&self) -> LostSignal {
        LostSignal {
            entry: self.entry.clone(),
            fut: None,
        }
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
        }
    }

    /// Stops the watchdog for this lock and returns the deadline it had, for the release
    /// that follows; from then on the entry (and every context) reports no validity.
    fn stop(&self) -> Instant {
        let deadline = match self.entry.state.lock() {
            Ok(mut st) => {
                st.stopped = true;
                st.deadline
            }
            Err(_) => Instant::now(),
        };
        self.entry.changed.send_modify(|g| *g = g.wrapping_add(1));
        deadline
    }

    /// Stops the watchdog and releases the lock (see [`Lock::release`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Lost`] when the watchdog had found the lock lost (its [`LostReason`]
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
        let lost = self.entry.check(Instant::now());
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

/// The kept locks of one [`Redlock`] and the one task that extends them.
pub(crate) struct Registry {
    entries: Arc<Mutex<Vec<Arc<Entry>>>>,
    wake: Arc<Notify>,
    nodes: Arc<[Node]>,
    quorum: usize,
    drift_factor: f64,
    node_timeout: NodeTimeout,
    /// The task; restarted by [`Registry::add`] if it is not running (never started
    /// outside a runtime, or its runtime shut down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Registry {
    fn start(nodes: &Arc<[Node]>, quorum: usize, config: &crate::config::Config) -> Registry {
        let c = config.clone();
        Registry {
            entries: Arc::new(Mutex::new(Vec::new())),
            wake: Arc::new(Notify::new()),
            nodes: nodes.clone(),
            quorum,
            drift_factor: config.drift_factor,
            node_timeout: Arc::new(move |ttl| c.node_timeout_for(ttl)),
            task: Mutex::new(None),
        }
    }

    fn add(&self, entry: Arc<Entry>) {
        if let Ok(mut v) = self.entries.lock() {
            v.push(entry);
        }
        self.ensure_running();
        self.wake.notify_one();
    }

    fn ensure_running(&self) {
        let Ok(mut task) = self.task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "quorumlock: keep_alive outside a Tokio runtime: the lock is not extended and its lost signal fires before it expires"
            );
            return;
        };
        // A task that died mid-round left its entries marked: unmark them.
        if task.is_some()
            && let Ok(v) = self.entries.lock()
        {
            for e in v.iter() {
                if let Ok(mut st) = e.state.lock() {
                    st.in_round = false;
                }
            }
        }
        let run = Task {
            entries: Arc::downgrade(&self.entries),
            wake: self.wake.clone(),
            nodes: self.nodes.clone(),
            quorum: self.quorum,
            drift_factor: self.drift_factor,
            node_timeout: self.node_timeout.clone(),
        }
        .run();
        *task = Some(rt.spawn(run));
    }
}

type NodeTimeout = Arc<dyn Fn(Duration) -> Duration + Send + Sync>;

struct Task {
    entries: Weak<Mutex<Vec<Arc<Entry>>>>,
    wake: Arc<Notify>,
    nodes: Arc<[Node]>,
    quorum: usize,
    drift_factor: f64,
    node_timeout: NodeTimeout,
}

/// How long before its own due time an entry may be swept into a round (batching window).
///
/// A quarter of the refresh window, and never more than a quarter of the time between two
/// extensions (`ttl − refresh`): with a late refresh point (`refresh_at(0.95)`) a window
/// of `refresh / 4` would make the lock due again the moment it was extended, and the
/// watchdog would run rounds back to back.
fn coalesce(e: &Entry) -> Duration {
    e.refresh.min(e.ttl.saturating_sub(e.refresh)) / 4
}

impl Task {
    async fn run(self) {
        loop {
            let Some(entries) = self.entries.upgrade() else {
                return;
            };
            let now = Instant::now();
            let (due, next) = self.collect(&entries, now);
            drop(entries);
            if !due.is_empty() {
                self.round(due).await;
                continue;
            }
            let notified = self.wake.notified();
            match next {
                Some(at) => tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                },
                None => notified.await,
            }
        }
    }

    /// The entries due now (marked in a round) and the next due time of the others; drops
    /// stopped and lost entries; fires caps.
    fn collect(
        &self,
        entries: &Mutex<Vec<Arc<Entry>>>,
        now: Instant,
    ) -> (Vec<Arc<Entry>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let Ok(mut v) = entries.lock() else {
            return (due, None);
        };
        v.retain(|e| {
            let Ok(mut st) = e.state.lock() else {
                return false;
            };
            if st.stopped || st.lost.is_some() {
                return false;
            }
            if st.in_round {
                return true;
            }
            let (fire_at, reason) = e.fire_at(st.deadline);
            if now >= fire_at {
                // Its time is up: never extend a lock past its lost signal (the keys left
                // on some nodes are no longer a quorum's to refresh).
                e.mark_lost(&mut st, Error::lost(reason, None));
                return false;
            }
            if st.next_try <= crate::time::later(now, coalesce(e)) {
                if e.max_extensions.is_some_and(|m| st.extensions >= m) {
                    e.mark_lost(&mut st, Error::lost(LostReason::MaxExtensions, None));
                    return false;
                }
                if e.hold_end.is_some_and(|h| now >= h) {
                    e.mark_lost(&mut st, Error::lost(LostReason::MaxHold, None));
                    return false;
                }
                st.in_round = true;
                due.push(e.clone());
            } else {
                next = Some(next.map_or(st.next_try, |n| n.min(st.next_try)));
            }
            true
        });
        (due, next)
    }

    /// One pipelined round: per node, `SCRIPT LOAD` then one `EVALSHA` per due lock.
    async fn round(&self, due: Vec<Arc<Entry>>) {
        let timeout = due
            .iter()
            .map(|e| (self.node_timeout)(e.ttl))
            .max()
            .unwrap_or(Duration::from_millis(50))
            // A long pipeline takes the server a while to run: ~20 µs per script call.
            .saturating_add(
                Duration::from_micros(20)
                    .saturating_mul(u32::try_from(due.len()).unwrap_or(u32::MAX)),
            );
        let batch = Arc::new(ExtendBatch::new(
            due.iter()
                .map(|e| (e.keys.as_slice(), e.token.as_slice(), e.ttl)),
        ));
        let start = Instant::now();
        let span = tracing::debug_span!(
            "quorumlock.watchdog",
            locks = due.len(),
            nodes = self.nodes.len(),
            quorum = self.quorum
        );
        let _enter = span.enter();
        drop(_enter);
        let mut replies: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|n| {
                let n = n.clone();
                let batch = batch.clone();
                async move { n.extend_batch(&batch, timeout).await }
            })
            .collect();
        let mut tallies: Vec<Tally> = due
            .iter()
            .map(|_| Tally::new(self.nodes.len(), self.quorum))
            .collect();
        let mut done = vec![false; due.len()];
        while let Some(reply) = replies.next().await {
            let at = Instant::now();
            for (k, e) in due.iter().enumerate() {
                if let Some(r) = reply.get(k) {
                    tallies[k].record(r.ballot());
                }
                if done[k] {
                    continue;
                }
                if let Some(d) = tallies[k].decision() {
                    done[k] = true;
                    self.apply(e, d, tallies[k], start, at);
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
        }
        if !replies.is_empty() {
            // Every lock of the round is decided: the slower nodes' answers can no longer
            // change anything. They finish in the background instead of holding up the next
            // round: a node that does not answer must not make every other kept lock wait
            // out its timeout (a short lock falling due meanwhile would be reported lost
            // while a healthy quorum holds it).
            crate::fanout::spawn(async move { while replies.next().await.is_some() {} });
        }
        for (k, e) in due.iter().enumerate() {
            if !done[k] {
                self.apply(
                    e,
                    tallies[k].final_decision(),
                    tallies[k],
                    start,
                    Instant::now(),
                );
            }
        }
    }

    fn apply(&self, e: &Entry, decision: Decision, tally: Tally, start: Instant, at: Instant) {
        let Ok(mut st) = e.state.lock() else { return };
        st.in_round = false;
        if st.stopped {
            return;
        }
        let now = Instant::now();
        let validity = validity(
            e.ttl,
            at.saturating_duration_since(start),
            drift(e.ttl, self.drift_factor),
        );
        // A kept lock is held with any validity left (no minimum), and a missed extension
        // keeps the old deadline, which the lost signal below watches.
        let verdict = verdict::extend(decision, &tally, validity, Duration::ZERO, true);
        if verdict == Verdict::Lost(Loss::NotHeld) {
            // Fewer than a quorum can still hold our token: no validity is left, even if
            // the lock was already marked lost for another reason (its lost signal's time
            // came, or a cap) while this round was running.
            st.deadline = st.deadline.min(now);
            e.mark_lost(&mut st, Error::lost(LostReason::NotHeld, None));
            e.changed.send_modify(|g| *g = g.wrapping_add(1));
            return;
        }
        if st.lost.is_some() {
            return;
        }
        let (fire_at, _) = e.fire_at(st.deadline);
        if now >= fire_at {
            // Too late: the lost signal's time has come; never un-lose a lock.
            let reason = e.fire_at(st.deadline).1;
            e.mark_lost(&mut st, Error::lost(reason, None));
            return;
        }
        if let Verdict::Held { validity } = verdict {
            let new = crate::time::earlier_of_overflow(start, validity);
            if new > st.deadline {
                st.deadline = new;
            }
            st.extensions = st.extensions.saturating_add(1);
            // Never due again at once: when an extension leaves less than the refresh
            // window (a late refresh point with a large drift allowance), wait at least
            // half the time between extensions, and at most half-way to the lost signal.
            let (fire, _) = e.fire_at(st.deadline);
            let gap = e
                .ttl
                .saturating_sub(e.refresh)
                .min(fire.saturating_duration_since(now))
                / 2;
            st.next_try = st
                .deadline
                .checked_sub(e.refresh)
                .unwrap_or(now)
                .max(crate::time::later(now, gap));
            e.changed.send_modify(|g| *g = g.wrapping_add(1));
            tracing::trace!(
                validity_ms = millis_ceil(validity),
                "quorumlock: watchdog extended a lock"
            );
            return;
        }
        // Retry soon, while validity remains.
        let retry = (e.refresh / 8).max(Duration::from_millis(5));
        st.next_try = crate::time::later(now, retry);
        tracing::debug!("quorumlock: watchdog extension missed the quorum; retrying");
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
        let lock = self.lock(resource, ttl).await?;
        scoped(lock.keep_alive(watchdog), f).await
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
        let lock = self.try_lock(resource, ttl).await?;
        scoped(lock.keep_alive(watchdog), f).await
    }
}

async fn scoped<F, Fut, T>(kept: KeptLock, f: F) -> Result<T, Error>
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = T>,
{
    use std::panic::AssertUnwindSafe;
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
                    return Err(e);
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

    fn entry(deadline: Instant) -> Arc<Entry> {
        Arc::new(Entry {
            state: Mutex::new(State {
                deadline,
                lost: None,
                stopped: false,
                extensions: 0,
                next_try: deadline,
                in_round: false,
            }),
            changed: watch::channel(0).0,
            keys: vec![b"k".to_vec()],
            token: b"t".to_vec(),
            ttl: Duration::from_secs(10),
            refresh: Duration::from_secs(5),
            margin: Duration::from_secs(1),
            max_extensions: None,
            hold_end: None,
        })
    }

    /// A panic while the state's mutex is held poisons it. The lock must then read as
    /// lost, with no validity left, and its lost signal must fire: failing open (as
    /// before: `is_lost()` false, the signal never firing) would let work go on under a
    /// lock nobody extends.
    #[tokio::test]
    async fn a_poisoned_state_fails_closed() {
        let e = entry(Instant::now() + Duration::from_secs(60));
        assert!(e.check(Instant::now()).is_none(), "healthy before");
        let poisoner = e.clone();
        let joined = std::thread::spawn(move || {
            let _guard = poisoner.state.lock();
            panic!("poison the watchdog state on purpose");
        })
        .join();
        assert!(joined.is_err());
        assert!(e.state.is_poisoned());
        let lost = e.check(Instant::now());
        match &lost {
            Some(Error::Lost(l)) => assert_eq!(l.reason(), LostReason::WatchdogFailed),
            other => panic!("a poisoned state must read as lost: {other:?}"),
        }
        assert!(
            e.deadline() <= Instant::now(),
            "no validity on a poisoned state"
        );
        let signal = LostSignal {
            entry: e.clone(),
            fut: None,
        };
        let fired = tokio::time::timeout(Duration::from_secs(1), signal).await;
        assert!(
            fired.is_ok(),
            "the lost signal must fire on a poisoned state"
        );
    }
}
