//! Deterministic simulation testing (feature `sim`): a model of a Redis node, and a
//! simulator that runs quorumlock's real protocol layer against N of them under random
//! schedules of faults, checking the safety invariants.
//!
//! # The simulator
//!
//! [`run`] takes one `u64` seed and a [`Config`] and simulates a world of N nodes
//! (default 5) and 2 to 8 clients contending for one resource. Every parameter comes from
//! the seed: each node's wall clock (offset within ±5 ms, rate within ±0.3 %), each
//! client's monotonic clock (rate within ±0.3 %; together within the 1 % drift
//! allowance), persistence, TTLs, the per-node timeout, network delays, whether fencing is
//! on, and a rolling stream of faults: node crashes (with AOF `always` restarted after any
//! delay, without persistence only after the longest TTL, as the deployment contract
//! says), node pauses (requests queue), lost connections (in-flight messages lost, the
//! caller times out), and client pauses (GC-like, some past the lock's validity).
//!
//! The clients build their requests with the crate's own request builders, decode every
//! answer with the crate's own decoder, count votes with the crate's `Tally` and act on
//! the crate's verdicts, as the real client does; only the I/O orchestration (fan-out,
//! timeouts, cancellation, the clean-up of stragglers) is re-expressed as events. The
//! invariants, checked in true (simulator) time: never two clients believing they hold
//! the lock; a holder's remaining validity never beyond the time a majority of nodes
//! still holds its token; fencing tokens strictly rising; no key left behind. The first
//! violation ends the run with a [`Report`] that carries the seed and the whole trace.
//! The same seed gives the same trace. A [`Mutation`] swaps in a known-unsafe variant
//! (quorum N/2, no drift allowance, immediate restarts without persistence, and, in the
//! Lua scripts themselves, extensions that shorten and releases without the token check)
//! to show the invariants catch it.
//!
//! ```
//! use quorumlock::sim::{run, Config, Mutation};
//!
//! let report = run(42, &Config::default());
//! assert!(report.violation.is_none(), "{report}");
//!
//! let unsafe_quorum = Config { mutation: Some(Mutation::HalfQuorum), ..Config::default() };
//! assert!((0..50).any(|seed| run(seed, &unsafe_quorum).violation.is_some()));
//! ```
//!
//! # The node model
//!
//! [`SimNode`] is one Redis 7.0 master reduced to what quorumlock uses, in two layers:
//!
//! * **The command model**: the commands the crate's scripts call (`GET`, `SET` with its
//!   options, `DEL`, `EXISTS`, `INCR`, `PSETEX`, `PEXPIRE`/`PEXPIREAT` with `NX`/`XX`/`GT`/`LT`,
//!   `PTTL`, `TYPE`, the hash and sorted-set commands, `TIME`, `PUBLISH`, `SPUBLISH`) over
//!   strings, sorted sets and hashes with per-key expiry, each answering what Redis answers,
//!   errors included (`WRONGTYPE`, syntax, range, arity);
//! * **The scripts**: the crate's own Lua sources ([`scripts`], the very table the node
//!   layer sends them from), run by an embedded Lua 5.1 as Redis runs them — `KEYS`/`ARGV`,
//!   `redis.call`/`redis.pcall` answered by the command model, numbers passed as `%.17g`,
//!   Lua values converted to replies as Redis converts them, an error ending the script
//!   with its earlier writes kept. The node knows nothing of what a script means, so a
//!   script changed in `src/scripts/` is simulated as changed, with no second copy to keep
//!   in step.
//!
//! Crash and restart with or without AOF persistence are modelled too. The node is pure:
//! no tokio, no sockets, no clock. Its wall clock is an argument of every call, so a
//! simulator that runs N nodes from one seed can give each its own drift, pause it, or
//! crash it between any two requests, and replay the whole run from the seed.
//!
//! ## How time works
//!
//! `now_us` is what `TIME` answers on that node, in microseconds. Expiry follows Redis: a
//! key set with `PX ttl` at millisecond `now` expires at `now + ttl` and stays visible up
//! to and including that millisecond. Expired keys are invisible to every request (lazy
//! expiry); [`SimNode::advance`] removes them all (active expiry), which only matters for
//! memory.
//!
//! ## What it does not model
//!
//! * Connections, latency, timeouts, pipelining and message loss: the simulator decides
//!   when a request reaches the node and whether its reply comes back.
//! * Subscriptions: `PUBLISH` answers the count set with [`SimNode::set_subscribers`], and
//!   published messages are handed to the simulator ([`SimNode::drain_published`]).
//! * Replication, failover, eviction (`maxmemory-policy` is `noeviction`), RDB snapshots
//!   (a crash keeps everything with [`Persistence::AofAlways`] and nothing otherwise).
//! * Commands (and options) no script or client of the crate sends: they are unknown
//!   commands to the model, never guessed.
//!
//! ## Proof that it matches Redis
//!
//! `tests/sim_differential.rs` (features `testkit` and `sim`) runs random sequences of the
//! modelled commands (random keys, types, TTLs and expiry, wrong types included) and of
//! every script with random keys and arguments against a real `redis-server` and a
//! `SimNode` side by side, and compares every reply and, at the end, the whole keyspace.
//! A unit test reads `src/scripts/` and checks that the simulator loads every file in it.
//!
//! ## Example
//!
//! ```
//! use quorumlock::sim::{Persistence, Reply, Request, SimNode};
//!
//! let mut node = SimNode::new(Persistence::None);
//! let now = 1_764_543_600_000_000; // the node's clock, µs
//! let key = "quorumlock:lock:{job}";
//! let token = "a1b2c3d4e5f6";
//! let acquire = Request::command(["SET", key, token, "NX", "PX", "10000", "GET"]);
//! assert_eq!(node.execute(now, &acquire)?, Reply::Nil); // granted
//!
//! // The crate's extend.lua never shortens the lock (PEXPIRE … GT).
//! let extend = Request::eval("extend", [key], [token, "10"]);
//! assert_eq!(node.execute(now, &extend)?, Reply::Int(1));
//! assert_eq!(node.execute(now, &Request::command(["PTTL", key]))?, Reply::Int(10_000));
//!
//! // The node crashes without persistence: the lock is gone after the restart.
//! node.crash();
//! node.restart();
//! assert_eq!(node.execute(now, &Request::command(["GET", key]))?, Reply::Nil);
//! # Ok::<(), quorumlock::sim::NodeDown>(())
//! ```

mod check;
mod client;
mod lua;
mod net;
mod node;
mod redis;
mod script;
mod state;
#[cfg(test)]
mod tests;
mod world;

pub use node::{NodeDown, Persistence, Published, Reply, Request, Script, SimNode, Value, scripts};
pub use world::{Config, Invariant, Mutation, Report, Stats, Violation, run};
