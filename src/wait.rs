//! Waiting strategies: retry after a random delay, and wake on release announcements.
//!
//! [`Redlock::lock`](crate::Redlock::lock) makes one attempt; if the resource is held (or
//! too few nodes answered) it waits and tries again, until the [`Retry`] policy's attempt
//! count or maximum wait is reached. Only attempts that were sent count. Two strategies
//! decide *when* to try again:
//!
//! * **Polling**: after a random delay drawn from the policy's range. Jitter keeps
//!   contenders out of lock-step; the expected hand-off latency is half the mean delay.
//! * **Notify** (the default): every release publishes on the resource's channel
//!   (`quorumlock:released:{name}`). Waiters of a [`Redlock`](crate::Redlock) share one
//!   subscription connection per node ([`Notifier`]) and try again when a release names
//!   them (or, without a queue, when any release is announced). The random delay stays as
//!   a fallback timer, so a lost message (a cut subscription link, a node down) only
//!   delays a waiter, never strands it.
//!
//! Waking every waiter at once would split the votes: each node grants a different
//! waiter and none reaches the quorum. So, for a single resource, waiters queue:
//!
//! 1. after its first failed attempt a waiter joins the resource's wait queue, a sorted
//!    set by arrival time (each herald's own clock when the join reached it, never the
//!    client's, so a client whose clock is off cannot jump the queue or fall behind it)
//!    on the resource's two *herald* nodes (chosen from the name; the
//!    only nodes whose releases announce, so the only nodes that keep a queue). Each entry
//!    is a lease of [`QUEUE_LEASE`] that the waiter renews while it waits; every queue
//!    script purges lapsed entries, and the queue's keys expire with the latest lease, so
//!    the entry of a waiter that crashed or was cut off is gone within the lease whatever
//!    other waiters do, and an idle queue leaves nothing behind;
//! 2. a release on a herald pops the first waiter and names it in its announcement: only
//!    that waiter tries. The others skip their fallback attempts while a hand-off is under
//!    way (a waiter was named within the larger of the per-node timeout and the longest
//!    retry delay), so a fallback timer does not race the waiter whose turn it is. The
//!    named waiter's attempt can overtake the release on the other nodes (the first
//!    herald to run it announces at once): while its attempts are refused by the very
//!    lock whose release named it, within that window, it keeps its turn and tries again
//!    when the release is announced again (by the second herald) or after a back-off that
//!    doubles up to the per-node timeout. No other announcement would come: the other
//!    nodes announce nothing;
//! 3. a caller that released the resource within the last second, while others were
//!    queued, joins the end of the queue before trying, and tries at once only if no one
//!    is queued ahead of it;
//! 4. within one `Redlock`, only one waiter per resource tries at a time (a turn skipped
//!    so sends nothing and is not counted as an attempt);
//! 5. without a queue (several resources, or an announcement naming no one) a woken
//!    waiter first sleeps a random stagger within the resource's contention window
//!    (initially [`NOTIFY_STAGGER`]; it doubles on every split vote and shrinks on every
//!    acquisition).
//!
//! Every one of these rules is a function of the protocol
//! ([`protocol::contention`](crate::protocol::contention)): what a failed attempt's votes
//! mean, how the window moves, whose turn an announcement gives, when the fallback timer
//! may fire an attempt, when a releaser yields. The subscription connections and the
//! per-resource state they keep are in [`notifier`](crate::notifier). This module is the
//! loop that runs them, with the clock and the random draws.
//!
//! Read-write locks and semaphore permits wait more simply ([`acquire_polling`]): an
//! attempt, then a random delay from the policy's range, until granted or the policy runs
//! out. Their releases announce nothing (a reader's release frees no one while other
//! readers remain; a permit frees one slot of many), so there is nothing to listen for.
//! A waiting writer's fairness comes from its intent instead (see `rwlock`).
//!
//! **A single resource with notify waiting** does not use the loop below: it waits by
//! *transfer* ([`transfer`](crate::transfer)): its queue entry on every node is the token
//! it will hold, a release hands the key to the queue's head inside the release script,
//! and the waiter holds once it knows a quorum of nodes did so, with no acquire round of
//! its own (docs/safety.md, "Direct hand-off"). The rules above (naming, turns, the chase
//! back-off, the queue on the heralds only) now serve multi-resource waiters, whose entries
//! are name-only.
//!
//! For those, the queue is only a hint for *who tries first*: an acquisition is always the
//! ordinary Redlock vote, whatever the queue says.
//!
//! The hand-over is in arrival order: with no faults and a scheduler that keeps up, a
//! waiter that arrived while `k` others were queued is served after exactly those `k`.
//! What can put a waiter back by one place, each time it happens: a newcomer's first
//! attempt (a caller not yet queued) that lands between a release and the named waiter's
//! attempt; a release heard late or not at all; the two heralds' queues differing after a
//! join and a release crossed on them; a pause longer than the hand-off window.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rand::Rng;

