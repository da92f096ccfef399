//! The watchdog's state of one kept lock, as a state machine: time and round results
//! go in, what to do comes out. The watchdog task (`extender.rs`) batches the rounds and
//! the guards (`watchdog.rs`) report what this state says.
//!
//! ```text
//!            sweep(now) ──▶ Due ──(one pipelined round)──▶ apply(verdict of the round)
//!   Kept ──┤              └▶ Later(t) / Busy / Drop            ├▶ Extended: deadline moves (never back)
//!            fire(now): the lost signal's time                 ├▶ Retry: again soon, old deadline kept
//!              = deadline − margin, or the hold cap if earlier  └▶ Lost(NotHeld | ExtendFailed | …)
//! ```
//!
//! The rules, each in one place below:
//! * **Due** ([`Kept::sweep`]): a lock is extended once its validity left drops below the
//!   refresh window (`ttl × fraction`); a lock due within the batching window
//!   ([`Kept::coalesce`]) joins the round now, so locks share rounds.
//! * **Lost** ([`Kept::fire_at`]): no extension confirmed by `deadline − margin` (or the
//!   `max_hold` cap, whichever comes first); a cap reached when the next extension is due;
//!   a round in which more than `N − Q` nodes refused (the lost rule). A lost lock is never
//!   extended again and never becomes un-lost.
//! * **Extended** ([`Kept::apply`]): the deadline moves to the round's start + validity,
//!   never earlier than it was; the next extension is due `refresh` before the new
//!   deadline, but never at once.
//! * **Retry** ([`Kept::apply`]): a missed round keeps the deadline and is tried again
//!   `refresh / 8` later (at least 5 ms). After any round the lock joins no round before
//!   the time its result set: the batching window pulls only a first due time forward,
//!   never a retry (a retry inside the window would be due the moment its round ended,
//!   and rounds would run back to back until the lost signal).

use std::time::Duration;

use super::tally::{Decision, Tally, drift, validity};
use super::time::{Moment, before, later};
use super::verdict::{self, Loss, Verdict};

/// The refresh window for a TTL: a kept lock is extended once its validity left drops below
/// `ttl × fraction` (`fraction` within `0.05..=0.95`, as the policy clamps it).
pub(crate) fn refresh_window(ttl: Duration, fraction: f64) -> Duration {
    Duration::try_from_secs_f64(ttl.as_secs_f64() * fraction).unwrap_or(ttl)
}

/// The safety margin: how long before the deadline the lost signal fires. The policy's
/// margin (`ttl / 10` by default), capped at half the refresh window so that there is
/// always time to extend before the signal fires.
pub(crate) fn margin(ttl: Duration, refresh: Duration, chosen: Option<Duration>) -> Duration {
    chosen.unwrap_or(ttl / 10).min(longest_margin(refresh))
}

/// The longest safety margin for a refresh window: half of it, so that there is always
/// time to extend before the lost signal fires (a longer chosen margin is refused).
pub(crate) fn longest_margin(refresh: Duration) -> Duration {
    refresh / 2
}

/// The refresh fractions a policy may choose (`ttl × fraction` is the refresh window).
pub(crate) const FRACTIONS: std::ops::RangeInclusive<f64> = 0.05..=0.95;

/// How long one pipelined round of `locks` extensions may take: the longest per-node
/// timeout among them, plus ~20 µs per script call for the server to run a long pipeline.
pub(crate) fn round_timeout(node_timeout: Duration, locks: usize) -> Duration {
    node_timeout.saturating_add(
        Duration::from_micros(20).saturating_mul(u32::try_from(locks).unwrap_or(u32::MAX)),
    )
}

/// How often, at most, a due lock that is not ready to extend (a permit whose kept nodes
/// are undecided) is looked at again ([`Kept::sweep`]).
pub(crate) const UNPLACED_POLL: Duration = Duration::from_millis(20);

