//! Verdicts: what a decided round means for the lock, as pure functions of the tally,
//! the validity left and what the caller already knows (whether the lock had expired).
//!
//! Acquire, extend and release all count votes the same way ([`Tally`]); they differ in
//! what a missed quorum means. These functions are the only place those meanings live;
//! the I/O layer (`client.rs`, `lock.rs`, the watchdog) turns a [`Verdict`] into a
//! [`Lock`](crate::Lock), an error or a new deadline.
//!
//! ```text
//!                      quorum reached              quorum missed
//!                 validity > min   validity ≤ min
//!   acquire       Held             Timeout         HeldByOther (refusals blocked it) | NoQuorum
//!   extend        Held             Timeout         Lost(NotHeld) | Lost(ExtendFailed) | NoQuorum
//!   release       Released                         Lost(NotHeld) | NoQuorum
//!   any, expired before the round (release)  ──▶   Lost(Expired)
//! ```
//!
//! **The lost rule** ([`not_held`]): when more than `N − Q` nodes refused (answered that
//! our token is not there), fewer than `Q` can still hold it, so no quorum holds the
//! lock any more, whatever the unanswered nodes would say. Failures and time-outs never
//! count towards it: an unknown answer may still hold our token.

use std::time::Duration;

use super::tally::{Decision, Tally, is_held};

/// Why a round found the lock lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// More than `N − Q` nodes refused: a quorum no longer holds our token.
    NotHeld,
    /// The lock had expired before the round started.
    Expired,
    /// The extension missed the quorum and the lock's validity ran out meanwhile.
    ExtendFailed,
}

/// What a decided round means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A quorum holds the lock for `validity`, counted from the round's start (the new
    /// deadline is `start + validity`).
    Held {
        /// The guaranteed validity left, from the round's start.
        validity: Duration,
    },
    /// The release reached a quorum.
    Released,
    /// The quorum was reached, but with no validity left.
    Timeout,
    /// An acquire missed the quorum because other owners hold it.
    HeldByOther,
    /// The lock is gone.
    Lost(Loss),
    /// Too few nodes answered for a decision about the lock itself.
    NoQuorum,
}

impl Verdict {
    /// The word tracing records as the round's `outcome`; `held` says what a held verdict
    /// did ("acquired", "extended").
    pub(crate) fn label(self, held: &'static str) -> &'static str {
        match self {
            Verdict::Held { .. } => held,
            Verdict::Released => "released",
            Verdict::Timeout => "no validity left",
            Verdict::HeldByOther => "held",
            Verdict::Lost(Loss::NotHeld) => "lost",
            Verdict::Lost(Loss::Expired | Loss::ExtendFailed) => "expired",
            Verdict::NoQuorum => "no quorum",
        }
    }
}

/// The lost rule: more than `N − Q` refusals mean fewer than `Q` nodes can still hold
/// our token. Only a round that missed the quorum can be lost.
pub(crate) fn not_held(decision: Decision, tally: &Tally) -> bool {
    decision != Decision::Reached && tally.refused() > tally.nodes().saturating_sub(tally.quorum())
}

/// An acquire round: held when a quorum granted with validity above `min_validity`.
pub(crate) fn acquire(
    decision: Decision,
    tally: &Tally,
    validity: Duration,
    min_validity: Duration,
) -> Verdict {
    if is_held(decision, validity, min_validity) {
        Verdict::Held { validity }
    } else if decision == Decision::Reached {
        Verdict::Timeout
    } else if tally.blocked_by_holder() {
        Verdict::HeldByOther
    } else {
        Verdict::NoQuorum
    }
}

/// An extend round. `still_valid`: whether the lock's old deadline is still ahead once
/// the round is decided (a missed extension keeps the old deadline, so the lock is lost
/// only if that has passed too).
pub(crate) fn extend(
    decision: Decision,
    tally: &Tally,
    validity: Duration,
    min_validity: Duration,
    still_valid: bool,
) -> Verdict {
    if is_held(decision, validity, min_validity) {
        Verdict::Held { validity }
    } else if decision == Decision::Reached {
        Verdict::Timeout
    } else if not_held(decision, tally) {
        Verdict::Lost(Loss::NotHeld)
    } else if !still_valid {
        Verdict::Lost(Loss::ExtendFailed)
    } else {
        Verdict::NoQuorum
    }
}

/// A release round. `expired`: whether the lock had expired before the release started
/// (its keys are deleted all the same, and the caller learns it was lost).
pub(crate) fn release(decision: Decision, tally: &Tally, expired: bool) -> Verdict {
    if expired {
        Verdict::Lost(Loss::Expired)
    } else if decision == Decision::Reached {
        Verdict::Released
    } else if not_held(decision, tally) {
        Verdict::Lost(Loss::NotHeld)
    } else {
        Verdict::NoQuorum
    }
}

#[cfg(test)]
mod tests {
    use super::super::tally::{Ballot, quorum};
    use super::*;
    use proptest::prelude::*;

    fn tally(granted: usize, refused: usize, failed: usize, n: usize) -> Tally {
        let mut t = Tally::new(n, quorum(n));
        let votes = [
            (Ballot::Granted, granted),
            (Ballot::Refused, refused),
            (Ballot::Failed, failed),
        ];
        for (b, k) in votes {
            for _ in 0..k {
                t.record(b);
            }
        }
        t
    }

