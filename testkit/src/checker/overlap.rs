//! Invariant (a): an exclusive hold of a resource overlaps no other hold of it.
//!
//! Holds are half-open, so `[a, b)` followed by `[b, c)` is fine. Every overlapping pair
//! with an exclusive hold in it is reported once, the earlier acquisition first: two
//! exclusive holds as [`Overlap`](ViolationKind::Overlap), an exclusive and a shared one (a
//! writer and a reader) as [`SharedWithExclusive`](ViolationKind::SharedWithExclusive).
//! Shared holds may overlap each other. Permit holds are counted by `permits.rs`; one that
//! meets an exclusive hold is a resource with mixed modes, reported by `modes.rs`. Holds of
//! the same client count too: a second successful acquisition while the client still
//! believes it holds the lock means the lock was granted twice.

use std::collections::BTreeMap;

use super::{Hold, Violation, ViolationKind};
use crate::history::HoldMode;

/// The violation two overlapping holds of one resource make, if any.
fn conflict(a: HoldMode, b: HoldMode) -> Option<ViolationKind> {
    match (a, b) {
        (HoldMode::Exclusive, HoldMode::Exclusive) => Some(ViolationKind::Overlap),
        (HoldMode::Exclusive, HoldMode::Shared) | (HoldMode::Shared, HoldMode::Exclusive) => {
            Some(ViolationKind::SharedWithExclusive)
        }
        _ => None,
    }
}

