//! Fan-out: send one request to every node in parallel, decide as soon as the outcome is
//! certain, and take care of the stragglers.
//!
//! A [`Round`] owns one future per node. [`Round::decide`] feeds their answers, in arrival
//! order, into a [`Tally`](crate::protocol::Tally) and returns as soon as the quorum is
//! reached or can no longer be reached; it does not wait for the slowest node. The
//! futures still running at that point (the stragglers) are handed back to the caller,
//! who decides what they need:
//!
//! * after a successful acquisition, they are drained in the background; a lock's later
//!   extend/release on such a node waits for that node's acquire to finish first
//!   ([`InFlight`]), so a release can never overtake the `SET` it deletes;
//! * after a failed (or cancelled) acquisition, each straggler is awaited in the
//!   background and its node is then released ([`Cleanup`]), because a timed-out `SET`
//!   may still land.
//!
//! Elapsed time is measured from an [`Instant`] read before the first request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{Notify, oneshot, watch};

use crate::background::spawn;
use crate::error::{NodeOutcome, NodeVote, Votes};
use crate::node::Node;
use crate::protocol::cleanup::{self, Plan};
use crate::protocol::semaphore::{self, NodeSet};
use crate::protocol::{Ballot, Decision, Reply, Tally};

/// One node's request, tagged with the node's index.
pub(crate) type NodeFuture = Pin<Box<dyn Future<Output = (usize, Reply)> + Send + 'static>>;

/// The in-flight requests of one round and the answers so far.
pub(crate) struct Round {
    started: Instant,
    pending: FuturesUnordered<NodeFuture>,
    replies: Vec<Option<Reply>>,
    /// The nodes that answered, in arrival order.
    order: Vec<usize>,
    tally: Tally,
}

impl Round {
    /// Reads the clock, then creates one request per node with `f`. Requests are sent on
    /// the first poll of [`decide`](Round::decide).
    pub(crate) fn start<F, Fut>(nodes: &[Node], quorum: usize, f: F) -> Round
    where
        F: FnMut(usize, &Node) -> Fut,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        Round::build(nodes, |_| true, Tally::new(nodes.len(), quorum), f)
    }

    /// As [`start`](Round::start), on the nodes of `among` only: the others are not asked
    /// and do not vote (a kept permit's extension, [`semaphore::extension_tally`]).
    pub(crate) fn start_on<F, Fut>(nodes: &[Node], among: NodeSet, quorum: usize, f: F) -> Round
    where
        F: FnMut(usize, &Node) -> Fut,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let tally = semaphore::extension_tally(among, quorum);
        Round::build(nodes, |i| among.contains(i), tally, f)
    }

    fn build<F, Fut>(nodes: &[Node], ask: impl Fn(usize) -> bool, tally: Tally, mut f: F) -> Round
    where
        F: FnMut(usize, &Node) -> Fut,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let started = Instant::now();
        let pending = FuturesUnordered::new();
        for (i, node) in nodes.iter().enumerate().filter(|(i, _)| ask(*i)) {
            let fut = f(i, node);
            pending.push(Box::pin(async move { (i, fut.await) }) as NodeFuture);
        }
        Round {
            started,
            pending,
            replies: (0..nodes.len()).map(|_| None).collect(),
            order: Vec::with_capacity(nodes.len()),
            tally,
        }
    }

    /// Waits until the outcome is certain. Cancel-safe: answers received so far stay in
    /// the round, and the pending requests stay owned by it.
    pub(crate) async fn decide(&mut self) -> Decision {
        loop {
            if let Some(d) = self.tally.decision() {
                return d;
            }
            match self.pending.next().await {
                Some((i, reply)) => {
                    self.tally.record(reply.ballot());
                    if let Some(slot) = self.replies.get_mut(i) {
                        *slot = Some(reply);
                        self.order.push(i);
                    }
                }
                None => return self.tally.final_decision(),
            }
        }
    }

    /// Measures a decided round: the time it took and the validity left for `ttl`
    /// (`protocol::tally::validity`), recorded on `span`, the operation's own span
    /// (`granted`, `elapsed_us`, `validity_ms`).
    pub(crate) fn measure(
        &self,
        ttl: Duration,
        drift_factor: f64,
        span: &tracing::Span,
    ) -> (Duration, Duration) {
        use crate::protocol::tally::{drift, validity};
        let elapsed = self.elapsed();
        let validity = validity(ttl, elapsed, drift(ttl, drift_factor));
        span.record("granted", self.tally.granted());
        span.record("elapsed_us", crate::time::log_us(elapsed));
        span.record("validity_ms", crate::time::log_ms(validity));
        (elapsed, validity)
    }

    /// Time since the clock was read at the start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Node `i`'s answer, if it has answered.
    pub(crate) fn reply(&self, i: usize) -> Option<&Reply> {
        self.replies.get(i).and_then(Option::as_ref)
    }

    /// The answers received so far, by node index.
    pub(crate) fn replies(&self) -> impl Iterator<Item = (usize, &Reply)> {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
    }

    /// The answers received so far, in the order they arrived.
    pub(crate) fn arrivals(&self) -> impl Iterator<Item = (usize, &Reply)> {
        self.order
            .iter()
            .filter_map(|&i| self.reply(i).map(|r| (i, r)))
    }

    /// Every node's outcome (pending ones as [`NodeOutcome::NotAwaited`]).
    pub(crate) fn votes(&self, nodes: &[Node]) -> Votes {
        Votes {
            quorum: self.tally.quorum(),
            largest_holder: None,
            holder_ids: Vec::new(),
            resources: Vec::new(),
            elapsed: self.elapsed(),
            votes: nodes
                .iter()
                .zip(&self.replies)
                .map(|(node, r)| NodeVote {
                    node: node.addr.clone(),
                    outcome: r.as_ref().map_or(NodeOutcome::NotAwaited, outcome),
                })
                .collect(),
        }
    }

    /// Takes the requests that are still running.
    pub(crate) fn take_pending(&mut self) -> FuturesUnordered<NodeFuture> {
        std::mem::take(&mut self.pending)
    }

    /// Takes the requests that are still running, after collecting, without waiting,
    /// those that have already finished (their answers, in arrival order). The answers are
    /// not counted: the round was decided before. Finishing them here, rather than in a
    /// background task, spares that task when every node has already answered, which on
    /// a fast network is the common case.
    fn take_unsettled(&mut self) -> (FuturesUnordered<NodeFuture>, Vec<(usize, Reply)>) {
        let mut pending = self.take_pending();
        let mut settled = Vec::new();
        while let Some(Some(answer)) = pending.next().now_or_never() {
            settled.push(answer);
        }
        (pending, settled)
    }

    /// Lets the requests still running finish in the background. Dropping them would be
    /// safe too (a sent command still runs), but finishing them keeps their connection's
    /// queue free of abandoned replies and lets tracing see them.
    pub(crate) fn detach(&mut self) {
        let (mut pending, _) = self.take_unsettled();
        if pending.is_empty() {
            return;
        }
        spawn(async move { while pending.next().await.is_some() {} });
    }
}

