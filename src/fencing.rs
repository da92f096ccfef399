//! Fencing tokens: a number that strictly increases across successive holders of a
//! resource, safe across the quorum.
//!
//! Two rounds, both on the granting nodes (see `docs/safety.md` for the argument):
//!
//! 1. **Acquire**: per node, one script takes every lock key or none and, when it does,
//!    `INCR`s each resource's fence counter, returning the largest new value. The client
//!    takes `t` = the maximum over the granting nodes.
//! 2. **Commit**: per granting node, only if the lock keys still hold our token, raise
//!    every counter of the lock to `max(counter, t)`. The token is usable only if a quorum
//!    confirms; otherwise the acquisition fails and is released.
//!
//! Why it is ordered: two committed holders' node sets are both quorums, so they share a
//! node; there the two lock keys cannot coexist, so the later holder's `INCR` comes after
//! the earlier holder's commit raised the counter to its token, and exceeds it.
//!
//! **Lost counters.** Fence counters never expire and clean-up never deletes them; but a
//! node restarted without persistence comes back empty. Round 1 reports, per node,
//! whether a counter is *unseeded*: it was missing before its `INCR` (first use, or lost
//! data), flagged so, and no client has since committed a re-seeded value. If any granting
//! node reports one, the client first *re-seeds*: it reads the counters from every node, needs a quorum of
//! answers, and raises `t` above the largest counter read. A quorum of reads shares a node
//! with the last holder's commit quorum, so `t` exceeds every committed token as long as
//! no majority lost its counters at once (see `docs/safety.md` for what that needs).
//! A counter is never *present but stale* under the deployment contract (AOF with
//! `appendfsync always`, or no persistence at all); RDB snapshots can bring back stale
//! counters and are not supported with fencing.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::client::{Attempt, Inner, acquire_ballot, outcome};
use crate::error::{Error, NodeOutcome, NodeVote, Votes};
use crate::fanout::Round;
use crate::lock::Lock;
use crate::node::{Lua, Node, Reply, ScriptCall, lua};
use crate::quorum::{self, Ballot, Decision};
use crate::resource::Resources;
use crate::token::Token;

static ACQUIRE_FENCED: Lua = lua!("scripts/acquire_fenced.lua");
static COMMIT_FENCE: Lua = lua!("scripts/commit_fence.lua");

/// A granting node's answer to round 1: (counter, whether a counter was missing).
fn parse_grant(r: &Reply) -> Option<(u64, bool)> {
    match r {
        Reply::Value(Value::Array(a)) if matches!(a.first(), Some(Value::Int(1))) => {
            let top = match a.get(1) {
                Some(Value::Int(n)) => u64::try_from(*n).ok()?,
                _ => return None,
            };
            let missing = matches!(a.get(2), Some(Value::Int(m)) if *m > 0);
            Some((top, missing))
        }
        _ => None,
    }
}

/// A node's answer to round 1 counts as granted only if it carries a well-formed counter.
fn fenced_ballot(r: &Reply) -> Ballot {
    match acquire_ballot(r) {
        Ballot::Granted if parse_grant(r).is_none() => Ballot::Failed,
        b => b,
    }
}

