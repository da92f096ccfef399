//! The transfer waiter: a single-resource mutex waiter with notify waiting (fenced or
//! not) that holds the lock when a quorum of nodes *transferred* it to its token inside
//! the releaser's release, with no acquire round of its own (docs/safety.md, "Direct
//! hand-off"). The decisions are pure ([`protocol::handoff`](crate::protocol::handoff));
//! this module runs them with the clock, the nodes and the notifier. (Waiters for several
//! resources do not queue: they are woken by release announcements and claim, see
//! [`wait`](crate::wait).)
//!
//! ```text
//!   claim(T) ──refused──▶ join: heralds first (ticket) ──▶ every other node (same ticket)
//!        ▲                    │ renew every third of QUEUE_LEASE: queued → s_i, holds → count, gone → retire
//!        │                    ▼
//!   fallback / window ◀── announcements ">:T" per node ──count──▶ q counted: validity from s_i ──▶ Lock(T)
//!   failed claim, gone, short validity ──▶ retire T (release T on every node) ──▶ fresh T', same ticket
//! ```
//!
//! * The epoch token `T` is the lock token: the waiter's claims use it (a key already
//!   holding `T` counts as granted) and its queue entries carry it (kind `t`, or `f` when
//!   the client fences).
//! * Per node, a first join of a token is sent at most once; every later request for that
//!   token there is a renewal (a lost first-join reply must not be answered by re-adding).
//! * `s_i` per node: the send time of the latest request whose reply said `T` was still
//!   queued; before that, the first join's send time.
//! * A node counts on its transfer announcement naming `T` (routed per node by the
//!   notifier) or a reply saying its key holds `T`. At `q` counted the validity is
//!   [`handoff::validity`]; too short → retire.
//! * While a claim with `T` is in flight, announcements wait in the channel (noted); they
//!   are counted afterwards only if `T` was not retired.
//! * Retiring `T`: it is never counted again, a release of `T` goes to every node (it also
//!   drops `T`'s entry there, and passes on a transfer that came meanwhile), and a late
//!   announcement naming it is answered with a release on that node. A fresh token joins
//!   every node with the same ticket.
//! * Leaving without holding `T` (gave up, cancelled, dropped) retires it in the background.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;

use crate::base::error::{Error, Timeout, Votes};
use crate::base::resource::{Kind, Resources};
use crate::base::time::jitter;
use crate::base::time::later;
use crate::base::token::Token;
use crate::client::acquire::{Ask, acquire_as};
use crate::client::config::Retry;
use crate::client::lock::Lock;
use crate::client::shared::Inner;
use crate::io::node::{EntryKind, JoinArgs, QueueJoin, Request};
use crate::io::notifier::{Interest, Notifier, Transfer, Wake};
use crate::protocol::contention::{self, QUEUE_LEASE, handoff_window};
use crate::protocol::handoff::{self, Heard, State};
use crate::protocol::reply::QueueState;
use crate::protocol::time::earlier_of_overflow;

/// What the waiter knows of its current token on each node.
struct Epoch {
    token: Token,
    /// `s_i`; `None` while no queue request with this token went to the node.
    confirmed: Vec<Option<Instant>>,
    /// Counted nodes, with the fence value announced (if any).
    counted: Vec<Option<Option<u64>>>,
    /// When the first node was counted.
    first_count: Option<Instant>,
    /// At least half of the latest confirmations said we are the queue's head (or nothing
    /// confirmed yet).
    head: bool,
    /// A reply said the token is gone (and not held) on a node not counted.
    gone: bool,
    /// The latest confirmations said the key was free on enough nodes to make a quorum with the nodes counted. A stale "free"
    /// from a minority must not make the head claim into a held lock.
    free: bool,
}

impl Epoch {
    fn new(token: Token, n: usize) -> Epoch {
        Epoch {
            token,
            confirmed: vec![None; n],
            counted: vec![None; n],
            first_count: None,
            head: true,
            gone: false,
            free: false,
        }
    }

    fn sent_anywhere(&self) -> bool {
        self.confirmed.iter().any(Option::is_some)
    }

