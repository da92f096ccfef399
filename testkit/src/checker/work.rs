//! Invariant (b): work happens inside its client's hold of the resource.
//!
//! A `WorkStarted` is paired with the same client's next `WorkEnded` on the resource (no
//! `WorkEnded`: the work is taken as instantaneous at its start). The work `[s, e]` is inside
//! the client's latest hold started at or before `s` iff `start <= s < end` and `e <= end`.
//! Work with no hold at all is reported against itself.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Hold, Violation, ViolationKind};
use crate::history::{ClientId, Event, EventKind, offset};

pub(super) fn check(events: &[Event], holds: &[Hold], out: &mut Vec<Violation>) {
    let mut started: HashMap<(ClientId, Arc<str>), Event> = HashMap::new();
    let mut spans: Vec<(Event, Option<Event>)> = Vec::new();
    for e in events {
        let key = (e.client, e.resource.clone());
        match e.kind {
            EventKind::WorkStarted => {
                if let Some(open) = started.insert(key, e.clone()) {
                    spans.push((open, None));
                }
            }
            EventKind::WorkEnded => {
                if let Some(open) = started.remove(&key) {
                    spans.push((open, Some(e.clone())));
                }
            }
            _ => {}
        }
    }
    spans.extend(started.into_values().map(|s| (s, None)));

    for (start, end) in spans {
        let end_at = end.as_ref().map_or(start.at, |e| e.at);
        let hold = holds
            .iter()
            .filter(|h| {
                h.client == start.client && h.resource == start.resource && h.start <= start.at
            })
            .max_by_key(|h| (h.start, h.acquired.seq));
        let Some(hold) = hold else {
            out.push(Violation {
                kind: ViolationKind::WorkOutsideHold,
                first: start.clone(),
                second: end.clone().unwrap_or_else(|| start.clone()),
                detail: format!(
                    "client {} worked at {} without holding the lock",
                    start.client,
                    offset(start.at)
                ),
            });
            continue;
        };
        let offending = if start.at >= hold.end {
            Some(start.clone())
        } else if end_at > hold.end {
            end.clone()
        } else {
            None
        };
        if let Some(second) = offending {
            out.push(Violation {
                kind: ViolationKind::WorkOutsideHold,
                first: hold.ended_by.clone(),
                second,
                detail: format!(
                    "work [{}, {}] is not inside {hold}",
                    offset(start.at),
                    offset(end_at)
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ViolationKind, check};
    use crate::history::{EventKind, History};
    use proptest::prelude::*;

    #[test]
    fn work_inside_hold_is_clean() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 0, 1, "r", EventKind::WorkStarted);
        at(&h, 100, 1, "r", EventKind::WorkEnded); // ends exactly at the deadline: inside
        check(&h).assert_clean();
    }

    #[test]
    fn work_running_past_deadline_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 10, 1, "r", EventKind::WorkStarted);
        at(&h, 101, 1, "r", EventKind::WorkEnded);
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::WorkOutsideHold), 1);
        let v = &report.violations()[0];
        assert_eq!(v.second.kind, EventKind::WorkEnded);
        assert!(matches!(v.first.kind, EventKind::Acquired { .. }));
    }

    #[test]
    fn work_after_release_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 50, 1, "r", EventKind::ReleaseInvoked);
        at(&h, 50, 1, "r", EventKind::WorkStarted); // starts at the hold's end: outside
        at(&h, 51, 1, "r", EventKind::WorkEnded);
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::WorkOutsideHold), 1);
        assert_eq!(report.violations()[0].first.kind, EventKind::ReleaseInvoked);
    }

    #[test]
    fn work_without_any_hold_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", EventKind::AcquireInvoked);
        at(&h, 5, 1, "r", EventKind::AcquireUnknown);
        at(&h, 6, 1, "r", EventKind::WorkStarted);
        assert!(check(&h).has(ViolationKind::WorkOutsideHold));
    }

    #[test]
    fn other_clients_hold_does_not_cover_work() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 10, 2, "r", EventKind::WorkStarted);
        at(&h, 20, 2, "r", EventKind::WorkEnded);
        assert!(check(&h).has(ViolationKind::WorkOutsideHold));
    }

    #[test]
    fn extension_covers_longer_work() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, None));
        at(&h, 10, 1, "r", EventKind::WorkStarted);
        at(&h, 90, 1, "r", EventKind::Extended { deadline: ms(190) });
        at(&h, 150, 1, "r", EventKind::WorkEnded);
        check(&h).assert_clean();
    }

    #[test]
    fn paused_holder_work_lands_outside() {
        // A holder paused longer than its validity (the fault matrix's last row).
        let h = History::new();
        at(&h, 0, 1, "r", acquired(100, Some(1)));
        at(&h, 5, 1, "r", EventKind::WorkStarted);
        at(&h, 300, 2, "r", acquired(400, Some(2)));
        at(&h, 310, 1, "r", EventKind::WorkEnded); // resumed after the pause
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::WorkOutsideHold), 1);
        assert!(!report.has(ViolationKind::Overlap));
    }

    proptest! {
        /// Work strictly inside a hold is clean; the same work shifted past the end is not.
        #[test]
        fn containment(start in 0u64..100, len in 1u64..100, a in 0u64..100, b in 0u64..100) {
            let (ws, we) = (a.min(b) % len, a.max(b) % len);
            let (ws, we) = (start + ws.min(we), start + ws.max(we));
            let h = History::new();
            at(&h, start, 1, "r", acquired(start + len, None));
            at(&h, ws, 1, "r", EventKind::WorkStarted);
            at(&h, we, 1, "r", EventKind::WorkEnded);
            prop_assert!(check(&h).is_clean());
            at(&h, start + len, 1, "r", EventKind::WorkStarted);
            prop_assert_eq!(check(&h).count(ViolationKind::WorkOutsideHold), 1);
        }
    }
}
