//! One acquisition attempt ([`acquire_once`], or [`acquire_as`] for any [`Kind`] of lock):
//! fan out, decide at the quorum, and either return the [`Lock`] or clean up every node
//! the attempt may have set its key on ([`Attempt`]). With fencing on (the mutex, a
//! read-write lock's writer), the two rounds of [`fencing`](crate::client::fencing) run in
//! between. Every kind goes through the same steps; only the requests differ
//! ([`Ask`]: the acquire request, its quorum; the clean-up is the kind's release). A
//! semaphore permit also decides which `Q` grants it keeps and gives back the others
//! ([`protocol::semaphore::place`](crate::protocol::semaphore::place)).
//!
//! ```text
//!   token, request ──Round::start──▶ decide ──▶ [fencing::commit] ──▶ Attempt::finish
//!                                                                  ├▶ verdict Held ──▶ Lock (stragglers drained: InFlight;
//!                                                                  │                   a permit then decides its KeptNodes
//!                                                                  │                   and gives back the rest)
//!                                                                  └▶ otherwise ──▶ clean-up plan (protocol::cleanup) ──▶ error
//!   dropped before finish ──▶ Attempt::drop ──▶ the same clean-up, in the background
//! ```

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, field};

use crate::base::error::Error;
use crate::base::resource::{Kind, Resources};
use crate::base::token::Token;
use crate::client::fencing::FenceKeys;
use crate::client::lock::Lock;
use crate::client::shared::Inner;
use crate::io::fanout::{Cleanup, InFlight, KeptNodes, Round};
use crate::io::node::Request;
use crate::protocol::contention::QUEUE_LEASE;
use crate::protocol::reply::{holder_ids, largest_holder};
use crate::protocol::{Decision, Reply, Verdict, cleanup, semaphore, verdict};

/// What an attempt asks each node for: the kind of lock (which selects every request),
/// the quorum it needs, and the kind's own arguments.
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) kind: Kind,
    pub(crate) quorum: usize,
    /// A waiting writer's intent id; empty for every other attempt.
    pub(crate) intent: Vec<u8>,
    /// A semaphore's configuration text (`"P:c:Q:N"`) and per-node limit `c`.
    pub(crate) permit: Option<(String, u32)>,
    /// A queued waiter's own token (its epoch token, the one its queue entries carry): the
    /// attempt uses it instead of a fresh one, and a key that already holds it (transferred
    /// to it) counts as granted (`claim.lua`; fenced: `acquire_fenced.lua` on one key).
    pub(crate) own: Option<Token>,
    /// A token chosen by the caller for a fresh acquisition (the parts of a lock spanning
    /// several lock groups share one); unlike `own`, it changes no request.
    pub(crate) token: Option<Token>,
}

impl Ask {
    /// A lock of `kind` needing `quorum` grants.
    pub(crate) fn new(kind: Kind, quorum: usize) -> Ask {
        Ask {
            kind,
            quorum,
            intent: Vec::new(),
            permit: None,
            own: None,
            token: None,
        }
    }

    /// The first round's request and, when fenced, the keys of the fencing commit.
    fn request(
        &self,
        res: &Resources,
        token: &Token,
        ttl: Duration,
        fencing: bool,
    ) -> (Request, Option<FenceKeys>) {
        match &self.kind {
            Kind::Exclusive if fencing => {
                let (request, keys) = crate::client::fencing::request(res, token, ttl);
                (request, Some(keys))
            }
            Kind::Exclusive if self.own.is_some() => {
                (Request::claim(res.lock_keys(), token, ttl), None)
            }
            Kind::Exclusive => (Request::acquire(res.lock_keys(), token, ttl), None),
            Kind::Read(k) => (Request::read_acquire(k, token, ttl), None),
            Kind::Write(k) => (
                Request::write_acquire(k, token, ttl, &self.intent, QUEUE_LEASE, fencing),
                fencing.then(|| FenceKeys::writer(k)),
            ),
            Kind::Permit(k) => {
                let (config, limit) = self.permit.clone().unwrap_or_default();
                (Request::sem_acquire(k, token, ttl, &config, limit), None)
            }
        }
    }
}

/// One attempt at the mutex on `res`.
pub(crate) async fn acquire_once(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    attempt: u32,
) -> Result<Lock, Error> {
    let ask = Ask::new(Kind::Exclusive, inner.quorum);
    acquire_as(inner, res, &ask, ttl, attempt).await
}