/// Why a kept lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// No extension confirmed by `deadline − margin`.
    ExtendFailed,
    /// The `max_hold` cap was reached.
    MaxHold,
    /// The `max_extensions` cap was reached when the next extension was due.
    MaxExtensions,
    /// A round found that a quorum no longer holds the lock (the lost rule).
    NotHeld,
    /// The lock had expired before it was kept.
    Expired,
}

/// The policy numbers of one kept lock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    /// The TTL each extension asks for.
    pub(crate) ttl: Duration,
    /// Extend once the validity left is below this.
    pub(crate) refresh: Duration,
    /// The lost signal fires this long before the deadline.
    pub(crate) margin: Duration,
    /// At most this many extensions.
    pub(crate) max_extensions: Option<u32>,
    /// The clock drift factor of the validity computation.
    pub(crate) drift_factor: f64,
}

/// One kept lock's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Kept<T> {
    policy: Policy,
    hold_end: Option<T>,
    deadline: T,
    lost: Option<Lost>,
    stopped: bool,
    extensions: u32,
    next_try: T,
    /// The earliest time the lock may join a round again: the batching window never pulls
    /// it ahead of this (set by each round's result, so rounds are never back to back).
    not_before: T,
    in_round: bool,
}

/// What a sweep decided for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep<T> {
    /// Released, or lost earlier: forget it.
    Drop,
    /// In a round already: keep it, nothing to do.
    Busy,
    /// Lost just now (its signal's time came, or a cap): forget it after reporting.
    Lost(Lost),
    /// Due: it joins the round that starts now (and is marked as in a round).
    Due,
    /// Not due before this time.
    Later(T),
}

/// What a round's result did to one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Nothing (released meanwhile, or already lost).
    Ignored,
    /// Extended: the guaranteed validity from the round's start.
    Extended(Duration),
    /// Missed the quorum; retried soon while validity remains.
    Retry,
    /// Lost. `newly`: the lock was not lost before (report it); a `NotHeld` round also
    /// takes away whatever validity was left, even from a lock lost for another reason.
    Lost {
        /// Why.
        reason: Lost,
        /// Whether this round made it lost.
        newly: bool,
    },
}

impl<T: Moment> Kept<T> {
    /// A lock kept from `now`, valid until `deadline`; `hold_end`: when the `max_hold` cap
    /// ends it. Its first extension is due `refresh` before the deadline (at once if that
    /// has passed).
    pub(crate) fn new(policy: Policy, deadline: T, now: T, hold_end: Option<T>) -> Kept<T> {
        Kept {
            policy,
            hold_end,
            deadline,
            lost: None,
            stopped: false,
            extensions: 0,
            next_try: deadline.minus(policy.refresh).unwrap_or(now),
            not_before: now,
            in_round: false,
        }
    }

    /// Whether a lock handed over at `now` is lost before it is ever extended: its lost
    /// signal's time has come already. Then it is marked lost, `Expired` when its validity
    /// is gone too, and must not be registered for extension (its keys are no longer a
    /// quorum's to refresh).
    pub(crate) fn lost_at_start(&mut self, now: T) -> Option<Lost> {
        let (at, reason) = self.fire_at();
        if now < at {
            return None;
        }
        let reason = if self.deadline > now {
            reason
        } else {
            Lost::Expired
        };
        self.mark_lost(reason, now);
        Some(reason)
    }

    /// When the lost signal fires if nothing changes, and why: `deadline − margin`, or the
    /// end of the `max_hold` cap if that comes first.
    pub(crate) fn fire_at(&self) -> (T, Lost) {
        let by_validity = before(self.deadline, self.policy.margin);
        match self.hold_end {
            Some(h) if h < by_validity => (h, Lost::MaxHold),
            _ => (by_validity, Lost::ExtendFailed),
        }
    }

    /// Marks the lock lost if its signal's time has come (and it was not released).
    /// Returns the reason when it is lost *now* for the first time.
    pub(crate) fn fire(&mut self, now: T) -> Option<Lost> {
        if self.lost.is_some() || self.stopped {
            return None;
        }
        let (at, reason) = self.fire_at();
        (now >= at && self.mark_lost(reason, now)).then_some(reason)
    }

