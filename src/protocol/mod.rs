//! The protocol: every decision Redlock makes, as pure functions of the replies and the
//! times they are given. No tokio, no redis, no clock reads.
//!
//! This is the sans-I/O core of the crate. The layers above it *execute*: they send
//! requests, read the clock, and wait; whenever something must be decided, they hand
//! what they saw to a function here and do what it says.
//!
//! ```text
//!   node.rs      raw Redis answer ──decode──▶ reply::Reply        (typed: Granted, HeldBy, …)
//!   fanout.rs    Reply::ballot() ──▶ tally::Tally ──▶ Decision     (as soon as certain)
//!   acquire.rs / lock.rs
//!                Decision + Tally + validity(ttl, elapsed, drift)
//!                           ──▶ verdict::{acquire, extend, release} ──▶ Verdict
//!   acquire.rs   failed or cancelled ──▶ cleanup::plan ──▶ fanout::Cleanup runs it
//!   fencing.rs   round-1 replies ──▶ fencing::{token, commit_to} ──▶ round 2 ──▶ fencing::committed
//!   wait.rs / notifier.rs
//!                votes, announcements, now ──▶ contention::{is_split, pause, heard, Releases, …}
//!   extender.rs  now, round results ──▶ keep::Kept::{sweep, apply, fire} ──▶ due / extended / lost
//! ```
//!
//! * [`tally`]: the quorum, vote counting with the early decision, and the validity
//!   arithmetic (`TTL − elapsed − drift`).
//! * [`reply`]: the typed node replies and the one rule that makes each a vote.
//! * [`verdict`]: what a decided round means for acquire, extend and release, including
//!   the lost rule (more than `N − Q` refusals).
//! * [`cleanup`]: after a failed or cancelled acquire, which nodes are released now and
//!   which once their pending request lands.
//! * [`fencing`]: the fence counter's grant (`max(counter + 1, clock)`), its strict
//!   parse, the token, where the commit goes and when it makes the token usable.
//! * [`contention`]: split votes, the contention window, turns, what an announcement
//!   means for a waiter, the releaser-yields rule, the queue's lease.
//! * [`semaphore`]: counted semaphores: the per-node limit `c`, the capacity (with every
//!   node up and with some down), the configuration every node checks, which grants a new
//!   holder gives back.
//! * [`keep`]: a kept lock's watchdog state: when it is due, what a round did to it, when
//!   its lost signal fires and why.
//! * [`time`]: instants as inputs ([`time::Moment`]) and the saturating sums on them.
//!
//! Each rule is written once, here, and property-tested against a naive oracle or an
//! invariant; the I/O code never re-derives one. This module refers to no other module of
//! the crate, and to nothing of tokio, redis or the system clock (`tests/layering.rs`
//! checks it).

pub(crate) mod cleanup;
pub(crate) mod contention;
pub(crate) mod fencing;
pub(crate) mod groups;
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the transfer waiter is not wired in yet")
)]
pub(crate) mod handoff;
pub(crate) mod inspect;
pub(crate) mod keep;
pub(crate) mod reply;
pub(crate) mod semaphore;
pub(crate) mod tally;
pub(crate) mod time;
pub(crate) mod verdict;

pub(crate) use reply::Reply;
pub(crate) use tally::{Ballot, Decision, Tally};
pub(crate) use verdict::{Loss, Verdict};
