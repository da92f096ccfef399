//! Direct hand-off (transfer): when a waiter that learns of transfers holds the lock, and
//! for how long. Pure rules; the waiter supplies its confirmation times and what it heard.
//!
//! A release with waiters hands the key, on each node, to the queue's head: it sets the
//! key to the head's token with the head's TTL. The waiter never sees that instant. What
//! it knows, per node `i`, is its *confirmation time* `s_i`: the send time (its own
//! clock) of the latest queue request carrying its token to node `i` whose reply said the
//! token was still queued there; before any such reply, the send time of the first
//! request that carried the token there. A token is queued at most once per node, so any
//! transfer to it on node `i` ran after `s_i`, and the key it set expires no earlier than
//! `s_i + ttl` (node clock), `s_i + ttl − drift` on the waiter's clock.
//!
//! ```text
//!   counted nodes' s_i ──start_of(q)──▶ start = q-th largest s_i ──validity──▶ ttl − (now − start) − drift
//! ```
//!
//! With `q` counted nodes, each key lasts at least until its own `s_i + ttl − drift`; a
//! quorum of keys lasts at least until the *smallest* of any `q` of those, and the best
//! choice of `q` among the counted nodes is the `q` largest: `start` is the `q`-th
//! largest `s_i`.

use std::time::Duration;

use super::tally;
use super::time::Moment;

/// The start of a hand-off's validity: the `q`-th largest confirmation time among the
/// counted nodes, or `None` when fewer than `q` (or `q == 0`) were counted.
pub(crate) fn start_of<T: Moment>(counted: &[T], q: usize) -> Option<T> {
    if q == 0 || counted.len() < q {
        return None;
    }
    let mut sorted = counted.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.get(q - 1).copied()
}

/// The validity a hand-off gives at `now`: `ttl − (now − start) − drift` with `start`
/// from [`start_of`] (the same formula as an acquisition's, the attempt's start replaced
/// by `start`), or `None` when fewer than `q` nodes were counted. Zero when spent.
pub(crate) fn validity<T: Moment>(
    counted: &[T],
    q: usize,
    now: T,
    ttl: Duration,
    drift_factor: f64,
) -> Option<Duration> {
    let start = start_of(counted, q)?;
    Some(tally::validity(
        ttl,
        now.since(start),
        tally::drift(ttl, drift_factor),
    ))
}

/// Whether a hand-off makes the waiter hold: a quorum counted and the validity strictly
/// above the configured minimum (as for an acquisition).
pub(crate) fn holds(validity: Option<Duration>, min_validity: Duration) -> bool {
    validity.is_some_and(|v| v > min_validity)
}

/// What a queue reply (`enqueue.lua`'s state and `holds`) means for a waiter's token on
/// that node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The token is (still) queued there: the request's send time is the node's new
    /// confirmation time.
    Confirm,
    /// The key there holds the token (a transfer whose announcement we may have missed):
    /// count the node.
    Count,
    /// The token is gone there and the key does not hold it, on a node not counted: the
    /// token is retired.
    Retire,
    /// Nothing to do (no answer; or gone on a node already counted).
    Nothing,
}

/// A queue reply's state (`enqueue.lua`: 0 queued, 1 added, 2 gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Queued,
    Added,
    Gone,
}

/// What a reply to a join or renewal of the waiter's current token on one node means
/// (`None`: no answer, or an unreadable one). `counted`: that node was already counted.
/// A reply saying the key holds the token counts, whatever the state; a `gone` without it
/// retires the token unless the node was counted (a transfer heard there, and its key
/// then lapsed or was passed on: nothing to learn).
pub(crate) fn on_reply(reply: Option<(State, bool)>, counted: bool) -> Reply {
    match reply {
        None => Reply::Nothing,
        Some((_, true)) => Reply::Count,
        Some((State::Queued | State::Added, false)) => Reply::Confirm,
        Some((State::Gone, false)) if counted => Reply::Nothing,
        Some((State::Gone, false)) => Reply::Retire,
    }
}