    /// Marks the lock lost with `reason` unless it already was; returns whether it was
    /// not. A `NotHeld` loss takes away the validity left (the deadline becomes `now`).
    pub(crate) fn mark_lost(&mut self, reason: Lost, now: T) -> bool {
        if self.lost.is_some() {
            return false;
        }
        if reason == Lost::NotHeld {
            self.deadline = self.deadline.min(now);
        }
        self.lost = Some(reason);
        true
    }

    /// Why it is lost, if it is.
    pub(crate) fn lost(&self) -> Option<Lost> {
        self.lost
    }

    /// Whether its holder released it (or dropped the guard).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// The deadline the guard reports at `now`: none left once released, since another
    /// client may hold the resource by then.
    pub(crate) fn deadline(&self, now: T) -> T {
        if self.stopped {
            self.deadline.min(now)
        } else {
            self.deadline
        }
    }

    /// The holder released it: no more extensions. Returns the deadline it had, for the
    /// release that follows.
    pub(crate) fn stop(&mut self) -> T {
        self.stopped = true;
        self.deadline
    }

    /// A round that will never report (its task died) leaves the lock free for the next.
    pub(crate) fn abort_round(&mut self) {
        self.in_round = false;
    }

    /// The batching window: how long before its own due time a lock joins a round. A
    /// quarter of the refresh window, and never more than a quarter of the time between two
    /// extensions (`ttl − refresh`), or a late refresh point would make the lock due again
    /// the moment it was extended and rounds would run back to back.
    pub(crate) fn coalesce(&self) -> Duration {
        let p = &self.policy;
        p.refresh.min(p.ttl.saturating_sub(p.refresh)) / 4
    }

    /// Decides, at `now`, what the watchdog does with this lock: forget it (released or
    /// lost), mark it lost (its signal's time came: a lock is never extended past it; a cap
    /// reached when it is due), put it in the round that starts now, or wait until it is due.
    ///
    /// `ready`: whether the lock may be extended now. A semaphore permit whose kept nodes
    /// are still undecided is not (no extension may be sent or counted before they are):
    /// it is never due then, but looked at again shortly ([`UNPLACED_POLL`], clamped to
    /// the refresh window), never later than its lost signal's time, which fires as for
    /// any lock if the decision never comes.
    pub(crate) fn sweep(&mut self, now: T, ready: bool) -> Sweep<T> {
        if self.stopped || self.lost.is_some() {
            return Sweep::Drop;
        }
        if self.in_round {
            return Sweep::Busy;
        }
        let (fire_at, reason) = self.fire_at();
        if now >= fire_at {
            self.mark_lost(reason, now);
            return Sweep::Lost(reason);
        }
        if self.next_try > later(now, self.coalesce()) || now < self.not_before {
            return Sweep::Later(self.next_try.max(self.not_before));
        }
        let capped = if self
            .policy
            .max_extensions
            .is_some_and(|m| self.extensions >= m)
        {
            Some(Lost::MaxExtensions)
        } else if self.hold_end.is_some_and(|h| now >= h) {
            Some(Lost::MaxHold)
        } else {
            None
        };
        if let Some(reason) = capped {
            self.mark_lost(reason, now);
            return Sweep::Lost(reason);
        }
        if !ready {
            let poll = (self.policy.refresh / 8).clamp(Duration::from_millis(5), UNPLACED_POLL);
            return Sweep::Later(later(now, poll).min(fire_at));
        }
        self.in_round = true;
        Sweep::Due
    }

