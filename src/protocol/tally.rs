//! Vote counting and validity arithmetic.
//!
//! Nothing here does I/O or reads a clock: [`Tally`] is fed one [`Ballot`] per node as
//! answers arrive and says, after each one, whether the outcome is already certain
//! ([`Decision`]). [`validity`] turns a TTL, the elapsed time and the clock drift into the
//! time the lock is guaranteed to be held. Both are property-tested against a naive
//! "wait for every node, then count" oracle.
//!
//! ```text
//!            answers arrive in any order
//!   N nodes ─────────────────────────────▶ Tally ──▶ Reached     (granted ≥ Q)
//!                                              └──▶ Impossible  (granted + pending < Q)
//!                                              └──▶ None        (not certain yet)
//! ```

use std::time::Duration;

/// The quorum for `n` nodes: a strict majority, `n / 2 + 1`.
pub(crate) const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The fixed part of the clock drift allowance (Redlock's "+ 2 ms").
pub(crate) const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// One node's vote, as far as counting is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Ballot {
    /// The node did what was asked.
    Granted,
    /// The node refused because another owner holds the key.
    Refused,
    /// The node failed or timed out: unknown, counted against the quorum.
    Failed,
}

/// The outcome, once it is certain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// At least a quorum granted.
    Reached,
    /// Too many refusals or failures: the quorum can no longer be reached.
    Impossible,
}

/// A running count of votes for one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    nodes: usize,
    quorum: usize,
    granted: usize,
    refused: usize,
    failed: usize,
}

impl Tally {
    /// A tally for `nodes` nodes needing `quorum` grants.
    pub(crate) const fn new(nodes: usize, quorum: usize) -> Tally {
        Tally {
            nodes,
            quorum,
            granted: 0,
            refused: 0,
            failed: 0,
        }
    }

    /// Counts one vote. Votes beyond the number of nodes are ignored (they cannot happen
    /// in a round, and ignoring them keeps every count ≤ `nodes`).
    pub(crate) fn record(&mut self, ballot: Ballot) {
        if self.answered() >= self.nodes {
            return;
        }
        match ballot {
            Ballot::Granted => self.granted += 1,
            Ballot::Refused => self.refused += 1,
            Ballot::Failed => self.failed += 1,
        }
    }

    /// The decision if it is already certain, whatever the unanswered nodes say.
    pub(crate) fn decision(&self) -> Option<Decision> {
        if self.granted >= self.quorum {
            Some(Decision::Reached)
        } else if self.granted + self.pending() < self.quorum {
            Some(Decision::Impossible)
        } else {
            None
        }
    }

    /// The decision when every node has answered (or will not answer any more).
    pub(crate) fn final_decision(&self) -> Decision {
        if self.granted >= self.quorum {
            Decision::Reached
        } else {
            Decision::Impossible
        }
    }

    pub(crate) fn granted(&self) -> usize {
        self.granted
    }
    pub(crate) fn refused(&self) -> usize {
        self.refused
    }
    pub(crate) fn answered(&self) -> usize {
        self.granted + self.refused + self.failed
    }
    pub(crate) fn pending(&self) -> usize {
        self.nodes.saturating_sub(self.answered())
    }
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }
    pub(crate) fn nodes(&self) -> usize {
        self.nodes
    }

    /// Whether a failed round should be reported as "held by another owner" rather than
    /// "no quorum": enough nodes answered that, without the refusals, the quorum would
    /// have been possible.
    pub(crate) fn blocked_by_holder(&self) -> bool {
        self.refused > 0 && self.granted + self.refused >= self.quorum
    }
}

/// The drift allowance for a TTL: `ttl × factor + 2 ms`, saturating.
///
/// `factor` must be finite and non-negative (the builder checks); anything else is
/// treated as the largest possible drift, which makes every lock invalid rather than
/// wrongly valid.
pub(crate) fn drift(ttl: Duration, factor: f64) -> Duration {
    let part = if factor.is_finite() && factor >= 0.0 {
        Duration::try_from_secs_f64(ttl.as_secs_f64() * factor).unwrap_or(Duration::MAX)
    } else {
        Duration::MAX
    };
    part.saturating_add(DRIFT_FIXED)
}

/// The guaranteed validity left: `ttl − elapsed − drift`, never below zero and never above
/// `ttl`.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Duration {
    ttl.saturating_sub(elapsed).saturating_sub(drift)
}