    fn count(&mut self, node: usize, fence: Option<u64>) {
        if let Some(c) = self.counted.get_mut(node)
            && c.is_none()
        {
            *c = Some(fence);
            self.first_count.get_or_insert_with(Instant::now);
        }
    }

    fn n_counted(&self) -> usize {
        self.counted.iter().filter(|c| c.is_some()).count()
    }
}

/// What a round of queue joins confirmed: how many nodes confirmed the waiter's place, how
/// many of those have no entry ahead of it, and how many found the lock key free.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    confirms: usize,
    heads: usize,
    frees: usize,
}

impl Tally {
    fn and(self, other: Tally) -> Tally {
        Tally {
            confirms: self.confirms.saturating_add(other.confirms),
            heads: self.heads.saturating_add(other.heads),
            frees: self.frees.saturating_add(other.frees),
        }
    }
}

/// The waiter's tokens: the current one and the retired ones. Leaving releases the
/// current token everywhere unless a returned lock holds it.
struct Waiter {
    inner: Arc<Inner>,
    res: Resources,
    ttl: Duration,
    timeout: Duration,
    kind: EntryKind,
    ticket: Option<Vec<u8>>,
    epoch: Epoch,
    retired: Vec<Token>,
    tx: mpsc::UnboundedSender<Transfer>,
    renew_at: tokio::time::Instant,
    /// The current token is kept by a returned lock, or was released on leaving: the drop
    /// releases nothing.
    kept: bool,
}

