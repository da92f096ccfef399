//! Invariant: each resource is either a lock (exclusive and shared holds) or a semaphore
//! (permit holds that all say the same P). The first hold of a resource decides which; every
//! hold that disagrees is reported against it, since the history then does not say what the
//! bound is (a test that records a permit of 2 and a permit of 3 for one name has a bug, or
//! the library mixed two configurations).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Hold, Violation, ViolationKind};
use crate::history::HoldMode;

/// What a resource is, as its first hold says.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Lock,
    Semaphore(u32),
}

fn family(mode: HoldMode) -> Family {
    match mode {
        HoldMode::Permit { permits } => Family::Semaphore(permits),
        _ => Family::Lock,
    }
}

/// Reports every hold whose mode disagrees with its resource's first hold; returns the
/// semaphore resources with their P.
pub(super) fn check(holds: &[Hold], out: &mut Vec<Violation>) -> BTreeMap<Arc<str>, u32> {
    let mut first: BTreeMap<Arc<str>, &Hold> = BTreeMap::new();
    for h in holds {
        let Some(f) = first.get(&h.resource) else {
            first.insert(h.resource.clone(), h);
            continue;
        };
        if family(f.mode) != family(h.mode) {
            out.push(Violation {
                kind: ViolationKind::MixedModes,
                first: f.acquired.clone(),
                second: h.acquired.clone(),
                detail: format!(
                    "client {}'s {} hold, but the resource's first hold was {} (client {})",
                    h.client, h.mode, f.mode, f.client
                ),
            });
        }
    }
    first
        .into_iter()
        .filter_map(|(resource, h)| h.mode.permits().map(|p| (resource, p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ViolationKind, check};
    use crate::history::{History, HoldMode};

    const P2: HoldMode = HoldMode::Permit { permits: 2 };

    #[test]
    fn exclusive_and_shared_holds_make_one_lock() {
        let h = History::new();
        hold_as(&h, 1, "rw", (0, 10), HoldMode::Exclusive);
        hold_as(&h, 2, "rw", (10, 20), HoldMode::Shared);
        hold(&h, 3, "rw", 20, 30);
        check(&h).assert_clean();
    }

    #[test]
    fn permits_on_a_lock_resource_are_flagged() {
        let h = History::new();
        hold_as(&h, 1, "r", (0, 10), HoldMode::Shared);
        hold_as(&h, 2, "r", (20, 30), P2); // no overlap: flagged for the mode alone
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::MixedModes), 1, "{report}");
        let v = &report.violations()[0];
        assert_eq!((v.first.client, v.second.client), (1, 2));
        assert!(v.detail.contains("permit of 2 hold"), "{v}");
    }

    #[test]
    fn permits_disagreeing_on_p_are_flagged_and_the_first_p_counts() {
        let h = History::new();
        hold_as(&h, 1, "s", (0, 10), P2);
        hold_as(&h, 2, "s", (20, 30), HoldMode::Permit { permits: 3 });
        hold_as(&h, 3, "s", (40, 50), HoldMode::Exclusive);
        let report = check(&h);
        assert_eq!(report.count(ViolationKind::MixedModes), 2, "{report}");
        assert_eq!(report.permit_peaks()[0].permits, 2);
        assert_eq!(report.permit_peaks()[0].holds, 1);
    }
}