fn commit_ballot(r: &Reply) -> Ballot {
    match r {
        Reply::Value(Value::Int(1)) => Ballot::Granted,
        Reply::Value(Value::Int(0)) => Ballot::Refused,
        _ => Ballot::Failed,
    }
}

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
    keys.extend(res.unseeded_keys());
    let ttl_ms = quorum::millis_ceil(ttl);
    let call = Arc::new(ScriptCall::new(
        &ACQUIRE_FENCED,
        keys.clone(),
        vec![token.as_bytes().to_vec(), ttl_ms.to_string().into_bytes()],
    ));
    let round = Round::start(&inner.nodes, inner.quorum, |_, node| {
        let node = node.clone();
        let call = call.clone();
        async move { node.eval(&call, node_timeout).await }
    });
    let mut attempt = Attempt::new(inner.clone(), res.clone(), token, node_timeout, round);
    let decision = attempt.round.decide(fenced_ballot).await;
    if decision == Decision::Impossible {
        return attempt.finish(decision, ttl, None).await;
    }
    // Round 1 reached the quorum: t = max over the granting nodes.
    let mut granting = Vec::new();
    let mut t = 0u64;
    let mut missing = false;
    for (i, r) in attempt.round.replies() {
        if let Some((top, m)) = parse_grant(r) {
            granting.push(i);
            t = t.max(top);
            missing |= m;
        }
    }
    if missing {
        match reseed_floor(inner, res, node_timeout).await {
            Ok(floor) => t = t.max(floor.saturating_add(1)),
            Err(votes) => return attempt.abandon(Error::NoQuorum(votes)).await,
        }
    }
    // Round 2: commit t on every granting node; a quorum must confirm.
    let commit = Arc::new(ScriptCall::new(
        &COMMIT_FENCE,
        keys,
        vec![
            attempt.token().as_bytes().to_vec(),
            t.to_string().into_bytes(),
        ],
    ));
    let subset: Vec<Node> = granting
        .iter()
        .filter_map(|&i| inner.nodes.get(i).cloned())
        .collect();
    let mut round2 = Round::start(&subset, inner.quorum, |_, node| {
        let node = node.clone();
        let commit = commit.clone();
        async move { node.eval(&commit, node_timeout).await }
    });
    let committed = round2.decide(commit_ballot).await;
    if committed != Decision::Reached {
        // Report every node: the commit round's answers for the granting nodes.
        let sub = round2.votes(&subset, outcome(commit_ballot));
        let mut votes: Vec<NodeVote> = inner
            .nodes
            .iter()
            .map(|n| NodeVote {
                node: n.addr.clone(),
                outcome: NodeOutcome::NotAwaited,
            })
            .collect();
        for (j, &i) in granting.iter().enumerate() {
            if let (Some(slot), Some(v)) = (votes.get_mut(i), sub.votes.get(j)) {
                slot.outcome = v.outcome.clone();
            }
        }
        round2.detach();
        let votes = Votes {
            quorum: inner.quorum,
            votes,
            elapsed: attempt.round.elapsed(),
        };
        tracing::debug!(%votes, "quorumlock: fencing commit missed the quorum");
        return attempt.abandon(Error::NoQuorum(votes)).await;
    }
    round2.detach();
    attempt.finish(Decision::Reached, ttl, Some(t)).await
}

/// Reads the fence counters of `res` from every node; with a quorum of answers, returns
/// the largest value read.
async fn reseed_floor(
    inner: &Arc<Inner>,
    res: &Resources,
    timeout: Duration,
) -> Result<u64, Votes> {
    let keys = res.fence_keys();
    let mut mget = redis::cmd("MGET");
    for k in &keys {
        mget.arg(k.as_slice());
    }
    let mget = Arc::new(mget);
    let mut round = Round::start(&inner.nodes, inner.quorum, |_, node| {
        let node = node.clone();
        let mget = mget.clone();
        async move { node.query(&mget, timeout).await }
    });
    let read = |r: &Reply| match r {
        Reply::Value(Value::Array(_)) => Ballot::Granted,
        _ => Ballot::Failed,
    };
    let decision = round.decide(read).await;
    if decision != Decision::Reached {
        let votes = round.votes(&inner.nodes, outcome(read));
        round.detach();
        return Err(votes);
    }
    let mut floor = 0u64;
    for (_, r) in round.replies() {
        if let Reply::Value(Value::Array(values)) = r {
            for v in values {
                let n = match v {
                    Value::BulkString(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok()),
                    Value::Int(i) => u64::try_from(*i).ok(),
                    _ => None,
                };
                floor = floor.max(n.unwrap_or(0));
            }
        }
    }
    round.detach();
    tracing::debug!(floor, "quorumlock: fence counters re-seeded from a quorum");
    Ok(floor)
}