use crate::acquire::{Ask, acquire_as, acquire_once};
use crate::config::Retry;
use crate::error::{Error, Timeout, TimeoutBudget, Votes};
use crate::lock::Lock;
use crate::node::{EntryKind, JoinArgs, Node, QueueJoin, Request};
use crate::notifier::{Interest, Wake};
pub(crate) use crate::protocol::contention::POLITE_DELAY;
pub use crate::protocol::contention::QUEUE_LEASE;
use crate::protocol::contention::{
    self, Heard, Joined, Pause, Turn, fallback_tries, handoff_window, joins,
};
use crate::resource::Resources;
use crate::shared::Inner;
pub(crate) use crate::time::jitter;
use crate::time::later;

/// Whether a failed attempt's votes show that no one holds a quorum
/// ([`contention::is_split`]).
pub(crate) fn is_split(v: &Votes) -> bool {
    contention::is_split(
        v.len(),
        v.granted(),
        v.held(),
        v.largest_holder(),
        v.quorum(),
    )
}

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
    let gave_up = Error::Timeout(Timeout {
        budget: TimeoutBudget::MaxWait,
        waited: start.elapsed(),
        attempts,
        votes: last,
    });
    crate::metrics::waited(start, Err(gave_up))
}

/// What one turn of the loop did.
enum Tried {
    /// Acquired, or failed for good: return this.
    Done(Result<Lock, Error>),
    /// The attempt was refused; whether the votes were split.
    Refused { split: bool },
    /// Another waiter of this client is trying right now: nothing was sent.
    Skipped,
}

/// One waiter: its budget, its attempts, the last attempt's votes and the turn it holds.
struct Waiter<'a> {
    inner: &'a Arc<Inner>,
    res: &'a Resources,
    ttl: Duration,
    retry: &'a Retry,
    start: Instant,
    give_up_at: Option<Instant>,
    /// The hand-off window ([`handoff_window`]).
    handoff: Duration,
    attempts: u32,
    last: Option<Votes>,
    /// The turn a release gave us by naming us, while its attempts go on.
    turn: Option<Turn<Instant>>,
}

impl Waiter<'_> {
    fn gave_up(&self) -> Error {
        Error::Timeout(Timeout {
            budget: TimeoutBudget::MaxWait,
            waited: self.start.elapsed(),
            attempts: self.attempts,
            votes: self.last.clone(),
        })
    }

    /// One attempt, unless another waiter of this client holds the resource's gate (then
    /// nothing is sent and nothing counted). A refusal by the very lock whose release named
    /// us keeps our turn ([`Turn::overtaken`]); any other refusal loses it.
    async fn try_once(&mut self, interest: Option<&Interest>, ticket: Option<&Ticket>) -> Tried {
        let gate = interest.map(|i| i.gate.clone());
        let guard = gate.as_ref().and_then(|g| g.try_lock().ok());
        if gate.is_some() && guard.is_none() {
            return Tried::Skipped;
        }
        self.attempts = self.attempts.saturating_add(1);
        let split = match acquire_once(self.inner, self.res, self.ttl, self.attempts).await {
            Ok(mut lock) => {
                crate::metrics::handoff(self.turn.is_some());
                if let Some(i) = interest {
                    i.adapt(false);
                }
                if let Some(t) = ticket {
                    lock.set_waiter(t.id.clone());
                }
                return Tried::Done(Ok(lock));
            }
            Err(e) if !e.is_retryable() => return Tried::Done(Err(e)),
            Err(e) => {
                self.last = e.votes().cloned();
                self.last.as_ref().is_some_and(is_split)
            }
        };
        crate::metrics::split_vote(split);
        let ids = self
            .last
            .as_ref()
            .map_or(&[][..], |v| v.holder_ids.as_slice());
        let now = Instant::now();
        if !self
            .turn
            .as_ref()
            .is_some_and(|t| t.overtaken(now, ids, self.handoff))
        {
            self.turn = None;
        }
        drop(guard);
        if self.retry.attempts.is_some_and(|n| self.attempts >= n) {
            return Tried::Done(Err(self.gave_up()));
        }
        Tried::Refused { split }
    }
}