pub(super) fn check(holds: &[Hold], out: &mut Vec<Violation>) {
    let mut by_resource: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in holds.iter().filter(|h| !h.is_empty()) {
        by_resource.entry(&h.resource).or_default().push(h);
    }
    for (_, mut holds) in by_resource {
        holds.sort_by_key(|h| (h.start, h.acquired.seq));
        // Sweep in start order, keeping the holds that have not ended yet.
        let mut active: Vec<&Hold> = Vec::new();
        for h in holds {
            active.retain(|a| a.end > h.start);
            for a in &active {
                debug_assert!(a.overlaps(h));
                let Some(kind) = conflict(a.mode, h.mode) else {
                    continue;
                };
                out.push(Violation {
                    kind,
                    first: a.acquired.clone(),
                    second: h.acquired.clone(),
                    detail: format!("{a} overlaps {h}"),
                });
            }
            active.push(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{check, check_events, holds};
    use super::*;
    use crate::history::{EventKind, History};
    use proptest::prelude::*;

    #[test]
    fn touching_holds_do_not_overlap() {
        let h = History::new();
        hold(&h, 1, "r", 0, 10);
        hold(&h, 2, "r", 10, 20);
        // Expiry instead of release: [20, 30) then [30, 40).
        at(&h, 20, 3, "r", acquired(30, None));
        at(&h, 30, 4, "r", acquired(40, None));
        check(&h).assert_clean();
    }

    #[test]
    fn overlapping_holds_are_flagged_with_both_acquisitions() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 99, 2, "r", acquired(200, None));
        let report = check(&h);
        assert_eq!(report.violations().len(), 1);
        let v = &report.violations()[0];
        assert_eq!(v.kind, ViolationKind::Overlap);
        assert_eq!((v.first.client, v.second.client), (1, 2));
        assert_eq!((v.first.seq, v.second.seq), (0, 1));
    }

    #[test]
    fn different_resources_never_conflict() {
        let h = History::new();
        at(&h, 0, 1, "a", acquired(100, None));
        at(&h, 10, 2, "b", acquired(100, None));
        check(&h).assert_clean();
    }

    #[test]
    fn extension_that_reaches_into_next_hold_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 90, 1, "r", EventKind::Extended { deadline: ms(190) });
        at(&h, 150, 2, "r", acquired(250, None));
        assert!(check(&h).has(ViolationKind::Overlap));
    }

    #[test]
    fn failed_or_unknown_extension_keeps_the_deadline() {
        // A shorter extension that timed out (or failed) does not move the believed end: a
        // holder that took the lock when the shorter expiry would have passed overlaps.
        let h = History::new();
        at(&h, 0, 1, "r", acquired(1000, None));
        at(&h, 10, 1, "r", EventKind::ExtendInvoked);
        at(&h, 30, 1, "r", EventKind::ExtendUnknown);
        at(&h, 40, 1, "r", EventKind::ExtendInvoked);
        at(&h, 140, 1, "r", EventKind::ExtendFailed);
        assert_eq!(holds(&h.events())[0].end, ms(1000));
        check(&h).assert_clean();
        at(&h, 200, 2, "r", acquired(400, None));
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::Overlap), 1);
        assert_eq!(report.violations()[0].second.client, 2);
    }

    #[test]
    fn release_before_next_acquire_is_clean() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 90, 1, "r", EventKind::Extended { deadline: ms(190) });
        at(&h, 120, 1, "r", EventKind::ReleaseInvoked);
        at(&h, 150, 2, "r", acquired(250, None));
        at(&h, 151, 1, "r", EventKind::Released); // a slow release reply changes nothing
        check(&h).assert_clean();
    }

    #[test]
    fn same_client_reacquiring_while_holding_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 10, 1, "r", acquired(110, None));
        assert_eq!(check(&h).count(ViolationKind::Overlap), 1);
    }

    #[test]
    fn empty_hold_overlaps_nothing() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 50, 2, "r", acquired(50, None)); // zero validity: not held
        check(&h).assert_clean();
    }

    #[test]
    fn three_way_overlap_reports_every_pair() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 10, 2, "r", acquired(100, None));
        at(&h, 20, 3, "r", acquired(100, None));
        assert_eq!(check(&h).count(ViolationKind::Overlap), 3);
    }

    #[test]
    fn readers_share_writers_do_not() {
        let h = History::new();
        hold_as(&h, 1, "rw", (0, 100), HoldMode::Shared);
        hold_as(&h, 2, "rw", (50, 150), HoldMode::Shared);
        hold_as(&h, 3, "rw", (150, 200), HoldMode::Exclusive); // after both readers
        hold_as(&h, 4, "rw", (200, 300), HoldMode::Shared);
        check(&h).assert_clean();
    }

    #[test]
    fn a_reader_overlapping_a_writer_is_flagged_either_way_round() {
        let h = History::new();
        hold_as(&h, 1, "rw", (0, 100), HoldMode::Exclusive);
        hold_as(&h, 2, "rw", (99, 150), HoldMode::Shared); // reader inside the writer
        hold_as(&h, 3, "rw", (200, 300), HoldMode::Shared);
        hold_as(&h, 4, "rw", (250, 350), HoldMode::Exclusive); // writer inside a reader
        hold_as(&h, 5, "rw", (260, 270), HoldMode::Exclusive); // and inside that writer
        let report = check(&h);
        assert_eq!(
            report.count(ViolationKind::SharedWithExclusive),
            3,
            "{report}"
        );
        assert_eq!(report.count(ViolationKind::Overlap), 1, "{report}");
        let pairs: Vec<_> = report
            .violations()
            .iter()
            .map(|v| (v.kind, v.first.client, v.second.client))
            .collect();
        assert_eq!(
            pairs,
            [
                (ViolationKind::SharedWithExclusive, 1, 2),
                (ViolationKind::SharedWithExclusive, 3, 4),
                (ViolationKind::SharedWithExclusive, 3, 5),
                (ViolationKind::Overlap, 4, 5),
            ]
        );
        let text = report.to_string();
        assert!(
            text.contains("shared hold overlapping an exclusive hold"),
            "{text}"
        );
        assert!(text.contains("held \"rw\" (shared) [+99.000ms"), "{text}");
    }

    #[test]
    fn write_lock_recorded_with_the_old_api_excludes_readers() {
        let h = History::new();
        at(&h, 0, 1, "rw", acquired(100, Some(1))); // exclusive, as before modes existed
        at(&h, 10, 2, "rw", acquired_as(50, HoldMode::Shared));
        assert_eq!(check(&h).count(ViolationKind::SharedWithExclusive), 1);
    }

    /// (client, start, length, released early at, deadline-or-release)
    fn arb_holds() -> impl Strategy<Value = Vec<(u64, u64, u64, Option<u64>)>> {
        prop::collection::vec(
            (0u64..4, 0u64..200, 0u64..60, prop::option::of(0u64..60)),
            0..12,
        )
    }

    proptest! {
        /// The sweep agrees with the naive all-pairs oracle on random histories.
        #[test]
        fn matches_naive_oracle(spec in arb_holds()) {
            let h = History::new();
            for (client, start, len, release) in &spec {
                at(&h, *start, *client, "r", acquired(start + len, None));
                if let Some(r) = release {
                    at(&h, start + r, *client, "r", EventKind::ReleaseInvoked);
                }
            }
            let events = h.events();
            let holds = holds(&events);
            let mut naive = 0;
            for (i, a) in holds.iter().enumerate() {
                for b in &holds[i + 1..] {
                    if !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end {
                        naive += 1;
                    }
                }
            }
            let report = check_events(&events);
            prop_assert_eq!(report.count(ViolationKind::Overlap), naive);
        }

        /// With readers and writers mixed: a pair is flagged iff it overlaps and has a writer.
        #[test]
        fn modes_match_naive_oracle(spec in arb_holds(), shared in prop::collection::vec(any::<bool>(), 12)) {
            let h = History::new();
            for (i, (client, start, len, release)) in spec.iter().enumerate() {
                let mode = if shared[i] { HoldMode::Shared } else { HoldMode::Exclusive };
                at(&h, *start, *client, "r", acquired_as(start + len, mode));
                if let Some(r) = release {
                    at(&h, start + r, *client, "r", EventKind::ReleaseInvoked);
                }
            }
            let events = h.events();
            let holds = holds(&events);
            let (mut writers, mut mixed) = (0, 0);
            for (i, a) in holds.iter().enumerate() {
                for b in &holds[i + 1..] {
                    if !a.overlaps(b) {
                        continue;
                    }
                    match (a.mode, b.mode) {
                        (HoldMode::Exclusive, HoldMode::Exclusive) => writers += 1,
                        (HoldMode::Shared, HoldMode::Shared) => {}
                        _ => mixed += 1,
                    }
                }
            }
            let report = check_events(&events);
            prop_assert_eq!(report.count(ViolationKind::Overlap), writers);
            prop_assert_eq!(report.count(ViolationKind::SharedWithExclusive), mixed);
        }

        /// Back-to-back holds (each starting at or after the previous end) are always clean.
        #[test]
        fn sequential_holds_are_clean(gaps in prop::collection::vec((0u64..20, 0u64..50, any::<bool>()), 1..20)) {
            let h = History::new();
            let mut t = 0;
            for (i, (gap, len, expire)) in gaps.iter().enumerate() {
                t += gap;
                let client = i as u64 % 3;
                if *expire {
                    at(&h, t, client, "r", acquired(t + len, None));
                } else {
                    at(&h, t, client, "r", acquired(t + len + 500, None));
                    at(&h, t + len, client, "r", EventKind::ReleaseInvoked);
                }
                t += len;
            }
            prop_assert!(check(&h).is_clean(), "{}", check(&h));
        }
    }
}
