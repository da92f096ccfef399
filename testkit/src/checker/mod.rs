//! The history checker: pure functions from a [`History`]'s events to a [`Report`] of
//! [`Violation`]s. One file per invariant:
//!
//! | invariant | file | [`ViolationKind`] |
//! | --- | --- | --- |
//! | two holders' believed holds of one resource never overlap (when one is exclusive) | `overlap.rs` | [`Overlap`](ViolationKind::Overlap) (both exclusive), [`SharedWithExclusive`](ViolationKind::SharedWithExclusive) (a shared hold and an exclusive one) |
//! | at most P permit holds of a semaphore overlap at any instant | `permits.rs` | [`TooManyPermits`](ViolationKind::TooManyPermits), with the peak in [`Report::permit_peaks`] |
//! | a resource is a lock (exclusive and shared holds) or a semaphore with one P, not both | `modes.rs` | [`MixedModes`](ViolationKind::MixedModes) |
//! | work happens inside its holder's hold | `work.rs` | [`WorkOutsideHold`](ViolationKind::WorkOutsideHold) |
//! | fencing tokens strictly increase in acquisition order; accepted writes' tokens never go down | `fencing.rs` | [`FencingNotIncreasing`](ViolationKind::FencingNotIncreasing), [`StaleWriteAccepted`](ViolationKind::StaleWriteAccepted) |
//!
//! # Holds
//!
//! A *hold* is what a client believes: from its [`Acquired`](EventKind::Acquired) event to
//! the earliest of its deadline and its [`ReleaseInvoked`](EventKind::ReleaseInvoked) or
//! [`Lost`](EventKind::Lost) event, as a half-open interval `[acquired, end)`. An
//! [`Extended`](EventKind::Extended) event inside the hold replaces the deadline (the last
//! one wins); an extension recorded after the hold already ended does not revive it. Failed,
//! unknown (timed-out) and cancelled acquisitions are not holds. Failed and unknown
//! (timed-out, cancelled) extensions leave the hold's deadline where it was: the client goes
//! on believing what its lock reports, so if such an extension shortened the keys' expiry on
//! the nodes, the next holder's hold overlaps this one and is flagged. Touching holds `[a, b)` and
//! `[b, c)` do not overlap. Events pair up per `(client, resource)`: an extension or a release
//! applies to that client's latest open hold of the resource.
//!
//! # Modes
//!
//! Each hold has the [`HoldMode`] its acquisition recorded ([`Acquired`](EventKind::Acquired)
//! is exclusive; [`AcquiredAs`](EventKind::AcquiredAs) says which):
//!
//! | mode | may overlap | recorded by |
//! | --- | --- | --- |
//! | [`Exclusive`](HoldMode::Exclusive) (mutex, write lock) | nothing | [`acquired`](super::ClientRecorder::acquired) |
//! | [`Shared`](HoldMode::Shared) (read lock) | other shared holds | [`acquired_shared`](super::ClientRecorder::acquired_shared) |
//! | [`Permit`](HoldMode::Permit) of P | other permit holds, at most P at any instant | [`acquired_permit`](super::ClientRecorder::acquired_permit) |
//!
//! For every semaphore resource the report keeps the most permit holds that overlapped
//! ([`Report::permit_peaks`]), whether or not that broke the bound: a test of a semaphore
//! can then say how close the run came, and a negative control can assert the peak went
//! above P.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use quorumlock_testkit::{EventKind, History};
//! use quorumlock_testkit::checker::ViolationKind;
//!
//! let ms = Duration::from_millis;
//! let h = History::new();
//! let acquired = |deadline| EventKind::Acquired { deadline, fencing_token: None };
//! h.record_at(ms(0), 1, "r", acquired(ms(100)));
//! h.record_at(ms(50), 2, "r", acquired(ms(150))); // while client 1 still believes it holds r
//! let report = h.check();
//! assert!(!report.is_clean());
//! assert_eq!(report.violations()[0].kind, ViolationKind::Overlap);
//! println!("{report}");
//! ```
//!
//! A semaphore with 2 permits and three holders at once:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use quorumlock_testkit::History;
//! use quorumlock_testkit::checker::ViolationKind;
//!
//! let h = History::new();
//! let until = Instant::now() + Duration::from_secs(10);
//! for client in 1..=3 {
//!     h.client(client).acquired_permit("pool", until, 2);
//! }
//! let report = h.check();
//! assert_eq!(report.count(ViolationKind::TooManyPermits), 1);
//! assert_eq!(report.permit_peak("pool"), Some(3));
//! ```

