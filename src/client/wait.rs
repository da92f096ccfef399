//! Waiting strategies: retry after a random delay, wake on release announcements, or be
//! handed the lock.
//!
//! [`Redlock::lock`](crate::Redlock::lock) makes one attempt; if the resource is held (or
//! too few nodes answered) it waits and tries again, until the [`Retry`] policy's attempt
//! count or maximum wait is reached. Only attempts that were sent count. Three ways to
//! wait:
//!
//! * **Transfer** (a single resource, notify waiting: the default for the mutex): the
//!   waiter queues on every node under the token it will hold, a release hands the key to
//!   the queue's head inside the release script, and the waiter holds once it knows that
//!   a quorum of nodes did so, with no acquire round of its own. Releases are handed over
//!   in arrival order. That waiter lives in [`transfer`](crate::client::transfer); the rules are in
//!   [`protocol::handoff`](crate::protocol::handoff) and the argument in docs/safety.md
//!   ("Direct hand-off").
//! * **Notify** (several resources, notify waiting): after a refused attempt the waiter
//!   marks each of its resources on every node (`listen.lua`, renewed every third of
//!   [`QUEUE_LEASE`] while it waits, dropped by the release of the lock it takes), and a
//!   release of a marked resource publishes on the resource's channel
//!   (`<namespace>:released:{name}`); a release with no mark announces nothing. Waiters of a
//!   [`Redlock`](crate::Redlock) share one subscription connection per node
//!   ([`Notifier`]) and, woken by a release, try again after a random stagger within the
//!   resource's contention window (initially [`NOTIFY_STAGGER`]; it doubles on every split
//!   vote and shrinks on every acquisition), so that waking every waiter at once does not
//!   split the votes. The random delay stays as a fallback timer, so a lost message (a cut
//!   subscription link, a node down) only delays a waiter, never strands it. A split vote
//!   (no one holds a quorum, so no release will be announced) backs off randomly within
//!   the window instead. The mark's reply says whether every key is free on a quorum
//!   (a key holding the waiter's own latest, refused, attempt counts as free: its
//!   clean-up may not have landed yet), and a free answer starts an attempt at once. A
//!   caller that released the resources moments ago while others
//!   listened waits [`POLITE_DELAY`] before its first attempt; within one `Redlock`, only
//!   one waiter per resource tries at a time (a turn skipped so sends nothing and is not
//!   counted as an attempt).
//! * **Polling** (notify waiting off, read-write locks, semaphore permits:
//!   [`acquire_polling`]): an attempt, then a random delay from the policy's range. Jitter
//!   keeps contenders out of lock-step. Reader and permit releases announce nothing (a
//!   reader's release frees no one while other readers remain; a permit frees one slot of
//!   many), so there is nothing to listen for; a waiting writer's fairness comes from its
//!   intent instead (see `rwlock`).
//!
//! Every rule of the notify loop is a function of the protocol
//! ([`protocol::contention`](crate::protocol::contention)): what a failed attempt's votes
//! mean, how the window moves, when a releaser yields. The subscription connections and
//! the per-resource state they keep are in [`notifier`](crate::io::notifier). This module is
//! the loop that runs them, with the clock and the random draws.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::error::{Error, Timeout, Votes};
use crate::base::resource::{Kind, Resources};
pub(crate) use crate::base::time::jitter;
use crate::base::time::later;
use crate::base::token::Token;
use crate::client::acquire::{Ask, acquire_as};
use crate::client::config::Retry;
use crate::client::lock::Lock;
use crate::client::shared::Inner;
use crate::io::node::QueueJoin;
use crate::io::notifier::Interest;
pub(crate) use crate::protocol::contention::POLITE_DELAY;
pub use crate::protocol::contention::QUEUE_LEASE;
use crate::protocol::contention::{self, Pause};
use futures::future::join_all;

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
    let intent = !ask.intent.is_empty();
    poll(retry, intent, |attempt| {
        acquire_as(inner, res, ask, ttl, attempt)
    })
    .await
}

