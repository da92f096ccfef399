//! Waiting strategies: retry after a random delay, wake on release announcements, or be
//! handed the lock.
//!
//! [`Redlock::lock`](crate::Redlock::lock) makes one attempt; if the resource is held (or
//! too few nodes answered) it waits and tries again, until the [`Retry`] policy's attempt
//! count or maximum wait is reached. Only attempts that were sent count. Four ways to
//! wait:
//!
//! * **Transfer** (a single resource, notify waiting: the default for the mutex): the
//!   waiter queues on every node under the token it will hold, a release hands the key to
//!   the queue's head inside the release script, and the waiter holds once it knows that
//!   a quorum of nodes did so, with no acquire round of its own. Releases are handed over
//!   in arrival order. That waiter lives in [`transfer`](crate::transfer); the rules are in
//!   [`protocol::handoff`](crate::protocol::handoff) and the argument in docs/safety.md
//!   ("Direct hand-off").
//! * **In order** (several resources, notify waiting): after one all-or-nothing attempt,
//!   the waiter takes the resources one at a time in their sorted order, each through its
//!   own wait queue as a single-resource waiter does (a *reservation*), then turns the
//!   reservations into one lock with an ordinary all-or-nothing round in which a key
//!   holding one of its reservations counts as free. It keeps its place on every resource,
//!   and since it only ever holds resources that sort before the one it waits for, no
//!   cycle of waiters can form. That waiter lives in [`ordered`](crate::ordered); the
//!   argument is in docs/safety.md ("Several resources: the ordered waiter"). Every
//!   release publishes on the resource's channel (`quorumlock:released:{name}`), which
//!   wakes the waiters of the resources it frees; the waiters of a
//!   [`Redlock`](crate::Redlock) share one subscription connection per node
//!   ([`Notifier`](crate::notifier::Notifier)).
//! * **Polling** (notify waiting off, read-write locks, semaphore permits:
//!   [`acquire_polling`]): an attempt, then a random delay from the policy's range. Jitter
//!   keeps contenders out of lock-step. Reader and permit releases announce nothing (a
//!   reader's release frees no one while other readers remain; a permit frees one slot of
//!   many), so there is nothing to listen for; a waiting writer's fairness comes from its
//!   intent instead (see `rwlock`).
//!
//! The rules waiters follow are functions of the protocol
//! ([`protocol::contention`](crate::protocol::contention),
//! [`protocol::handoff`](crate::protocol::handoff)): what a failed attempt's votes mean,
//! what an announcement means, when a releaser yields. The subscription connections and
//! the per-resource state they keep are in [`notifier`](crate::notifier).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::{Ask, acquire_as};
use crate::config::Retry;
use crate::error::{Error, Timeout, Votes};
use crate::lock::Lock;
use crate::protocol::contention;
pub use crate::protocol::contention::QUEUE_LEASE;
use crate::resource::{Kind, Resources};
use crate::shared::Inner;
pub(crate) use crate::time::jitter;
use crate::time::later;

/// Acquires a lock of any kind by polling, per `retry`: an attempt, then a random delay
/// from the policy's range, until granted, a failure that is not retryable, or the
/// policy's attempts or maximum wait running out ([`Error::Timeout`] with the last
/// attempt's votes). The attempts of a waiting writer carry its intent (in `ask`), and
/// come at least every third of the intent's lease, whatever the policy's delays
/// ([`contention::polling_delay`]), so the intent never lapses while it waits.
pub(crate) async fn acquire_polling(
    inner: &Arc<Inner>,
    res: &Resources,
    ask: &Ask,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    let start = Instant::now();
    let give_up_at = retry.max_wait.map(|d| later(start, d));
    let mut attempts: u32 = 0;
    let mut last: Option<Votes>;
    loop {
        attempts = attempts.saturating_add(1);
        match acquire_as(inner, res, ask, ttl, attempts).await {
            Ok(lock) => return crate::metrics::waited(start, Ok(lock)),
            Err(e) if !e.is_retryable() => return crate::metrics::waited(start, Err(e)),
            Err(e) => last = e.votes().cloned(),
        }
        if retry.attempts.is_some_and(|n| attempts >= n) {
            break;
        }
        let drawn = jitter(retry.delay_min, retry.delay_max);
        let mut delay = contention::polling_delay(drawn, !ask.intent.is_empty());
        if let Some(at) = give_up_at {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            delay = delay.min(left);
        }
        tokio::time::sleep(delay).await;
        if give_up_at.is_some_and(|at| Instant::now() >= at) {
            break;
        }
    }
    crate::metrics::waited(start, Err(Timeout::gave_up(start, attempts, last)))
}

/// Acquires an exclusive lock with retries, per `retry`: a single resource with notify
/// waiting waits by transfer ([`transfer`](crate::transfer)), several resources with
/// notify waiting in order ([`ordered`](crate::ordered)), and with notify waiting off
/// every lock polls ([`acquire_polling`]).
pub(crate) async fn acquire_waiting(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    if res.len() == 1
        && let Some(n) = &inner.notifier
    {
        // A single resource with notify waiting: hand-off by transfer.
        let yield_first = n.should_yield(res);
        let interest = n.interest(res);
        return crate::transfer::acquire(inner, res, ttl, retry, interest, yield_first).await;
    }
    if let Some(n) = &inner.notifier {
        // Several resources with notify waiting: in each resource's queue, in order.
        return crate::ordered::acquire(inner, n, res, ttl, retry).await;
    }
    // Notify waiting off: polling.
    let ask = Ask::new(Kind::Exclusive, inner.quorum);
    acquire_polling(inner, res, &ask, ttl, retry).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeSpec;

    fn votes(outcomes: &[crate::NodeOutcome], largest: Option<usize>) -> Votes {
        let addr = NodeSpec::parse(0, "redis://127.0.0.1:1").unwrap().addr;
        Votes {
            quorum: outcomes.len() / 2 + 1,
            votes: outcomes
                .iter()
                .map(|o| crate::NodeVote {
                    node: addr.clone(),
                    outcome: o.clone(),
                })
                .collect(),
            elapsed: Duration::ZERO,
            largest_holder: largest,
            holder_ids: Vec::new(),
        }
    }

    /// The votes reach the protocol's rule with the right counts.
    #[test]
    fn split_detection() {
        use crate::NodeOutcome::{Granted as G, HeldByOther as H, NotAwaited as N, TimedOut as T};
        assert!(votes(&[G, G, H, H, H], Some(2)).is_split());
        assert!(!votes(&[G, G, H, H, H], Some(3)).is_split());
        assert!(!votes(&[G, G, H, H, T], Some(2)).is_split());
        assert!(!votes(&[H, H, N, N, G], Some(2)).is_split());
        assert!(!votes(&[G, G, H, H, H], None).is_split());
        assert!(votes(&[H, H, H, G, G], Some(1)).is_split());
    }

    #[test]
    fn jitter_in_range() {
        for _ in 0..1000 {
            let d = jitter(Duration::from_millis(10), Duration::from_millis(20));
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
        }
        assert_eq!(
            jitter(Duration::from_millis(5), Duration::from_millis(5)),
            Duration::from_millis(5)
        );
        assert_eq!(jitter(Duration::ZERO, Duration::ZERO), Duration::ZERO);
        let _ = jitter(Duration::ZERO, Duration::MAX);
    }
}