/// Acquires with retries, per `retry`.
///
/// After a failed attempt ([`contention::pause`]):
/// * someone may hold a quorum → wait for a release announcement (then a short random
///   stagger) or the retry delay, whichever comes first;
/// * the votes were split (no one holds a quorum) → retry after a random back-off within
///   the resource's contention window, which doubles on every split and shrinks on every
///   acquisition (like Ethernet's exponential back-off);
/// * a caller that itself released this resource moments ago, while others were listening
///   for it, joins the end of the queue first and tries at once only if no one is queued
///   ahead (several resources: waits [`POLITE_DELAY`] before its first attempt).
///
/// A queued waiter (single resource, notify waiting) skips its fallback attempt while a
/// release named another waiter within the hand-off window (the larger of the per-node
/// timeout and the longest retry delay): that hand-off is under way, and an attempt now
/// could only race the waiter whose turn it is (the announcements show that the channel
/// works, so nothing was lost). It renews its queue lease every
/// third of [`QUEUE_LEASE`]; a renewal that finds its place gone (popped by a release
/// whose announcement it missed, or lapsed) makes it try at once.
///
/// Only attempts that were sent count against [`Retry::attempts`]: a turn skipped because
/// another waiter of this client is trying right now sends nothing.
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
    let start = Instant::now();
    let mut w = Waiter {
        inner,
        res,
        ttl,
        retry,
        start,
        give_up_at: retry.max_wait.map(|d| later(start, d)),
        handoff: handoff_window(inner.config.node_timeout_for(ttl), retry.delay_max),
        attempts: 0,
        last: None,
        turn: None,
    };
    let mut interest: Option<Interest> = None;
    let mut ticket: Option<Ticket> = None;
    let mut try_now = true;
    let mut fallback_at: Option<tokio::time::Instant> = None;
    if let Some(n) = &inner.notifier
        && n.should_yield(res)
    {
        // We released it moments ago and others are queued for it: take our place at the
        // end of the queue instead of trying first (multi-resource locks, which have no
        // queue, just pause).
        let mut i = n.interest(res);
        match Ticket::new(inner, res, ttl) {
            Some(mut t) => {
                i.register(&t.id);
                let joined = t.join().await;
                try_now = contention::try_at_once_after_yield(
                    joined,
                    i.handoff_under_way(&t.id, w.handoff),
                );
                ticket = Some(t);
            }
            None => tokio::time::sleep(POLITE_DELAY).await,
        }
        interest = Some(i);
    }
    loop {
        let sent = w.attempts;
        let mut split = false;
        if try_now {
            match w.try_once(interest.as_ref(), ticket.as_ref()).await {
                Tried::Done(r) => return crate::metrics::waited(start, r),
                Tried::Refused { split: s } => split = s,
                Tried::Skipped => {}
            }
        }
        if w.attempts == sent {
            // No attempt went out (another waiter of ours is trying): no turn to keep.
            w.turn = None;
        }
        if interest.is_none() {
            interest = inner.notifier.as_ref().map(|n| n.interest(res));
        }
        if split && let Some(i) = &interest {
            i.adapt(true);
        }
        // Join the wait queue (once; again after a turn that was lost to someone else,
        // since the release that named us popped us), so releases hand over in order; and
        // renew the lease while waiting.
        let renew = ticket.as_ref().is_some_and(Ticket::renewal_due);
        if interest.is_some() && joins(split, try_now, renew) {
            match ticket.as_mut() {
                Some(t) => {
                    if t.join().await.lost && !try_now {
                        // Our place was gone (a release named us and we missed it, or the
                        // lease lapsed): it is back, at our arrival; try at once. (Also when
                        // no herald answered: then we cannot count on being named.)
                        try_now = true;
                        continue;
                    }
                }
                None => {
                    if let Some(mut t) = Ticket::new(inner, res, ttl) {
                        if let Some(i) = interest.as_mut() {
                            i.register(&t.id);
                        }
                        t.join().await;
                        ticket = Some(t);
                    }
                }
            }
        }
        // The fallback timer runs from the last attempt: announcements that name someone
        // else do not restart it (or a waiter that lost its place would never try again).
        if try_now || fallback_at.is_none() {
            let mut delay = jitter(retry.delay_min, retry.delay_max);
            if let Some(at) = w.give_up_at {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return crate::metrics::waited(start, Err(w.gave_up()));
                }
                delay = delay.min(left);
            }
            fallback_at = Some(later(tokio::time::Instant::now(), delay));
        }
        let wake_at = fallback_at.unwrap_or_else(tokio::time::Instant::now);
        let delay = wake_at.saturating_duration_since(tokio::time::Instant::now());
        try_now = true;
        match (
            contention::pause(interest.is_some(), split, w.turn.is_some()),
            interest.as_mut(),
        ) {
            (Pause::Backoff, Some(i)) => {
                // No one holds it: back off randomly and try again, no announcement will come.
                tokio::time::sleep(jitter(Duration::ZERO, i.window()).min(delay)).await;
            }
            (Pause::Chase, Some(i)) => {
                // Our turn, overtaken by its own release: try again when the release is
                // announced again (it reached the other herald) or after a back-off that
                // doubles each time, up to the per-node timeout (within which a release
                // normally reaches every node).
                let cap = inner.config.node_timeout_for(ttl);
                let bound = w
                    .turn
                    .as_mut()
                    .map(|t| t.next_backoff(cap))
                    .unwrap_or_default();
                tokio::select! {
                    _ = i.released() => {}
                    () = tokio::time::sleep(jitter(Duration::ZERO, bound).min(delay)) => {}
                }
            }
            (Pause::Listen, Some(i)) => {
                match listen(i, ticket.as_ref(), wake_at, w.handoff).await {
                    Listened::Turn(t) => w.turn = t,
                    Listened::Wait => try_now = false,
                    Listened::Restart => {
                        try_now = false;
                        fallback_at = None;
                    }
                    Listened::Try => {}
                }
            }
            _ => tokio::time::sleep(delay).await,
        }
        if w.give_up_at.is_some_and(|at| Instant::now() >= at) {
            // One last look is not taken: the budget is spent.
            return crate::metrics::waited(start, Err(w.gave_up()));
        }
    }
}