/// The polling loop: `attempt(n)` for n = 1, 2, …, then a random delay from the policy's
/// range (capped for a waiting writer's `intent`, see [`contention::polling_delay`]),
/// until granted, a failure that is not retryable, or the policy's attempts or maximum
/// wait running out ([`Error::Timeout`] with the last attempt's votes). Any kind of
/// attempt: one lock's, or every part of a lock across lock groups (`spanning`).
pub(crate) async fn poll<F, Fut>(retry: &Retry, intent: bool, mut attempt: F) -> Result<Lock, Error>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<Lock, Error>>,
{
    let start = Instant::now();
    let give_up_at = retry.max_wait.map(|d| later(start, d));
    let mut attempts: u32 = 0;
    let mut last: Option<Votes>;
    loop {
        attempts = attempts.saturating_add(1);
        match attempt(attempts).await {
            Ok(lock) => return crate::base::metrics::waited(start, Ok(lock)),
            Err(e) if !e.is_retryable() => return crate::base::metrics::waited(start, Err(e)),
            Err(e) => last = e.votes().cloned(),
        }
        if retry.attempts.is_some_and(|n| attempts >= n) {
            break;
        }
        let drawn = jitter(retry.delay_min, retry.delay_max);
        let mut delay = contention::polling_delay(drawn, intent);
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
    crate::base::metrics::waited(start, Err(Timeout::gave_up(start, attempts, last)))
}

/// What one turn of the loop did.
enum Tried {
    /// Acquired, or failed for good: return this.
    Done(Box<Result<Lock, Error>>),
    /// The attempt was refused; whether the votes were split.
    Refused { split: bool },
    /// Another waiter of this client is trying right now: nothing was sent.
    Skipped,
}

/// One waiter: its budget, its attempts and the last attempt's votes.
struct Waiter<'a> {
    inner: &'a Arc<Inner>,
    res: &'a Resources,
    ttl: Duration,
    retry: &'a Retry,
    start: Instant,
    give_up_at: Option<Instant>,
    attempts: u32,
    last: Option<Votes>,
    /// The latest attempt's token (each attempt has its own).
    token: Option<Token>,
}

impl Waiter<'_> {
    fn gave_up(&self) -> Error {
        Timeout::gave_up(self.start, self.attempts, self.last.clone())
    }

    /// One attempt, unless another waiter of this client holds the resource's gate (then
    /// nothing is sent and nothing counted).
    async fn try_once(&mut self, interest: Option<&Interest>) -> Tried {
        let gate = interest.map(|i| i.gate.clone());
        let guard = gate.as_ref().and_then(|g| g.try_lock().ok());
        if gate.is_some() && guard.is_none() {
            return Tried::Skipped;
        }
        self.attempts = self.attempts.saturating_add(1);
        let mut ask = Ask::new(Kind::Exclusive, self.inner.quorum);
        match Token::generate() {
            Ok(t) => ask.token = Some(t),
            Err(e) => return Tried::Done(Box::new(Err(e))),
        }
        self.token = ask.token.clone();
        let split = match acquire_as(self.inner, self.res, &ask, self.ttl, self.attempts).await {
            Ok(lock) => {
                crate::base::metrics::handoff(false);
                if let Some(i) = interest {
                    i.adapt(false);
                }
                return Tried::Done(Box::new(Ok(lock)));
            }
            Err(e) if !e.is_retryable() => return Tried::Done(Box::new(Err(e))),
            Err(e) => {
                self.last = e.votes().cloned();
                self.last.as_ref().is_some_and(Votes::is_split)
            }
        };
        crate::base::metrics::split_vote(split);
        drop(guard);
        if self.retry.attempts.is_some_and(|n| self.attempts >= n) {
            return Tried::Done(Box::new(Err(self.gave_up())));
        }
        Tried::Refused { split }
    }
}

/// How many renewals a refused wake, or a renewal that finds the keys free on more nodes
/// than the one before but not on a quorum, brings forward ([`Listener::recheck`]): with
/// [`contention::RECHECK_GAP`] between them, half a second for the release to land.
const RECHECKS: u8 = 5;

/// A multi-resource waiter's mark on its resources' waiting state (`listen.lua`): its id,
/// renewed every third of [`QUEUE_LEASE`] while it waits, and left in the lock it takes
/// (whose release drops it).
struct Listener<'a> {
    inner: &'a Arc<Inner>,
    res: &'a Resources,
    id: Option<Token>,
    renew_at: Option<tokio::time::Instant>,
    timeout: Duration,
    /// Renewals left to bring forward while the keys are not yet free ([`Listener::recheck`]).
    rechecks: u8,
    /// On how many nodes the latest renewal found every key of the set free.
    free_on: usize,
}

