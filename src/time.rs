//! Saturating time arithmetic.
//!
//! Durations in this crate come from users (`Retry::delay(Duration::MAX, Duration::MAX)`,
//! `Redlock::flush(Duration::MAX)`) and from subtractions that may underflow. `Instant +
//! Duration` panics on overflow, so every instant the crate computes goes through these
//! helpers instead: a deadline that would overflow becomes "far in the future" (about 30
//! years: later than any lock or wait can matter, and still a valid timer for Tokio).
//!
//! Deadlines that bound a lock's *validity* never use the far-future fallback: they come
//! from [`earlier_of_overflow`], which falls back to the start instant, so an overflow can
//! only make a lock look shorter, never longer.

use std::time::{Duration, Instant};

/// About 30 years: the stand-in for "never" when an instant would overflow.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + d`, or `at + FAR` (or `at`) when that overflows. For timers and give-up times.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// The same for Tokio's clock.
pub(crate) fn later_tokio(at: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// `at + d` for a validity deadline: on overflow, `at` itself (the lock then looks expired
/// rather than valid for longer than it is).
pub(crate) fn earlier_of_overflow(at: Instant, d: Duration) -> Instant {
    at.checked_add(d).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_saturates_instead_of_panicking() {
        let now = Instant::now();
        let t = later(now, Duration::MAX);
        assert!(t > now + Duration::from_secs(86_400 * 365));
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        let tnow = tokio::time::Instant::now();
        assert!(later_tokio(tnow, Duration::MAX) > tnow + Duration::from_secs(86_400 * 365));
    }

    #[test]
    fn a_validity_deadline_that_overflows_is_no_later_than_its_start() {
        let now = Instant::now();
        assert_eq!(earlier_of_overflow(now, Duration::MAX), now);
        assert_eq!(
            earlier_of_overflow(now, Duration::from_millis(5)),
            now + Duration::from_millis(5)
        );
    }
}