/// What a transfer announcement naming one of this waiter's tokens means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// The current token, on a node it was sent to, no attempt in flight: count the node.
    Count,
    /// The current token while an attempt with it is in flight: noted (counted after the
    /// attempt only if the token is not retired by then).
    Note,
    /// A retired token (or one never sent to that node): release it on that node at once,
    /// so the transfer is passed on.
    PassOn,
}

/// What an announcement of a transfer to `current` (else a retired token of this waiter)
/// means; `sent`: a queue request with the current token went to that node.
pub(crate) fn on_transfer(current: bool, sent: bool, in_flight: bool) -> Heard {
    match (current && sent, in_flight) {
        (false, _) => Heard::PassOn,
        (true, true) => Heard::Note,
        (true, false) => Heard::Count,
    }
}

/// Whether a waiter with `counted` of `q` nodes counted makes its own claim now: when the
/// fallback timer fired, or when some but fewer than `q` were counted and the hand-off
/// window since the first count passed (a release that reached only some nodes, or
/// announcements lost).
pub(crate) fn claims(counted: usize, q: usize, window_passed: bool, fallback: bool) -> bool {
    if counted >= q && q > 0 {
        return false;
    }
    fallback || (counted > 0 && window_passed)
}

/// Whether a failed claim with the current token retires it. Not when every node answered
/// and refused: then no node granted and no clean-up release was sent anywhere, so the
/// token's queue entries and confirmation times are exactly as before the claim (a claim
/// is not a queue request). Any grant, failure or timeout sends a release of the token to
/// that node (the attempt's clean-up), which drops its entry there: retired.
pub(crate) fn retires_after_claim(all_refused: bool) -> bool {
    !all_refused
}