mod fencing;
mod modes;
mod overlap;
mod permits;
mod work;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::history::{ClientId, Event, EventKind, History, HoldMode, offset};

/// Which invariant a [`Violation`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ViolationKind {
    /// Two exclusive holds of one resource overlap: mutual exclusion was broken.
    Overlap,
    /// A shared hold (a reader) overlaps an exclusive one (a writer) of the same resource.
    SharedWithExclusive,
    /// More permit holds of a semaphore overlapped than it has permits: one violation per
    /// maximal interval during which the count stayed above P.
    TooManyPermits,
    /// A resource has permit holds and exclusive or shared ones, or permit holds that
    /// disagree on P: the history does not say what the bound is.
    MixedModes,
    /// Work ran (partly) outside its client's hold of the resource.
    WorkOutsideHold,
    /// A later acquisition of a resource got a fencing token not greater than an earlier one.
    FencingNotIncreasing,
    /// The storage accepted a write whose token is lower than one it accepted before.
    StaleWriteAccepted,
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViolationKind::Overlap => "overlapping holds",
            ViolationKind::SharedWithExclusive => "shared hold overlapping an exclusive hold",
            ViolationKind::TooManyPermits => "more permit holds than permits",
            ViolationKind::MixedModes => "mixed hold modes",
            ViolationKind::WorkOutsideHold => "work outside its hold",
            ViolationKind::FencingNotIncreasing => "fencing token not increasing",
            ViolationKind::StaleWriteAccepted => "stale write accepted",
        })
    }
}

/// One broken invariant, naming the two events that conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// The earlier event of the conflict (e.g. the first holder's acquisition).
    pub first: Event,
    /// The later event of the conflict (e.g. the second holder's acquisition).
    pub second: Event,
    /// A sentence with the intervals or tokens involved.
    pub detail: String,
}

impl Violation {
    /// The resource involved.
    pub fn resource(&self) -> &str {
        &self.second.resource
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {:?}: {}\n    first:  {}\n    second: {}",
            self.kind,
            self.resource(),
            self.detail,
            self.first,
            self.second
        )
    }
}

/// A client's believed hold of a resource: `[start, end)`, offsets from the history's start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold {
    /// The holder.
    pub client: ClientId,
    /// The resource held.
    pub resource: Arc<str>,
    /// When the client learned it holds the lock (its `Acquired` event).
    pub start: Duration,
    /// min(last deadline, release invoked, lost).
    pub end: Duration,
    /// The `Acquired` event.
    pub acquired: Event,
    /// The event that set `end`: the `Acquired` or last `Extended` (deadline), or the
    /// `ReleaseInvoked`/`Lost` that cut it short.
    pub ended_by: Event,
    /// The fencing token of the acquisition.
    pub fencing_token: Option<u64>,
    /// How the hold shares the resource.
    pub mode: HoldMode,
}

impl Hold {
    /// Whether the hold covers no time at all (validity already gone when acquired).
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Whether two holds share some instant (half-open intervals; empty holds share none).
    pub fn overlaps(&self, other: &Hold) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            HoldMode::Exclusive => String::new(),
            mode => format!(" ({mode})"),
        };
        write!(
            f,
            "client {} held {:?}{mode} [{}, {})",
            self.client,
            &*self.resource,
            offset(self.start),
            offset(self.end)
        )
    }
}

/// Events sorted by `(at, seq)`.
fn sorted(events: &[Event]) -> Vec<Event> {
    let mut events = events.to_vec();
    events.sort_by_key(|e| (e.at, e.seq));
    events
}

/// The holds the events describe (see the [module docs](self)), in acquisition order.
pub fn holds(events: &[Event]) -> Vec<Hold> {
    let mut holds: Vec<Hold> = Vec::new();
    let mut open: HashMap<(ClientId, Arc<str>), usize> = HashMap::new();
    for e in sorted(events) {
        let key = (e.client, e.resource.clone());
        if let Some((deadline, fencing_token, mode)) = e.kind.acquisition() {
            open.insert(key, holds.len());
            holds.push(Hold {
                client: e.client,
                resource: e.resource.clone(),
                start: e.at,
                end: deadline.max(e.at),
                acquired: e.clone(),
                ended_by: e,
                fencing_token,
                mode,
            });
            continue;
        }
        match e.kind {
            EventKind::Extended { deadline } => {
                if let Some(&i) = open.get(&key) {
                    let hold = &mut holds[i];
                    if e.at < hold.end {
                        hold.end = deadline.max(e.at);
                        hold.ended_by = e;
                    }
                }
            }
            EventKind::ReleaseInvoked | EventKind::Lost => {
                if let Some(i) = open.remove(&key) {
                    let hold = &mut holds[i];
                    if e.at < hold.end {
                        hold.end = e.at;
                        hold.ended_by = e;
                    }
                }
            }
            _ => {}
        }
    }
    holds
}