impl<'a> Listener<'a> {
    /// A listener for notify waiting on several resources; with nothing to do otherwise.
    fn new(
        inner: &'a Arc<Inner>,
        res: &'a Resources,
        ttl: Duration,
    ) -> Result<Listener<'a>, Error> {
        let id = if inner.notifier.is_some() && res.len() > 1 {
            Some(Token::generate()?)
        } else {
            None
        };
        Ok(Listener {
            inner,
            res,
            id,
            renew_at: None,
            timeout: inner.config.node_timeout_for(ttl),
            rechecks: 0,
            free_on: 0,
        })
    }

    fn due(&self) -> bool {
        self.id.is_some()
            && self
                .renew_at
                .is_none_or(|at| tokio::time::Instant::now() >= at)
    }

    /// When the mark is due for renewal, if before `fallback` (else `fallback`, which
    /// makes an attempt instead).
    fn renew_by(&self, fallback: tokio::time::Instant) -> tokio::time::Instant {
        match self.renew_at {
            Some(at) if at < fallback => at,
            _ => later(fallback, Duration::from_secs(3600)),
        }
    }

    /// Brings the next renewal forward to [`contention::RECHECK_GAP`] from now (time for a
    /// release still on its way to land), if marked and not due sooner; and so the next
    /// few while their replies do not find the keys free (the release may be slow).
    fn recheck(&mut self) {
        self.rechecks = RECHECKS;
        self.soon();
    }

    fn soon(&mut self) {
        if let Some(at) = self.renew_at {
            let soon = later(tokio::time::Instant::now(), contention::RECHECK_GAP);
            self.renew_at = Some(at.min(soon));
        }
    }

    /// Marks (or renews) on every node at once, awaiting the replies (bounded by the node
    /// timeout). Whether a quorum of nodes answered that no key of the set is held, keys
    /// held by `own` counting as free: the waiter's latest attempt, refused, may have been
    /// decided before some node answered it, its clean-up landing there only later.
    async fn listen(&mut self, own: Option<&Token>) -> bool {
        let Some(id) = &self.id else {
            return false;
        };
        self.renew_at = Some(contention::renew_at(tokio::time::Instant::now()));
        let join = QueueJoin::listen(
            self.res,
            id.as_bytes(),
            QUEUE_LEASE,
            own.map(Token::as_bytes),
        );
        let timeout = self.timeout;
        let replies = join_all(self.inner.nodes.iter().map(|n| n.listen(&join, timeout))).await;
        let free_on = replies.iter().filter(|r| **r == Some(true)).count();
        let free = free_on >= self.inner.quorum;
        if free {
            self.rechecks = 0;
        } else if free_on > self.free_on {
            // Free on more nodes than before, not yet on a quorum: a release may be on its
            // way to the others, and it announces nothing where it landed before the mark
            // (or on a node that is not a herald). Look again soon, not a third of the
            // lease later.
            self.recheck();
        } else if self.rechecks > 0 {
            self.rechecks -= 1;
            self.soon();
        }
        self.free_on = free_on;
        free
    }

    /// The lock taken carries the mark's id: its release drops it.
    fn mark(&self, got: Result<Lock, Error>) -> Result<Lock, Error> {
        match (got, &self.id) {
            (Ok(mut lock), Some(id)) if self.renew_at.is_some() => {
                lock.set_waiter(id.as_bytes().to_vec());
                Ok(lock)
            }
            (got, _) => got,
        }
    }
}