    /// Applies a decided extension round that started at `started` and was decided at
    /// `decided` (its `tally` and `decision`), at `now`. A kept lock is held with any
    /// validity left (no minimum); a missed extension keeps the old deadline, which the lost
    /// signal watches.
    pub(crate) fn apply(
        &mut self,
        decision: Decision,
        tally: &Tally,
        started: T,
        decided: T,
        now: T,
    ) -> Applied {
        self.in_round = false;
        if self.stopped {
            return Applied::Ignored;
        }
        let ttl = self.policy.ttl;
        let elapsed = decided.since(started);
        let left = validity(ttl, elapsed, drift(ttl, self.policy.drift_factor));
        let verdict = verdict::extend(decision, tally, left, Duration::ZERO, true);
        if verdict == Verdict::Lost(Loss::NotHeld) {
            // Fewer than a quorum can still hold our token: no validity is left, even if the
            // lock was lost for another reason while this round ran.
            self.deadline = self.deadline.min(now);
            let newly = self.mark_lost(Lost::NotHeld, now);
            return Applied::Lost {
                reason: Lost::NotHeld,
                newly,
            };
        }
        if self.lost.is_some() {
            return Applied::Ignored;
        }
        let (fire_at, reason) = self.fire_at();
        if now >= fire_at {
            // Too late: the lost signal's time has come; never un-lose a lock.
            let newly = self.mark_lost(reason, now);
            return Applied::Lost { reason, newly };
        }
        match verdict {
            Verdict::Held { validity } => {
                self.extended(started, validity, now);
                Applied::Extended(validity)
            }
            _ => {
                let retry = (self.policy.refresh / 8).max(Duration::from_millis(5));
                self.next_try = later(now, retry);
                self.not_before = self.next_try;
                Applied::Retry
            }
        }
    }

    /// An extension that started at `started` was held for `validity`: moves the deadline
    /// ([`verdict::extended_deadline`]: never back), counts it, and schedules the next one
    /// `refresh` before the deadline, but never due again at once: at least half the time
    /// between extensions, at most half-way to the lost signal.
    fn extended(&mut self, started: T, validity: Duration, now: T) {
        self.deadline = verdict::extended_deadline(self.deadline, started, validity);
        self.extensions = self.extensions.saturating_add(1);
        let p = &self.policy;
        let (fire, _) = self.fire_at();
        let gap = p.ttl.saturating_sub(p.refresh).min(fire.since(now)) / 2;
        let due = self.deadline.minus(p.refresh).unwrap_or(now);
        self.not_before = later(now, gap);
        self.next_try = due.max(self.not_before);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tally::{Ballot, quorum};
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> Policy {
        Policy {
            ttl: 10_000 * MS,
            refresh: 5_000 * MS,
            margin: 1_000 * MS,
            max_extensions: None,
            drift_factor: 0.01,
        }
    }

    fn tally(n: usize, granted: usize, refused: usize) -> (Tally, Decision) {
        let mut t = Tally::new(n, quorum(n));
        for k in 0..n {
            t.record(if k < granted {
                Ballot::Granted
            } else if k < granted + refused {
                Ballot::Refused
            } else {
                Ballot::Failed
            });
        }
        (t, t.final_decision())
    }

    #[test]
    fn policy_numbers() {
        let ttl = 10_000 * MS;
        assert_eq!(refresh_window(ttl, 0.5), 5_000 * MS);
        assert_eq!(margin(ttl, 5_000 * MS, None), 1_000 * MS);
        assert_eq!(margin(ttl, 1_000 * MS, None), 500 * MS);
        assert_eq!(margin(ttl, 5_000 * MS, Some(MS)), MS);
        assert_eq!(round_timeout(50 * MS, 1_000), 70 * MS);
        let k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.coalesce(), 1_250 * MS);
        assert_eq!(k.fire_at(), (9_000 * MS, Lost::ExtendFailed));
        let capped = Kept::new(policy(), 10_000 * MS, Duration::ZERO, Some(3_000 * MS));
        assert_eq!(capped.fire_at(), (3_000 * MS, Lost::MaxHold));
    }

