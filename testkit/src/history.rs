//! [`History`]: a thread-safe recorder of what lock clients did and believed, on one
//! monotonic clock, for the [`checker`](super::checker).
//!
//! Every time in an [`Event`] is an offset from the history's start (one
//! [`std::time::Instant`] taken by [`History::new`]), so all events, and the deadlines that
//! clients report, are on one monotonic clock. Timestamps are taken while the recorder's lock
//! is held, so the recording order (`seq`) and the time order agree.
//!
//! # What to record
//!
//! One [`ClientId`] is one sequential actor (a task that takes, uses and releases locks one
//! after another). For each attempt on a resource:
//!
//! | when | record | notes |
//! | --- | --- | --- |
//! | before calling `try_lock`/`lock` | [`acquire_invoked`](ClientRecorder::acquire_invoked) | optional, for reading |
//! | it returned a lock | [`acquired`](ClientRecorder::acquired) with `Instant::now() + lock.remaining()` and the fencing token | opens an exclusive hold (a mutex, a write lock) |
//! | it returned a read lock | [`acquired_shared`](ClientRecorder::acquired_shared) | opens a shared hold: other shared holds may overlap it, exclusive ones may not |
//! | it returned a semaphore permit | [`acquired_permit`](ClientRecorder::acquired_permit) with the semaphore's permits P | opens a permit hold: at most P overlap |
//! | it returned an error | [`acquire_failed`](ClientRecorder::acquire_failed) | not a hold |
//! | it timed out or was cancelled | [`acquire_unknown`](ClientRecorder::acquire_unknown) | not a hold: the client does not believe it holds the lock |
//! | before calling `extend` | [`extend_invoked`](ClientRecorder::extend_invoked) | optional, for reading |
//! | `extend` succeeded | [`extended`](ClientRecorder::extended) with the new deadline (`lock.deadline()`) | moves the hold's end |
//! | `extend` returned an error other than lost | [`extend_failed`](ClientRecorder::extend_failed) | the hold keeps its deadline |
//! | `extend` timed out or was cancelled | [`extend_unknown`](ClientRecorder::extend_unknown) | the hold keeps its deadline: the client believes what `lock.remaining()` says, whatever reached the nodes |
//! | the lost signal fired | [`lost`](ClientRecorder::lost) | ends the hold there |
//! | before calling `release` | [`release_invoked`](ClientRecorder::release_invoked) | ends the hold there |
//! | the protected work starts / ends | [`work_started`](ClientRecorder::work_started) / [`work_ended`](ClientRecorder::work_ended) | must lie inside the hold |
//! | the storage accepted / rejected a fenced write | [`write_accepted`](ClientRecorder::write_accepted) / [`write_rejected`](ClientRecorder::write_rejected) | accepted tokens must not go down |
//!
//! Each hold has a [`HoldMode`]; [`acquired`](ClientRecorder::acquired) records the
//! exclusive mode, so code written before modes existed records what it always did. A
//! resource's holds are either exclusive and shared (a mutex or a read-write lock) or permits
//! of one semaphore with one P; the checker flags a resource that mixes the two.
//!
//! # Example
//!
//! ```
//! use std::time::{Duration, Instant};
//! use quorumlock_testkit::History;
//!
//! let history = History::new();
//! let alice = history.client(1);
//! alice.acquire_invoked("orders:42");
//! alice.acquired("orders:42", Instant::now() + Duration::from_secs(10), Some(7));
//! alice.work_started("orders:42");
//! alice.work_ended("orders:42");
//! alice.release_invoked("orders:42");
//! alice.released("orders:42");
//! assert!(history.check().is_clean());
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Identifies one sequential client (task) in a [`History`].
pub type ClientId = u64;

/// How a hold shares its resource with the other holds of the same resource, for the
/// [`checker`](super::checker).
///
/// # Example
///
/// ```
/// use quorumlock_testkit::HoldMode;
///
/// assert!(HoldMode::Exclusive.is_exclusive());
/// assert_eq!(HoldMode::Permit { permits: 3 }.permits(), Some(3));
/// assert_eq!(HoldMode::default(), HoldMode::Exclusive);
/// assert_eq!(HoldMode::Shared.to_string(), "shared");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HoldMode {
    /// Alone: no other hold of the resource may overlap it (a mutex, a write lock).
    #[default]
    Exclusive,
    /// Shared with other shared holds, never with an exclusive one (a read lock).
    Shared,
    /// One permit of a semaphore with `permits` permits: at most `permits` permit holds of
    /// the resource overlap at any instant.
    Permit {
        /// The semaphore's number of permits (P).
        permits: u32,
    },
}

