//! Invariant (c): fencing tokens strictly increase in acquisition order, per resource; and
//! the storage never accepts a write with a token lower than one it already accepted.
//!
//! Acquisitions without a token (fencing off, readers, permits) are ignored; a write lock's
//! token counts like a mutex's (a resource name is one or the other). Each offending acquisition is
//! reported against the acquisition that holds the highest token so far.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Violation, ViolationKind};
use crate::history::{Event, EventKind};

pub(super) fn check(events: &[Event], out: &mut Vec<Violation>) {
    let mut acquired_max: HashMap<Arc<str>, (u64, Event)> = HashMap::new();
    let mut accepted_max: HashMap<Arc<str>, (u64, Event)> = HashMap::new();
    for e in events {
        let (token, max, kind) = match (e.kind.acquisition(), e.kind) {
            (Some((_, Some(t), _)), _) => {
                (t, &mut acquired_max, ViolationKind::FencingNotIncreasing)
            }
            (_, EventKind::WriteAccepted { token: Some(t) }) => {
                (t, &mut accepted_max, ViolationKind::StaleWriteAccepted)
            }
            _ => continue,
        };
        match max.get(&e.resource) {
            // Acquisitions must strictly increase; accepted writes must not go down (one
            // holder may write several times with its token).
            Some((m, prev))
                if token < *m || (token == *m && kind == ViolationKind::FencingNotIncreasing) =>
            {
                out.push(Violation {
                    kind,
                    first: prev.clone(),
                    second: e.clone(),
                    detail: format!("token {token} after token {m}"),
                });
            }
            _ => {
                max.insert(e.resource.clone(), (token, e.clone()));
            }
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
    fn increasing_tokens_are_clean() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(10, Some(1)));
        at(&h, 10, 2, "r", acquired(20, Some(2)));
        at(&h, 20, 1, "r", acquired(30, Some(7)));
        at(&h, 20, 1, "other", acquired(30, Some(1))); // per resource
        check(&h).assert_clean();
    }

    #[test]
    fn repeated_token_is_flagged() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(10, Some(5)));
        at(&h, 10, 2, "r", acquired(20, Some(5)));
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::FencingNotIncreasing), 1);
        let v = &report.violations()[0];
        assert_eq!((v.first.client, v.second.client), (1, 2));
        assert!(v.to_string().contains("token 5 after token 5"), "{v}");
    }

    #[test]
    fn decreasing_token_is_flagged_against_the_maximum() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(10, Some(3)));
        at(&h, 10, 2, "r", acquired(20, Some(9)));
        at(&h, 20, 3, "r", acquired(30, Some(4)));
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::FencingNotIncreasing), 1);
        assert_eq!(report.violations()[0].first.client, 2);
    }

    #[test]
    fn write_lock_tokens_recorded_with_a_mode_are_checked() {
        let h = History::new();
        let write = |deadline, token| EventKind::AcquiredAs {
            deadline: ms(deadline),
            fencing_token: Some(token),
            mode: crate::HoldMode::Exclusive,
        };
        at(&h, 0, 1, "rw", write(10, 4));
        at(&h, 10, 2, "rw", acquired_as(20, crate::HoldMode::Shared));
        at(&h, 20, 3, "rw", write(30, 4));
        assert_eq!(check(&h).count(ViolationKind::FencingNotIncreasing), 1);
    }

    #[test]
    fn acquisitions_without_tokens_are_ignored() {
        let h = History::new();
        at(&h, 0, 1, "r", acquired(10, None));
        at(&h, 10, 2, "r", acquired(20, None));
        check(&h).assert_clean();
    }

    #[test]
    fn stale_write_accepted_is_flagged_rejected_is_not() {
        let h = History::new();
        at(&h, 0, 1, "r", EventKind::WriteAccepted { token: Some(2) });
        at(&h, 1, 1, "r", EventKind::WriteAccepted { token: Some(2) }); // same holder again
        at(&h, 2, 2, "r", EventKind::WriteRejected { token: Some(1) });
        check(&h).assert_clean();
        at(&h, 3, 2, "r", EventKind::WriteAccepted { token: Some(1) });
        assert_eq!(check(&h).count(ViolationKind::StaleWriteAccepted), 1);
    }

    proptest! {
        #[test]
        fn flags_iff_not_strictly_increasing(tokens in prop::collection::vec(0u64..20, 0..15)) {
            let h = History::new();
            for (i, t) in tokens.iter().enumerate() {
                at(&h, i as u64 * 10, i as u64, "r", acquired(i as u64 * 10 + 10, Some(*t)));
            }
            let mut max = None;
            let mut naive = 0;
            for t in &tokens {
                match max {
                    Some(m) if *t <= m => naive += 1,
                    _ => max = Some(*t),
                }
            }
            prop_assert_eq!(check(&h).count(ViolationKind::FencingNotIncreasing), naive);
        }
    }
}
