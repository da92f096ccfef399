//! Fencing tokens: a number that strictly increases across successive holders of a
//! resource, safe across the quorum and across nodes that lost their counters.
//!
//! Two rounds (see `docs/safety.md` for the full argument):
//!
//! 1. **Acquire**: per node, one script takes every lock key or none and, when it does,
//!    raises each resource's fence counter to `max(counter + 1, now)`, where `now` is the
//!    node's own clock (Redis `TIME`) in microseconds since the Unix epoch, and returns the
//!    largest new value. Once a quorum granted, the client takes `t` = the maximum over
//!    the granting nodes.
//! 2. **Commit**: sent to every node that did not refuse round 1: only if the lock keys
//!    still hold our token, raise every counter of the lock to `max(counter, t)`. The
//!    token is usable as soon as **any** quorum confirms (not necessarily the nodes that
//!    granted first, so a node stalling between the rounds does not fail the attempt);
//!    otherwise the acquisition fails and is released.
//!
//! Why it is ordered: let A's acquisition return with `t_A`, and B's attempt start after
//! that. A's commit quorum and B's granting quorum share a node `x`, and A's commit ran on
//! `x` before B's grant there. If `x` kept its counter, B's grant there is at least
//! `t_A + 1`. If `x` lost it (restarted without persistence, or from a stale snapshot),
//! it was down for a time `D`, while `t_A` is a clock reading (or a counter raised by one
//! per holder from one) that some node took before `x` went down; so `x`'s clock, and
//! with it B's grant there, is past `t_A` provided that reading was not ahead of `x`'s
//! clock by `D` or more *when it was taken*, and `x`'s clock did not fall back while it
//! was down. Either way `t_B`, the maximum over B's granting nodes, is larger than
//! `t_A`. (The same holds when B merely set its key on `x` after A's key there was gone:
//! A's commit on `x` needed A's key, so it came first.)
//!
//! Attempts that overlap in time are ordered too, by the moment they return: if B's key
//! on `x` came *before* A's, it was gone before A's grant there, so B's attempt lasted
//! longer than its TTL and was refused for want of validity (measured over both rounds).
//!
//! The clock condition is about every reading that ever went into a token, not about the
//! clocks at the time of a restart: a node whose clock once ran ahead by `S` (and was then
//! corrected, by a step or a slew) left tokens `S` ahead in the counters of every node its
//! holders committed to, and a later restart of *another* node, down for less than `S`,
//! hands out smaller ones (`tests/fencing_review.rs` shows it). A host must also not start
//! `redis-server` before its clock is synchronised.
//!
//! No quorum read, re-seed or "unseeded" state is needed: every granting quorum yields
//! a token. Tokens read like timestamps in microseconds: they follow the fastest clock
//! reading any holder of the resource ever got, plus one per holder while that reading is
//! ahead of the granting nodes' clocks (a resource acquired more than once per
//! microsecond, or a clock that ran ahead before). They stay below 2^53 (exact in the
//! scripts' Lua numbers) until the year 2255; a counter at or above 2^53, or one that is not
//! a plain decimal integer, fails the node's vote before anything is written (above 2^53
//! Lua would round `INCR`'s answer and two holders could share a token).

use std::sync::Arc;
use std::time::Duration;

use crate::client::{Attempt, Inner};
use crate::error::Error;
use crate::fanout::Round;
use crate::lock::Lock;
use crate::node::Request;
use crate::protocol::{Ballot, Decision, Reply};
use crate::resource::Resources;
use crate::token::Token;

/// One fenced acquisition attempt.
pub(crate) async fn acquire_fenced(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    token: Token,
    node_timeout: Duration,
) -> Result<Lock, Error> {
    let mut keys = res.lock_keys().to_vec();
    keys.extend(res.fence_keys());
    let call = Arc::new(Request::acquire_fenced(keys.clone(), &token, ttl));
    let round = Round::start(&inner.nodes, inner.quorum, |_, node| {
        let node = node.clone();
        let call = call.clone();
        async move { node.send(&call, node_timeout).await }
    });
    let mut attempt = Attempt::new(inner.clone(), res.clone(), token, node_timeout, round);
    let decision = attempt.round.decide().await;
    if decision == Decision::Impossible {
        return attempt.finish(decision, ttl, None).await;
    }
    // Round 1 reached the quorum: t = max over the granting nodes. Nodes that refused
    // hold another owner's key: a commit there can only answer 0, so it is not sent.
    let mut refused = vec![false; inner.nodes.len()];
    let mut t = 0u64;
    for (i, r) in attempt.round.replies() {
        match r {
            Reply::Fenced(top) => t = t.max(*top),
            r if r.ballot() == Ballot::Refused => {
                if let Some(slot) = refused.get_mut(i) {
                    *slot = true;
                }
            }
            _ => {}
        }
    }
    // Round 2: commit t on every other node, including those that failed, timed out or
    // have not answered round 1 yet (the commit follows round 1 on the node's one
    // connection; where our key is not there it answers 0 and changes nothing). Any
    // quorum of confirmations will do.
    let commit = Arc::new(Request::commit_fence(keys, attempt.token(), t));
    let mut round2 = Round::start(&inner.nodes, inner.quorum, |i, node| {
        let node = node.clone();
        let commit = commit.clone();
        let skip = refused.get(i).copied().unwrap_or(true);
        async move {
            if skip {
                Reply::HeldBy(None)
            } else {
                node.send(&commit, node_timeout).await
            }
        }
    });
    let committed = round2.decide().await;
    if committed != Decision::Reached {
        let votes = round2.votes(&inner.nodes);
        round2.detach();
        tracing::debug!(%votes, "quorumlock: fencing commit missed the quorum");
        return attempt.abandon(Error::NoQuorum(votes)).await;
    }
    round2.detach();
    attempt.finish(Decision::Reached, ttl, Some(t)).await
}
