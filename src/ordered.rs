//! The ordered waiter: a multi-resource mutex that waits in each resource's queue, one
//! resource at a time, in a fixed order (notify waiting; docs/safety.md, "Several
//! resources: the ordered waiter").
//!
//! ```text
//!   all-or-nothing attempt ──granted──▶ Lock
//!        │ refused
//!        ▼
//!   for r in sorted(resources): transfer waiter on r alone ──▶ reservation R_r (a held lock)
//!        │   (the reservations held so far are extended while the next one is awaited)
//!        ▼
//!   conversion: one all-or-nothing round over every key, where a key holding one of our
//!   reservations counts as free ──granted──▶ Lock (one token), reservations released
//!        │ refused
//!        ▼
//!   every reservation released ──▶ start again (until the retry budget is spent)
//! ```
//!
//! * **Fair.** Each resource is taken through its own wait queue, so the waiter keeps its
//!   place behind earlier waiters and ahead of later ones, on every resource, as a
//!   single-resource waiter does.
//! * **No deadlock.** A waiter holds only resources that sort before the one it waits
//!   for. Whoever holds that one either waits for nothing (an ordinary holder: it releases
//!   or its keys expire) or is an ordered waiter waiting for a resource that sorts later
//!   still. Following who-waits-for-whom, the resources strictly increase, so the chain
//!   ends, and no cycle can form. This assumes holders that do not themselves wait:
//!   callers that nest locks must take them in the same sorted order.
//! * **Safe by the ordinary argument.** The reservations only keep others off; the lock
//!   the caller gets comes from the conversion, an ordinary acquisition round (quorum,
//!   validity from the round's start, fencing rounds when fencing is on). A key that holds
//!   one of our reservation tokens counts as free in it because it is ours: tokens are
//!   random and only this waiter holds them. A reservation that lapsed, or a key someone
//!   else holds, makes the node refuse as for any acquisition.
//! * **Costs.** Waiting holds the reservations taken so far: a later waiter for those
//!   resources alone waits too (that is what keeps the place). A waiter that is dropped
//!   or gives up releases its reservations at once; one that crashes costs what a crashed
//!   holder costs, the TTL of each reservation (and its queue entries lapse with their
//!   lease).
//!
//! The order is the resources' sorted order: [`Resources`] keeps names sorted, so every
//! client agrees on it. It covers the resources of one call: a caller that holds one lock
//! and asks for another orders those calls itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::{Ask, acquire_as};
use crate::config::Retry;
use crate::error::{Error, Timeout, Votes};
use crate::lock::Lock;
use crate::notifier::Notifier;
use crate::resource::{Kind, Resources};
use crate::shared::Inner;
use crate::time::later;

/// What is left of the caller's retry budget.
struct Budget {
    start: Instant,
    give_up_at: Option<Instant>,
    attempts: u32,
    retry: Retry,
    last: Option<Votes>,
}

impl Budget {
    fn new(retry: &Retry) -> Budget {
        let start = Instant::now();
        Budget {
            start,
            give_up_at: retry.max_wait.map(|d| later(start, d)),
            attempts: 0,
            retry: *retry,
            last: None,
        }
    }

    fn spent(&self) -> bool {
        self.retry.attempts.is_some_and(|n| self.attempts >= n)
            || self.give_up_at.is_some_and(|at| Instant::now() >= at)
    }

    fn gave_up(&self) -> Error {
        Timeout::gave_up(self.start, self.attempts, self.last.clone())
    }

    /// The policy for one resource's wait: the caller's, within what is left of the
    /// maximum wait. `None` when nothing is left.
    fn step(&self) -> Option<Retry> {
        let max_wait = match self.give_up_at {
            Some(at) => Some(
                at.checked_duration_since(Instant::now())
                    .filter(|d| !d.is_zero())?,
            ),
            None => None,
        };
        Some(Retry {
            max_wait,
            ..self.retry
        })
    }
}

