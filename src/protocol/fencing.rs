//! Fencing tokens: the rules of the two rounds, as pure functions.
//!
//! ```text
//!   round 1, per granting node:  counter ← max(counter + 1, node clock in µs)   (grant)
//!                                a counter that is not a plain decimal < 2^53 fails the vote
//!                                (parse_counter), before anything is written
//!   the client:                  t = max of the granted counters it has seen  (token)
//!   round 2, to every node that did not refuse round 1 (commit_to):
//!                                counter ← max(counter, t) where our token still holds the keys
//!   the token is usable iff any quorum confirms the commit                      (committed)
//! ```
//!
//! Why that orders holders: a later holder's granting quorum shares a node with an earlier
//! holder's commit quorum; there the counter was already at least the earlier `t`, so the
//! later grant is at least `t + 1`, and the later token, a maximum that includes it, is
//! larger. A node that lost its counters restarts with a clock past every earlier token
//! (the deployment contract), and the clock floor carries that over.
//!
//! The scripts (`acquire_fenced.lua`, `commit_fence.lua`) run the node's half of these
//! rules on the server; this module is the client's half and the reference the script and
//! the simulated node are compared with.

use super::reply::Reply;
use super::tally::{Ballot, Decision};

/// Counters (and tokens) stay below 2^53: exact as Lua numbers, which the scripts use.
pub(crate) const COUNTER_LIMIT: u64 = 1 << 53;

/// Why a stored fence counter is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the node's half of the rule: the script runs it on the server; this is its reference"
    )
)]
pub(crate) enum BadCounter {
    /// Not a plain decimal integer (a sign, spaces, an exponent, leading zeros, hex, text,
    /// more than 16 digits).
    NotInteger,
    /// A plain decimal, but not below 2^53.
    TooLarge,
}

/// Reads a stored fence counter the way the fenced acquire does: exactly `0` or a decimal
/// without sign, spaces, exponent or leading zeros, of at most 16 digits
/// ([`BadCounter::NotInteger`] otherwise), and below 2^53 ([`BadCounter::TooLarge`]).
/// Anything looser would pass Lua's `tonumber` and then make `INCR` fail after the lock
/// keys were set, or be rounded by Lua so that two holders could share a token.
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the node's half of the rule: the script runs it on the server; this is its reference"
    )
)]
pub(crate) fn parse_counter(raw: &[u8]) -> Result<u64, BadCounter> {
    let plain = raw == b"0"
        || (matches!(raw.first(), Some(b'1'..=b'9'))
            && raw.len() <= 16
            && raw.iter().all(u8::is_ascii_digit));
    if !plain {
        return Err(BadCounter::NotInteger);
    }
    let value = raw.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
    if value >= COUNTER_LIMIT {
        return Err(BadCounter::TooLarge);
    }
    Ok(value)
}

/// The counter a grant leaves on a node: one more than before, but at least the node's
/// clock in microseconds since the Unix epoch (the floor that keeps tokens rising on a node
/// that lost its counters).
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the node's half of the rule: the script runs it on the server; this is its reference"
    )
)]
pub(crate) fn grant(counter: u64, now_us: u64) -> u64 {
    counter.saturating_add(1).max(now_us)
}

/// A fenced grant's counter, as the node answered it, read as a token: in `1..2^53`,
/// else the answer is malformed (`None`): no grant yields 0 or more than 2^53 − 1.
pub(crate) fn token_of(counter: i64) -> Option<u64> {
    u64::try_from(counter)
        .ok()
        .filter(|t| (1..COUNTER_LIMIT).contains(t))
}