impl HoldMode {
    /// Whether no other hold may overlap this one.
    pub fn is_exclusive(&self) -> bool {
        matches!(self, HoldMode::Exclusive)
    }

    /// The semaphore's permits, for a permit hold.
    pub fn permits(&self) -> Option<u32> {
        match self {
            HoldMode::Permit { permits } => Some(*permits),
            _ => None,
        }
    }
}

impl fmt::Display for HoldMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldMode::Exclusive => f.write_str("exclusive"),
            HoldMode::Shared => f.write_str("shared"),
            HoldMode::Permit { permits } => write!(f, "permit of {permits}"),
        }
    }
}

/// What happened, in an [`Event`]. Deadlines are offsets from the history's start, like
/// [`Event::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// The client called an acquire method.
    AcquireInvoked,
    /// The client got the lock and believes it holds it until `deadline`.
    Acquired {
        /// The end of the validity the client believes in (`now + lock.remaining()`).
        deadline: Duration,
        /// The lock's fencing token, when fencing is on.
        fencing_token: Option<u64>,
    },
    /// The client got a hold of the resource in `mode` and believes it holds it until
    /// `deadline`: like [`Acquired`](EventKind::Acquired), which is this with
    /// [`HoldMode::Exclusive`].
    AcquiredAs {
        /// The end of the validity the client believes in (`now + lock.remaining()`).
        deadline: Duration,
        /// The lock's fencing token, when fencing is on (write locks only).
        fencing_token: Option<u64>,
        /// How the hold shares the resource.
        mode: HoldMode,
    },
    /// The acquire returned an error: the client does not hold the lock.
    AcquireFailed,
    /// The acquire timed out or was cancelled: outcome unknown on the nodes, but the client
    /// does not believe it holds the lock, so it is not a hold.
    AcquireUnknown,
    /// An extension succeeded: the client now believes it holds the lock until `deadline`.
    Extended {
        /// The new end of validity.
        deadline: Duration,
    },
    /// The client called extend.
    ExtendInvoked,
    /// An extension failed; the hold keeps its previous deadline.
    ExtendFailed,
    /// An extension timed out or was cancelled: what reached the nodes is unknown (it may
    /// have changed the keys' expiry on some or all of them), but the client still believes
    /// its previous deadline, so the hold keeps it. Recorded so that the history shows the
    /// operation; it is never treated as if it had not happened.
    ExtendUnknown,
    /// The client learned that the lock is lost (the lost signal fired): the hold ends here.
    Lost,
    /// The client called release: the hold ends here.
    ReleaseInvoked,
    /// The release returned successfully.
    Released,
    /// The release returned an error.
    ReleaseFailed,
    /// The work protected by the lock started.
    WorkStarted,
    /// The work protected by the lock ended.
    WorkEnded,
    /// The protected storage accepted a write carrying `token`.
    WriteAccepted {
        /// The fencing token the write carried.
        token: Option<u64>,
    },
    /// The protected storage rejected a write carrying `token` as stale.
    WriteRejected {
        /// The fencing token the write carried.
        token: Option<u64>,
    },
}

impl EventKind {
    /// For an acquisition ([`Acquired`](EventKind::Acquired) or
    /// [`AcquiredAs`](EventKind::AcquiredAs)): its deadline, fencing token and mode.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock_testkit::{EventKind, HoldMode};
    ///
    /// let kind = EventKind::Acquired { deadline: Duration::from_millis(5), fencing_token: None };
    /// assert_eq!(kind.acquisition(), Some((Duration::from_millis(5), None, HoldMode::Exclusive)));
    /// assert_eq!(EventKind::Lost.acquisition(), None);
    /// ```
    pub fn acquisition(&self) -> Option<(Duration, Option<u64>, HoldMode)> {
        match *self {
            EventKind::Acquired {
                deadline,
                fencing_token,
            } => Some((deadline, fencing_token, HoldMode::Exclusive)),
            EventKind::AcquiredAs {
                deadline,
                fencing_token,
                mode,
            } => Some((deadline, fencing_token, mode)),
            _ => None,
        }
    }

