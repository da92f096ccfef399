//! Fairness of a waiting history: per `lock()` call, how many acquisitions by others it saw
//! granted while it waited (**hand-offs waited**), and how many of those went to callers that
//! started waiting *after* it did (**overtakes**).
//!
//! A fairness test records, for every call of `lock()` (a [`Wait`]): which contender made
//! it, the moment it started waiting (taken just before calling `lock()`), and, if it got
//! the lock, a [`Grant`]: the moment it got it and a sequence number taken *inside* the
//! critical section from one counter shared by all contenders (so the sequence numbers are
//! the true order of the acquisitions, whatever the clocks of the tasks say).
//! [`scores`] then gives each wait its [`Score`]:
//!
//! * **hand-offs waited** of a wait `A`: the acquisitions `B` by other contenders granted
//!   after `A` started waiting and before `A` got the lock (`B.at > A.started`, and
//!   `B.seq < A.seq` or `A` never got it);
//! * **overtakes** of `A`: those of them whose wait started after `A`'s
//!   (`B.started > A.started`).
//!
//! In first-come-first-served order every overtake count is 0, and a wait that started
//! while `k` others waited waits exactly `k` hand-offs. In general, since each other
//! contender has at most one wait under way when `A` starts,
//! `hand-offs waited ≤ (contenders − 1) + overtakes`: a bound on the overtakes is a bound
//! on the wait in hand-offs. Last-come-first-served order makes the overtakes grow with
//! the length of the run; a random order spreads them out to many per wait.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use quorumlock_testkit::fairness::{Grant, Wait, scores};
//!
//! let t = Instant::now();
//! let at = |ms| t + Duration::from_millis(ms);
//! // Contender 0 starts waiting at 0 ms, contender 1 at 1 ms; 1 gets the lock first.
//! let waits = [
//!     Wait { contender: 0, started: at(0), grant: Some(Grant { seq: 1, at: at(5) }) },
//!     Wait { contender: 1, started: at(1), grant: Some(Grant { seq: 0, at: at(2) }) },
//! ];
//! let s = scores(&waits);
//! assert_eq!((s[0].overtakes, s[0].hand_offs), (1, 1));
//! assert_eq!((s[1].overtakes, s[1].hand_offs), (0, 0));
//! ```

use std::time::Instant;

/// The lock was granted: when, and as which acquisition of the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The acquisition's place in the order of all acquisitions of the resource (from a
    /// counter shared by every contender, taken while holding the lock).
    pub seq: u64,
    /// When the caller had the lock in hand.
    pub at: Instant,
}

/// One call of `lock()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    /// Who waited (one sequential actor: one wait at a time).
    pub contender: usize,
    /// When it started waiting (just before calling `lock()`).
    pub started: Instant,
    /// The grant, or `None` if it never got the lock (gave up, or still waiting when the
    /// run ended): then every later grant to another contender counts against it.
    pub grant: Option<Grant>,
}

/// What one wait went through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Acquisitions granted, during this wait, to other contenders that started waiting
    /// after this one.
    pub overtakes: usize,
    /// Acquisitions granted to other contenders during this wait.
    pub hand_offs: usize,
}

/// The [`Score`] of every wait, in the order of `waits`.
///
/// Quadratic in the number of waits (a few thousand take milliseconds).
pub fn scores(waits: &[Wait]) -> Vec<Score> {
    let mut granted: Vec<(Grant, &Wait)> = waits
        .iter()
        .filter_map(|w| w.grant.map(|g| (g, w)))
        .collect();
    granted.sort_by_key(|(g, _)| g.seq);
    waits
        .iter()
        .map(|a| {
            let mut s = Score::default();
            for (g, b) in &granted {
                if a.grant.is_some_and(|mine| g.seq >= mine.seq) {
                    break;
                }
                if b.contender == a.contender || g.at <= a.started {
                    continue;
                }
                s.hand_offs += 1;
                if b.started > a.started {
                    s.overtakes += 1;
                }
            }
            s
        })
        .collect()
}

/// Percentiles of a set of counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Distribution {
    /// How many values.
    pub count: usize,
    /// The median (nearest rank).
    pub p50: usize,
    /// The 99th percentile (nearest rank).
    pub p99: usize,
    /// The largest value.
    pub max: usize,
    /// The sum of the values (the mean is `sum / count`).
    pub sum: usize,
}

impl Distribution {
    /// The distribution of `values` (all zero when there are none).
    pub fn of(values: impl IntoIterator<Item = usize>) -> Distribution {
        let mut v: Vec<usize> = values.into_iter().collect();
        v.sort_unstable();
        let rank = |q: f64| -> usize {
            // Nearest rank: the smallest value with at least q of the values at or below it.
            let n = v.len();
            let r = ((q * n as f64).ceil() as usize).clamp(1, n.max(1));
            v.get(r - 1).copied().unwrap_or(0)
        };
        Distribution {
            count: v.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: v.last().copied().unwrap_or(0),
            sum: v.iter().sum(),
        }
    }

    /// The mean, 0 for no values.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }
}

