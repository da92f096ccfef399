//! Typed node replies: what one node said, once the node layer has decoded its raw Redis
//! answer for the request it sent.
//!
//! Redis answers each of our requests in its own shape: `SET … NX GET` with nil or the
//! holder's token, the scripts with `1`/`0`, `{1, counter}`/`{0}`, `{1, load}` or
//! `{deleted, listeners}`. The node layer (`node.rs`) knows those shapes and turns each
//! answer into one [`Reply`]; from here on nothing looks at a Redis value again. A reply
//! then counts in exactly one way ([`Reply::ballot`]):
//!
//! ```text
//!   Granted, Fenced(t), Admitted{load},
//!   Released{deleted > 0}                     ──▶ Ballot::Granted
//!   HeldBy(_), Released{deleted = 0},
//!   Mismatch(_)                               ──▶ Ballot::Refused   (another owner, not ours, or a
//!                                                                    semaphore's other configuration)
//!   Failed(text), TimedOut                    ──▶ Ballot::Failed    (unknown: against the quorum)
//! ```

use std::fmt;

use super::tally::Ballot;

/// Another owner's token, as a node named it in a refusal. Compared, never shown:
/// `Debug` prints only its length.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Holder(Vec<u8>);

impl Holder {
    /// The token a node named as the holder's.
    pub(crate) fn new(token: Vec<u8>) -> Holder {
        Holder(token)
    }

    /// The first eight characters of the holder's token: the id its release announces.
    pub(crate) fn release_id(&self) -> String {
        String::from_utf8_lossy(self.0.get(..8).unwrap_or(&self.0)).into_owned()
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Holder(<{} bytes>)", self.0.len())
    }
}

/// One node's answer to one request, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The node did what was asked: set our key, extended it, committed the fence.
    Granted,
    /// A fenced acquire granted, with the node's new fence counter.
    Fenced(u64),
    /// A semaphore's node admitted our permit; `load` is how many live permits it holds
    /// now, ours included.
    Admitted {
        /// Live permits on the node after the grant.
        load: u64,
    },
    /// The node refused: another owner's key is there (named when the node said whose),
    /// or, for a compare-and-X script, the key no longer holds our token.
    HeldBy(Option<Holder>),
    /// A release: how many of our keys the node deleted, and how many clients listen
    /// for the announcement (zero where nothing was announced).
    Released {
        /// Keys deleted (ours only).
        deleted: u64,
        /// Subscribers the announcement reached.
        listeners: u64,
    },
    /// A semaphore's node refused because the semaphore is in use with another
    /// configuration (`"P:c:Q:N"`, the stored one): nothing was written.
    Mismatch(String),
    /// The node answered with an error, an unexpected value, or the connection failed.
    /// The text never holds credentials or tokens.
    Failed(String),
    /// No answer within the per-node timeout: the outcome is unknown.
    TimedOut,
}

impl Reply {
    /// How the reply counts towards the quorum. This is the only place a reply becomes a
    /// vote.
    pub(crate) fn ballot(&self) -> Ballot {
        match self {
            Reply::Granted | Reply::Fenced(_) | Reply::Admitted { .. } => Ballot::Granted,
            Reply::Released { deleted, .. } if *deleted > 0 => Ballot::Granted,
            Reply::HeldBy(_) | Reply::Released { .. } | Reply::Mismatch(_) => Ballot::Refused,
            Reply::Failed(_) | Reply::TimedOut => Ballot::Failed,
        }
    }

    /// The number of listeners a release announcement reached (zero for other replies).
    pub(crate) fn listeners(&self) -> u64 {
        match self {
            Reply::Released { listeners, .. } => *listeners,
            _ => 0,
        }
    }
}

/// One herald's answer to a wait-queue join: whether it added the waiter anew (a first
/// join, or its place had been popped or had lapsed), how many live waiters are queued
/// ahead of it, and its arrival score there (the herald's clock at the first join, sent
/// back on a re-join so the place is kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueuePlace {
    /// Whether the token was queued there, added, or gone.
    pub(crate) state: QueueState,
    /// Live waiters queued ahead of it (0 when it is not queued).
    pub(crate) ahead: u64,
    /// Its ticket, as the node printed it (`None` when it is not queued).
    pub(crate) score: Option<Vec<u8>>,
    /// The lock key on that node holds the token (a transfer to it happened there).
    pub(crate) holds: bool,
    /// No lock key of the waiter's on that node holds any token (the key absent; several
    /// resources, every key of the set absent).
    pub(crate) free: bool,
}