/// One acquisition attempt: fan out, decide at quorum, compute the validity, and either
/// return the lock or clean up every node.
pub(crate) async fn acquire_as(
    inner: &Arc<Inner>,
    res: &Resources,
    ask: &Ask,
    ttl: Duration,
    attempt: u32,
) -> Result<Lock, Error> {
    // A client that saw another group map sends no attempt, whichever loop asks; and the
    // group-map record must outlive the lock (see `groupmap`).
    inner.cover(ttl).await?;
    let config = &inner.config;
    let token = match ask.own.as_ref().or(ask.token.as_ref()) {
        Some(t) => t.clone(),
        None => Token::generate()?,
    };
    let node_timeout = config.node_timeout_for(ttl);
    let span = tracing::debug_span!(
        "quorumlock.acquire",
        resource = %res.label(),
        mode = ask.kind.label(),
        nodes = inner.nodes.len(),
        quorum = ask.quorum,
        ttl_ms = crate::base::time::log_ms(ttl),
        attempt,
        token = %token,
        granted = field::Empty,
        elapsed_us = field::Empty,
        validity_ms = field::Empty,
        outcome = field::Empty,
        votes = field::Empty,
    );
    let own_span = span.clone();
    async move {
        let (request, fence) = ask.request(res, &token, ttl, config.fencing);
        let request = Arc::new(request);
        let round = Round::start(&inner.nodes, ask.quorum, |_, node| {
            let node = node.clone();
            let request = request.clone();
            async move { node.send(&request, node_timeout).await }
        });
        let mut attempt = Attempt {
            inner: inner.clone(),
            res: res.clone(),
            ask: ask.clone(),
            token,
            node_timeout,
            round,
            armed: true,
            span: own_span,
        };
        let decision = attempt.round.decide().await;
        let fencing_token = match fence {
            Some(keys) if decision == Decision::Reached => {
                let committed = crate::client::fencing::commit(
                    inner,
                    &attempt.round,
                    keys,
                    &attempt.token,
                    node_timeout,
                );
                match committed.await {
                    Ok(t) => Some(t),
                    Err(e) => return attempt.abandon(e).await,
                }
            }
            _ => None,
        };
        attempt.finish(decision, ttl, fencing_token).await
    }
    .instrument(span)
    .await
}

/// One acquisition attempt in progress. If it is dropped before [`Attempt::finish`]
/// decides, every node that may hold its key is released in the background.
pub(crate) struct Attempt {
    inner: Arc<Inner>,
    res: Resources,
    ask: Ask,
    token: Token,
    node_timeout: Duration,
    round: Round,
    armed: bool,
    /// The attempt's own span, where its fields are recorded (never `Span::current()`:
    /// with this span disabled, that is the caller's span).
    span: tracing::Span,
}

