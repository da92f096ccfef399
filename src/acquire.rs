//! One acquisition attempt ([`acquire_once`]): fan out, decide at the quorum, and either
//! return the [`Lock`] or clean up every node the attempt may have set its key on
//! ([`Attempt`]). With fencing on, the two rounds of [`fencing`](crate::fencing) run in
//! between.
//!
//! ```text
//!   token, request ──Round::start──▶ decide ──▶ [fencing::commit] ──▶ Attempt::finish
//!                                                                  ├▶ verdict Held ──▶ Lock (stragglers drained: InFlight)
//!                                                                  └▶ otherwise ──▶ clean-up plan (protocol::cleanup) ──▶ error
//!   dropped before finish ──▶ Attempt::drop ──▶ the same clean-up, in the background
//! ```

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, field};

use crate::error::Error;
use crate::fanout::{Cleanup, InFlight, Round};
use crate::lock::Lock;
use crate::node::Request;
use crate::protocol::reply::{holder_ids, largest_holder};
use crate::protocol::{Decision, Reply, Verdict, cleanup, verdict};
use crate::resource::Resources;
use crate::shared::Inner;
use crate::token::Token;

/// One acquisition attempt: fan out, decide at quorum, compute the validity, and either
/// return the lock or clean up every node.
pub(crate) async fn acquire_once(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    attempt: u32,
) -> Result<Lock, Error> {
    let config = &inner.config;
    let token = Token::generate()?;
    let node_timeout = config.node_timeout_for(ttl);
    let span = tracing::debug_span!(
        "quorumlock.acquire",
        resource = %res.label(),
        nodes = inner.nodes.len(),
        quorum = inner.quorum,
        ttl_ms = crate::time::log_ms(ttl),
        attempt,
        token = %token,
        granted = field::Empty,
        elapsed_us = field::Empty,
        validity_ms = field::Empty,
        outcome = field::Empty,
    );
    async move {
        let (round, fence) = if config.fencing {
            let (round, keys) = crate::fencing::start(inner, res, &token, ttl, node_timeout);
            (round, Some(keys))
        } else {
            let request = Arc::new(Request::acquire(res.lock_keys(), &token, ttl));
            let round = Round::start(&inner.nodes, inner.quorum, |_, node| {
                let node = node.clone();
                let request = request.clone();
                async move { node.send(&request, node_timeout).await }
            });
            (round, None)
        };
        let mut attempt = Attempt::new(inner.clone(), res.clone(), token, node_timeout, round);
        let decision = attempt.round.decide().await;
        let fencing_token = match fence {
            Some(keys) if decision == Decision::Reached => {
                let committed = crate::fencing::commit(
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
    token: Token,
    node_timeout: Duration,
    round: Round,
    armed: bool,
}

impl Attempt {
    fn new(
        inner: Arc<Inner>,
        res: Resources,
        token: Token,
        node_timeout: Duration,
        round: Round,
    ) -> Attempt {
        Attempt {
            inner,
            res,
            token,
            node_timeout,
            round,
            armed: true,
        }
    }

    /// Decides the attempt: a lock, or an error after cleaning up.
    async fn finish(
        mut self,
        decision: Decision,
        ttl: Duration,
        fencing_token: Option<u64>,
    ) -> Result<Lock, Error> {
        let config = &self.inner.config;
        let (elapsed, validity) = self.round.measure(ttl, config.drift_factor);
        let tally = self.round.tally();
        let verdict = verdict::acquire(decision, tally, validity, config.min_validity);
        tracing::Span::current().record("outcome", verdict.label("acquired"));
        self.inner.metrics.acquire(verdict, elapsed);
        if let Verdict::Held { validity } = verdict {
            self.armed = false;
            let deadline = crate::time::earlier_of_overflow(self.round.started(), validity);
            let inflight = InFlight::track(&mut self.round);
            return Ok(Lock::new(
                self.inner.clone(),
                self.res.clone(),
                self.token.clone(),
                ttl,
                deadline,
                inflight,
                fencing_token,
            ));
        }
        let mut votes = self.round.votes(&self.inner.nodes);
        votes.largest_holder = largest_holder(self.round.replies().map(|(_, r)| r));
        votes.holder_ids = holder_ids(self.round.replies().map(|(_, r)| r));
        let err = match verdict {
            Verdict::Timeout => Error::no_validity(elapsed, votes),
            Verdict::HeldByOther => Error::Held(votes),
            _ => Error::NoQuorum(votes),
        };
        self.fail(err).await
    }

    /// Gives the attempt up with `err` (the fencing commit missed its quorum).
    async fn abandon(self, err: Error) -> Result<Lock, Error> {
        tracing::Span::current().record("outcome", "abandoned");
        crate::metrics::acquire_ended(crate::metrics::Ended::Abandoned, self.round.started());
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
        let inner = self.inner.clone();
        let call = Arc::new(Request::release(&self.res, &self.token, false, &[]));
        let timeout = self.node_timeout;
        cleanup.spawn(move |i: usize| {
            let node = inner.nodes.get(i).cloned();
            let call = call.clone();
            async move {
                match node {
                    Some(node) => node.send(&call, timeout).await,
                    None => Reply::TimedOut,
                }
            }
        })
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.armed {
            crate::metrics::acquire_ended(crate::metrics::Ended::Cancelled, self.round.started());
            tracing::debug!(resource = %self.res.label(), token = %self.token,
                "quorumlock: attempt cancelled; releasing in the background");
            drop(self.clean_up(false));
        }
    }
}
