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