/// Whether a round that reached the quorum holds the lock: validity strictly above the
/// configured minimum.
pub(crate) fn is_held(decision: Decision, validity: Duration, min_validity: Duration) -> bool {
    decision == Decision::Reached && validity > min_validity
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The oracle: wait for every node, then count.
    fn naive(ballots: &[Ballot], quorum: usize) -> Decision {
        let granted = ballots.iter().filter(|b| **b == Ballot::Granted).count();
        if granted >= quorum {
            Decision::Reached
        } else {
            Decision::Impossible
        }
    }

    fn ballot() -> impl Strategy<Value = Ballot> {
        prop_oneof![
            Just(Ballot::Granted),
            Just(Ballot::Refused),
            Just(Ballot::Failed)
        ]
    }

    /// Hand-picked cases: (ballots in arrival order, quorum, index of the answer after which
    /// the decision is certain, decision).
    const SEEDS: &[(&[Ballot], usize, usize, Decision)] = {
        use Ballot::*;
        &[
            (
                &[Granted, Granted, Granted, Failed, Failed],
                3,
                2,
                Decision::Reached,
            ),
            (
                &[Failed, Failed, Failed, Granted, Granted],
                3,
                2,
                Decision::Impossible,
            ),
            (
                &[Granted, Refused, Granted, Refused, Granted],
                3,
                4,
                Decision::Reached,
            ),
            (
                &[Granted, Refused, Granted, Refused, Failed],
                3,
                4,
                Decision::Impossible,
            ),
            (&[Granted], 1, 0, Decision::Reached),
            (&[Refused], 1, 0, Decision::Impossible),
            (&[Granted, Failed], 2, 1, Decision::Impossible),
            (
                &[Granted, Granted, Refused, Refused],
                3,
                3,
                Decision::Impossible,
            ),
        ]
    };

    #[test]
    fn seed_table() {
        for (ballots, q, at, want) in SEEDS {
            let mut t = Tally::new(ballots.len(), *q);
            let mut decided_at = None;
            for (i, b) in ballots.iter().enumerate() {
                t.record(*b);
                if decided_at.is_none()
                    && let Some(d) = t.decision()
                {
                    decided_at = Some((i, d));
                }
            }
            assert_eq!(decided_at, Some((*at, *want)), "case {ballots:?} q={q}");
        }
    }

    #[test]
    fn quorum_is_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
        for n in 1..100 {
            assert!(2 * quorum(n) > n, "two quorums of {n} must intersect");
        }
    }

    #[test]
    fn validity_edges() {
        let d = drift(Duration::from_millis(10_000), 0.01);
        assert_eq!(d, Duration::from_millis(102));
        assert_eq!(
            validity(Duration::from_secs(10), Duration::from_millis(5), d),
            Duration::from_millis(9_893)
        );
        // A 1 ms TTL has no validity at all: the fixed 2 ms drift eats it.
        let ttl = Duration::from_millis(1);
        assert_eq!(
            validity(ttl, Duration::ZERO, drift(ttl, 0.01)),
            Duration::ZERO
        );
        assert_eq!(drift(Duration::MAX, 1.0), Duration::MAX);
        assert_eq!(drift(Duration::from_secs(1), f64::NAN), Duration::MAX);
        assert_eq!(drift(Duration::from_secs(1), -1.0), Duration::MAX);
        assert!(!is_held(Decision::Reached, Duration::ZERO, Duration::ZERO));
        assert!(is_held(
            Decision::Reached,
            Duration::from_nanos(1),
            Duration::ZERO
        ));
        assert!(!is_held(
            Decision::Impossible,
            Duration::from_secs(1),
            Duration::ZERO
        ));
    }

    proptest! {
        /// The early decision, whenever it is made, equals what waiting for every node
        /// would have decided, and it is always made by the last answer.
        #[test]
        fn early_decision_matches_oracle(ballots in prop::collection::vec(ballot(), 1..16)) {
            let n = ballots.len();
            let q = quorum(n);
            let want = naive(&ballots, q);
            let mut t = Tally::new(n, q);
            let mut first = None;
            for b in &ballots {
                t.record(*b);
                if let Some(d) = t.decision() {
                    first.get_or_insert(d);
                    prop_assert_eq!(d, want);
                }
            }
            prop_assert_eq!(first, Some(want));
            prop_assert_eq!(t.final_decision(), want);
        }

        /// Never granted below the quorum, for any quorum (not only majorities).
        #[test]
        fn never_reached_below_quorum(ballots in prop::collection::vec(ballot(), 0..16), q in 1usize..17) {
            let mut t = Tally::new(ballots.len(), q);
            for b in &ballots {
                t.record(*b);
                if t.decision() == Some(Decision::Reached) {
                    prop_assert!(t.granted() >= q);
                }
                prop_assert!(t.answered() <= ballots.len());
            }
        }

        /// Extra votes never push the counts past the number of nodes.
        #[test]
        fn extra_votes_ignored(n in 0usize..8, extra in prop::collection::vec(ballot(), 0..20)) {
            let mut t = Tally::new(n, quorum(n));
            for b in &extra { t.record(*b); }
            prop_assert!(t.answered() <= n);
            prop_assert_eq!(t.pending() + t.answered(), n);
        }

        /// Validity is never above the TTL, never negative, and no Duration overflows.
        #[test]
        fn validity_bounded(ttl_ns in any::<u64>(), ttl_s in any::<u64>(), el_ns in any::<u64>(),
                            el_s in any::<u64>(), factor in prop_oneof![Just(0.0), Just(0.01), 0.0f64..1.0, Just(1e300)]) {
            let ttl = Duration::new(ttl_s, (ttl_ns % 1_000_000_000) as u32);
            let elapsed = Duration::new(el_s, (el_ns % 1_000_000_000) as u32);
            let d = drift(ttl, factor);
            let v = validity(ttl, elapsed, d);
            prop_assert!(v <= ttl);
            prop_assert!(d >= DRIFT_FIXED);
            if elapsed >= ttl { prop_assert_eq!(v, Duration::ZERO); }
            prop_assert!(v.saturating_add(elapsed).saturating_add(d) >= ttl.min(Duration::MAX) || v == Duration::ZERO);
        }

        /// Small TTLs around the 2 ms floor, elapsed times at 0/1 ms edges.
        #[test]
        fn validity_small(ttl_us in 0u64..5_000, el_us in 0u64..5_000) {
            let ttl = Duration::from_micros(ttl_us);
            let v = validity(ttl, Duration::from_micros(el_us), drift(ttl, 0.01));
            let expect = ttl_us as i128 - el_us as i128 - 2_000 - (ttl_us as i128 / 100);
            prop_assert!((v.as_micros() as i128 - expect.max(0)).abs() <= 1);
        }
    }
}
