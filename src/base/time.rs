//! Saturating time arithmetic on the process's clocks.
//!
//! Durations in this crate come from users (`Retry::delay(Duration::MAX, Duration::MAX)`,
//! `Redlock::flush(Duration::MAX)`) and from subtractions that may underflow. `Instant +
//! Duration` panics on overflow, so every instant the crate computes goes through the
//! protocol's saturating sums ([`crate::protocol::time`]), which this module applies to
//! the standard and the Tokio instant: a deadline that would overflow becomes "far in the
//! future" (about 30 years: later than any lock or wait can matter, and still a valid timer
//! for Tokio).
//!
//! Deadlines that bound a lock's *validity* never use the far-future fallback: they come
//! from [`earlier_of_overflow`], which falls back to the start instant, so an overflow can
//! only make a lock look shorter, never longer.

use std::time::{Duration, Instant};

use crate::protocol::time::Moment;
pub(crate) use crate::protocol::time::{earlier_of_overflow, later};

impl Moment for Instant {
    fn plus(self, d: Duration) -> Option<Instant> {
        self.checked_add(d)
    }
    fn minus(self, d: Duration) -> Option<Instant> {
        self.checked_sub(d)
    }
    fn since(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for tokio::time::Instant {
    fn plus(self, d: Duration) -> Option<tokio::time::Instant> {
        self.checked_add(d)
    }
    fn minus(self, d: Duration) -> Option<tokio::time::Instant> {
        self.checked_sub(d)
    }
    fn since(self, earlier: tokio::time::Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// A duration in whole milliseconds (truncated, saturating), for tracing fields such as
/// `ttl_ms` and `validity_ms`. Never a request argument: those are built in `node.rs`.
pub(crate) fn log_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole microseconds (truncated, saturating), for tracing fields.
pub(crate) fn log_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A random delay in `min..=max`.
pub(crate) fn jitter(min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
    let drawn = rand::RngExt::random_range(&mut rand::rng(), 0..=span);
    min.saturating_add(Duration::from_nanos(drawn))
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
        assert!(later(tnow, Duration::MAX) > tnow + Duration::from_secs(86_400 * 365));
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

    #[test]
    fn log_units() {
        assert_eq!(log_ms(Duration::from_micros(1_500)), 1);
        assert_eq!(log_ms(Duration::MAX), u64::MAX);
        assert_eq!(log_us(Duration::from_nanos(1_999)), 1);
    }
}