/// Acquires the multi-resource mutex `res` (two or more resources) with notify waiting:
/// an all-or-nothing attempt, then, while refused, reservations taken in order and a
/// conversion (see the module docs). The retry policy bounds the whole call: its maximum
/// wait covers every step; its attempt count bounds the all-or-nothing rounds (the first
/// attempt and the conversions), and each resource's own wait counts its attempts
/// against the same number (so `attempts(1)` is one all-or-nothing attempt, as
/// [`try_lock_many`](crate::Redlock::try_lock_many)).
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    n: &Notifier,
    res: &Resources,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    let mut b = Budget::new(retry);
    let result = acquire_in_order(inner, n, res, ttl, &mut b).await;
    crate::metrics::waited(b.start, result)
}

async fn acquire_in_order(
    inner: &Arc<Inner>,
    n: &Notifier,
    res: &Resources,
    ttl: Duration,
    b: &mut Budget,
) -> Result<Lock, Error> {
    let plain = Ask::new(Kind::Exclusive, inner.quorum);
    let mut first = true;
    // Released moments ago while others listened: no all-or-nothing attempt (a releaser is
    // always first to see the keys free, and would take them back before any waiter that
    // heard the release could claim); join every queue behind those waiters instead.
    let mut again = n.should_yield(res);
    loop {
        if first && !again {
            first = false;
            b.attempts = b.attempts.saturating_add(1);
            match acquire_as(inner, res, &plain, ttl, b.attempts).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => b.last = e.votes().cloned(),
            }
            if b.spent() {
                return Err(b.gave_up());
            }
        }
        let held = match reserve_all(inner, n, res, ttl, b, again).await {
            Ok(held) => held,
            Err(e) => return Err(e),
        };
        b.attempts = b.attempts.saturating_add(1);
        let ask = Ask {
            over: held.0.iter().map(|l| l.token_value().clone()).collect(),
            ..plain.clone()
        };
        let converted = acquire_as(inner, res, &ask, ttl, b.attempts).await;
        // Either way the reservations are done with. Converted, their keys hold the new
        // token, except on nodes that refused the conversion: there they are deleted
        // silently, not handed to the resource's next waiter (it would claim against the
        // converted lock); it hears that lock's release. Refused, they are released and
        // handed over, so that the others are not held up while we start again.
        if converted.is_ok() {
            held.converted();
        } else {
            drop(held);
        }
        match converted {
            Ok(lock) => {
                tracing::debug!(resource = %res.label(), "quorumlock: ordered waiter converted its reservations");
                return Ok(lock);
            }
            Err(e) if !e.is_retryable() => return Err(e),
            Err(e) => {
                tracing::debug!(resource = %res.label(), error = %e,
                    "quorumlock: ordered waiter's conversion refused; starting again");
                b.last = e.votes().cloned();
            }
        }
        again = true;
        if b.spent() {
            return Err(b.gave_up());
        }
    }
}

/// Takes a reservation on each resource in order, each through the resource's own wait
/// queue, extending those already held while the next is awaited. On failure (the budget
/// ran out, or an error that is not retryable) every reservation taken is released.
async fn reserve_all(
    inner: &Arc<Inner>,
    n: &Notifier,
    res: &Resources,
    ttl: Duration,
    b: &mut Budget,
    again: bool,
) -> Result<Reservations, Error> {
    let mut held = Reservations(Vec::with_capacity(res.len()));
    for name in res.names() {
        let Some(step) = b.step() else {
            return Err(b.gave_up());
        };
        let one = Resources::new(&[name.as_str()])?;
        // Starting again after a refused conversion, whose reservations were just handed
        // to the next waiters: join behind them rather than claim straight back.
        let yield_first = again || n.should_yield(&one);
        let interest = n.interest(&one);
        let wait = crate::transfer::acquire(inner, &one, ttl, &step, interest, yield_first);
        let taken = keep_alive(&mut held.0, crate::metrics::as_part(wait), ttl).await;
        match taken {
            Ok(lock) => held.0.push(lock),
            Err(e) => {
                drop(held);
                if !e.is_retryable() && !matches!(e, Error::Timeout(_)) {
                    return Err(e);
                }
                // The resource's wait ran out of the budget it was given: what was left.
                b.last = e.votes().cloned().or(b.last.take());
                return Err(b.gave_up());
            }
        }
    }
    Ok(held)
}

