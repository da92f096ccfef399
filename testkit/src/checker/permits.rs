//! Invariant: at most P permit holds of a semaphore overlap at any instant.
//!
//! A sweep over the holds' starts and ends (half-open: at one instant ends come before
//! starts, so `[a, b)` then `[b, c)` count once) keeps the holds alive at each instant. Each
//! maximal interval during which more than P are alive is one violation (a hold ending at
//! the instant another starts does not split it): `first` is the
//! acquisition of the oldest hold alive when the count went above P, `second` the acquisition
//! that took it there, and the detail lists the holds alive then and the interval. Whatever
//! the outcome, the peak of every semaphore resource goes into the report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Hold, PermitPeak, Violation, ViolationKind};
use crate::history::{HoldMode, offset};

/// An interval above the bound that has not closed yet.
struct Excess<'a> {
    start: Duration,
    /// The oldest hold alive when it began, and the one that began it.
    first: &'a Hold,
    second: &'a Hold,
    /// The holds alive when it began.
    alive: Vec<String>,
    peak: usize,
}

pub(super) fn check(
    holds: &[Hold],
    semaphores: &BTreeMap<Arc<str>, u32>,
    out: &mut Vec<Violation>,
) -> Vec<PermitPeak> {
    let mut by_resource: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in holds {
        if matches!(semaphores.get(&h.resource), Some(&permits) if h.mode == HoldMode::Permit { permits })
        {
            by_resource.entry(&h.resource).or_default().push(h);
        }
    }
    semaphores
        .iter()
        .map(|(resource, &permits)| {
            let holds = by_resource.remove(&**resource).unwrap_or_default();
            sweep(resource, permits, &holds, out)
        })
        .collect()
}

fn sweep(
    resource: &Arc<str>,
    permits: u32,
    holds: &[&Hold],
    out: &mut Vec<Violation>,
) -> PermitPeak {
    // (time, +1 start / 0 end, index); ends sort first at one instant.
    let mut points: Vec<(Duration, u8, usize)> = Vec::new();
    for (i, h) in holds.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
        points.push((h.start, 1, i));
        points.push((h.end, 0, i));
    }
    points.sort_by_key(|&(t, kind, i)| (t, kind, holds[i].acquired.seq));
    let bound = permits as usize;
    let mut alive: Vec<&Hold> = Vec::new();
    let mut peak = PermitPeak {
        resource: resource.clone(),
        permits,
        peak: 0,
        at: Duration::ZERO,
        over: Vec::new(),
        holds: holds.len(),
    };
    let mut excess: Option<Excess<'_>> = None;
    let mut points = points.into_iter().peekable();
    while let Some(&(t, _, _)) = points.peek() {
        // Every end and start at instant `t` (ends first), then the count at `t`.
        while let Some((_, kind, i)) = points.next_if(|p| p.0 == t) {
            let h = holds[i];
            if kind == 0 {
                alive.retain(|a| !std::ptr::eq(*a, h));
                continue;
            }
            alive.push(h);
            if alive.len() > peak.peak {
                peak.peak = alive.len();
                peak.at = t;
            }
            match &mut excess {
                Some(x) => x.peak = x.peak.max(alive.len()),
                None if alive.len() > bound => {
                    excess = Some(Excess {
                        start: t,
                        first: alive.first().copied().unwrap_or(h),
                        second: h,
                        alive: alive.iter().map(|a| a.to_string()).collect(),
                        peak: alive.len(),
                    });
                }
                None => {}
            }
        }
        if alive.len() <= bound
            && let Some(x) = excess.take()
        {
            out.push(violation(permits, &x, t));
            peak.over.push((x.start, t));
        }
    }
    peak
}