/// What a listening waiter heard.
enum Listened {
    /// A release named it: its turn (if the release is still the latest), try at once.
    Turn(Option<Turn<Instant>>),
    /// Try now (an announcement naming no one, after a stagger; or the fallback timer).
    Try,
    /// Someone else's turn, or the lease is due for renewal: keep waiting, the fallback
    /// timer stays.
    Wait,
    /// The fallback timer fired during another waiter's hand-off: do not race it; the
    /// timer starts again.
    Restart,
}

/// Waits for an announcement, the fallback timer (`wake_at`) or the queue lease's
/// renewal, and says what it means ([`contention::heard`], [`fallback_tries`]).
async fn listen(
    i: &mut Interest,
    ticket: Option<&Ticket>,
    wake_at: tokio::time::Instant,
    handoff: Duration,
) -> Listened {
    let me = ticket.map(|t| t.id.as_slice());
    let renew_at = ticket.map(Ticket::renew_at);
    tokio::select! {
        wake = i.released() => {
            let heard = match wake {
                Wake::Named => Heard::Turn,
                Wake::Announced => i.heard(me),
            };
            match heard {
                Heard::Turn => Listened::Turn(me.and_then(|me| i.turn(me))),
                Heard::Others => Listened::Wait,
                Heard::Stagger => {
                    tokio::time::sleep(jitter(Duration::ZERO, i.window())).await;
                    Listened::Try
                }
            }
        }
        () = tokio::time::sleep_until(wake_at) => {
            let under_way = me.is_some_and(|me| i.handoff_under_way(me, handoff));
            if fallback_tries(me.is_some(), under_way) {
                Listened::Try
            } else {
                Listened::Restart
            }
        }
        () = tokio::time::sleep_until(renew_at.unwrap_or(wake_at)), if renew_at.is_some() => {
            Listened::Wait
        }
    }
}

