//! Locks spanning several lock groups: a multi-resource mutex whose resources are routed
//! to more than one group, taken group by group, all or nothing.
//!
//! ```text
//!   names ──Groups::split──▶ (group 1, its names) (group 3, its names) …   in the groups' order
//!         ──acquire each part in that order, one token for all──▶ every part held?
//!              │ no: release the parts already held (awaited), return the part's error
//!              ▼ yes
//!         fencing on: raise every part's counters to T = the largest part's token
//!         ──▶ validity left? ──▶ Lock::spanning(parts)
//! ```
//!
//! Each part is an ordinary multi-resource lock of its group, decided by that group's
//! quorum exactly as a lock within one group is; the spanning lock holds every resource
//! while **every** part is held, so its deadline is the earliest part's. A part that
//! fails (held, too few nodes, no validity left, a map mismatch) undoes the parts already
//! held before the error is returned, and a cancelled call drops them, which releases
//! them in the background: no part is left behind either way.
//!
//! **Order.** Parts are taken in the groups' configured order, which is part of the group
//! map, so every client allowed to run beside this one uses the same order. No part is
//! held while waiting for another: an attempt that finds a part held gives every part up,
//! and [`acquire_waiting`] tries the whole set again after a random delay (polling, like
//! read-write locks and semaphores: a release hands over a lock within one group only).
//! Callers of overlapping sets therefore cannot deadlock; the fixed order only makes two
//! of them less likely to keep taking each other's first part.
//!
//! **Fencing.** Each part's acquisition yields a fencing token `t_g` that is larger than
//! every earlier holder's token of that part's resources. The spanning lock's token is
//! `T = max t_g`, and it is committed (the fencing commit: "raise every counter of the
//! lock to at least `T`, only where the lock keys still hold our token") to every part
//! whose `t_g` is below `T`, on a quorum of its group. So `T` is larger than every
//! earlier holder's token of every resource of the set, and every later holder's grant in
//! any of the groups, which meets that commit's quorum, is larger than `T`: one token
//! valid for every resource, as for a lock within one group. A raise that misses its
//! quorum fails the attempt (every part is released).
//!
//! This module may touch acquisitions (`acquire`), the fencing commit, the lock guard and
//! the client's groups; it sends no request of its own.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use crate::base::error::{Error, Timeout};
use crate::base::resource::{Kind, Resources};
use crate::base::token::Token;
use crate::client::acquire::{Ask, acquire_as};
use crate::client::config::Retry;
use crate::client::lock::Lock;
use crate::client::shared::Inner;

/// One part of a spanning lock before it is taken: its group and its resources.
pub(crate) type Part = (Arc<Inner>, Resources);

/// One attempt at every part, in order, with one token: the spanning lock, or the first
/// failing part's error after every part already held was released.
pub(crate) async fn acquire_once(
    parts: &[Part],
    names: &Arc<[String]>,
    ttl: Duration,
    attempt: u32,
) -> Result<Lock, Error> {
    let token = Token::generate()?;
    let mut held: Vec<Lock> = Vec::with_capacity(parts.len());
    for (inner, res) in parts {
        let mut ask = Ask::new(Kind::Exclusive, inner.quorum);
        ask.token = Some(token.clone());
        match acquire_as(inner, res, &ask, ttl, attempt).await {
            Ok(lock) => held.push(lock),
            Err(e) => return Err(give_up(held, e).await),
        }
    }
    let fencing = match fence(parts, &held, &token, ttl).await {
        Ok(t) => t,
        Err(e) => return Err(give_up(held, e).await),
    };
    let mut held = held.into_iter();
    let Some(first) = held.next() else {
        return Err(Error::invalid("resources", "no lock group"));
    };
    let lock = Lock::spanning(first, held.collect(), names.clone(), fencing);
    let min = lock.inner().config.min_validity;
    if lock.remaining() <= min {
        // The parts were taken one after another: the earliest may have too little left.
        let waited = lock.ttl().saturating_sub(lock.remaining());
        let _ = lock.release().await;
        return Err(Timeout::spanning(waited));
    }
    Ok(lock)
}

/// With fencing on, the spanning lock's token `T` (the largest part's), after committing
/// it to every part whose own token is smaller; `None` with fencing off.
async fn fence(
    parts: &[Part],
    held: &[Lock],
    token: &Token,
    ttl: Duration,
) -> Result<Option<u64>, Error> {
    let Some(t) = held.iter().filter_map(Lock::fencing_token).max() else {
        return Ok(None);
    };
    let raises = parts
        .iter()
        .zip(held)
        .filter(|(_, lock)| lock.fencing_token().is_some_and(|own| own < t))
        .map(|((inner, res), _)| {
            let timeout = inner.config.node_timeout_for(ttl);
            crate::client::fencing::commit_transfer(inner, res, token, t, timeout)
        });
    for raised in join_all(raises).await {
        raised?;
    }
    Ok(Some(t))
}

/// Releases the parts already held (awaited: each returns once its group's quorum
/// confirmed, or its nodes timed out; the rest expire by TTL) and returns `err`.
async fn give_up(held: Vec<Lock>, err: Error) -> Error {
    let _ = join_all(held.into_iter().map(Lock::release)).await;
    err
}

/// Takes every part, polling per `retry` ([`wait::poll`](crate::client::wait::poll)): an attempt
/// at every part, then a random delay from the policy's range, until granted, a failure
/// that is not retryable, or the policy's attempts or maximum wait running out.
pub(crate) async fn acquire_waiting(
    parts: &[Part],
    names: &Arc<[String]>,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    crate::client::wait::poll(retry, false, |attempt| {
        acquire_once(parts, names, ttl, attempt)
    })
    .await
}