fn violation(permits: u32, x: &Excess<'_>, end: Duration) -> Violation {
    Violation {
        kind: ViolationKind::TooManyPermits,
        first: x.first.acquired.clone(),
        second: x.second.acquired.clone(),
        detail: format!(
            "{} permit holds of a semaphore with {permits} permits during [{}, {}) (peak {}): {}",
            x.alive.len(),
            offset(x.start),
            offset(end),
            x.peak,
            x.alive.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ViolationKind, check, check_events, holds};
    use crate::history::{EventKind, History, HoldMode};
    use proptest::prelude::*;

    const P2: HoldMode = HoldMode::Permit { permits: 2 };

    #[test]
    fn up_to_p_overlapping_permits_are_clean_and_the_peak_is_reported() {
        let h = History::new();
        hold_as(&h, 1, "s", (0, 100), P2);
        hold_as(&h, 2, "s", (50, 150), P2);
        hold_as(&h, 3, "s", (100, 200), P2); // touches client 1's end: still 2 at once
        hold_as(&h, 4, "s", (150, 250), P2);
        let report = check(&h);
        report.assert_clean();
        let peak = &report.permit_peaks()[0];
        assert_eq!((peak.peak, peak.permits, peak.holds), (2, 2, 4));
        assert_eq!(peak.at, ms(50));
        assert!(peak.within_bound() && peak.over.is_empty());
        assert_eq!(report.permit_peak("s"), Some(2));
        assert_eq!(report.permit_peak("other"), None);
        assert!(
            report
                .to_string()
                .contains("permits: \"s\": peak 2 of 2 permits"),
            "{report}"
        );
    }

    #[test]
    fn p_plus_one_overlapping_permits_are_flagged_with_the_interval() {
        let h = History::new();
        hold_as(&h, 1, "s", (0, 100), P2);
        hold_as(&h, 2, "s", (10, 200), P2);
        hold_as(&h, 3, "s", (60, 300), P2); // 3 alive during [60, 100)
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::TooManyPermits), 1, "{report}");
        let v = &report.violations()[0];
        assert_eq!((v.first.client, v.second.client), (1, 3));
        assert!(v.detail.contains("[+60.000ms, +100.000ms) (peak 3)"), "{v}");
        let peak = &report.permit_peaks()[0];
        assert_eq!((peak.peak, peak.at), (3, ms(60)));
        assert_eq!(peak.over, [(ms(60), ms(100))]);
        assert!(!peak.within_bound());
        assert!(
            report.to_string().contains("over the bound during"),
            "{report}"
        );
    }

    #[test]
    fn each_interval_above_the_bound_is_one_violation() {
        let h = History::new();
        hold_as(&h, 1, "s", (0, 1000), P2);
        hold_as(&h, 2, "s", (0, 1000), P2);
        hold_as(&h, 3, "s", (100, 200), P2);
        hold_as(&h, 4, "s", (150, 250), P2); // 4 alive during [150, 200)
        hold_as(&h, 5, "s", (500, 600), P2);
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::TooManyPermits), 2, "{report}");
        let peak = &report.permit_peaks()[0];
        assert_eq!(peak.peak, 4);
        assert_eq!(peak.over, [(ms(100), ms(250)), (ms(500), ms(600))]);
        assert!(
            report.violations()[0].detail.contains("(peak 4)"),
            "{report}"
        );
    }

    #[test]
    fn a_hand_over_above_the_bound_does_not_split_the_interval() {
        let h = History::new();
        hold_as(&h, 1, "s", (0, 300), P2);
        hold_as(&h, 2, "s", (0, 300), P2);
        hold_as(&h, 3, "s", (100, 200), P2);
        hold_as(&h, 4, "s", (200, 250), P2); // takes over from 3 at 200: still 3 alive
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::TooManyPermits), 1, "{report}");
        assert_eq!(report.permit_peaks()[0].over, [(ms(100), ms(250))]);
        assert_eq!(report.permit_peaks()[0].peak, 3);
    }

    #[test]
    fn holds_end_at_their_deadline_extension_release_or_loss() {
        let h = History::new();
        at(&h, 0, 1, "s", acquired_as(100, P2)); // expires at 100
        at(&h, 0, 2, "s", acquired_as(100, P2));
        at(&h, 50, 2, "s", EventKind::Extended { deadline: ms(300) });
        at(&h, 100, 3, "s", acquired_as(400, P2)); // 2 and 3 alive
        at(&h, 150, 4, "s", acquired_as(400, P2)); // 2, 3 and 4 alive
        at(&h, 160, 3, "s", EventKind::Lost);
        let report = check(&h);
        assert_eq!(report.permit_peaks()[0].over, [(ms(150), ms(160))]);
        assert_eq!(report.count(ViolationKind::TooManyPermits), 1);
    }

    #[test]
    fn semaphores_are_counted_apart_and_locks_are_not_counted() {
        let h = History::new();
        for client in 0..2 {
            hold_as(&h, client, "a", (0, 100), P2);
            hold_as(&h, client + 10, "b", (0, 100), P2);
            hold_as(&h, client + 20, "rw", (0, 100), HoldMode::Shared);
        }
        let report = check(&h);
        report.assert_clean();
        let names: Vec<&str> = report.permit_peaks().iter().map(|p| &*p.resource).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn one_permit_is_a_mutex() {
        let h = History::new();
        let p1 = HoldMode::Permit { permits: 1 };
        hold_as(&h, 1, "s", (0, 100), p1);
        hold_as(&h, 2, "s", (99, 200), p1);
        assert_eq!(check(&h).count(ViolationKind::TooManyPermits), 1);
    }

    /// (start, length, released early at)
    fn arb_permits() -> impl Strategy<Value = Vec<(u64, u64, Option<u64>)>> {
        prop::collection::vec((0u64..200, 0u64..80, prop::option::of(0u64..80)), 0..14)
    }

    proptest! {
        /// The sweep's peak and verdict agree with counting at every instant.
        #[test]
        fn matches_naive_count(spec in arb_permits(), permits in 1u32..4) {
            let h = History::new();
            let mode = HoldMode::Permit { permits };
            for (client, (start, len, release)) in spec.iter().enumerate() {
                let client = client as u64;
                at(&h, *start, client, "s", acquired_as(start + len, mode));
                if let Some(r) = release {
                    at(&h, start + r, client, "s", EventKind::ReleaseInvoked);
                }
            }
            let events = h.events();
            let holds = holds(&events);
            // Alive at each instant t (ms): the count is constant between integer instants.
            let alive = |t: u64| holds.iter().filter(|x| x.start <= ms(t) && ms(t) < x.end).count();
            let counts: Vec<usize> = (0..300).map(alive).collect();
            let peak = counts.iter().copied().max().unwrap_or(0);
            let bound = permits as usize;
            let intervals = counts
                .iter()
                .enumerate()
                .filter(|&(t, &c)| c > bound && (t == 0 || counts[t - 1] <= bound))
                .count();
            let report = check_events(&events);
            if !spec.is_empty() {
                prop_assert_eq!(report.permit_peak("s"), Some(peak));
            }
            prop_assert_eq!(report.count(ViolationKind::TooManyPermits), intervals);
            prop_assert_eq!(report.is_clean(), peak <= bound);
        }
    }
}