impl Waiter {
    fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier.as_ref()
    }

    /// Releases `token` on the nodes `on` in the background (a release with transfer:
    /// drops its queue entry there and passes on a transfer to it).
    fn release_in_background(&self, token: &Token, on: &[usize]) {
        let req = Arc::new(Request::release(&self.res, token, token.as_bytes(), false));
        let nodes: Vec<_> = on
            .iter()
            .filter_map(|i| self.inner.nodes.get(*i).cloned())
            .collect();
        let timeout = self.timeout;
        crate::io::background::spawn(async move {
            let all: FuturesUnordered<_> = nodes.iter().map(|n| n.send(&req, timeout)).collect();
            all.collect::<Vec<_>>().await;
        });
    }

    /// The join (or renewal) request of `args.token` (`enqueue.lua`).
    fn queue_join(&self, args: &JoinArgs<'_>) -> QueueJoin {
        QueueJoin::new(&self.res, args)
    }

    fn all_nodes(&self) -> Vec<usize> {
        (0..self.inner.nodes.len()).collect()
    }

    /// Retires the current token (released on every node, never counted again) and takes
    /// a fresh one with the same ticket.
    fn retire(&mut self) -> Result<(), Error> {
        let fresh = Token::generate()?;
        if let Some(n) = self.notifier() {
            n.route(fresh.as_bytes(), self.tx.clone());
        }
        let n = self.inner.nodes.len();
        let old = std::mem::replace(&mut self.epoch, Epoch::new(fresh, n));
        // A token that never joined was never queued, so never transferred to: only its
        // own claims may have set keys, and their clean-up is the attempt's.
        if old.sent_anywhere() {
            self.release_in_background(&old.token, &self.all_nodes());
            self.retired.push(old.token);
        } else if let Some(n) = self.notifier() {
            n.unroute(old.token.as_bytes());
        }
        self.renew_at = tokio::time::Instant::now();
        Ok(())
    }

    /// Handles one transfer announcement.
    fn heard(&mut self, t: &Transfer) {
        let current = t.token == self.epoch.token.as_bytes();
        let sent = self
            .epoch
            .confirmed
            .get(t.node)
            .is_some_and(Option::is_some);
        match handoff::on_transfer(current, sent, false) {
            Heard::Count | Heard::Note => self.epoch.count(t.node, t.fence),
            Heard::PassOn => {
                if let Some(old) = self.retired.iter().find(|r| r.as_bytes() == t.token) {
                    self.release_in_background(old, &[t.node]);
                }
            }
        }
    }

    /// Joins or renews on every node: while no ticket is known, the heralds one after the
    /// other until one answers and assigns it (its clock), then every node with that
    /// ticket, the other herald included. Asking both heralds at once would let each
    /// assign its own score, and two waiters joining together could then be ordered
    /// differently on the two, splitting the next release's transfers. With both heralds
    /// silent (down, paused, cut off), the other nodes are asked the same way, one after
    /// the other: the waiter is queued where it can be, and the releases there hand over
    /// to it (with five nodes and more, the three others are a quorum). A first join is
    /// sent at most once per token and node. The node that assigned the ticket is not
    /// asked again at once: its answer, a moment old, stands beside the others'. A renewal
    /// there would cost that node a script call per contended acquisition and tell little
    /// that the announcements and the next renewal (a third of the lease later) do not;
    /// its confirmation time stays the earlier one, which only shortens a validity.
    async fn join(&mut self) {
        self.renew_at = contention::renew_at(tokio::time::Instant::now());
        let n = self.inner.nodes.len();
        let mut assigned = None;
        if self.ticket.is_none() {
            let (heralds, others): (Vec<usize>, Vec<usize>) =
                (0..n).partition(|i| self.res.is_herald(*i, n));
            for h in heralds.into_iter().chain(others) {
                let answered = self.send(&[h], Tally::default()).await;
                if self.ticket.is_some() {
                    if answered.confirms == 1 {
                        assigned = Some((h, answered));
                    }
                    break;
                }
            }
        }
        if self.ticket.is_some() {
            let (skip, carried) = match assigned {
                Some((h, t)) => (Some(h), t),
                None => (None, Tally::default()),
            };
            let rest: Vec<usize> = (0..n).filter(|i| Some(*i) != skip).collect();
            self.send(&rest, carried).await;
        }
    }

    /// Sends a join (first, or renewal) of the current token to the nodes `on`, awaiting
    /// every reply (bounded by the node timeout), and applies what each reply means; the
    /// head and free verdicts count the confirmations `carried` (answers of other nodes
    /// just before, not asked again) with these. Returns this send's own confirmations.
    async fn send(&mut self, on: &[usize], carried: Tally) -> Tally {
        let ticket = self.ticket.clone().unwrap_or_default();
        let inbox = self
            .notifier()
            .map(|n| self.res.inbox(n.inbox()))
            .unwrap_or_default();
        let all: FuturesUnordered<_> = on
            .iter()
            .filter_map(|&i| {
                let node = self.inner.nodes.get(i)?.clone();
                let first = self.epoch.confirmed.get(i)?.is_none();
                let args = JoinArgs {
                    token: self.epoch.token.as_bytes(),
                    ticket: &ticket,
                    lease: QUEUE_LEASE,
                    ttl: self.ttl,
                    kind: self.kind,
                    first,
                    inbox: &inbox,
                };
                let join = self.queue_join(&args);
                let sent_at = Instant::now();
                if first && let Some(c) = self.epoch.confirmed.get_mut(i) {
                    *c = Some(sent_at);
                }
                let timeout = self.timeout;
                Some(async move { (i, first, sent_at, node.join_queue(&join, timeout).await) })
            })
            .collect();
        let answers: Vec<_> = all.collect().await;
        // Whether this waiter is the queue's head: as at least half of the nodes that
        // confirmed its place say (an entry left behind on a minority, by a holder whose
        // release did not reach it, must not hold the head back until its lease lapses).
        // Half of those that answered in time, not a quorum of all nodes: with a node
        // down, a quorum rule never makes the head of the live nodes claim when an entry
        // ahead sits on one of them, or when a node handed it the key. The price: with one
        // reply slow, a waiter that heads the queue on one node only can claim into a held
        // lock and spend an attempt (`handoff_refused_nodes::a_slow_reply_…`, ignored).
        let mut own = Tally::default();
        for (i, first, sent_at, place) in answers {
            let Some(place) = place else { continue };
            if first && place.holds {
                // The key holds a token never queued here: set by this waiter's own claim
                // (a failed one whose clean-up has not landed yet), not by a transfer, so
                // no confirmation time bounds it. Never counted: retire the token.
                self.epoch.gone = true;
                continue;
            }
            if self.ticket.is_none()
                && let Some(s) = &place.score
            {
                self.ticket = Some(s.clone());
            }
            let state = match place.state {
                QueueState::Queued => State::Queued,
                QueueState::Added => State::Added,
                QueueState::Gone => State::Gone,
            };
            let counted = self.epoch.counted.get(i).is_some_and(Option::is_some);
            match handoff::on_reply(Some((state, place.holds)), counted) {
                handoff::Reply::Confirm => {
                    if let Some(c) = self.epoch.confirmed.get_mut(i) {
                        *c = Some(sent_at);
                    }
                    own.confirms += 1;
                    own.heads += usize::from(place.ahead == 0);
                    own.frees += usize::from(place.free);
                }
                handoff::Reply::Count => self.epoch.count(i, None),
                handoff::Reply::Retire => self.epoch.gone = true,
                handoff::Reply::Nothing => {}
            }
        }
        let all = own.and(carried);
        if all.confirms > 0 {
            self.epoch.head = all.heads.saturating_mul(2) >= all.confirms;
            // (Nodes whose keys were transferred to this waiter count too: its claim
            // takes a key that holds its token as granted.)
            self.epoch.free = all.frees.saturating_add(self.epoch.n_counted()) >= self.inner.quorum;
        }
        own
    }

    /// With a quorum counted: the lock, if the validity (and, fenced, the commit) allows;
    /// `None` to retire.
    async fn hold(&mut self) -> Option<Lock> {
        // A lock handed over holds for `ttl` without an acquisition round of its own: it is
        // a new lock, so as for an acquisition, a client that saw another group map takes
        // none, and the group-map record must cover it now, not only when the waiter
        // queued.
        if self.inner.cover(self.ttl).await.is_err() {
            return None;
        }
        let config = &self.inner.config;
        let q = self.inner.quorum;
        let counted: Vec<Instant> = self
            .epoch
            .counted
            .iter()
            .zip(&self.epoch.confirmed)
            .filter_map(|(c, s)| c.and(*s))
            .collect();
        let now = Instant::now();
        let validity = handoff::validity(&counted, q, now, self.ttl, config.drift_factor);
        if !handoff::holds(validity, config.min_validity) {
            return None;
        }
        let deadline = earlier_of_overflow(now, validity.unwrap_or_default());
        let fencing = if config.fencing {
            // Every counted node must have announced its counter (a node counted from a
            // renewal's reply did not): otherwise claim instead.
            let fences: Option<Vec<u64>> = self.epoch.counted.iter().flatten().copied().collect();
            let t = fences?.into_iter().max()?;
            let token = self.epoch.token.clone();
            let committed = crate::client::fencing::commit_transfer(
                &self.inner,
                &self.res,
                &token,
                t,
                self.timeout,
            )
            .await
            .ok()?;
            if deadline.saturating_duration_since(Instant::now()) <= config.min_validity {
                return None;
            }
            Some(committed)
        } else {
            None
        };
        let mut lock = Lock::new(
            self.inner.clone(),
            self.res.clone(),
            self.epoch.token.clone(),
            self.ttl,
            deadline,
            None,
            fencing,
        )
        .with_kind(Kind::Exclusive, q);
        lock.set_waiter(self.epoch.token.as_bytes().to_vec());
        Some(lock)
    }

    /// Leaves without holding: releases the current token on every node and waits for it
    /// (bounded by the node timeout), so that a process that exits right after giving up
    /// leaves no queued entry a release could transfer to.
    async fn leave(&mut self) {
        if self.kept || !self.epoch.sent_anywhere() {
            return;
        }
        let token = self.epoch.token.clone();
        let req = Request::release(&self.res, &token, token.as_bytes(), false);
        let timeout = self.timeout;
        let all: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .map(|n| n.send(&req, timeout))
            .collect();
        all.collect::<Vec<_>>().await;
        // Released (if this future is dropped before, the drop releases it again).
        self.kept = true;
    }

    /// After a claim won the lock: lets the current token's queue entries lapse at once
    /// on the nodes `granted` (a renewal with a zero lease, in the background), so the next
    /// waiter is the queue's head there now rather than when the entry's lease runs out:
    /// should this holder crash after the lapse landed, the next waiter waits for the
    /// lock's TTL only. On those nodes the key holds this lock's token, so only its own
    /// release acts there. The entries on the nodes that refused the claim stay (a
    /// minority, which the head rule ignores): a late release there (of the holder the
    /// claim found) transfers that key to this lock's own token, which its release
    /// deletes, instead of to the next waiter, which would count one node and claim
    /// against a lock that is held.
    fn lapse_in_background(&self, granted: &[usize]) {
        let Some(n) = self.notifier() else {
            return;
        };
        let inbox = self.res.inbox(n.inbox());
        let args = JoinArgs {
            token: self.epoch.token.as_bytes(),
            ticket: b"",
            lease: Duration::ZERO,
            ttl: self.ttl,
            kind: self.kind,
            first: false,
            inbox: &inbox,
        };
        let join = Arc::new(self.queue_join(&args));
        let nodes: Vec<_> = granted
            .iter()
            .filter(|i| self.epoch.confirmed.get(**i).is_some_and(Option::is_some))
            .filter_map(|i| self.inner.nodes.get(*i).cloned())
            .collect();
        if nodes.is_empty() {
            return;
        }
        let timeout = self.timeout;
        crate::io::background::spawn(async move {
            let all: FuturesUnordered<_> =
                nodes.iter().map(|n| n.join_queue(&join, timeout)).collect();
            all.collect::<Vec<_>>().await;
        });
    }

    /// Keeps the current token for a returned lock. Its entries on nodes that did not
    /// transfer stay: the lock's release drops them, or their lease lapses (they are no
    /// longer renewed). A release there meanwhile may hand that node's key to the token
    /// the lock already holds, which only adds a key the lock's release deletes.
    fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.kept && self.epoch.sent_anywhere() {
            self.release_in_background(&self.epoch.token.clone(), &self.all_nodes());
        }
        if let Some(n) = self.notifier() {
            n.unroute(self.epoch.token.as_bytes());
            for r in &self.retired {
                n.unroute(r.as_bytes());
            }
        }
    }
}