/// What a join or renewal found of the token on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueState {
    /// It was queued (a renewal; its lease renewed).
    Queued,
    /// It was added (a first join).
    Added,
    /// It is not queued and was not added: popped by a transfer or a naming, lapsed, or
    /// (a first join) the key already holds it. A token is never queued twice on a node.
    Gone,
}

/// The largest number of nodes one other owner holds, from the refusals (each names its
/// holder when the request was `SET … NX GET`). `None` when some refusal did not name its
/// holder: then nothing is known about how the others split.
pub(crate) fn largest_holder<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> Option<usize> {
    let mut owners: Vec<(&Holder, usize)> = Vec::new();
    for r in replies {
        match r {
            Reply::HeldBy(Some(h)) => match owners.iter_mut().find(|(o, _)| *o == h) {
                Some((_, n)) => *n += 1,
                None => owners.push((h, 1)),
            },
            r if r.ballot() == Ballot::Refused => return None,
            _ => {}
        }
    }
    Some(owners.iter().map(|(_, n)| *n).max().unwrap_or(0))
}

/// The release ids of the owners named by `SET … GET` refusals: each holder token's first
/// eight characters, as a release announcement names its lock (distinct, in node order).
pub(crate) fn holder_ids<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for r in replies {
        if let Reply::HeldBy(Some(h)) = r {
            let id = h.release_id();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn holder(b: u8) -> Reply {
        Reply::HeldBy(Some(Holder::new(vec![b; 4])))
    }

    pub(crate) fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Granted),
            any::<u64>().prop_map(Reply::Fenced),
            (0u64..5).prop_map(|load| Reply::Admitted { load }),
            (0u8..3).prop_map(holder),
            Just(Reply::HeldBy(None)),
            (0u64..3, 0u64..3)
                .prop_map(|(deleted, listeners)| Reply::Released { deleted, listeners }),
            Just(Reply::Failed("ERR".into())),
            Just(Reply::TimedOut),
            Just(Reply::Mismatch("1:1:2:3".into())),
        ]
    }

    #[test]
    fn ballots() {
        assert_eq!(Reply::Granted.ballot(), Ballot::Granted);
        assert_eq!(Reply::Fenced(7).ballot(), Ballot::Granted);
        assert_eq!(Reply::Admitted { load: 2 }.ballot(), Ballot::Granted);
        assert_eq!(holder(1).ballot(), Ballot::Refused);
        assert_eq!(Reply::HeldBy(None).ballot(), Ballot::Refused);
        let released = |deleted| Reply::Released {
            deleted,
            listeners: 2,
        };
        assert_eq!(released(1).ballot(), Ballot::Granted);
        assert_eq!(released(0).ballot(), Ballot::Refused);
        assert_eq!(released(0).listeners(), 2);
        assert_eq!(Reply::Failed("x".into()).ballot(), Ballot::Failed);
        assert_eq!(Reply::TimedOut.ballot(), Ballot::Failed);
        assert_eq!(Reply::Mismatch("1:1:2:3".into()).ballot(), Ballot::Refused);
    }

    #[test]
    fn holder_is_never_shown() {
        let r = Reply::HeldBy(Some(Holder::new(b"0123456789abcdef".to_vec())));
        assert!(!format!("{r:?}").contains("0123"));
    }

    #[test]
    fn largest_holder_counts_named_owners() {
        let rs = [
            holder(1),
            holder(2),
            holder(1),
            Reply::Granted,
            Reply::TimedOut,
        ];
        assert_eq!(largest_holder(&rs), Some(2));
        assert_eq!(largest_holder(&[Reply::Granted]), Some(0));
        assert_eq!(largest_holder(&[holder(1), Reply::HeldBy(None)]), None);
    }

    proptest! {
        /// The largest holder never exceeds the refusals, and is known exactly when every
        /// refusal named its holder.
        #[test]
        fn largest_holder_bounded(rs in prop::collection::vec(reply(), 0..9)) {
            let refused = rs.iter().filter(|r| r.ballot() == Ballot::Refused).count();
            let named = rs.iter().filter(|r| matches!(r, Reply::HeldBy(Some(_)))).count();
            match largest_holder(&rs) {
                Some(n) => {
                    prop_assert_eq!(named, refused);
                    prop_assert!(n <= refused);
                    prop_assert_eq!(n == 0, refused == 0);
                }
                None => prop_assert!(named < refused),
            }
        }
    }
}