impl std::fmt::Display for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {} p99 {} max {} mean {:.2} (n = {})",
            self.p50,
            self.p99,
            self.max,
            self.mean(),
            self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use std::time::Duration;

    /// A history of `contenders` that always want the lock: every contender starts waiting
    /// again the moment it releases, and `pick` chooses who gets the lock next among the
    /// waiting ones (given their start times, oldest first). `grants` grants in all.
    fn simulate(
        contenders: usize,
        grants: u64,
        mut pick: impl FnMut(&[(Instant, usize)]) -> usize,
    ) -> Vec<Wait> {
        let t0 = Instant::now();
        let tick = |n: u64| t0 + Duration::from_micros(n);
        let mut clock = 0u64;
        // Everyone starts waiting one after another.
        let mut waiting: Vec<(Instant, usize)> = (0..contenders)
            .map(|c| {
                clock += 1;
                (tick(clock), c)
            })
            .collect();
        let mut out = Vec::new();
        for seq in 0..grants {
            waiting.sort();
            let i = pick(&waiting).min(waiting.len() - 1);
            let (started, c) = waiting.remove(i);
            clock += 1;
            out.push(Wait {
                contender: c,
                started,
                grant: Some(Grant {
                    seq,
                    at: tick(clock),
                }),
            });
            // A short hold, then it waits again.
            clock += 1;
            waiting.push((tick(clock), c));
        }
        for (started, c) in waiting {
            out.push(Wait {
                contender: c,
                started,
                grant: None,
            });
        }
        out
    }

    fn granted_only(waits: &[Wait]) -> Distribution {
        let s = scores(waits);
        Distribution::of(
            waits
                .iter()
                .zip(&s)
                .filter(|(w, _)| w.grant.is_some())
                .map(|(_, s)| s.overtakes),
        )
    }

    #[test]
    fn first_come_first_served_has_no_overtakes_and_waits_for_the_others() {
        let waits = simulate(8, 200, |_| 0);
        let s = scores(&waits);
        for (w, s) in waits.iter().zip(&s) {
            assert_eq!(s.overtakes, 0, "{w:?}");
            if w.grant.is_some_and(|g| g.seq >= 8) {
                assert_eq!(s.hand_offs, 7, "{w:?}");
            }
        }
    }

    #[test]
    fn last_come_first_served_overtakes_grow_with_the_run() {
        // The newest waiter (the releaser, waiting again) is served: the others starve.
        let waits = simulate(8, 200, |w| w.len() - 1);
        let s = scores(&waits);
        let starved: Vec<&Score> = waits
            .iter()
            .zip(&s)
            .filter(|(w, _)| w.grant.is_none())
            .map(|(_, s)| s)
            .collect();
        assert_eq!(starved.len(), 8);
        assert!(starved.iter().any(|s| s.overtakes >= 190), "{starved:?}");
    }

    #[test]
    fn random_order_overtakes_several_times() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let waits = simulate(8, 400, |w| rng.random_range(0..w.len()));
        let d = granted_only(&waits);
        assert!(d.max >= 10 && d.p99 >= 6, "{d}");
    }

    #[test]
    fn an_overtake_is_a_later_start_granted_earlier() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let w = |contender, started, seq, granted| Wait {
            contender,
            started: at(started),
            grant: Some(Grant {
                seq,
                at: at(granted),
            }),
        };
        let waits = [
            w(0, 0, 2, 30), // waited for 1 (earlier start) and 2 (later start)
            w(1, 0, 0, 10),
            w(2, 5, 1, 20),
            w(1, 11, 3, 40), // 1 again: waits for 2 and 0, both queued before it
            Wait {
                contender: 3,
                started: at(1),
                grant: None,
            },
        ];
        let s = scores(&waits);
        let got: Vec<(usize, usize)> = s.iter().map(|s| (s.overtakes, s.hand_offs)).collect();
        // 3 never got it: 2 (started 5), 0 (started 0: not an overtake), 1 twice.
        assert_eq!(got, [(1, 2), (0, 0), (0, 1), (0, 2), (2, 4)]);
    }

    #[test]
    fn grants_before_the_start_and_own_grants_do_not_count() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let waits = [
            Wait {
                contender: 0,
                started: at(0),
                grant: Some(Grant { seq: 0, at: at(1) }),
            },
            Wait {
                contender: 0,
                started: at(2),
                grant: Some(Grant { seq: 1, at: at(3) }),
            },
            Wait {
                contender: 1,
                started: at(2),
                grant: Some(Grant { seq: 2, at: at(4) }),
            },
        ];
        let s = scores(&waits);
        assert_eq!(s[0], Score::default());
        assert_eq!(s[1], Score::default());
        // Contender 1 started at 2 with contender 0: grant 1 (at 3) is a hand-off, not an
        // overtake (same start).
        assert_eq!(
            s[2],
            Score {
                overtakes: 0,
                hand_offs: 1
            }
        );
    }

    #[test]
    fn distribution_by_nearest_rank() {
        let d = Distribution::of((1..=100).rev());
        assert_eq!(
            (d.count, d.p50, d.p99, d.max, d.sum),
            (100, 50, 99, 100, 5050)
        );
        assert_eq!(Distribution::of([]), Distribution::default());
        assert_eq!(Distribution::of([3]).p99, 3);
        assert!((Distribution::of([1, 2]).mean() - 1.5).abs() < 1e-9);
    }

    proptest::proptest! {
        /// Whatever the order of service: the overtakes are among the hand-offs, and the
        /// hand-offs are at most the others waiting at the start plus the overtakes.
        #[test]
        fn hand_offs_are_bounded_by_the_others_plus_the_overtakes(
            seed in 0u64..10_000,
            contenders in 2usize..10,
        ) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let waits = simulate(contenders, 60, |w| rng.random_range(0..w.len()));
            for (w, s) in waits.iter().zip(scores(&waits)) {
                proptest::prop_assert!(s.overtakes <= s.hand_offs);
                proptest::prop_assert!(s.hand_offs <= contenders - 1 + s.overtakes, "{w:?} {s:?}");
            }
        }
    }
}