    /// Whether this is an acquisition, in any mode.
    pub fn is_acquired(&self) -> bool {
        self.acquisition().is_some()
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    /// Recording order, from 0.
    pub seq: u64,
    /// When it happened, as an offset from the history's start.
    pub at: Duration,
    /// Who.
    pub client: ClientId,
    /// Which resource (lock name).
    pub resource: Arc<str>,
    /// What.
    pub kind: EventKind,
}

/// Formats an offset from the history's start as `+12.345ms`.
pub(crate) fn offset(d: Duration) -> String {
    format!("+{:.3}ms", d.as_secs_f64() * 1000.0)
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = |t: &Option<u64>| t.map_or_else(|| "none".to_owned(), |t| t.to_string());
        match self {
            EventKind::AcquireInvoked => f.write_str("acquire invoked"),
            EventKind::Acquired {
                deadline,
                fencing_token,
            } => write!(
                f,
                "acquired (deadline {}, token {})",
                offset(*deadline),
                token(fencing_token)
            ),
            EventKind::AcquiredAs {
                deadline,
                fencing_token,
                mode,
            } => write!(
                f,
                "acquired {mode} (deadline {}, token {})",
                offset(*deadline),
                token(fencing_token)
            ),
            EventKind::AcquireFailed => f.write_str("acquire failed"),
            EventKind::AcquireUnknown => f.write_str("acquire outcome unknown"),
            EventKind::Extended { deadline } => {
                write!(f, "extended (deadline {})", offset(*deadline))
            }
            EventKind::ExtendInvoked => f.write_str("extend invoked"),
            EventKind::ExtendFailed => f.write_str("extend failed"),
            EventKind::ExtendUnknown => f.write_str("extend outcome unknown"),
            EventKind::Lost => f.write_str("lost"),
            EventKind::ReleaseInvoked => f.write_str("release invoked"),
            EventKind::Released => f.write_str("released"),
            EventKind::ReleaseFailed => f.write_str("release failed"),
            EventKind::WorkStarted => f.write_str("work started"),
            EventKind::WorkEnded => f.write_str("work ended"),
            EventKind::WriteAccepted { token: t } => {
                write!(f, "write accepted (token {})", token(t))
            }
            EventKind::WriteRejected { token: t } => {
                write!(f, "write rejected (token {})", token(t))
            }
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {} client {} {:?} {}",
            self.seq,
            offset(self.at),
            self.client,
            &*self.resource,
            self.kind
        )
    }
}

struct Inner {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

/// A cheap-clone, thread-safe event recorder. Clones share the same events.
///
/// See the [module docs](self) for what to record and an example.
#[derive(Clone)]
pub struct History {
    inner: Arc<Inner>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History")
            .field("events", &self.len())
            .finish_non_exhaustive()
    }
}

/// One event per line, in time order.
impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.events() {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History {
            inner: Arc::new(Inner {
                start: Instant::now(),
                events: Mutex::new(Vec::new()),
            }),
        }
    }

    fn events_lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The instant the history's clock starts at.
    pub fn start(&self) -> Instant {
        self.inner.start
    }

    /// Time since the start.
    pub fn now(&self) -> Duration {
        self.inner.start.elapsed()
    }

    /// `at` as an offset from the start (zero for an instant before it).
    pub fn offset(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.inner.start)
    }

    /// The instant `offset` after the start, e.g. to build deadlines in unit tests.
    pub fn instant(&self, offset: Duration) -> Instant {
        self.inner.start + offset
    }

    /// Records an event happening now and returns it.
    pub fn record(&self, client: ClientId, resource: &str, kind: EventKind) -> Event {
        let mut events = self.events_lock();
        let at = self.now(); // under the lock: seq order == time order
        Self::push(&mut events, at, client, resource, kind)
    }

    /// Records an event at a given offset (for histories built by hand, e.g. in tests of a
    /// checker). Events are ordered by `(at, seq)` when read back.
    pub fn record_at(
        &self,
        at: Duration,
        client: ClientId,
        resource: &str,
        kind: EventKind,
    ) -> Event {
        let mut events = self.events_lock();
        Self::push(&mut events, at, client, resource, kind)
    }

    fn push(
        events: &mut Vec<Event>,
        at: Duration,
        client: ClientId,
        resource: &str,
        kind: EventKind,
    ) -> Event {
        let event = Event {
            seq: events.len() as u64,
            at,
            client,
            resource: Arc::from(resource),
            kind,
        };
        events.push(event.clone());
        event
    }

    /// A copy of every event, ordered by `(at, seq)`.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.events_lock().clone();
        events.sort_by_key(|e| (e.at, e.seq));
        events
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.events_lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A recorder for client `id`.
    pub fn client(&self, id: ClientId) -> ClientRecorder {
        ClientRecorder {
            history: self.clone(),
            client: id,
        }
    }
}