/// What a node's reply says, for [`Votes`] and tracing.
pub(crate) fn outcome(r: &Reply) -> NodeOutcome {
    match r {
        Reply::TimedOut => NodeOutcome::TimedOut,
        Reply::Failed(text) => NodeOutcome::Failed(text.clone()),
        r if r.ballot() == Ballot::Granted => NodeOutcome::Granted,
        _ => NodeOutcome::HeldByOther,
    }
}

/// Which nodes still have an acquire request running, one bit per node.
///
/// A lock created at quorum may still have `SET`s in flight on the other nodes. Any later
/// request of that lock to such a node first waits until the node's acquire finished (at
/// most the acquire's per-node timeout), so its commands reach the node in order.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    rx: watch::Receiver<u64>,
}

impl InFlight {
    /// Drains the round's pending requests in the background and tracks which nodes are
    /// done. Returns `None` when nothing is pending.
    pub(crate) fn track(round: &mut Round) -> Option<InFlight> {
        let (mask, pending, _) = InFlight::unsettled(round);
        InFlight::spawn_tracker(mask, pending, |_| async {})
    }

    /// As [`track`](InFlight::track), and once every pending request has finished, runs
    /// `landed` with their answers (in arrival order) in the same background task; at once
    /// with none if nothing was pending.
    pub(crate) fn track_then<F, Fut>(round: &mut Round, landed: F) -> Option<InFlight>
    where
        F: FnOnce(Vec<(usize, Reply)>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (mask, pending, settled) = InFlight::unsettled(round);
        if pending.is_empty() || mask == 0 {
            spawn(landed(settled));
            return None;
        }
        InFlight::spawn_tracker(mask, pending, move |mut late: Vec<(usize, Reply)>| {
            late.splice(0..0, settled);
            landed(late)
        })
    }

    /// The round's requests still running (those that already finished are collected
    /// first, without waiting), and the mask of their nodes.
    fn unsettled(round: &mut Round) -> (u64, FuturesUnordered<NodeFuture>, Vec<(usize, Reply)>) {
        let (pending, settled) = round.take_unsettled();
        let mask = round
            .replies
            .iter()
            .enumerate()
            .filter(|(i, r)| r.is_none() && !settled.iter().any(|(j, _)| j == i))
            .fold(0u64, |m, (i, _)| m | bit(i));
        (mask, pending, settled)
    }