impl Attempt {
    /// Decides the attempt: a lock, or an error after cleaning up.
    async fn finish(
        mut self,
        decision: Decision,
        ttl: Duration,
        fencing_token: Option<u64>,
    ) -> Result<Lock, Error> {
        let config = &self.inner.config;
        let (elapsed, validity) = self.round.measure(ttl, config.drift_factor, &self.span);
        // Never past the group-map record's coverage (checked before the round; a pause
        // since then must not stretch it).
        let validity = validity.min(self.inner.map.coverage_from(self.round.started()));
        let tally = self.round.tally();
        let verdict = match self.ask.kind {
            Kind::Permit(_) => semaphore::acquire(decision, tally, validity, config.min_validity),
            _ => verdict::acquire(decision, tally, validity, config.min_validity),
        };
        let span = &self.span;
        span.record("outcome", verdict.label("acquired"));
        self.inner.metrics.acquire(verdict, elapsed);
        if !span.is_disabled() {
            span.record("votes", self.round.votes(&self.inner.nodes).per_node());
        }
        if let Verdict::Held { validity } = verdict {
            self.armed = false;
            let deadline = crate::base::time::earlier_of_overflow(self.round.started(), validity);
            let (inflight, kept) = match self.ask.kind {
                Kind::Permit(_) => {
                    let (inflight, kept) = self.give_back();
                    (inflight, Some(kept))
                }
                _ => (InFlight::track(&mut self.round), None),
            };
            let lock = Lock::new(
                self.inner.clone(),
                self.res.clone(),
                self.token.clone(),
                ttl,
                deadline,
                inflight,
                fencing_token,
            );
            // A queued waiter's claim: which nodes granted (it lets its queue entries lapse
            // there only). Not computed for other acquisitions (the hot path).
            let granted = if self.ask.own.is_some() {
                self.round
                    .votes(&self.inner.nodes)
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| matches!(v.outcome, crate::NodeOutcome::Granted))
                    .map(|(i, _)| i)
                    .collect()
            } else {
                Vec::new()
            };
            let lock = lock
                .with_kind(self.ask.kind.clone(), self.ask.quorum)
                .with_granted(granted);
            return Ok(match kept {
                Some(kept) => lock.with_kept(kept),
                None => lock,
            });
        }
        let mut votes = self.round.votes(&self.inner.nodes);
        votes.largest_holder = largest_holder(self.round.replies().map(|(_, r)| r));
        votes.holder_ids = holder_ids(self.round.replies().map(|(_, r)| r));
        let mismatch = semaphore::mismatch(self.round.replies().map(|(_, r)| r));
        let err = match (mismatch, verdict) {
            (Some(stored), _) => Error::PermitsMismatch(crate::base::error::PermitsMismatch::new(
                stored.to_owned(),
                self.ask.permit.clone().unwrap_or_default().0,
                votes,
            )),
            (None, Verdict::Timeout) => Error::no_validity(elapsed, votes),
            (None, Verdict::HeldByOther) => Error::Held(votes),
            (None, _) => Error::NoQuorum(votes),
        };
        self.fail(err).await
    }

    /// A semaphore permit held at quorum keeps its entries on `Q` nodes only: once every
    /// request of the round has finished (each bounded by the node timeout), it decides
    /// which ([`semaphore::place`]: the least loaded grants), records them in the returned
    /// [`KeptNodes`] (before anything is given back: the permit's extensions wait for it
    /// and count those nodes only), and gives back the other grants and the unknown
    /// answers, never a kept node, in the background. Meanwhile the lock's own requests
    /// wait for each node's acquire, as the mutex's do ([`InFlight`]). With no request
    /// left running, the set is decided before this returns.
    fn give_back(&mut self) -> (Option<InFlight>, KeptNodes) {
        let mut answers: Vec<(usize, Reply)> =
            self.round.arrivals().map(|(i, r)| (i, r.clone())).collect();
        let q = self.ask.quorum;
        let release = self.release_on(Arc::new(self.release_request()));
        let (decide, kept) = KeptNodes::undecided();
        let inflight = InFlight::track_then(&mut self.round, move |late| {
            answers.extend(late);
            let placement = semaphore::place(answers.iter().map(|(i, r)| (*i, r)), q);
            decide.decide(placement.kept);
            let all: futures::stream::FuturesUnordered<_> = placement
                .back
                .into_iter()
                .filter(|&i| !placement.kept.contains(i))
                .map(release)
                .collect();
            async move {
                use futures::StreamExt;
                all.collect::<Vec<_>>().await;
            }
        });
        (inflight, kept)
    }

    /// The kind's release of this attempt's token (never announced).
    fn release_request(&self) -> Request {
        Request::release_held(&self.ask.kind, &self.res, &self.token, &[], false)
    }

    /// Sends `call` to a node by index, bounded by the node timeout.
    fn release_on(
        &self,
        call: Arc<Request>,
    ) -> impl Fn(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>
    + Send
    + Sync
    + 'static {
        let inner = self.inner.clone();
        let timeout = self.node_timeout;
        move |i: usize| {
            let node = inner.nodes.get(i).cloned();
            let call = call.clone();
            Box::pin(async move {
                match node {
                    Some(node) => node.send(&call, timeout).await,
                    None => Reply::TimedOut,
                }
            })
        }
    }

    /// Gives the attempt up with `err` (the fencing commit missed its quorum).
    async fn abandon(self, err: Error) -> Result<Lock, Error> {
        self.span.record("outcome", "abandoned");
        self.inner
            .metrics
            .acquire_ended(crate::base::metrics::Ended::Abandoned, self.round.started());
        self.fail(err).await
    }

    /// Returns `err` after releasing the granting nodes (awaited, so that a failed
    /// attempt's keys there are gone when it returns; bounded by the node timeout;
    /// dropping this future does not stop the clean-up).
    async fn fail(mut self, err: Error) -> Result<Lock, Error> {
        let granted_released = self.clean_up(true);
        let _ = granted_released.await;
        Err(err)
    }

    /// Starts the clean-up in the background, per the plan (`protocol::cleanup`): the
    /// granting nodes first, then every node that failed or timed out, then each node still
    /// running its request once it lands (unless it lands refused). Returns a receiver that
    /// completes once the granting nodes are released.
    fn clean_up(&mut self, wait_for_granted: bool) -> tokio::sync::oneshot::Receiver<()> {
        self.armed = false;
        let plan = cleanup::plan(self.round.replies(), wait_for_granted);
        let cleanup = Cleanup {
            plan,
            later: self.round.take_pending(),
        };
        let call = Arc::new(self.release_request());
        cleanup.spawn(self.release_on(call))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.armed {
            self.inner
                .metrics
                .acquire_ended(crate::base::metrics::Ended::Cancelled, self.round.started());
            tracing::debug!(resource = %self.res.label(), token = %self.token,
                "quorumlock: attempt cancelled; releasing in the background");
            drop(self.clean_up(false));
        }
    }
}