/// The token `t`: the largest counter among the grants seen when round 1 was decided.
pub(crate) fn token<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> u64 {
    replies
        .into_iter()
        .filter_map(|r| match r {
            Reply::Fenced(t) => Some(*t),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Whether round 2 goes to a node, given its round-1 answer (`None`: not answered yet).
/// Every node that did not refuse: a grant, but also a failure, a time-out or a request
/// still running may have set our key, and a commit there raises the counter (it follows
/// round 1 on the node's one connection). A node that refused holds another owner's key,
/// where a commit could only answer 0.
pub(crate) fn commit_to(round1: Option<&Reply>) -> bool {
    round1.is_none_or(|r| r.ballot() != Ballot::Refused)
}

/// The commit verdict: the token is usable iff a quorum confirmed the commit (any quorum,
/// not necessarily the nodes that granted first); otherwise the acquisition fails and is
/// released.
pub(crate) fn committed(round2: Decision) -> bool {
    round2 == Decision::Reached
}

#[cfg(test)]
mod tests {
    use super::super::tally::{Tally, quorum};
    use super::*;
    use proptest::prelude::*;

    /// The oracle for counters: the decimal text of a number below 2^53, as `u64`
    /// prints it, and nothing else.
    fn naive(raw: &[u8]) -> Option<u64> {
        let s = std::str::from_utf8(raw).ok()?;
        let v: u64 = s.parse().ok()?;
        (v.to_string() == s && v < COUNTER_LIMIT).then_some(v)
    }

    const SEEDS: &[(&[u8], Result<u64, BadCounter>)] = &[
        (b"0", Ok(0)),
        (b"7", Ok(7)),
        (b"9007199254740991", Ok(COUNTER_LIMIT - 1)),
        (b"9007199254740992", Err(BadCounter::TooLarge)),
        (b"9999999999999999", Err(BadCounter::TooLarge)),
        (b"10000000000000000", Err(BadCounter::NotInteger)),
        (b"", Err(BadCounter::NotInteger)),
        (b"007", Err(BadCounter::NotInteger)),
        (b"00", Err(BadCounter::NotInteger)),
        (b"+5", Err(BadCounter::NotInteger)),
        (b"-3", Err(BadCounter::NotInteger)),
        (b" 7", Err(BadCounter::NotInteger)),
        (b"7 ", Err(BadCounter::NotInteger)),
        (b"1e16", Err(BadCounter::NotInteger)),
        (b"1.5", Err(BadCounter::NotInteger)),
        (b"0x1f", Err(BadCounter::NotInteger)),
        (b"inf", Err(BadCounter::NotInteger)),
        (b"nan", Err(BadCounter::NotInteger)),
        (b"abc", Err(BadCounter::NotInteger)),
    ];

    #[test]
    fn seed_table() {
        for (raw, want) in SEEDS {
            assert_eq!(
                parse_counter(raw),
                *want,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        assert_eq!(grant(5, 3), 6);
        assert_eq!(grant(5, 1_000), 1_000);
        assert_eq!(grant(u64::MAX, 0), u64::MAX);
        assert_eq!(token_of(0), None);
        assert_eq!(token_of(-1), None);
        assert_eq!(token_of(1), Some(1));
        assert_eq!(token_of(1 << 53), None);
        let rs = [
            Reply::Fenced(4),
            Reply::HeldBy(None),
            Reply::Fenced(9),
            Reply::TimedOut,
        ];
        assert_eq!(token(&rs), 9);
        assert_eq!(token(&[Reply::Granted]), 0);
        assert!(commit_to(None));
        assert!(commit_to(Some(&Reply::TimedOut)));
        assert!(commit_to(Some(&Reply::Fenced(1))));
        assert!(!commit_to(Some(&Reply::HeldBy(None))));
        assert!(committed(Decision::Reached));
        assert!(!committed(Decision::Impossible));
    }

    /// Counter text: digits mostly, with the characters the script must refuse.
    fn counter_text() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (0u64..COUNTER_LIMIT + 1000).prop_map(|v| v.to_string().into_bytes()),
            prop::collection::vec(
                prop_oneof![
                    Just(b'0'),
                    Just(b'1'),
                    Just(b'9'),
                    Just(b' '),
                    Just(b'-'),
                    Just(b'+'),
                    Just(b'e'),
                    Just(b'.'),
                    Just(b'x')
                ],
                0..20
            ),
            prop::collection::vec(b'0'..=b'9', 15..19),
        ]
    }

    /// One holder's turn in the ordering model: which nodes grant (in order), how many of
    /// them decide round 1, which nodes confirm the commit, and how far each clock moves.
    #[derive(Debug, Clone)]
    struct Turn {
        order: Vec<usize>,
        commit: Vec<bool>,
        ticks: Vec<u64>,
        restart: Option<usize>,
    }

    fn turn(n: usize) -> impl Strategy<Value = Turn> {
        (
            Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(0u64..3, n),
            prop::option::of(0..n),
        )
            .prop_map(|(order, commit, ticks, restart)| Turn {
                order,
                commit,
                ticks,
                restart,
            })
    }

    proptest! {
        /// The strict parse accepts exactly the canonical decimals below 2^53.
        #[test]
        fn parse_matches_oracle(raw in counter_text()) {
            prop_assert_eq!(parse_counter(&raw).ok(), naive(&raw));
            if let Err(BadCounter::TooLarge) = parse_counter(&raw) {
                prop_assert!(naive(&raw).is_none());
                prop_assert!(std::str::from_utf8(&raw).ok().and_then(|s| s.parse::<u64>().ok()).is_some());
            }
        }

        /// A grant is always above the counter and at least the clock.
        #[test]
        fn grant_rises(c in any::<u64>(), now in any::<u64>()) {
            let g = grant(c, now);
            prop_assert!(g >= now);
            prop_assert!(g > c || c == u64::MAX);
        }

        /// Successive holders get strictly increasing tokens: each takes a quorum of grants
        /// (the first `Q` of a random order decide `t`, the others land later), commits to a
        /// random set of the nodes that did not refuse, and succeeds only when a quorum
        /// confirms. Nodes restart without their counters, with a clock past every token
        /// issued before (the deployment contract); clocks stand still or move forward.
        #[test]
        fn tokens_increase(n in 1usize..8, turns in prop::collection::vec(turn(7), 1..12)) {
            let q = quorum(n);
            let mut counters = vec![0u64; n];
            let mut clocks = vec![1_000u64; n];
            let mut last: Option<u64> = None;
            let mut highest = 0u64;
            for t in &turns {
                let order: Vec<usize> = t.order.iter().copied().filter(|i| *i < n).collect();
                if let Some(r) = t.restart.filter(|r| *r < n) {
                    counters[r] = 0;
                    clocks[r] = clocks[r].max(highest + 1);
                }
                for (c, tick) in clocks.iter_mut().zip(&t.ticks) {
                    *c += tick;
                }
                // Round 1: every node grants (the previous holder is gone), in `order`.
                let replies: Vec<Reply> = order.iter().map(|&i| {
                    counters[i] = grant(counters[i], clocks[i]);
                    Reply::Fenced(counters[i])
                }).collect();
                let tok = token(&replies[..q]);
                highest = highest.max(counters.iter().copied().max().unwrap_or(0));
                // Round 2: the confirming nodes raise their counters to t.
                let mut round2 = Tally::new(n, q);
                for (c, confirms) in counters.iter_mut().zip(&t.commit) {
                    prop_assert!(commit_to(Some(&Reply::Fenced(*c))));
                    if *confirms {
                        *c = (*c).max(tok);
                        round2.record(Ballot::Granted);
                    } else {
                        round2.record(Ballot::Failed);
                    }
                }
                if committed(round2.final_decision()) {
                    if let Some(prev) = last {
                        prop_assert!(tok > prev, "token {} after {}", tok, prev);
                    }
                    last = Some(tok);
                }
            }
        }
    }
}
