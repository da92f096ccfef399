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
//! hands out smaller ones (`tests/fencing_token_order.rs` shows it). A host must also not start
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

//! The rules themselves (the grant, the strict counter, the token, where the commit goes and
//! when it counts) are in [`protocol::fencing`](crate::protocol::fencing); this module runs
//! the two rounds for [`acquire`](crate::client::acquire).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::Error;
use crate::base::resource::{Resources, RwKeys};
use crate::base::token::Token;
use crate::client::shared::Inner;
use crate::io::fanout::Round;
use crate::io::node::Request;
use crate::protocol::{Reply, fencing};

/// The keys both rounds name: the lock keys, then the fence counters, in the same order.
pub(crate) struct FenceKeys(Vec<Vec<u8>>);

impl FenceKeys {
    /// A read-write lock's writer key and its fence counter: the writer's round 1 is
    /// `write_acquire.lua` (fenced), its round 2 the same commit as the mutex's.
    pub(crate) fn writer(keys: &RwKeys) -> FenceKeys {
        FenceKeys(vec![keys.writer.clone(), keys.fence.clone()])
    }
}

/// Round 1's request for the mutex: the fenced acquire of `res`, and the keys both rounds
/// name. (A read-write lock's writer sends its own fenced acquire, with
/// [`FenceKeys::writer`].)
pub(crate) fn request(res: &Resources, token: &Token, ttl: Duration) -> (Request, FenceKeys) {
    let mut keys = res.lock_keys().to_vec();
    keys.extend(res.fence_keys());
    let call = Request::acquire_fenced(keys.clone(), token, ttl);
    (call, FenceKeys(keys))
}

/// Round 2, once round 1 reached the quorum: commits `t` (the largest counter granted so
/// far) on every node that did not refuse round 1, including those that failed, timed out
/// or have not answered yet (the commit follows round 1 on the node's one connection;
/// where our key is not there it answers 0 and changes nothing). Completes with `t` once
/// any quorum confirmed, else with [`Error::NoQuorum`] and the commit's votes (the caller
/// then abandons the attempt). The requests are created at once, from what round 1 has
/// seen so far; the future only waits for them.
pub(crate) fn commit<'a>(
    inner: &'a Inner,
    round1: &Round,
    keys: FenceKeys,
    token: &Token,
    node_timeout: Duration,
) -> impl Future<Output = Result<u64, Error>> + Send + 'a {
    let t = fencing::token(round1.replies().map(|(_, r)| r));
    let call = Arc::new(Request::commit_fence(keys.0, token, t));
    let mut round2 = Round::start(&inner.nodes, inner.quorum, |i, node| {
        let node = node.clone();
        let call = call.clone();
        let send = fencing::commit_to(round1.reply(i));
        async move {
            if send {
                node.send(&call, node_timeout).await
            } else {
                // Refused round 1: another owner's key is there, a commit could only fail.
                Reply::HeldBy(None)
            }
        }
    });
    async move {
        let committed = fencing::committed(round2.decide().await);
        let votes = (!committed).then(|| round2.votes(&inner.nodes));
        round2.detach();
        match votes {
            None => Ok(t),
            Some(votes) => {
                tracing::debug!(%votes, "quorumlock: fencing commit missed the quorum");
                Err(Error::NoQuorum(votes))
            }
        }
    }
}

/// The commit round of a lock a waiter holds by transfer (no round 1 of its own): commits
/// `t` (the largest counter the counted transfers announced) on every node, exactly as
/// [`commit`] does after a fenced acquire; `t` once a quorum confirmed, else
/// [`Error::NoQuorum`] with the commit's votes.
pub(crate) async fn commit_transfer(
    inner: &Inner,
    res: &Resources,
    token: &Token,
    t: u64,
    node_timeout: Duration,
) -> Result<u64, Error> {
    let mut keys = res.lock_keys().to_vec();
    keys.extend(res.fence_keys());
    let call = Arc::new(Request::commit_fence(keys, token, t));
    let mut round = Round::start(&inner.nodes, inner.quorum, |_, node| {
        let node = node.clone();
        let call = call.clone();
        async move { node.send(&call, node_timeout).await }
    });
    let committed = fencing::committed(round.decide().await);
    let votes = (!committed).then(|| round.votes(&inner.nodes));
    round.detach();
    match votes {
        None => Ok(t),
        Some(votes) => Err(Error::NoQuorum(votes)),
    }
}