/// A waiter's place in a resource's wait queue (single-resource locks, notify waiting).
///
/// Joining adds the waiter, by arrival time, to a sorted set on the resource's two herald
/// nodes (the only nodes whose releases hand over, so the only ones that keep a queue),
/// with a lease of [`QUEUE_LEASE`] that the waiter renews while it waits. A release pops
/// the first waiter and names it in its announcement, so the lock is handed over in arrival
/// order instead of to whoever of the woken waiters is fastest. The queue is only a hint
/// for *who tries first*: the acquisition itself is the ordinary Redlock vote. Leaving (on
/// drop: acquired, gave up or cancelled) removes the waiter in the background; the entry of
/// a waiter that cannot leave (crashed, cut off) lapses with its lease.
struct Ticket {
    inner: Arc<Inner>,
    res: Resources,
    keys: [Vec<u8>; 3],
    id: Vec<u8>,
    ttl: Duration,
    /// This waiter's arrival score on each herald (by node index), as that herald assigned
    /// it at the first join (its own clock: the clients' clocks play no part in the order);
    /// re-joins after a lost place send it back, so the place is kept.
    scores: HashMap<usize, Vec<u8>>,
    timeout: Duration,
    /// When the lease was last renewed (the start of the last join).
    joined_at: tokio::time::Instant,
}

impl Ticket {
    fn new(inner: &Arc<Inner>, res: &Resources, ttl: Duration) -> Option<Ticket> {
        if res.len() != 1 {
            return None;
        }
        let id = format!("{:016x}", rand::rng().random::<u64>()).into_bytes();
        Some(Ticket {
            inner: inner.clone(),
            res: res.clone(),
            keys: res.queue_keys(),
            id,
            ttl,
            scores: HashMap::new(),
            timeout: inner.config.node_timeout_for(ttl),
            joined_at: tokio::time::Instant::now(),
        })
    }

    /// When the lease is next due for renewal.
    fn renew_at(&self) -> tokio::time::Instant {
        contention::renew_at(self.joined_at)
    }

    fn renewal_due(&self) -> bool {
        tokio::time::Instant::now() >= self.renew_at()
    }

    /// The herald nodes, with their indices.
    fn heralds(&self) -> impl Iterator<Item = (usize, &Node)> {
        let n = self.inner.nodes.len();
        self.inner
            .nodes
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.res.is_herald(*i, n))
    }

    /// Joins, re-joins (keeping the arrival order) or renews the lease, on the herald
    /// nodes; bounded by the node timeout, failures ignored (the queue is only a hint).
    async fn join(&mut self) -> Joined {
        self.joined_at = tokio::time::Instant::now();
        let timeout = self.timeout;
        let all: FuturesUnordered<_> = self
            .heralds()
            .map(|(i, n)| {
                // The score this herald gave us, or none yet: it assigns one (its time).
                let score = self.scores.get(&i).map_or(&[][..], Vec::as_slice);
                // A name-only entry: a release names it, and it tries. Such an entry may be
                // added again after it was popped (nothing is transferred to it).
                let args = JoinArgs {
                    token: &self.id,
                    ticket: score,
                    lease: QUEUE_LEASE,
                    ttl: self.ttl,
                    kind: EntryKind::NameOnly,
                    first: true,
                };
                let lock = self.res.lock_keys().first().map_or(&[][..], Vec::as_slice);
                let join = QueueJoin::new(&self.keys, lock, &args);
                async move { (i, n.join_queue(&join, timeout).await) }
            })
            .collect();
        // Every reply is awaited (dropping a request midway could leave a herald unrenewed).
        let answers: Vec<_> = all.collect().await;
        for (i, place) in &answers {
            if let Some(score) = place.as_ref().and_then(|p| p.score.clone()) {
                self.scores.insert(*i, score);
            }
        }
        contention::joined(answers.iter().map(|(_, p)| p.as_ref()))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let leave = Arc::new(Request::dequeue(&self.keys, &self.id));
        let heralds: Vec<Node> = self.heralds().map(|(_, n)| n.clone()).collect();
        let timeout = self.timeout;
        crate::background::spawn(async move {
            let all: FuturesUnordered<_> = heralds
                .iter()
                .map(|node| node.send(&leave, timeout))
                .collect();
            all.collect::<Vec<_>>().await;
        });
    }
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
        assert!(is_split(&votes(&[G, G, H, H, H], Some(2))));
        assert!(!is_split(&votes(&[G, G, H, H, H], Some(3))));
        assert!(!is_split(&votes(&[G, G, H, H, T], Some(2))));
        assert!(!is_split(&votes(&[H, H, N, N, G], Some(2))));
        assert!(!is_split(&votes(&[G, G, H, H, H], None)));
        assert!(is_split(&votes(&[H, H, H, G, G], Some(1))));
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
