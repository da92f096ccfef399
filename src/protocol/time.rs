//! Time as an input: the arithmetic the protocol does on the instants it is given.
//!
//! The protocol never reads a clock. An instant is any [`Moment`]: the I/O layers pass
//! the process's monotonic clock (`crate::base::time` implements it for the standard and the
//! Tokio instant), a simulator or a test passes a `Duration` since its own start. Every
//! sum saturates in the direction that is safe for what it computes:
//!
//! ```text
//!   later(at, d)                at + d, or at + FAR, or at   timers and give-up times ("never" stays far)
//!   earlier_of_overflow(at, d)  at + d, or at                validity deadlines (overflow looks expired)
//!   before(at, d)               at − d, or at                fire times ahead of a deadline
//! ```

use std::time::Duration;

/// About 30 years: the stand-in for "never" when an instant would overflow.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// An instant on some monotonic clock the caller reads.
pub(crate) trait Moment: Copy + Ord {
    /// `self + d`, or `None` when that is not representable.
    fn plus(self, d: Duration) -> Option<Self>;
    /// `self − d`, or `None` when that is not representable.
    fn minus(self, d: Duration) -> Option<Self>;
    /// `self − earlier`, zero when `earlier` is later.
    fn since(self, earlier: Self) -> Duration;
}

/// A `Duration` is an instant measured from an origin of the caller's choosing.
impl Moment for Duration {
    fn plus(self, d: Duration) -> Option<Duration> {
        self.checked_add(d)
    }
    fn minus(self, d: Duration) -> Option<Duration> {
        self.checked_sub(d)
    }
    fn since(self, earlier: Duration) -> Duration {
        self.saturating_sub(earlier)
    }
}

/// `at + d` for a timer or a give-up time: when that overflows, `at + FAR` (or `at`
/// itself when even that does), so a huge duration means "practically never", not a panic.
pub(crate) fn later<T: Moment>(at: T, d: Duration) -> T {
    at.plus(d).or_else(|| at.plus(FAR)).unwrap_or(at)
}

/// `at + d` for a validity deadline: on overflow, `at` itself, so an overflow can only
/// make a lock look shorter (expired), never valid for longer than it is.
pub(crate) fn earlier_of_overflow<T: Moment>(at: T, d: Duration) -> T {
    at.plus(d).unwrap_or(at)
}

/// `at − d` for a time that must come no later than `at` (a signal ahead of a deadline):
/// `at` itself when that underflows.
pub(crate) fn before<T: Moment>(at: T, d: Duration) -> T {
    at.minus(d).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edges() {
        let at = Duration::from_secs(5);
        assert_eq!(later(at, Duration::from_secs(1)), Duration::from_secs(6));
        assert_eq!(later(at, Duration::MAX), at + FAR);
        assert_eq!(later(Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(earlier_of_overflow(at, Duration::MAX), at);
        assert_eq!(before(at, Duration::from_secs(6)), at);
        assert_eq!(before(at, Duration::from_secs(2)), Duration::from_secs(3));
        assert_eq!(at.since(Duration::from_secs(9)), Duration::ZERO);
    }

    proptest! {
        /// Timers are never earlier than asked unless the sum overflows (then "far", or the
        /// instant itself when even that overflows), validity deadlines never later than
        /// asked (on overflow, the start: the lock looks expired), and fire times never
        /// after their deadline. Instants and durations span the whole `Duration` range, so
        /// the overflow fallbacks are exercised, not only the exact sums.
        #[test]
        fn saturation_is_safe(
            at_s in prop_oneof![any::<u64>(), 0u64..1_000_000],
            at_ns in 0u32..1_000_000_000,
            d_s in prop_oneof![any::<u64>(), 0u64..1_000_000],
            d_ns in 0u32..1_000_000_000,
        ) {
            let (at, d) = (Duration::new(at_s, at_ns), Duration::new(d_s, d_ns));
            match at.checked_add(d) {
                Some(e) => {
                    prop_assert_eq!(later(at, d), e);
                    prop_assert_eq!(earlier_of_overflow(at, d), e);
                }
                None => {
                    prop_assert_eq!(later(at, d), at.checked_add(FAR).unwrap_or(at));
                    prop_assert_eq!(earlier_of_overflow(at, d), at);
                }
            }
            prop_assert!(later(at, d) >= at);
            prop_assert_eq!(before(at, d), at.checked_sub(d).unwrap_or(at));
            prop_assert!(before(at, d) <= at);
        }
    }
}