/// Parses a transfer announcement, `<release id>:>:<token>[:<fence>]`: the token and the
/// fence value (absent, or unreadable, for an unfenced transfer). `None` for any other
/// announcement.
pub(crate) fn parse_transfer(payload: &[u8]) -> Option<(&[u8], Option<u64>)> {
    let mut parts = payload.split(|b| *b == b':');
    let _id = parts.next()?;
    if parts.next()? != b">" {
        return None;
    }
    let token = parts.next().filter(|t| !t.is_empty())?;
    let fence = parts
        .next()
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|f| f.parse::<u64>().ok())
        .filter(|f| *f > 0);
    Some((token, fence))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn start_is_the_qth_largest() {
        let s = [ms(10), ms(40), ms(20), ms(30), ms(0)];
        assert_eq!(start_of(&s, 1), Some(ms(40)));
        assert_eq!(start_of(&s, 3), Some(ms(20)));
        assert_eq!(start_of(&s, 5), Some(ms(0)));
        assert_eq!(start_of(&s, 6), None);
        assert_eq!(start_of(&s, 0), None);
        assert_eq!(start_of::<Duration>(&[], 1), None);
    }

    #[test]
    fn validity_from_the_start() {
        // ttl 1000 ms, drift 2 ms (factor 0): counted at 100, 300, 200 ms; q = 2 → start
        // 200 ms; at 250 ms: 1000 − 50 − 2.
        let s = [ms(100), ms(300), ms(200)];
        assert_eq!(validity(&s, 2, ms(250), ms(1000), 0.0), Some(ms(948)));
        assert_eq!(validity(&s, 4, ms(250), ms(1000), 0.0), None);
        // Long after: spent, never negative.
        assert_eq!(
            validity(&s, 2, ms(5000), ms(1000), 0.0),
            Some(Duration::ZERO)
        );
        assert!(holds(Some(ms(948)), ms(0)));
        assert!(!holds(Some(Duration::ZERO), ms(0)));
        assert!(!holds(None, ms(0)));
        // A start after now (a confirmation taken after the clock reading) counts as no
        // time elapsed.
        assert_eq!(validity(&s, 1, ms(250), ms(1000), 0.0), Some(ms(998)));
    }

    #[test]
    fn replies() {
        use State::*;
        assert_eq!(on_reply(None, false), Reply::Nothing);
        assert_eq!(on_reply(Some((Queued, false)), false), Reply::Confirm);
        assert_eq!(on_reply(Some((Added, false)), false), Reply::Confirm);
        assert_eq!(on_reply(Some((Gone, true)), false), Reply::Count);
        assert_eq!(on_reply(Some((Gone, false)), false), Reply::Retire);
        assert_eq!(on_reply(Some((Gone, false)), true), Reply::Nothing);
    }

    #[test]
    fn transfers_and_claims() {
        assert_eq!(on_transfer(true, true, false), Heard::Count);
        assert_eq!(on_transfer(true, true, true), Heard::Note);
        assert_eq!(on_transfer(false, true, false), Heard::PassOn);
        assert_eq!(on_transfer(true, false, false), Heard::PassOn);
        assert!(!claims(0, 2, true, false));
        assert!(claims(1, 2, true, false));
        assert!(!claims(1, 2, false, false));
        assert!(claims(0, 2, false, true));
        assert!(!claims(2, 2, true, true));
        assert!(retires_after_claim(false));
        assert!(!retires_after_claim(true));
        assert_eq!(
            parse_transfer(b"abcdefgh:>:tok:42"),
            Some((&b"tok"[..], Some(42)))
        );
        assert_eq!(parse_transfer(b"abcdefgh:>:tok"), Some((&b"tok"[..], None)));
        assert_eq!(
            parse_transfer(b"abcdefgh:>:tok:0"),
            Some((&b"tok"[..], None))
        );
        assert_eq!(parse_transfer(b"abcdefgh:tok"), None);
        assert_eq!(parse_transfer(b"abcdefgh"), None);
        assert_eq!(parse_transfer(b"abcdefgh:>:"), None);
    }

    proptest! {

        /// A reply saying the key holds the token always counts; a counted node is never a
        /// reason to retire; a node is never both confirmed and counted by one reply.
        #[test]
        fn replies_never_retire_a_counted_node(state in 0u8..3, holds in any::<bool>(), counted in any::<bool>(), none in any::<bool>()) {
            let st = match state { 0 => State::Queued, 1 => State::Added, _ => State::Gone };
            let r = on_reply((!none).then_some((st, holds)), counted);
            if none { prop_assert_eq!(r, Reply::Nothing); }
            if holds && !none { prop_assert_eq!(r, Reply::Count); }
            if counted { prop_assert_ne!(r, Reply::Retire); }
            if r == Reply::Confirm { prop_assert!(st != State::Gone && !holds); }
        }

        /// A claim is never made once a quorum is counted, and an announcement of a token
        /// that is not current (retired) is never counted.
        #[test]
        fn no_claim_at_quorum_no_count_when_retired(counted in 0usize..6, q in 1usize..6, w in any::<bool>(), f in any::<bool>(), sent in any::<bool>(), fl in any::<bool>()) {
            if counted >= q { prop_assert!(!claims(counted, q, w, f)); }
            prop_assert_eq!(on_transfer(false, sent, fl), Heard::PassOn);
        }
        /// Safety: the validity never exceeds what some q counted keys guarantee together
        /// (ttl − (now − min s_i over those q) − drift: each key lasts until its own
        /// s_i + ttl − drift); and it is exactly the best such guarantee.
        #[test]
        fn never_beyond_what_q_keys_guarantee(
            s in prop::collection::vec(0u64..10_000, 1..8),
            q in 1usize..8,
            now in 0u64..20_000,
            ttl in 0u64..10_000,
            factor in 0.0f64..0.1,
        ) {
            let s: Vec<Duration> = s.into_iter().map(ms).collect();
            let (now, ttl) = (ms(now), ms(ttl));
            let v = validity(&s, q, now, ttl, factor);
            prop_assert_eq!(v.is_some(), q <= s.len());
            if let Some(v) = v {
                let drift = tally::drift(ttl, factor);
                let n = s.len();
                // The best guarantee over every choice of q counted nodes (bit masks).
                let best = (0u32..(1 << n))
                    .filter(|m| m.count_ones() as usize == q)
                    .map(|m| {
                        let min = (0..n).filter(|i| m & (1 << i) != 0).map(|i| s[i]).min().unwrap();
                        ttl.saturating_sub(now.saturating_sub(min)).saturating_sub(drift)
                    })
                    .max()
                    .unwrap();
                prop_assert!(v <= best);
                prop_assert_eq!(v, best);
                prop_assert!(v <= ttl);
            }
        }
    }
}