/// Acquires with retries, per `retry`.
///
/// Notify waiting waits by transfer ([`transfer`](crate::client::transfer)): one resource, or
/// several without fencing. Every other lock (several resources with fencing; or notify
/// waiting off) runs this loop. After a
/// failed attempt ([`contention::pause`]):
/// * someone may hold a quorum → wait for a release announcement (then a short random
///   stagger) or the retry delay, whichever comes first;
/// * the votes were split (no one holds a quorum) → retry after a random back-off within
///   the resource's contention window, which doubles on every split and shrinks on every
///   acquisition (like Ethernet's exponential back-off);
/// * a caller that itself released these resources moments ago, while others were
///   listening for them, waits [`POLITE_DELAY`] before its first attempt.
///
/// Only attempts that were sent count against [`Retry::attempts`]: a turn skipped because
/// another waiter of this client is trying right now sends nothing.
pub(crate) async fn acquire_waiting(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    if let Some(n) = &inner.notifier
        && res.len() == 1
    {
        // Notify waiting for one resource: hand-off by transfer.
        let yield_first = n.should_yield(res);
        let interest = n.interest(res);
        return crate::client::transfer::acquire(inner, res, ttl, retry, interest, yield_first)
            .await;
    }
    let start = Instant::now();
    let mut w = Waiter {
        inner,
        res,
        ttl,
        retry,
        start,
        give_up_at: retry.max_wait.map(|d| later(start, d)),
        attempts: 0,
        last: None,
        token: None,
    };
    let mut interest: Option<Interest> = None;
    // Notify waiting marks the resources' waiting state on every node (`listen.lua`), so
    // their releases announce; renewed every third of the lease while it waits, dropped by
    // the release of the lock it takes, else lapsing with the lease.
    let mut listener = Listener::new(inner, res, ttl)?;
    // The last pause ended with a release announcement.
    let mut woken = false;
    // This attempt follows a mark that found every key free on a quorum.
    let mut marked_free = false;
    let mut try_now = true;
    let mut fallback_at: Option<tokio::time::Instant> = None;
    if let Some(n) = &inner.notifier
        && n.should_yield(res)
    {
        // We released them moments ago while others listened: let a waiter go first.
        interest = Some(n.interest(res));
        tokio::time::sleep(POLITE_DELAY).await;
    }
    loop {
        let mut split = false;
        if try_now {
            match w.try_once(interest.as_ref()).await {
                Tried::Done(r) => return crate::base::metrics::waited(start, listener.mark(*r)),
                Tried::Refused { split: s } => {
                    split = s;
                    if std::mem::take(&mut marked_free) {
                        // The mark counted this waiter's previous attempt as free where
                        // its clean-up had not landed yet; this attempt may have met it
                        // there. Look once more soon (not five times: keys that stay
                        // free on a quorum and refused must not become a fast loop).
                        listener.soon();
                    }
                    if std::mem::take(&mut woken) {
                        // Woken by a release, refused: the attempt may have reached a node
                        // before that release did, and the release is announced once.
                        // Renew the mark soon: its reply says whether the keys are free.
                        listener.recheck();
                    }
                }
                Tried::Skipped => {}
            }
        }
        if interest.is_none() {
            interest = inner.notifier.as_ref().map(|n| n.interest(res));
        }
        if split && let Some(i) = &interest {
            i.adapt(true);
        }
        if listener.due() && listener.listen(w.token.as_ref()).await && !split {
            // The mark found every key free on a quorum: a release ran before the first
            // mark landed (not announced), or after an attempt it woke had been refused
            // (announced once). Try now; the next renewal is a third of the lease away.
            try_now = true;
            marked_free = true;
            continue;
        }
        // The fallback timer runs from the last attempt.
        if try_now || fallback_at.is_none() {
            let mut delay = jitter(retry.delay_min, retry.delay_max);
            if let Some(at) = w.give_up_at {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return crate::base::metrics::waited(start, Err(w.gave_up()));
                }
                delay = delay.min(left);
            }
            fallback_at = Some(later(tokio::time::Instant::now(), delay));
        }
        let wake_at = fallback_at.unwrap_or_else(tokio::time::Instant::now);
        let delay = wake_at.saturating_duration_since(tokio::time::Instant::now());
        try_now = true;
        match (
            contention::pause(interest.is_some(), split),
            interest.as_mut(),
        ) {
            (Pause::Backoff, Some(i)) => {
                // No one holds it: back off randomly and try again, no announcement will come.
                tokio::time::sleep(jitter(Duration::ZERO, i.window()).min(delay)).await;
            }
            (Pause::Listen, Some(i)) => {
                // An announcement (then a random stagger within the contention window,
                // against the herd) or the fallback timer, whichever comes first.
                tokio::select! {
                    _ = i.released() => {
                        woken = true;
                        tokio::time::sleep(jitter(Duration::ZERO, i.window())).await;
                    }
                    () = tokio::time::sleep_until(wake_at) => {}
                    () = tokio::time::sleep_until(listener.renew_by(wake_at)) => {
                        // Only the mark is due: renew it, no attempt.
                        try_now = false;
                    }
                }
            }
            _ => tokio::time::sleep(delay).await,
        }
        if w.give_up_at.is_some_and(|at| Instant::now() >= at) {
            // One last look is not taken: the budget is spent.
            return crate::base::metrics::waited(start, Err(w.gave_up()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::node::NodeSpec;

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
            resources: Vec::new(),
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
