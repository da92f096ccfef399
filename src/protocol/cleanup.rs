//! The clean-up plan after a failed or cancelled acquire: which nodes need a release now,
//! and which once their pending request lands.
//!
//! A failed attempt must leave no key behind, including a `SET` that lands after the
//! attempt gave up. A release may only be sent to a node once that node's acquire request
//! has finished (the node's one connection then carries the release after it), so the plan
//! depends on what each node answered, or that it has not answered yet:
//!
//! ```text
//!   answer                       may hold our key   release
//!   granted                      yes                now; First when the caller waits for them
//!   failed, timed out            unknown            now (the request is over, whatever it did)
//!   refused (another owner)      no: SET NX did nothing   never
//!   refused (semaphore mismatch) no: nothing written      never
//!   still running                unknown            once it lands, unless it lands as a refusal
//! ```
//!
//! The I/O layer (`fanout::Cleanup`) runs the plan in the background; the attempt awaits
//! the `First` releases before it returns its error, so its granted keys are gone by then.

use super::reply::Reply;
use super::tally::Ballot;

/// When one node is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Granted, and the caller waits for these releases before it returns.
    First,
    /// Released now, in the background.
    Now,
    /// Still running: released once its request lands, unless it lands as a refusal
    /// ([`after_landing`]).
    AfterLanding,
    /// Refused: our `SET NX` did nothing there; nothing to release.
    Never,
}

/// The step for one node: its answer so far (`None`: still running), and whether the
/// caller waits for the granted nodes' releases.
///
/// The rule: a node is released unless it refused (it then holds another owner's key, never
/// ours); a node that has not answered is released only after its request lands.
pub(crate) fn step(reply: Option<&Reply>, wait_for_granted: bool) -> Step {
    match reply.map(Reply::ballot) {
        None => Step::AfterLanding,
        Some(Ballot::Granted) if wait_for_granted => Step::First,
        Some(Ballot::Granted | Ballot::Failed) => Step::Now,
        Some(Ballot::Refused) => Step::Never,
    }
}

/// Whether a request that landed after the attempt gave up needs a release: yes unless the
/// node refused (a late grant, an error or a time-out may all have left our key).
pub(crate) fn after_landing(reply: &Reply) -> bool {
    reply.ballot() != Ballot::Refused
}

/// The nodes to release at once, by node index: `first` (awaited by the caller) and `now`.
/// The nodes still running are not listed: the caller hands their pending requests over,
/// and each is released per [`after_landing`].
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Granted nodes the caller waits for.
    pub(crate) first: Vec<usize>,
    /// Nodes released in the background at once.
    pub(crate) now: Vec<usize>,
}

/// The plan for the nodes that answered, as `(node index, reply)` (the rule: [`step`]).
pub(crate) fn plan<'a>(
    answered: impl IntoIterator<Item = (usize, &'a Reply)>,
    wait_for_granted: bool,
) -> Plan {
    let mut p = Plan::default();
    for (i, r) in answered {
        match step(Some(r), wait_for_granted) {
            Step::First => p.first.push(i),
            Step::Now => p.now.push(i),
            Step::AfterLanding | Step::Never => {}
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::super::reply::tests::reply;
    use super::*;
    use proptest::prelude::*;

    /// The oracle: a node may hold our key unless it said that someone else holds it.
    fn may_hold(r: &Reply) -> bool {
        !matches!(
            r,
            Reply::HeldBy(_) | Reply::Released { deleted: 0, .. } | Reply::Mismatch(_)
        )
    }

    #[test]
    fn seed_table() {
        let held = Reply::HeldBy(None);
        assert_eq!(step(Some(&Reply::Granted), true), Step::First);
        assert_eq!(step(Some(&Reply::Granted), false), Step::Now);
        assert_eq!(step(Some(&Reply::Fenced(7)), true), Step::First);
        assert_eq!(step(Some(&Reply::TimedOut), true), Step::Now);
        assert_eq!(step(Some(&Reply::Failed("x".into())), true), Step::Now);
        assert_eq!(step(Some(&held), true), Step::Never);
        assert_eq!(step(None, true), Step::AfterLanding);
        assert!(after_landing(&Reply::TimedOut));
        assert!(!after_landing(&held));
        let rs = [Reply::Granted, held, Reply::TimedOut];
        let p = plan(rs.iter().enumerate(), true);
        assert_eq!(
            p,
            Plan {
                first: vec![0],
                now: vec![2]
            }
        );
    }

    proptest! {
        /// Every node that may hold our key is released exactly once, never before its
        /// request finished; no node that refused is ever released; the caller waits only
        /// for granted nodes, and only when it asked to.
        #[test]
        fn releases_exactly_what_may_hold(
            answers in prop::collection::vec(prop::option::of(reply()), 0..10),
            late in prop::collection::vec(reply(), 10),
            wait in any::<bool>(),
        ) {
            let answered = answers.iter().enumerate().filter_map(|(i, r)| r.as_ref().map(|r| (i, r)));
            let p = plan(answered, wait);
            let mut released = vec![0u32; answers.len()];
            for &i in p.first.iter().chain(&p.now) {
                released[i] += 1;
                prop_assert!(answers[i].is_some(), "released before its request finished");
            }
            for &i in &p.first {
                prop_assert!(wait);
                prop_assert_eq!(answers[i].as_ref().map(Reply::ballot), Some(Ballot::Granted));
            }
            for (i, a) in answers.iter().enumerate() {
                // The request still running lands with `late[i]`.
                let landed = a.as_ref().unwrap_or(&late[i]);
                if a.is_none() && after_landing(landed) {
                    released[i] += 1;
                }
                prop_assert_eq!(released[i], u32::from(may_hold(landed)), "node {}", i);
            }
        }
    }
}