/// Whether some node refused a failed claim: the key was held there (by a lock being
/// released, or by another), so finding it free later is news.
fn refused_somewhere(v: Option<&Votes>) -> bool {
    v.is_some_and(|v| {
        v.iter()
            .any(|n| matches!(n.outcome, crate::NodeOutcome::HeldByOther))
    })
}

/// Whether every node answered a failed claim and refused it (nothing to clean up: the
/// token's entries are untouched).
fn all_refused(v: Option<&Votes>) -> bool {
    v.is_some_and(|v| {
        v.iter()
            .all(|n| matches!(n.outcome, crate::NodeOutcome::HeldByOther))
    })
}

/// Acquires a single-resource mutex with notify waiting by transfer (see the module
/// docs). `yield_first`: this client released the resource moments ago while others
/// waited; join first instead of claiming at once.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    retry: &Retry,
    mut interest: Interest,
    yield_first: bool,
) -> Result<Lock, Error> {
    // A lock handed over holds for `ttl` without an acquisition round of its own: the
    // group-map record must cover it (see `groupmap`). A mismatch ends the wait; a record
    // not confirmed now is waited out like any refusal (each claim covers again, and so
    // does a hand-off before it is held).
    if let Err(e) = inner.cover(ttl).await
        && !e.is_retryable()
    {
        return Err(e);
    }
    let start = Instant::now();
    let give_up_at = retry.max_wait.map(|d| later(start, d));
    let timeout = inner.config.node_timeout_for(ttl);
    let window = handoff_window(timeout, retry.delay_max);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let token = Token::generate()?;
    if let Some(n) = &inner.notifier {
        n.route(token.as_bytes(), tx.clone());
    }
    let mut w = Waiter {
        inner: inner.clone(),
        res: res.clone(),
        ttl,
        timeout,
        kind: if inner.config.fencing {
            EntryKind::FencedTransfer
        } else {
            EntryKind::Transfer
        },
        ticket: None,
        epoch: Epoch::new(token, inner.nodes.len()),
        retired: Vec::new(),
        tx,
        renew_at: tokio::time::Instant::now(),
        kept: false,
    };
    let q = inner.quorum;
    let mut attempts: u32 = 0;
    let mut last: Option<Votes> = None;
    let mut claim_now = !yield_first;
    // A plain release was heard when not the head: claim if the renewal it prompts says
    // this waiter is the head now.
    let mut recheck = false;
    let mut fallback_at = later(
        tokio::time::Instant::now(),
        jitter(retry.delay_min, retry.delay_max),
    );
    // No claim because the key was found free before this: set after a claim that failed
    // although no node refused it (too little validity left, a node's error), which a
    // free key would only repeat at once, whatever the retry delay says.
    let mut free_after = tokio::time::Instant::now();
    loop {
        // The client saw another group map: it takes no lock from now on, not even one
        // handed over; leaving releases whatever was transferred to this waiter.
        if let Err(e) = inner.map.usable() {
            w.leave().await;
            return crate::base::metrics::waited(start, Err(e));
        }
        // Announcements that arrived meanwhile (during a claim: noted, counted now unless
        // the token was retired, in which case they are passed on).
        while let Ok(t) = rx.try_recv() {
            w.heard(&t);
        }
        // Fenced, a node counted from a renewal's reply has no announced counter to
        // commit: claim instead (the token there counts as granted, the counter raised as
        // for a fresh grant) rather than retire, which would give the lock away.
        let unfenced_count =
            inner.config.fencing && w.epoch.counted.iter().flatten().any(Option::is_none);
        if w.epoch.n_counted() >= q && unfenced_count {
            claim_now = true;
        } else if w.epoch.n_counted() >= q {
            match w.hold().await {
                Some(lock) => {
                    w.keep();
                    crate::base::metrics::handoff(true);
                    interest.adapt(false);
                    return crate::base::metrics::waited(start, Ok(lock));
                }
                None => {
                    // Refused for another group map seen meanwhile: leave with the token
                    // the lock was handed to, awaited as at the top of the loop (a
                    // process that exits on the error leaves no key behind).
                    if let Err(e) = inner.map.usable() {
                        w.leave().await;
                        return crate::base::metrics::waited(start, Err(e));
                    }
                    w.retire()?;
                    continue;
                }
            }
        }
        if w.epoch.gone && !claim_now {
            w.retire()?;
        }
        let now = Instant::now();
        let window_passed = w
            .epoch
            .first_count
            .is_some_and(|f| now.saturating_duration_since(f) >= window);
        if claim_now || handoff::claims(w.epoch.n_counted(), q, window_passed, false) {
            claim_now = false;
            attempts = attempts.saturating_add(1);
            let mut ask = Ask::new(Kind::Exclusive, q);
            ask.own = Some(w.epoch.token.clone());
            match acquire_as(inner, res, &ask, ttl, attempts).await {
                Ok(mut lock) => {
                    w.keep();
                    w.lapse_in_background(lock.granted_nodes());
                    crate::base::metrics::handoff(w.epoch.sent_anywhere());
                    interest.adapt(false);
                    lock.set_waiter(w.epoch.token.as_bytes().to_vec());
                    return crate::base::metrics::waited(start, Ok(lock));
                }
                Err(e) if !e.is_retryable() => {
                    w.leave().await;
                    return crate::base::metrics::waited(start, Err(e));
                }
                Err(e) => {
                    last = e.votes().cloned();
                    let split = last.as_ref().is_some_and(Votes::is_split);
                    crate::base::metrics::split_vote(split);
                    if split {
                        interest.adapt(true);
                    }
                    // Retired even before it joined anywhere: a grant of the failed claim
                    // may still be on a node (its clean-up in flight), and a key holding
                    // the token must never be taken for a transfer to it.
                    if handoff::retires_after_claim(all_refused(last.as_ref())) {
                        w.retire()?;
                    } else if w.epoch.first_count.is_some() {
                        // Kept: the hand-off window starts again.
                        w.epoch.first_count = Some(Instant::now());
                    }
                }
            }
            if retry.attempts.is_some_and(|n| attempts >= n) {
                break;
            }
            fallback_at = later(
                tokio::time::Instant::now(),
                jitter(retry.delay_min, retry.delay_max),
            );
            if !refused_somewhere(last.as_ref()) {
                free_after = fallback_at;
            }
            continue;
        }
        if tokio::time::Instant::now() >= w.renew_at {
            w.join().await;
            let rechecked = std::mem::take(&mut recheck);
            // The head of one resource's queue claims when its key is free (or transferred
            // to it) on a quorum: no announcement may come. A release is announced by its
            // first herald as soon as that key is free, and wakes a client's waiters
            // once; a claim it prompted can reach the other nodes before the release
            // does, be refused there, and leave nothing to wake the waiter when the
            // release lands (before this join: the key is free there; after it: the key
            // is transferred to this waiter). It claims after a random stagger within
            // the contention window (the fallback timer brought forward): two waiters
            // that each take themselves for the head, from different nodes' replies,
            // must not claim in lock-step again and again. Not again before the retry
            // delay after a claim no node refused (`free_after`).
            let free_now = w.epoch.free && tokio::time::Instant::now() >= free_after;
            if w.epoch.head && rechecked {
                // A plain release was heard while a waiter ahead was still on record: the
                // renewal says this one is the head now.
                claim_now = true;
            } else if w.epoch.head && free_now {
                let stagger = jitter(Duration::ZERO, interest.window());
                fallback_at = fallback_at.min(later(tokio::time::Instant::now(), stagger));
            }
            continue;
        }
        if give_up_at.is_some_and(|at| Instant::now() >= at) {
            break;
        }
        let give_up = give_up_at.map_or_else(
            || later(tokio::time::Instant::now(), Duration::from_secs(3600)),
            tokio::time::Instant::from_std,
        );
        let window_at = w
            .epoch
            .first_count
            .map(|f| tokio::time::Instant::from_std(later(f, window)));
        tokio::select! {
            t = rx.recv() => {
                if let Some(t) = t {
                    w.heard(&t);
                }
            }
            () = tokio::time::sleep_until(w.renew_at) => {}
            wake = interest.released() => {
                // A release that handed the lock to no one: transfers are announced in
                // the waiter's inbox, so this is a plain release on the resource's channel
                // (a node whose queue had no live transfer entry). The key is free there; the queue's head, or a waiter queued
                // nowhere, claims now rather than at its fallback timer. A subscription
                // that only became active is no release: claiming on it would spend an
                // attempt on a lock still held (a release missed before it was active is
                // found by the fallback timer and the renewals).
                if wake == Wake::Released {
                    if w.epoch.head || !w.epoch.sent_anywhere() {
                        claim_now = true;
                    } else {
                        // Not the head as of the latest reply; that may be stale (the
                        // waiter that was ahead left, or took the lock by a claim, and its
                        // entry has gone since). Renew soon to find out, rather than at the
                        // next renewal (a third of the lease later).
                        let now = tokio::time::Instant::now();
                        w.renew_at = contention::recheck_at(w.renew_at, now);
                        recheck = true;
                    }
                }
            }
            () = tokio::time::sleep_until(fallback_at) => {
                // Only the queue's head (as the latest reply said) claims on the fallback
                // timer: a holder that died, or announcements that were lost. The others
                // would only be refused, or jump the queue.
                if w.epoch.head || !w.epoch.sent_anywhere() {
                    claim_now = true;
                } else {
                    fallback_at = later(
                        tokio::time::Instant::now(),
                        jitter(retry.delay_min, retry.delay_max),
                    );
                }
            }
            () = tokio::time::sleep_until(window_at.unwrap_or(give_up)), if window_at.is_some() => {}
            () = tokio::time::sleep_until(give_up) => {}
        }
    }
    w.leave().await;
    crate::base::metrics::waited(start, Err(Timeout::gave_up(start, attempts, last)))
}