/// Records events for one client; from [`History::client`]. Cheap to clone.
///
/// Every method records an event happening now and returns it.
#[derive(Clone, Debug)]
pub struct ClientRecorder {
    history: History,
    client: ClientId,
}

impl ClientRecorder {
    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.client
    }

    /// The history this recorder writes to.
    pub fn history(&self) -> &History {
        &self.history
    }

    fn rec(&self, resource: &str, kind: EventKind) -> Event {
        self.history.record(self.client, resource, kind)
    }

    /// [`EventKind::AcquireInvoked`].
    pub fn acquire_invoked(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::AcquireInvoked)
    }

    /// [`EventKind::Acquired`]: the client holds `resource` until `deadline`.
    pub fn acquired(&self, resource: &str, deadline: Instant, fencing_token: Option<u64>) -> Event {
        let deadline = self.history.offset(deadline);
        self.rec(
            resource,
            EventKind::Acquired {
                deadline,
                fencing_token,
            },
        )
    }

    /// [`EventKind::Acquired`] with the deadline `remaining` from now (pass
    /// `lock.remaining()`; the recorded deadline is at most a few microseconds late).
    pub fn acquired_for(
        &self,
        resource: &str,
        remaining: Duration,
        fencing_token: Option<u64>,
    ) -> Event {
        self.acquired(resource, Instant::now() + remaining, fencing_token)
    }

    /// [`EventKind::AcquiredAs`]: the client holds `resource` in `mode` until `deadline`.
    pub fn acquired_as(
        &self,
        resource: &str,
        deadline: Instant,
        fencing_token: Option<u64>,
        mode: HoldMode,
    ) -> Event {
        let deadline = self.history.offset(deadline);
        self.rec(
            resource,
            EventKind::AcquiredAs {
                deadline,
                fencing_token,
                mode,
            },
        )
    }

    /// [`EventKind::AcquiredAs`] in [`HoldMode::Shared`]: a read lock of `resource` until
    /// `deadline` (readers carry no fencing token).
    pub fn acquired_shared(&self, resource: &str, deadline: Instant) -> Event {
        self.acquired_as(resource, deadline, None, HoldMode::Shared)
    }

    /// [`EventKind::AcquiredAs`] in [`HoldMode::Permit`]: one permit of the semaphore
    /// `resource`, which has `permits` permits, until `deadline`.
    pub fn acquired_permit(&self, resource: &str, deadline: Instant, permits: u32) -> Event {
        self.acquired_as(resource, deadline, None, HoldMode::Permit { permits })
    }

    /// [`EventKind::AcquireFailed`].
    pub fn acquire_failed(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::AcquireFailed)
    }

    /// [`EventKind::AcquireUnknown`].
    pub fn acquire_unknown(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::AcquireUnknown)
    }

    /// [`EventKind::Extended`]: the hold now lasts until `deadline`.
    pub fn extended(&self, resource: &str, deadline: Instant) -> Event {
        let deadline = self.history.offset(deadline);
        self.rec(resource, EventKind::Extended { deadline })
    }

    /// [`EventKind::Extended`] with the deadline `remaining` from now.
    pub fn extended_for(&self, resource: &str, remaining: Duration) -> Event {
        self.extended(resource, Instant::now() + remaining)
    }

    /// [`EventKind::ExtendInvoked`].
    pub fn extend_invoked(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::ExtendInvoked)
    }

    /// [`EventKind::ExtendFailed`].
    pub fn extend_failed(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::ExtendFailed)
    }

    /// [`EventKind::ExtendUnknown`].
    pub fn extend_unknown(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::ExtendUnknown)
    }

    /// [`EventKind::Lost`].
    pub fn lost(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::Lost)
    }

    /// [`EventKind::ReleaseInvoked`].
    pub fn release_invoked(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::ReleaseInvoked)
    }

    /// [`EventKind::Released`].
    pub fn released(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::Released)
    }

    /// [`EventKind::ReleaseFailed`].
    pub fn release_failed(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::ReleaseFailed)
    }

    /// [`EventKind::WorkStarted`].
    pub fn work_started(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::WorkStarted)
    }

    /// [`EventKind::WorkEnded`].
    pub fn work_ended(&self, resource: &str) -> Event {
        self.rec(resource, EventKind::WorkEnded)
    }

    /// [`EventKind::WriteAccepted`].
    pub fn write_accepted(&self, resource: &str, token: Option<u64>) -> Event {
        self.rec(resource, EventKind::WriteAccepted { token })
    }

    /// [`EventKind::WriteRejected`].
    pub fn write_rejected(&self, resource: &str, token: Option<u64>) -> Event {
        self.rec(resource, EventKind::WriteRejected { token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_in_order_on_one_clock() {
        let h = History::new();
        let c = h.client(3);
        let a = c.acquire_invoked("r");
        let b = c.acquired_for("r", Duration::from_millis(100), Some(1));
        assert_eq!((a.seq, b.seq), (0, 1));
        assert!(a.at <= b.at);
        match b.kind {
            EventKind::Acquired { deadline, .. } => {
                let ms100 = Duration::from_millis(100);
                assert!(deadline >= a.at + ms100 && deadline <= b.at + ms100);
            }
            other => panic!("unexpected {other:?}"),
        }
        let clone = h.clone();
        clone.client(4).work_started("r");
        assert_eq!(h.len(), 3);
        assert!(h.to_string().contains("client 4 \"r\" work started"));
    }

    #[test]
    fn modes_are_recorded_and_displayed() {
        let h = History::new();
        let c = h.client(1);
        let now = Instant::now();
        let ms10 = Duration::from_millis(10);
        let events = [
            c.acquired("r", now + ms10, Some(3)),
            c.acquired_shared("r", now + ms10),
            c.acquired_permit("s", now + ms10, 2),
            c.acquired_as("r", now + ms10, Some(4), HoldMode::Exclusive),
        ];
        let modes: Vec<_> = events
            .iter()
            .map(|e| e.kind.acquisition().map(|(_, t, m)| (t, m)))
            .collect();
        assert_eq!(
            modes,
            [
                Some((Some(3), HoldMode::Exclusive)),
                Some((None, HoldMode::Shared)),
                Some((None, HoldMode::Permit { permits: 2 })),
                Some((Some(4), HoldMode::Exclusive)),
            ]
        );
        assert!(events.iter().all(|e| e.kind.is_acquired()));
        assert!(!c.released("r").kind.is_acquired());
        let text = h.to_string();
        assert!(text.contains("\"r\" acquired shared (deadline"), "{text}");
        assert!(
            text.contains("\"s\" acquired permit of 2 (deadline"),
            "{text}"
        );
    }

    #[test]
    fn record_at_sorts_by_time_then_seq() {
        let h = History::new();
        h.record_at(Duration::from_millis(5), 1, "r", EventKind::Released);
        h.record_at(Duration::from_millis(1), 1, "r", EventKind::AcquireInvoked);
        h.record_at(Duration::from_millis(5), 1, "r", EventKind::WorkEnded);
        let seqs: Vec<u64> = h.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 0, 2]);
    }

    #[test]
    fn instants_before_start_saturate() {
        let h = History::new();
        if let Some(before) = h.start().checked_sub(Duration::from_millis(1)) {
            assert_eq!(h.offset(before), Duration::ZERO);
        }
        assert_eq!(
            h.offset(h.instant(Duration::from_millis(7))),
            Duration::from_millis(7)
        );
    }

    #[test]
    fn history_is_send_sync() {
        fn bounds<T: Send + Sync + Clone + 'static>() {}
        bounds::<History>();
        bounds::<ClientRecorder>();
    }
}