    /// A due lock that is not ready (a permit's kept nodes undecided) is never put in a
    /// round; it is looked at again soon, and its lost signal still fires on time.
    #[test]
    fn an_unready_lock_waits_and_still_fires() {
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(MS, false), Sweep::Later(5_000 * MS));
        assert_eq!(k.sweep(5_000 * MS, false), Sweep::Later(5_020 * MS));
        assert_eq!(k.sweep(8_990 * MS, false), Sweep::Later(9_000 * MS));
        assert_eq!(k.sweep(9_000 * MS, false), Sweep::Lost(Lost::ExtendFailed));
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(5_000 * MS, false), Sweep::Later(5_020 * MS));
        assert_eq!(k.sweep(5_020 * MS, true), Sweep::Due);
    }

    #[test]
    fn one_lifetime() {
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.lost_at_start(Duration::ZERO), None);
        assert_eq!(k.sweep(MS, true), Sweep::Later(5_000 * MS));
        // Within the batching window of its due time: it joins the round.
        assert_eq!(k.sweep(4_000 * MS, true), Sweep::Due);
        assert_eq!(k.sweep(4_001 * MS, true), Sweep::Busy);
        let (t, d) = tally(3, 2, 0);
        let a = k.apply(d, &t, 4_000 * MS, 4_010 * MS, 4_010 * MS);
        // validity = 10 s − 10 ms − 102 ms, from the round's start.
        assert_eq!(a, Applied::Extended(9_888 * MS));
        assert_eq!(k.deadline(4_010 * MS), 13_888 * MS);
        assert_eq!(k.sweep(5_000 * MS, true), Sweep::Later(8_888 * MS));
        // A missed round keeps the deadline and retries soon.
        assert_eq!(k.sweep(8_000 * MS, true), Sweep::Due);
        let (t, d) = tally(3, 1, 0);
        assert_eq!(
            k.apply(d, &t, 8_000 * MS, 8_001 * MS, 8_001 * MS),
            Applied::Retry
        );
        // Retried 625 ms later (refresh / 8), although that is within the batching window
        // (1.25 s): never due again at once.
        assert_eq!(k.sweep(8_001 * MS, true), Sweep::Later(8_626 * MS));
        assert_eq!(k.sweep(8_625 * MS, true), Sweep::Later(8_626 * MS));
        assert_eq!(k.sweep(8_626 * MS, true), Sweep::Due);
        assert_eq!(k.deadline(8_626 * MS), 13_888 * MS);
        // The lost signal's time: lost once, never extended again.
        assert_eq!(k.fire(12_887 * MS), None);
        assert_eq!(k.fire(12_888 * MS), Some(Lost::ExtendFailed));
        assert_eq!(k.fire(12_889 * MS), None);
        assert_eq!(k.lost(), Some(Lost::ExtendFailed));
        assert_eq!(k.sweep(12_889 * MS, true), Sweep::Drop);
        // A released lock reports no validity left.
        assert_eq!(k.stop(), 13_888 * MS);
        assert_eq!(k.deadline(12_900 * MS), 12_900 * MS);
    }

    /// A slow round that still extends (a paused node, 3.5 s of a 10 s TTL) leaves the
    /// next due time within the batching window of the round's end: it must not be due
    /// again at once, only half-way to the lost signal.
    #[test]
    fn a_slow_extension_is_not_followed_at_once() {
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(5_000 * MS, true), Sweep::Due);
        let (t, d) = tally(3, 2, 0);
        let a = k.apply(d, &t, 5_000 * MS, 8_500 * MS, 8_500 * MS);
        // validity = 10 s − 3.5 s − 102 ms, from the round's start: deadline 11.398 s,
        // lost signal at 10.398 s, next try half-way there (949 ms after the round).
        assert_eq!(a, Applied::Extended(6_398 * MS));
        assert_eq!(k.sweep(8_500 * MS, true), Sweep::Later(9_449 * MS));
        assert_eq!(k.sweep(9_448 * MS, true), Sweep::Later(9_449 * MS));
        assert_eq!(k.sweep(9_449 * MS, true), Sweep::Due);
    }

    #[test]
    fn losses() {
        // More than N − Q refusals: lost, with no validity left.
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(5_000 * MS, true), Sweep::Due);
        let (t, d) = tally(5, 1, 3);
        let a = k.apply(d, &t, 5_000 * MS, 5_001 * MS, 5_002 * MS);
        assert_eq!(
            a,
            Applied::Lost {
                reason: Lost::NotHeld,
                newly: true
            }
        );
        assert_eq!(k.deadline(6_000 * MS), 5_002 * MS);
        // The caps, when the next extension is due.
        let mut p = policy();
        p.max_extensions = Some(0);
        let mut k = Kept::new(p, 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(5_000 * MS, true), Sweep::Lost(Lost::MaxExtensions));
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, Some(4_500 * MS));
        assert_eq!(k.sweep(4_600 * MS, true), Sweep::Lost(Lost::MaxHold));
        // Handed over too late: lost at once, expired when no validity is left.
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.lost_at_start(9_500 * MS), Some(Lost::ExtendFailed));
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.lost_at_start(10_000 * MS), Some(Lost::Expired));
        // A round that confirms after the signal's time does not un-lose it.
        let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
        assert_eq!(k.sweep(8_900 * MS, true), Sweep::Due);
        let (t, d) = tally(3, 3, 0);
        let late = k.apply(d, &t, 8_900 * MS, 9_000 * MS, 9_000 * MS);
        assert_eq!(
            late,
            Applied::Lost {
                reason: Lost::ExtendFailed,
                newly: true
            }
        );
    }

    /// One step of a random schedule.
    #[derive(Debug, Clone)]
    enum Step {
        Wait(u64),
        Sweep,
        Round {
            granted: usize,
            refused: usize,
            took: u64,
        },
        Stop,
        /// The lost signal's timer looks at the lock.
        Fire,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..3_000).prop_map(Step::Wait),
            4 => Just(Step::Sweep),
            4 => (0usize..6, 0usize..6, 0u64..600).prop_map(|(granted, refused, took)| Step::Round { granted, refused, took }),
            1 => Just(Step::Stop),
            2 => Just(Step::Fire),
        ]
    }

    /// The schedule's clock, the round in flight, the extensions so far, and the earliest
    /// time the lock may join a round again (set when a round ends).
    struct Run {
        now: Duration,
        round_started: Option<Duration>,
        extensions: u32,
        n: usize,
        ttl: Duration,
        refresh: Duration,
        not_before: Option<Duration>,
    }

    /// Checks what a sweep at the schedule's clock did.
    fn sweep_step(k: &mut Kept<Duration>, r: &mut Run) -> Result<(), TestCaseError> {
        let now = r.now;
        match k.sweep(now, true) {
            Sweep::Due => {
                prop_assert!(now < k.fire_at().0);
                // Never back to back: not at the instant a round ended, nor before a
                // missed round's retry time.
                if let Some(t) = r.not_before {
                    prop_assert!(now >= t, "due at {:?}, before {:?}", now, t);
                }
                r.round_started = Some(now);
            }
            Sweep::Lost(l) => prop_assert!(
                now >= k.fire_at().0 || matches!(l, Lost::MaxExtensions | Lost::MaxHold)
            ),
            Sweep::Drop => prop_assert!(k.lost().is_some() || k.stopped()),
            Sweep::Busy => prop_assert!(r.round_started.is_some()),
            Sweep::Later(t) => prop_assert!(t > now),
        }
        Ok(())
    }

    /// Ends the round in flight (if any) `took` ms later with these votes, and checks
    /// what applying it did.
    fn round_step(
        k: &mut Kept<Duration>,
        r: &mut Run,
        (granted, refused, took): (usize, usize, u64),
    ) -> Result<(), TestCaseError> {
        let Some(start) = r.round_started.take() else {
            return Ok(());
        };
        let (before_deadline, was_lost) = (k.deadline, k.lost());
        let (fire_before, _) = k.fire_at();
        r.now += Duration::from_millis(took);
        let g = granted.min(r.n);
        let (t, d) = tally(r.n, g, refused.min(r.n - g));
        match k.apply(d, &t, start, r.now, r.now) {
            Applied::Retry => {
                let retry = (r.refresh / 8).max(MS * 5);
                r.not_before = Some(r.now + retry);
                prop_assert!(k.deadline == before_deadline);
            }
            Applied::Extended(v) => {
                r.not_before = Some(r.now + Duration::from_nanos(1));
                r.extensions += 1;
                // Confirmed before the lost signal's time: never un-loses a lock.
                prop_assert!(r.now < fire_before);
                prop_assert!(t.granted() >= t.quorum());
                prop_assert!(was_lost.is_none());
                prop_assert!(v <= r.ttl);
                prop_assert!(k.deadline >= before_deadline);
            }
            Applied::Lost {
                reason: Lost::NotHeld,
                ..
            } => prop_assert!(k.deadline <= r.now),
            _ => prop_assert!(k.deadline == before_deadline),
        }
        Ok(())
    }

    /// Runs one step and checks what it did.
    fn run_step(k: &mut Kept<Duration>, s: Step, r: &mut Run) -> Result<(), TestCaseError> {
        let before_deadline = k.deadline;
        let (fire_before, _) = k.fire_at();
        let was_lost = k.lost();
        let now = r.now;
        match s {
            Step::Wait(ms) => r.now += Duration::from_millis(ms),
            Step::Sweep => sweep_step(k, r)?,
            Step::Round {
                granted,
                refused,
                took,
            } => round_step(k, r, (granted, refused, took))?,
            Step::Fire => {
                if let Some(l) = k.fire(now) {
                    prop_assert!(was_lost.is_none() && !k.stopped());
                    prop_assert!(now >= fire_before);
                    prop_assert_eq!(k.lost(), Some(l));
                }
            }
            Step::Stop => {
                k.stop();
                prop_assert!(k.deadline(now) <= now);
            }
        }
        if let Some(l) = was_lost {
            prop_assert_eq!(k.lost(), Some(l));
            prop_assert!(k.deadline <= before_deadline);
        }
        Ok(())
    }

    proptest! {
        /// Over any schedule: the signal fires no later than the deadline; a lost lock
        /// stays lost and is never due again; the deadline never moves back except when a
        /// quorum no longer holds the lock (then to no later than now); it moves forward
        /// only through a round that a quorum confirmed before the signal's time; a cap is
        /// never exceeded; a released lock reports no validity; rounds are never back to
        /// back (a lock is not due at the instant its round ended, nor, after a missed
        /// round, before its retry time).
        #[test]
        fn invariants(
            ttl_ms in 20u64..20_000,
            fraction in 0.05f64..0.95,
            margin_ms in prop::option::of(0u64..5_000),
            max_ext in prop::option::of(0u32..4),
            n in 1usize..6,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let refresh = refresh_window(ttl, fraction);
            let p = Policy {
                ttl,
                refresh,
                margin: margin(ttl, refresh, margin_ms.map(Duration::from_millis)),
                max_extensions: max_ext,
                drift_factor: 0.01,
            };
            let mut k = Kept::new(p, ttl.saturating_sub(drift(ttl, 0.01)), Duration::ZERO, None);
            let mut r = Run {
                now: Duration::ZERO, round_started: None, extensions: 0, n, ttl, refresh, not_before: None,
            };
            for s in steps {
                prop_assert!(k.fire_at().0 <= k.deadline);
                run_step(&mut k, s, &mut r)?;
                if let Some(m) = max_ext {
                    prop_assert!(r.extensions <= m);
                }
            }
        }

        /// A round in which more than `N − Q` nodes refused leaves no validity, whatever
        /// happened while it ran: the lock's lost signal fired (its time came during a slow
        /// round), it was capped, or nothing at all.
        #[test]
        fn not_held_leaves_no_validity(
            ttl_ms in 20u64..20_000,
            fraction in 0.05f64..0.95,
            n in 1usize..8,
            fired in any::<bool>(),
            took_permille in 0u64..1_200,
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let refresh = refresh_window(ttl, fraction);
            let p = Policy {
                ttl,
                refresh,
                margin: margin(ttl, refresh, None),
                max_extensions: None,
                drift_factor: 0.01,
            };
            let deadline = ttl.saturating_sub(drift(ttl, 0.01));
            let mut k = Kept::new(p, deadline, Duration::ZERO, None);
            let start = deadline.saturating_sub(refresh);
            prop_assert_eq!(k.sweep(start, true), Sweep::Due);
            // The round ends anywhere from its start to past the deadline.
            let now = start + refresh * u32::try_from(took_permille).unwrap_or(0) / 1_000;
            if fired && now >= k.fire_at().0 {
                prop_assert_eq!(k.fire(now), Some(Lost::ExtendFailed));
            }
            let q = quorum(n);
            let (t, d) = tally(n, 0, n - q + 1);
            let a = k.apply(d, &t, start, now, now);
            prop_assert!(matches!(a, Applied::Lost { reason: Lost::NotHeld, .. }), "{:?}", a);
            prop_assert!(k.deadline(now) <= now);
        }

        /// A lock whose rounds come back one after another (each swept the moment the
        /// previous one ended, the way the watchdog task does) is never due again at the
        /// instant its round ended, and after a missed round not before `refresh / 8`
        /// (at least 5 ms): however fast the rounds fail, they never run back to back.
        #[test]
        fn rounds_never_back_to_back(
            ttl_ms in 20u64..20_000,
            fraction in 0.05f64..0.95,
            margin_ms in prop::option::of(0u64..5_000),
            n in 1usize..6,
            rounds in prop::collection::vec((0usize..6, 0usize..6, 0u32..600), 1..40),
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let refresh = refresh_window(ttl, fraction);
            let p = Policy {
                ttl,
                refresh,
                margin: margin(ttl, refresh, margin_ms.map(Duration::from_millis)),
                max_extensions: None,
                drift_factor: 0.01,
            };
            let mut k = Kept::new(p, ttl.saturating_sub(drift(ttl, 0.01)), Duration::ZERO, None);
            let mut now = Duration::ZERO;
            for (granted, refused, took) in rounds {
                match k.sweep(now, true) {
                    Sweep::Later(t) => {
                        now = t;
                        if k.sweep(now, true) != Sweep::Due {
                            break;
                        }
                    }
                    Sweep::Due => {}
                    _ => break,
                }
                let start = now;
                // A round takes up to 60 % of the TTL (a paused or slow node).
                now += ttl * took / 1_000;
                let g = granted.min(n);
                let (t, d) = tally(n, g, refused.min(n - g));
                let earliest = match k.apply(d, &t, start, now, now) {
                    Applied::Retry => now + (refresh / 8).max(5 * MS),
                    Applied::Extended(_) => now + Duration::from_nanos(1),
                    _ => break,
                };
                match k.sweep(now, true) {
                    Sweep::Later(t) => prop_assert!(t >= earliest, "due again at {:?}, round ended {:?}", t, now),
                    Sweep::Due => prop_assert!(false, "due again at once, at {:?}", now),
                    _ => break,
                }
            }
        }

        /// A lock that is not ready to extend (a permit's kept nodes undecided) is never
        /// put in a round, is always looked at again after now and no later than its lost
        /// signal's time, and is lost at that time like any other.
        #[test]
        fn an_unready_lock_is_never_due_and_still_lost_on_time(
            steps in prop::collection::vec(1u64..3_000, 1..40),
        ) {
            let mut k = Kept::new(policy(), 10_000 * MS, Duration::ZERO, None);
            let (fire, _) = k.fire_at();
            let mut now = Duration::ZERO;
            for step in steps {
                now += Duration::from_millis(step);
                match k.sweep(now, false) {
                    Sweep::Later(t) => prop_assert!(t > now && t <= fire, "{:?} at {:?}", t, now),
                    Sweep::Lost(l) => {
                        prop_assert_eq!(l, Lost::ExtendFailed);
                        prop_assert!(now >= fire);
                        break;
                    }
                    other => prop_assert!(false, "{:?} at {:?}", other, now),
                }
            }
        }
    }
}
