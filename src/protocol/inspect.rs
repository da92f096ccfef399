//! The inspection rule: what a read of every node says about one resource.
//!
//! Each node that answered says either "free here" or "held here by holder `h`, for
//! another `ttl`" (no TTL: the key never expires); a node that failed or timed out says
//! nothing. From those readings:
//!
//! ```text
//!   one holder on ≥ Q nodes            ──▶ Held { holder, nodes, ttl }
//!   otherwise, free on ≥ Q nodes       ──▶ Free { nodes }
//!   otherwise                          ──▶ Unknown   (too few answers, or a split)
//! ```
//!
//! With `Q = N / 2 + 1` at most one holder can be on a quorum, and a resource cannot be
//! both held and free on a quorum, so the order of the two checks never matters. More
//! answers never turn a quorum reading around: a node that did not answer can only move
//! `Unknown` to `Held` or `Free`, never `Held` to `Free`, `Free` to `Held` or one holder to
//! another.
//!
//! The `ttl` of a held resource is how long the holder stays on a quorum if nothing
//! changes: the `Q`-th largest of its nodes' remaining TTLs (`None`: at least `Q` of its
//! keys never expire).
//!
//! The read-write lock and the semaphore of the same name are read by rules of the same
//! shape ([`read_rw`], [`read_semaphore`]): a node that answered lists its live entries
//! (the writer key; each reader, each permit with its remaining TTL), and an entry holds
//! the lock once it is on a quorum of nodes:
//!
//! ```text
//!   read-write:  the writer on ≥ Q nodes         ──▶ Write { holder, nodes, ttl }
//!                otherwise, a reader on ≥ Q      ──▶ Read { readers, nodes, ttl }
//!                otherwise, neither on ≥ Q       ──▶ Free { nodes }
//!                otherwise                       ──▶ Unknown
//!   semaphore:   a holder on ≥ Qs nodes          ──▶ Held { holders, ttl }
//!                otherwise, empty on ≥ N − Qs + 1 ──▶ Free { nodes }
//!                otherwise                       ──▶ Unknown
//! ```
//!
//! `Qs` is the semaphore's own quorum (at least the majority): a holder keeps its entries
//! on exactly `Qs` nodes, so `N − Qs + 1` empty nodes leave no room for one. A reader's or
//! a holder's `ttl` is its own quorum TTL, as for the mutex; the verdict's is the longest
//! of them (how long the lock stays held if nothing changes).

use std::time::Duration;

/// What one node said about the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen<H> {
    /// No lock key on this node.
    Free,
    /// A lock key holding `holder`, for another `ttl` (`None`: no expiry).
    Held {
        /// The value of the key: whose lock it is.
        holder: H,
        /// The key's remaining TTL; `None` when it has none.
        ttl: Option<Duration>,
    },
    /// The node failed or timed out.
    Unknown,
}

/// What the nodes together say about the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading<H> {
    /// One holder's key is on at least a quorum of nodes.
    Held {
        /// The holder.
        holder: H,
        /// On how many nodes its key is.
        nodes: usize,
        /// How long it stays on a quorum of them if nothing changes (`None`: forever).
        ttl: Option<Duration>,
    },
    /// No lock key on at least a quorum of nodes.
    Free {
        /// On how many nodes there is no key.
        nodes: usize,
    },
    /// Neither: too few nodes answered, or the answers are split between holders and free
    /// nodes so that none has a quorum.
    Unknown,
}

/// Reads the nodes' answers, as the module docs say. `quorum` is `N / 2 + 1` for the
/// `N = seen.len()` nodes.
pub(crate) fn read<H: Eq + Clone>(seen: &[Seen<H>], quorum: usize) -> Reading<H> {
    let quorum = quorum.max(1);
    // Each distinct holder with the TTLs of its keys, in order of first appearance.
    let mut holders: Vec<(&H, Vec<Option<Duration>>)> = Vec::new();
    let mut free = 0;
    for s in seen {
        match s {
            Seen::Free => free += 1,
            Seen::Held { holder, ttl } => match holders.iter_mut().find(|(h, _)| *h == holder) {
                Some((_, ttls)) => ttls.push(*ttl),
                None => holders.push((holder, vec![*ttl])),
            },
            Seen::Unknown => {}
        }
    }
    if let Some((holder, ttls)) = holders.into_iter().find(|(_, t)| t.len() >= quorum) {
        return Reading::Held {
            holder: holder.clone(),
            nodes: ttls.len(),
            ttl: quorum_ttl(ttls, quorum),
        };
    }
    if free >= quorum {
        return Reading::Free { nodes: free };
    }
    Reading::Unknown
}