    /// Drains `pending` in the background, clearing each node's bit of `mask` as its
    /// request finishes, then runs `landed` with their answers. `None` (and nothing
    /// spawned) when nothing is pending.
    fn spawn_tracker<F, Fut>(
        mask: u64,
        mut pending: FuturesUnordered<NodeFuture>,
        landed: F,
    ) -> Option<InFlight>
    where
        F: FnOnce(Vec<(usize, Reply)>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if pending.is_empty() || mask == 0 {
            return None;
        }
        let (tx, rx) = watch::channel(mask);
        let spawned = spawn(async move {
            let mut late = Vec::new();
            while let Some((i, reply)) = pending.next().await {
                tx.send_modify(|m| *m &= !bit(i));
                late.push((i, reply));
            }
            tx.send_replace(0);
            landed(late).await;
        });
        spawned.then_some(InFlight { rx })
    }

    /// Whether node `i`'s acquire has finished already.
    pub(crate) fn done(&self, i: usize) -> bool {
        *self.rx.borrow() & bit(i) == 0
    }

    /// Waits until node `i`'s acquire has finished.
    pub(crate) async fn wait(&self, i: usize) {
        let b = bit(i);
        let mut rx = self.rx.clone();
        // Err means the tracker ended, which happens only after clearing every bit.
        let _ = rx.wait_for(|m| m & b == 0).await;
    }
}

/// Where a semaphore permit keeps its entries ([`semaphore::place`]): undecided until its
/// give-back has every answer of the acquire round (each request is bounded by the node
/// timeout), then decided once, for good. The guard's extensions and the watchdog share
/// it: neither sends nor counts an extension of the permit before it is decided, and then
/// only on the kept nodes.
#[derive(Clone, Debug)]
pub(crate) struct KeptNodes {
    shared: Arc<Kept>,
}

/// The decision and its waiters (one allocation: the guard stays small).
#[derive(Debug, Default)]
struct Kept {
    set: OnceLock<NodeSet>,
    decided: Notify,
}

/// The give-back's side of [`KeptNodes`]: decides the set once. Dropped undecided (its
/// task never ran), the permit's extensions are never sent: it runs out at its deadline.
pub(crate) struct DecideKept {
    shared: Arc<Kept>,
}

impl KeptNodes {
    /// A set still to be decided, and the handle that decides it.
    pub(crate) fn undecided() -> (DecideKept, KeptNodes) {
        let shared = Arc::new(Kept::default());
        (
            DecideKept {
                shared: shared.clone(),
            },
            KeptNodes { shared },
        )
    }

    /// The kept nodes, once decided.
    pub(crate) fn get(&self) -> Option<NodeSet> {
        self.shared.set.get().copied()
    }

    /// Waits for the decision, at most `limit`: `None` if it has not come by then (or
    /// never will).
    pub(crate) async fn wait(&self, limit: Duration) -> Option<NodeSet> {
        let decided = async {
            loop {
                let notified = self.shared.decided.notified();
                if let Some(set) = self.get() {
                    return set;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, decided).await.ok()
    }
}

impl DecideKept {
    /// Decides the kept nodes (once: a second decision is ignored).
    pub(crate) fn decide(self, kept: NodeSet) {
        let _ = self.shared.set.set(kept);
        self.shared.decided.notify_waiters();
    }
}

fn bit(i: usize) -> u64 {
    1u64.checked_shl(u32::try_from(i).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

/// The clean-up after a failed or cancelled acquisition: release on every node that may
/// hold our key, each only after that node's acquire request has finished. What to release
/// when is the protocol's plan ([`cleanup`]); this runs it.
pub(crate) struct Cleanup {
    /// The nodes that answered: `first` (the caller may wait for these), then `now`.
    pub(crate) plan: Plan,
    /// Requests still running; each node is released once its request lands, per
    /// [`cleanup::after_landing`].
    pub(crate) later: FuturesUnordered<NodeFuture>,
}

impl Cleanup {
    /// Runs the clean-up in a background task with `release(node_index)`. The returned
    /// receiver completes once the `first` nodes are released; the rest goes on in the
    /// background even if the receiver is dropped.
    pub(crate) fn spawn<R, Fut>(self, release: R) -> oneshot::Receiver<()>
    where
        R: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let Cleanup {
            plan: Plan { first, now },
            mut later,
        } = self;
        spawn(async move {
            let mut firsts: FuturesUnordered<_> = first.into_iter().map(&release).collect();
            let mut others: FuturesUnordered<_> = now.into_iter().map(&release).collect();
            let mut done = Some(tx);
            loop {
                if firsts.is_empty()
                    && let Some(tx) = done.take()
                {
                    let _ = tx.send(());
                }
                tokio::select! {
                    Some(_) = firsts.next(), if !firsts.is_empty() => {}
                    Some(_) = others.next(), if !others.is_empty() => {}
                    Some((i, reply)) = later.next(), if !later.is_empty() => {
                        if cleanup::after_landing(&reply) {
                            others.push(release(i));
                        }
                    }
                    else => break,
                }
            }
        });
        rx
    }
}