/// The most permit holds of one semaphore resource that overlapped at one instant; from
/// [`Report::permit_peaks`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitPeak {
    /// The semaphore (resource name).
    pub resource: Arc<str>,
    /// Its permits (P), as its holds recorded them.
    pub permits: u32,
    /// The most permit holds that overlapped at one instant (0 when every hold was empty).
    pub peak: usize,
    /// When that count was first reached (offset from the history's start).
    pub at: Duration,
    /// The maximal intervals `[start, end)` during which more than `permits` holds
    /// overlapped; empty when the bound held.
    pub over: Vec<(Duration, Duration)>,
    /// How many permit holds were counted.
    pub holds: usize,
}

impl PermitPeak {
    /// Whether the peak stayed within the permits.
    pub fn within_bound(&self) -> bool {
        self.peak <= self.permits as usize
    }
}

impl fmt::Display for PermitPeak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: peak {} of {} permits at {} ({} holds)",
            &*self.resource,
            self.peak,
            self.permits,
            offset(self.at),
            self.holds
        )?;
        if !self.over.is_empty() {
            let spans: Vec<String> = self
                .over
                .iter()
                .map(|(a, b)| format!("[{}, {})", offset(*a), offset(*b)))
                .collect();
            write!(f, ", over the bound during {}", spans.join(", "))?;
        }
        Ok(())
    }
}

/// The outcome of [`check`]: every violation found, plus what was looked at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    violations: Vec<Violation>,
    events: usize,
    holds: usize,
    permits: Vec<PermitPeak>,
}

impl Report {
    /// Whether no invariant is broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations, ordered by the time of their second event.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// The violations, by value.
    pub fn into_violations(self) -> Vec<Violation> {
        self.violations
    }