/// Awaits `wait`, extending each lock of `held` when a third of its TTL is left, so that
/// a long wait for the next resource does not lose the ones already taken. A lock found
/// lost is not extended again (the conversion will find out); one whose extension missed
/// a quorum (too few answers in time) keeps its deadline and is tried again a twelfth of
/// the TTL later, while it lasts. The wait is polled throughout, and when it completes
/// while extensions are under way they are dropped (an extension is cancel-safe: a late
/// one never shortens a lock).
async fn keep_alive<F>(held: &mut [Lock], wait: F, ttl: Duration) -> Result<Lock, Error>
where
    F: std::future::Future<Output = Result<Lock, Error>>,
{
    tokio::pin!(wait);
    let margin = ttl / 3;
    let pause = ttl / 12;
    // When each lock is next due for an extension; `None`: given up.
    let mut next: Vec<Option<Instant>> = held
        .iter()
        .map(|l| {
            Some(
                l.deadline()
                    .checked_sub(margin)
                    .unwrap_or_else(Instant::now),
            )
        })
        .collect();
    loop {
        let Some(due) = next.iter().flatten().min().copied() else {
            return wait.await;
        };
        tokio::select! {
            r = &mut wait => return r,
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {}
        }
        // Every extension that is due, at once, while the wait goes on: a slow round
        // (a node at its timeout) must not keep the wait from renewing its place.
        let now = Instant::now();
        let due = held
            .iter_mut()
            .zip(next.iter_mut())
            .filter(|(_, at)| at.is_some_and(|t| t <= now))
            .map(|(lock, at)| async move {
                *at = extended(lock, ttl, margin, pause).await;
            });
        let extending = futures::future::join_all(due);
        tokio::select! {
            r = &mut wait => return r,
            _ = extending => {}
        }
    }
}

/// Extends one reservation; when its next extension is due (`None`: given up).
async fn extended(
    lock: &mut Lock,
    ttl: Duration,
    margin: Duration,
    pause: Duration,
) -> Option<Instant> {
    match lock.extend(ttl).await {
        Ok(()) => {
            // Never sooner than the pause: a round slower than two thirds of the TTL must
            // not turn into a loop of extensions.
            let due = lock
                .deadline()
                .checked_sub(margin)
                .unwrap_or_else(Instant::now);
            Some(due.max(later(Instant::now(), pause)))
        }
        Err(e) if matches!(e, Error::Lost(_)) || !lock.is_valid() => {
            tracing::debug!(error = %e, "quorumlock: ordered waiter lost a reservation");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "quorumlock: a reservation's extension missed a quorum; trying again");
            Some(later(Instant::now(), pause))
        }
    }
}

/// The reservations taken so far: let go of in the background when dropped (done with,
/// given up, or the caller cancelled), without counting as the caller's releases or
/// drops.
struct Reservations(Vec<Lock>);

impl Reservations {
    /// Done with after a granted conversion: let go of silently (see [`Lock::let_go`]).
    fn converted(mut self) {
        release_all(std::mem::take(&mut self.0), false);
    }
}

impl Drop for Reservations {
    fn drop(&mut self) {
        release_all(std::mem::take(&mut self.0), true);
    }
}

/// Lets go of every reservation in the background.
fn release_all(held: Vec<Lock>, hand_over: bool) {
    if held.is_empty() {
        return;
    }
    let spawned = crate::background::spawn(async move {
        let all = held.into_iter().map(|l| l.let_go(hand_over));
        futures::future::join_all(all).await;
    });
    if !spawned {
        tracing::debug!(
            "quorumlock: reservations dropped outside a Tokio runtime; they expire by TTL"
        );
    }
}