/// What one node said about a read-write lock or a semaphore: its live entries, or
/// nothing (failed or timed out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entries<H> {
    /// The node answered. `writer`: the writer key, if any, with its TTL (`None`: no
    /// expiry; always `None` for a semaphore). `members`: the live readers or permits, each
    /// with its remaining TTL.
    Answered {
        /// The writer key's value and TTL (read-write locks only).
        writer: Option<(H, Option<Duration>)>,
        /// The live sorted-set members and their remaining TTLs.
        members: Vec<(H, Duration)>,
    },
    /// The node failed or timed out.
    Unknown,
}

/// What the nodes together say about a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RwReading<H> {
    /// The writer's key is on at least a quorum of nodes.
    Write {
        /// The writer.
        holder: H,
        /// On how many nodes its key is.
        nodes: usize,
        /// How long it stays on a quorum if nothing changes (`None`: forever).
        ttl: Option<Duration>,
    },
    /// At least one reader is on a quorum of nodes.
    Read {
        /// How many readers are on a quorum.
        readers: usize,
        /// On how many nodes at least one of them is.
        nodes: usize,
        /// The longest of their quorum TTLs.
        ttl: Duration,
    },
    /// Neither a writer nor a reader on at least a quorum of nodes.
    Free {
        /// On how many nodes there is neither.
        nodes: usize,
    },
    /// Neither: too few answers, or a split.
    Unknown,
}

/// What the nodes together say about a semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SemReading {
    /// At least one holder is on the semaphore's quorum of nodes.
    Held {
        /// How many holders are.
        holders: usize,
        /// The longest of their quorum TTLs.
        ttl: Duration,
    },
    /// At least `N − Qs + 1` nodes have no live entry: no holder fits.
    Free {
        /// How many nodes have no live entry.
        nodes: usize,
    },
    /// Neither.
    Unknown,
}

/// The members on at least `quorum` nodes, each with its node count and quorum TTL, in
/// order of first appearance.
fn quorum_members<H: Eq>(seen: &[Entries<H>], quorum: usize) -> Vec<(&H, usize, Duration)> {
    let mut all: Vec<(&H, Vec<Option<Duration>>)> = Vec::new();
    for s in seen {
        let Entries::Answered { members, .. } = s else {
            continue;
        };
        for (m, ttl) in members {
            match all.iter_mut().find(|(h, _)| *h == m) {
                Some((_, ttls)) => ttls.push(Some(*ttl)),
                None => all.push((m, vec![Some(*ttl)])),
            }
        }
    }
    all.into_iter()
        .filter(|(_, ttls)| ttls.len() >= quorum)
        .map(|(h, ttls)| {
            let nodes = ttls.len();
            (h, nodes, quorum_ttl(ttls, quorum).unwrap_or_default())
        })
        .collect()
}

/// Reads a read-write lock, as the module docs say. `quorum` is `N / 2 + 1`.
pub(crate) fn read_rw<H: Eq + Clone>(seen: &[Entries<H>], quorum: usize) -> RwReading<H> {
    let quorum = quorum.max(1);
    let writers: Vec<Seen<&H>> = seen
        .iter()
        .map(|s| match s {
            Entries::Answered {
                writer: Some((h, ttl)),
                ..
            } => Seen::Held {
                holder: h,
                ttl: *ttl,
            },
            Entries::Answered { writer: None, .. } => Seen::Free,
            Entries::Unknown => Seen::Unknown,
        })
        .collect();
    if let Reading::Held { holder, nodes, ttl } = read(&writers, quorum) {
        return RwReading::Write {
            holder: holder.clone(),
            nodes,
            ttl,
        };
    }
    let readers = quorum_members(seen, quorum);
    if !readers.is_empty() {
        let nodes = seen
            .iter()
            .filter(|s| match s {
                Entries::Answered { members, .. } => members
                    .iter()
                    .any(|(m, _)| readers.iter().any(|(r, _, _)| *r == m)),
                Entries::Unknown => false,
            })
            .count();
        let ttl = readers.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
        return RwReading::Read {
            readers: readers.len(),
            nodes,
            ttl,
        };
    }
    let free = seen
        .iter()
        .filter(|s| matches!(s, Entries::Answered { writer: None, members } if members.is_empty()))
        .count();
    if free >= quorum {
        return RwReading::Free { nodes: free };
    }
    RwReading::Unknown
}