    /// Whether some violation is of `kind`.
    pub fn has(&self, kind: ViolationKind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    /// How many violations are of `kind`.
    pub fn count(&self, kind: ViolationKind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    /// Number of events checked.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Number of holds found.
    pub fn holds(&self) -> usize {
        self.holds
    }

    /// For every semaphore resource (one whose holds are permits), the most permit holds
    /// that overlapped, in resource order, whether or not that broke the bound.
    pub fn permit_peaks(&self) -> &[PermitPeak] {
        &self.permits
    }

    /// The most permit holds of semaphore `resource` that overlapped at one instant; `None`
    /// when the history has no permit hold of it.
    pub fn permit_peak(&self, resource: &str) -> Option<usize> {
        self.permits
            .iter()
            .find(|p| &*p.resource == resource)
            .map(|p| p.peak)
    }

    /// Panics with the whole report unless it is clean: for tests.
    ///
    /// # Panics
    ///
    /// When there is a violation.
    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(self.is_clean(), "history checker found violations:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peaks = if self.permits.is_empty() {
            String::new()
        } else {
            let peaks: Vec<String> = self.permits.iter().map(|p| p.to_string()).collect();
            format!("; permits: {}", peaks.join("; "))
        };
        if self.is_clean() {
            return write!(
                f,
                "clean ({} events, {} holds{peaks})",
                self.events, self.holds
            );
        }
        writeln!(
            f,
            "{} violation(s) in {} events, {} holds{peaks}:",
            self.violations.len(),
            self.events,
            self.holds
        )?;
        for (i, v) in self.violations.iter().enumerate() {
            writeln!(f, "{}. {v}", i + 1)?;
        }
        Ok(())
    }
}

impl History {
    /// Runs every invariant of the [`checker`](self) over the events so far (the same as
    /// [`check`]).
    pub fn check(&self) -> Report {
        check(self)
    }
}

/// Checks every invariant over a history's events.
pub fn check(history: &History) -> Report {
    check_events(&history.events())
}

/// Checks every invariant over events in any order (they are sorted by `(at, seq)` first).
pub fn check_events(events: &[Event]) -> Report {
    let events = sorted(events);
    let holds = holds(&events);
    let mut violations = Vec::new();
    let semaphores = modes::check(&holds, &mut violations);
    overlap::check(&holds, &mut violations);
    let permits = permits::check(&holds, &semaphores, &mut violations);
    work::check(&events, &holds, &mut violations);
    fencing::check(&events, &mut violations);
    violations.sort_by_key(|v| (v.second.at, v.second.seq, v.first.seq));
    Report {
        violations,
        events: events.len(),
        holds: holds.len(),
        permits,
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Hand-built histories for the checker tests.
    use super::*;

    pub(crate) fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    pub(crate) fn acquired(deadline: u64, token: Option<u64>) -> EventKind {
        EventKind::Acquired {
            deadline: ms(deadline),
            fencing_token: token,
        }
    }

    /// Records `kind` at `at` ms.
    pub(crate) fn at(h: &History, at: u64, client: ClientId, resource: &str, kind: EventKind) {
        h.record_at(ms(at), client, resource, kind);
    }

    /// An acquisition in `mode` with its deadline at `deadline` ms.
    pub(crate) fn acquired_as(deadline: u64, mode: HoldMode) -> EventKind {
        EventKind::AcquiredAs {
            deadline: ms(deadline),
            fencing_token: None,
            mode,
        }
    }

    /// A complete hold `[start, end)` in `mode`, released at `end` (deadline `end + slack`).
    pub(crate) fn hold_as(
        h: &History,
        client: ClientId,
        resource: &str,
        (start, end): (u64, u64),
        mode: HoldMode,
    ) {
        at(h, start, client, resource, acquired_as(end + 1_000, mode));
        at(h, end, client, resource, EventKind::ReleaseInvoked);
        at(h, end, client, resource, EventKind::Released);
    }

    /// A complete hold `[start, end)` released at `end` (deadline `end + slack`).
    pub(crate) fn hold(h: &History, client: ClientId, resource: &str, start: u64, end: u64) {
        at(h, start, client, resource, acquired(end + 1_000, None));
        at(h, end, client, resource, EventKind::ReleaseInvoked);
        at(h, end, client, resource, EventKind::Released);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn hold_ends_at_earliest_of_deadline_and_release() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 40, 1, "r", EventKind::ReleaseInvoked);
        at(&h, 200, 2, "r", acquired(300, None));
        at(&h, 350, 2, "r", EventKind::ReleaseInvoked);
        let holds = holds(&h.events());
        assert_eq!(holds.len(), 2);
        assert_eq!((holds[0].start, holds[0].end), (ms(0), ms(40)));
        assert_eq!(holds[0].ended_by.kind, EventKind::ReleaseInvoked);
        assert_eq!((holds[1].start, holds[1].end), (ms(200), ms(300)));
    }

    #[test]
    fn extension_moves_deadline_last_one_wins() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 50, 1, "r", EventKind::Extended { deadline: ms(300) });
        at(&h, 60, 1, "r", EventKind::Extended { deadline: ms(200) });
        let holds = holds(&h.events());
        assert_eq!(holds[0].end, ms(200));
    }

    #[test]
    fn extension_after_expiry_does_not_revive() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 150, 1, "r", EventKind::Extended { deadline: ms(300) });
        assert_eq!(holds(&h.events())[0].end, ms(100));
    }

    #[test]
    fn failed_and_unknown_acquisitions_are_not_holds() {
        let h = History::new();
        at(&h, 0, 1, "r", EventKind::AcquireInvoked);
        at(&h, 5, 1, "r", EventKind::AcquireUnknown);
        at(&h, 6, 2, "r", EventKind::AcquireInvoked);
        at(&h, 9, 2, "r", EventKind::AcquireFailed);
        at(&h, 10, 3, "r", acquired(100, None));
        let report = check(&h);
        assert_eq!(report.holds(), 1);
        report.assert_clean();
    }

    #[test]
    fn lost_ends_the_hold() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 30, 1, "r", EventKind::Lost);
        at(&h, 30, 2, "r", acquired(130, None));
        assert!(check(&h).is_clean());
    }

    #[test]
    fn report_display_names_both_events() {
        let h = History::new();
        at(&h, 0, 1, "orders:1", acquired(100, None));
        at(&h, 50, 2, "orders:1", acquired(150, None));
        let report = check(&h);
        let text = report.to_string();
        assert!(text.contains("overlapping holds on \"orders:1\""), "{text}");
        assert!(text.contains("#0 +0.000ms client 1"), "{text}");
        assert!(text.contains("#1 +50.000ms client 2"), "{text}");
        assert_eq!(report.count(ViolationKind::Overlap), 1);
    }

    #[test]
    #[should_panic(expected = "history checker found violations")]
    fn assert_clean_panics_on_violation() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 50, 2, "r", acquired(150, None));
        check(&h).assert_clean();
    }

    #[test]
    fn clean_report_display() {
        let h = History::new();
        hold(&h, 1, "r", 0, 10);
        assert_eq!(check(&h).to_string(), "clean (3 events, 1 holds)");
    }
}
