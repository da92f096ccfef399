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

    proptest! {
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