/// Reads a semaphore whose holders need `quorum` grants (its own quorum, at least the
/// majority of the `seen.len()` nodes), as the module docs say.
pub(crate) fn read_semaphore<H: Eq>(seen: &[Entries<H>], quorum: usize) -> SemReading {
    let quorum = quorum.max(1);
    let holders = quorum_members(seen, quorum);
    if !holders.is_empty() {
        let ttl = holders.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
        return SemReading::Held {
            holders: holders.len(),
            ttl,
        };
    }
    let free = seen
        .iter()
        .filter(|s| matches!(s, Entries::Answered { members, .. } if members.is_empty()))
        .count();
    if free > seen.len().saturating_sub(quorum) {
        return SemReading::Free { nodes: free };
    }
    SemReading::Unknown
}

/// The `quorum`-th longest of `ttls` (`None`, no expiry, is the longest). `None` too when
/// there are fewer than `quorum` of them (never, when called from [`read`]).
fn quorum_ttl(mut ttls: Vec<Option<Duration>>, quorum: usize) -> Option<Duration> {
    // Longest first: no expiry, then the largest TTLs.
    ttls.sort_unstable_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(x),
    });
    ttls.get(quorum.saturating_sub(1)).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held(h: u8, ms: u64) -> Seen<u8> {
        Seen::Held {
            holder: h,
            ttl: Some(Duration::from_millis(ms)),
        }
    }

    const fn quorum(n: usize) -> usize {
        n / 2 + 1
    }

    #[test]
    fn examples() {
        use Seen::{Free, Unknown};
        let ms = |m| Some(Duration::from_millis(m));
        // Held on all five, TTLs 100..500: the quorum holds until the third longest.
        let all = [
            held(1, 100),
            held(1, 500),
            held(1, 300),
            held(1, 200),
            held(1, 400),
        ];
        assert_eq!(
            read(&all, 3),
            Reading::Held {
                holder: 1,
                nodes: 5,
                ttl: ms(300)
            }
        );
        // Held on a minority, free on the rest: free.
        let minority = [held(1, 100), held(1, 100), Free, Free, Free];
        assert_eq!(read(&minority, 3), Reading::Free { nodes: 3 });
        // A split: two holders and a free node, none on a quorum.
        let split = [held(1, 100), held(1, 100), held(2, 100), held(2, 100), Free];
        assert_eq!(read(&split, 3), Reading::Unknown);
        // Too few answers.
        let down: [Seen<u8>; 5] = [Free, Free, Unknown, Unknown, Unknown];
        assert_eq!(read(&down, 3), Reading::Unknown);
        let down = [held(1, 9), held(1, 9), Unknown, Unknown, Unknown];
        assert_eq!(read(&down, 3), Reading::Unknown);
        // Exactly a quorum answered and agree.
        let three = [held(1, 9), held(1, 7), held(1, 8), Unknown, Unknown];
        assert_eq!(
            read(&three, 3),
            Reading::Held {
                holder: 1,
                nodes: 3,
                ttl: ms(7)
            }
        );
    }

    #[test]
    fn keys_without_expiry_count_as_the_longest() {
        let forever = [
            Seen::Held {
                holder: 1,
                ttl: None,
            },
            Seen::Held {
                holder: 1,
                ttl: None,
            },
            held(1, 5),
        ];
        assert_eq!(
            read(&forever, 2),
            Reading::Held {
                holder: 1,
                nodes: 3,
                ttl: None
            }
        );
        assert_eq!(read::<u8>(&[], 1), Reading::Unknown);
    }

    fn entries(writer: Option<u8>, members: &[(u8, u64)]) -> Entries<u8> {
        Entries::Answered {
            writer: writer.map(|w| (w, Some(Duration::from_millis(50)))),
            members: members
                .iter()
                .map(|(m, ms)| (*m, Duration::from_millis(*ms)))
                .collect(),
        }
    }

    #[test]
    fn read_write_examples() {
        let ms = Duration::from_millis;
        let free = entries(None, &[]);
        let u = Entries::Unknown;
        // Two readers on every node; the lock stays read-held until the longer one goes.
        let two = entries(None, &[(1, 100), (2, 300)]);
        assert_eq!(
            read_rw(&vec![two.clone(); 5], 3),
            RwReading::Read {
                readers: 2,
                nodes: 5,
                ttl: ms(300)
            }
        );
        // A reader on a minority only: free.
        let v = [
            entries(None, &[(1, 9)]),
            free.clone(),
            free.clone(),
            free.clone(),
            free.clone(),
        ];
        assert_eq!(read_rw(&v, 3), RwReading::Free { nodes: 4 });
        // A writer on four of five.
        let w = entries(Some(7), &[]);
        let v = [w.clone(), w.clone(), w.clone(), w.clone(), u.clone()];
        assert!(matches!(
            read_rw(&v, 3),
            RwReading::Write {
                holder: 7,
                nodes: 4,
                ..
            }
        ));
        // Two nodes answered: unknown, whatever they say.
        let v = [two.clone(), two, u.clone(), u.clone(), u.clone()];
        assert_eq!(read_rw(&v, 3), RwReading::Unknown);
        let v = [free.clone(), free, u.clone(), u.clone(), u];
        assert_eq!(read_rw(&v, 3), RwReading::Unknown);
    }

    #[test]
    fn semaphore_examples() {
        let ms = Duration::from_millis;
        let free = entries(None, &[]);
        let u = Entries::Unknown;
        // P = 2 on 5 nodes, quorum 4: two holders, each on four nodes.
        let v = [
            entries(None, &[(1, 100), (2, 200)]),
            entries(None, &[(1, 100), (2, 200)]),
            entries(None, &[(1, 100), (2, 200)]),
            entries(None, &[(1, 100)]),
            entries(None, &[(2, 200)]),
        ];
        assert_eq!(
            read_semaphore(&v, 4),
            SemReading::Held {
                holders: 2,
                ttl: ms(200)
            }
        );
        // With quorum 4, two empty nodes leave no room for a holder: free.
        let v = [free.clone(), free.clone(), u.clone(), u.clone(), u.clone()];
        assert_eq!(read_semaphore(&v, 4), SemReading::Free { nodes: 2 });
        // With the majority, two empty nodes are not enough.
        assert_eq!(read_semaphore(&v, 3), SemReading::Unknown);
        // A holder on three of five answering nodes, quorum 4: unknown.
        let one = entries(None, &[(1, 100)]);
        let v = [one.clone(), one.clone(), one, free, u];
        assert_eq!(read_semaphore(&v, 4), SemReading::Unknown);
    }

    fn seen() -> impl Strategy<Value = Seen<u8>> {
        prop_oneof![
            Just(Seen::Free),
            Just(Seen::Unknown),
            (0u8..3, prop::option::of(0u64..50)).prop_map(|(holder, ms)| Seen::Held {
                holder,
                ttl: ms.map(Duration::from_millis),
            }),
        ]
    }

    /// The naive oracle: count every candidate separately.
    fn oracle(seen: &[Seen<u8>], q: usize) -> Reading<u8> {
        for h in 0u8..3 {
            let ttls: Vec<Option<Duration>> = seen
                .iter()
                .filter_map(|s| match s {
                    Seen::Held { holder, ttl } if *holder == h => Some(*ttl),
                    _ => None,
                })
                .collect();
            if ttls.len() >= q {
                // The largest t such that at least q keys last at least t.
                let at_least = |t: Option<Duration>| {
                    ttls.iter()
                        .filter(|x| match (x, t) {
                            (None, _) => true,
                            (Some(_), None) => false,
                            (Some(x), Some(t)) => *x >= t,
                        })
                        .count()
                };
                let ttl = if at_least(None) >= q {
                    None
                } else {
                    ttls.iter()
                        .flatten()
                        .copied()
                        .filter(|t| at_least(Some(*t)) >= q)
                        .max()
                };
                return Reading::Held {
                    holder: h,
                    nodes: ttls.len(),
                    ttl,
                };
            }
        }
        let free = seen.iter().filter(|s| **s == Seen::Free).count();
        if free >= q {
            Reading::Free { nodes: free }
        } else {
            Reading::Unknown
        }
    }

    proptest! {
        /// The rule agrees with the naive oracle, whatever the node count and answers.
        #[test]
        fn agrees_with_the_oracle(v in prop::collection::vec(seen(), 0..10)) {
            let q = quorum(v.len());
            prop_assert_eq!(read(&v, q), oracle(&v, q));
        }

        /// The order in which nodes are listed does not matter.
        #[test]
        fn order_does_not_matter(
            v in prop::collection::vec(seen(), 1..10),
            rot in 0usize..10,
        ) {
            let q = quorum(v.len());
            let mut w = v.clone();
            w.rotate_left(rot % v.len());
            w.reverse();
            prop_assert_eq!(read(&v, q), read(&w, q));
        }

        /// A quorum reading is sound: held means that holder is on ≥ Q nodes (so no one
        /// else can be, and fewer than Q are free); free means ≥ Q free nodes.
        #[test]
        fn quorum_readings_are_sound(v in prop::collection::vec(seen(), 0..10)) {
            let q = quorum(v.len());
            let free = v.iter().filter(|s| **s == Seen::Free).count();
            match read(&v, q) {
                Reading::Held { holder, nodes, ttl } => {
                    let mine: Vec<Option<Duration>> = v.iter().filter_map(|s| match s {
                        Seen::Held { holder: h, ttl } if *h == holder => Some(*ttl),
                        _ => None,
                    }).collect();
                    prop_assert_eq!(nodes, mine.len());
                    prop_assert!(nodes >= q);
                    prop_assert!(free < q);
                    // At least Q keys last `ttl`, and fewer than Q last longer.
                    let lasts = |x: &Option<Duration>| match (x, ttl) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        (Some(x), Some(t)) => *x >= t,
                    };
                    prop_assert!(mine.iter().filter(|x| lasts(x)).count() >= q);
                    if let Some(t) = ttl {
                        let longer = mine.iter().filter(|x| match x {
                            None => true,
                            Some(x) => *x > t,
                        }).count();
                        prop_assert!(longer < q);
                    }
                }
                Reading::Free { nodes } => {
                    prop_assert_eq!(nodes, free);
                    prop_assert!(nodes >= q);
                }
                Reading::Unknown => prop_assert!(free < q),
            }
        }

        /// More answers never turn a quorum reading around: replacing the nodes that did
        /// not answer by any answers keeps a `Held` (same holder) or a `Free` reading.
        #[test]
        fn more_answers_never_reverse_a_quorum_reading(
            v in prop::collection::vec(seen(), 1..10),
            fill in prop::collection::vec(seen(), 10),
        ) {
            let q = quorum(v.len());
            let filled: Vec<Seen<u8>> = v.iter().zip(&fill).map(|(s, f)| match s {
                Seen::Unknown => f.clone(),
                s => s.clone(),
            }).collect();
            match (read(&v, q), read(&filled, q)) {
                (Reading::Held { holder: a, .. }, Reading::Held { holder: b, .. }) => {
                    prop_assert_eq!(a, b)
                }
                (Reading::Held { .. }, other) => prop_assert!(false, "held became {other:?}"),
                (Reading::Free { .. }, Reading::Free { .. }) => {}
                (Reading::Free { .. }, other) => prop_assert!(false, "free became {other:?}"),
                (Reading::Unknown, _) => {}
            }
        }
    }
}
