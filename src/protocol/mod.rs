//! The protocol: every decision Redlock makes, as pure functions of the replies and the
//! times they are given. No tokio, no redis, no clock reads.
//!
//! This is the sans-I/O core of the crate. The layers above it *execute*: they send
//! requests, read the clock, and wait; whenever something must be decided, they hand
//! what they saw to a function here and do what it says.
//!
//! ```text
//!   node.rs    raw Redis answer ──decode──▶ reply::Reply        (typed: Granted, HeldBy, …)
//!   fanout.rs  Reply::ballot() ──▶ tally::Tally ──▶ Decision     (as soon as certain)
//!   client.rs / lock.rs / watchdog.rs
//!              Decision + Tally + validity(ttl, elapsed, drift)
//!                         ──▶ verdict::{acquire, extend, release} ──▶ Verdict
//! ```
//!
//! * [`tally`]: the quorum, vote counting with the early decision, and the validity
//!   arithmetic (`TTL − elapsed − drift`).
//! * [`reply`]: the typed node replies and the one rule that makes each a vote.
//! * [`verdict`]: what a decided round means for acquire, extend and release, including
//!   the lost rule (more than `N − Q` refusals).
//!
//! Each rule is written once, here, and property-tested against a naive oracle or an
//! invariant; the I/O code never re-derives one.

pub(crate) mod reply;
pub(crate) mod tally;
pub(crate) mod verdict;

pub(crate) use reply::Reply;
pub(crate) use tally::{Ballot, Decision, Tally};
pub(crate) use verdict::{Loss, Verdict};