    /// A tally of `n` nodes with the given grants and refusals, the rest failed, and the
    /// decision a finished round makes of it.
    fn finished() -> impl Strategy<Value = (Tally, Decision)> {
        (1usize..10).prop_flat_map(|n| {
            (0..=n).prop_flat_map(move |g| {
                (0..=n - g).prop_map(move |r| {
                    let t = tally(g, r, n - g - r, n);
                    (t, t.final_decision())
                })
            })
        })
    }

    const SEEDS: &[(usize, usize, usize, usize, Verdict)] = &[
        // (nodes, granted, refused, failed, extend verdict with validity left)
        (5, 3, 2, 0, Verdict::Held { validity: MS }),
        (5, 2, 3, 0, Verdict::Lost(Loss::NotHeld)),
        (5, 2, 2, 1, Verdict::NoQuorum),
        (5, 0, 2, 3, Verdict::NoQuorum),
        (3, 1, 2, 0, Verdict::Lost(Loss::NotHeld)),
        (1, 0, 1, 0, Verdict::Lost(Loss::NotHeld)),
        (1, 0, 0, 1, Verdict::NoQuorum),
    ];
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn seed_table() {
        for &(n, g, r, f, want) in SEEDS {
            let t = tally(g, r, f, n);
            let got = extend(t.final_decision(), &t, MS, Duration::ZERO, true);
            assert_eq!(got, want, "n={n} granted={g} refused={r} failed={f}");
        }
    }

    #[test]
    fn edges() {
        let t = tally(3, 0, 0, 3);
        let d = t.final_decision();
        assert_eq!(
            acquire(d, &t, Duration::ZERO, Duration::ZERO),
            Verdict::Timeout
        );
        assert_eq!(
            extend(d, &t, Duration::ZERO, Duration::ZERO, false),
            Verdict::Timeout
        );
        assert_eq!(release(d, &t, true), Verdict::Lost(Loss::Expired));
        assert_eq!(release(d, &t, false), Verdict::Released);
        let t = tally(1, 1, 1, 3);
        let d = t.final_decision();
        assert_eq!(
            extend(d, &t, MS, Duration::ZERO, false),
            Verdict::Lost(Loss::ExtendFailed)
        );
        assert_eq!(acquire(d, &t, MS, Duration::ZERO), Verdict::HeldByOther);
        let t = tally(1, 0, 2, 3);
        assert_eq!(
            acquire(t.final_decision(), &t, MS, Duration::ZERO),
            Verdict::NoQuorum
        );
        assert_eq!(Verdict::Held { validity: MS }.label("acquired"), "acquired");
        assert_eq!(Verdict::Lost(Loss::ExtendFailed).label("x"), "expired");
        assert_eq!(Verdict::Lost(Loss::NotHeld).label("x"), "lost");
    }

    proptest! {
        /// The lost rule holds exactly when more than N − Q refused; a lost round never
        /// reached the quorum, and no quorum can still be formed without the refusers.
        #[test]
        fn lost_rule((t, d) in finished()) {
            let lost = not_held(d, &t);
            prop_assert_eq!(lost, t.refused() > t.nodes() - t.quorum());
            if lost {
                prop_assert_eq!(d, Decision::Impossible);
                prop_assert!(t.nodes() - t.refused() < t.quorum());
            }
            let lost_verdict = Verdict::Lost(Loss::NotHeld);
            prop_assert_eq!(release(d, &t, false) == lost_verdict, lost);
            prop_assert_eq!(extend(d, &t, MS, Duration::ZERO, true) == lost_verdict, lost);
        }

        /// A verdict is `Held` only with a quorum of grants and validity above the minimum,
        /// and the validity it carries is the one it was given (never above the TTL, since
        /// `validity` never is).
        #[test]
        fn held_needs_quorum_and_validity((t, d) in finished(), v_us in 0u64..2_000, min_us in 0u64..2_000) {
            let (v, min) = (Duration::from_micros(v_us), Duration::from_micros(min_us));
            for verdict in [acquire(d, &t, v, min), extend(d, &t, v, min, true)] {
                if let Verdict::Held { validity } = verdict {
                    prop_assert!(t.granted() >= t.quorum());
                    prop_assert!(validity > min);
                    prop_assert_eq!(validity, v);
                }
            }
        }

        /// Held is monotone in grants: turning a refusal or a failure into a grant never
        /// turns a held verdict into another one.
        #[test]
        fn held_monotone_in_grants((t, d) in finished(), v_us in 1u64..2_000) {
            let v = Duration::from_micros(v_us);
            let n = t.nodes();
            let (g, r) = (t.granted(), t.refused());
            let f = n - g - r;
            let mut more = Vec::new();
            if r > 0 { more.push(tally(g + 1, r - 1, f, n)); }
            if f > 0 { more.push(tally(g + 1, r, f - 1, n)); }
            let held = matches!(acquire(d, &t, v, Duration::ZERO), Verdict::Held { .. });
            for m in more {
                let held_more = matches!(acquire(m.final_decision(), &m, v, Duration::ZERO), Verdict::Held { .. });
                prop_assert!(!held || held_more);
            }
        }

        /// An expired lock's release is always reported lost, whatever the votes.
        #[test]
        fn expired_release_is_lost((t, d) in finished()) {
            prop_assert_eq!(release(d, &t, true), Verdict::Lost(Loss::Expired));
        }
    }
}
