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
//! node reports one, the client first *re-seeds*: it reads every node's counters and
//! flags and raises `t` above the largest counter read, but only when **a quorum of
//! trusted nodes** (counters present, no flag) answered, or **every node** answered.
//! A trusted quorum shares a node with every earlier commit quorum, and that node's
//! counter is at least the token committed there. Counting an empty (lost) node towards
//! a plain read quorum would be unsound: it may be the only node the read shares with the
//! last holder's commit quorum, and the token would go backwards. The every-node rule
//! (needed for a brand-new resource, which has no counter anywhere) is sound as long as
//! no majority of nodes lost the counters without being re-seeded since; see
//! `docs/safety.md`. A counter is never *present but stale* under the deployment contract
//! (AOF with `appendfsync always`, or no persistence at all); RDB snapshots can bring back
//! stale counters and are not supported with fencing.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::Value;

use crate::client::{Attempt, Inner, acquire_ballot, outcome};
use crate::error::{Error, NodeOutcome, NodeVote, Votes};
use crate::fanout::Round;
use crate::lock::Lock;
use crate::node::{Lua, Node, Reply, ScriptCall, lua};
use crate::quorum::{self, Ballot, Decision};
use crate::resource::Resources;
use crate::token::Token;

static ACQUIRE_FENCED: Lua = lua!("scripts/acquire_fenced.lua", idempotent: false);
static COMMIT_FENCE: Lua = lua!("scripts/commit_fence.lua", idempotent: true);

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
            largest_holder: None,
            votes,
            elapsed: attempt.round.elapsed(),
        };
        tracing::debug!(%votes, "quorumlock: fencing commit missed the quorum");
        return attempt.abandon(Error::NoQuorum(votes)).await;
    }
    round2.detach();
    attempt.finish(Decision::Reached, ttl, Some(t)).await
}

/// One node's answer to the re-seed read (`MGET` of the counters, then the flags):
/// the counters it holds, and whether it is *trusted*: every counter present and no
/// "unseeded" flag, i.e. the node has not lost this lock's counters since they were last
/// written by a commit (or it was re-seeded since).
fn parse_read(r: &Reply, n: usize) -> Option<(u64, bool)> {
    let Reply::Value(Value::Array(values)) = r else {
        return None;
    };
    if values.len() != 2 * n {
        return None;
    }
    let mut top = 0u64;
    let mut trusted = true;
    for (j, v) in values.iter().enumerate() {
        let num = match v {
            Value::Nil => None,
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<u64>().ok()),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => return None,
        };
        if j < n {
            match num {
                Some(c) => top = top.max(c),
                None => trusted = false,
            }
        } else if !matches!(v, Value::Nil) {
            trusted = false;
        }
    }
    Some((top, trusted))
}

/// Reads the fence counters of `res` (and their "unseeded" flags) from every node and
/// returns a floor: a value at least every committed token of these resources.
///
/// The floor is sound when either
///
/// * a quorum of nodes answered **trusted** (counters present, no flag): that quorum
///   shares a node with the commit quorum of every earlier holder, and a trusted node's
///   counter is at least every token committed on it; no assumption about lost nodes; or
/// * **every** node answered: every earlier commit quorum is then entirely inside the
///   read set, so the floor is right as long as no commit quorum lost all its counters,
///   i.e. fewer than a majority of nodes lost these counters without being re-seeded
///   since. This second rule is what lets a brand-new resource (no counter anywhere)
///   get its first token.
///
/// A read that counts a node that lost its counters (an empty answer) towards a plain
/// quorum is **not** sound: that node may be the only one the read shares with the last
/// holder's commit quorum.
async fn reseed_floor(
    inner: &Arc<Inner>,
    res: &Resources,
    timeout: Duration,
) -> Result<u64, Votes> {
    let n = res.len();
    let mut mget = redis::cmd("MGET");
    for k in res.fence_keys().iter().chain(res.unseeded_keys().iter()) {
        mget.arg(k.as_slice());
    }
    let mget = Arc::new(mget);
    let mut round = Round::start(&inner.nodes, inner.quorum, |_, node| {
        let node = node.clone();
        let mget = mget.clone();
        async move { node.query(&mget, timeout).await }
    });
    let trusted = move |r: &Reply| match parse_read(r, n) {
        Some((_, true)) => Ballot::Granted,
        Some((_, false)) => Ballot::Refused,
        None => Ballot::Failed,
    };
    let decision = round.decide(trusted).await;
    // Per node: the parsed read, or what went wrong.
    let read = |r: &Reply| parse_read(r, n).ok_or_else(|| outcome(fenced_read_ballot)(r));
    let mut reads: Vec<Option<Result<(u64, bool), NodeOutcome>>> =
        (0..inner.nodes.len()).map(|_| None).collect();
    for (i, r) in round.replies() {
        if let Some(slot) = reads.get_mut(i) {
            *slot = Some(read(r));
        }
    }
    if decision != Decision::Reached {
        // Not enough trusted nodes so far: wait for every node (each request is bounded
        // by the node timeout); the floor is then sound only if every node answered.
        let mut pending = round.take_pending();
        while let Some((i, r)) = pending.next().await {
            if let Some(slot) = reads.get_mut(i) {
                *slot = Some(read(&r));
            }
        }
    }
    round.detach();
    let mut floor = 0u64;
    let mut trusted_count = 0usize;
    let mut answered = 0usize;
    for (top, ok) in reads.iter().flatten().filter_map(|r| r.as_ref().ok()) {
        floor = floor.max(*top);
        answered += 1;
        trusted_count += usize::from(*ok);
    }
    if trusted_count >= inner.quorum || answered == inner.nodes.len() {
        tracing::debug!(
            floor,
            trusted = trusted_count,
            answered,
            "quorumlock: fence counters re-seeded"
        );
        return Ok(floor);
    }
    let votes = Votes {
        quorum: inner.quorum,
        largest_holder: None,
        votes: inner
            .nodes
            .iter()
            .zip(reads)
            .map(|(node, r)| NodeVote {
                node: node.addr.clone(),
                outcome: match r {
                    None => NodeOutcome::NotAwaited,
                    Some(Ok((_, true))) => NodeOutcome::Granted,
                    Some(Ok((_, false))) => {
                        NodeOutcome::Failed("fence counter lost or unseeded".into())
                    }
                    Some(Err(o)) => o,
                },
            })
            .collect(),
        elapsed: round.elapsed(),
    };
    tracing::debug!(%votes, "quorumlock: fence counters could not be re-seeded");
    Err(votes)
}

/// How a failed re-seed read counts, for error reporting.
fn fenced_read_ballot(r: &Reply) -> Ballot {
    match r {
        Reply::Value(Value::Array(_)) => Ballot::Granted,
        _ => Ballot::Failed,
    }
}
