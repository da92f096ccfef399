//! A deterministic model of a Redis node, for simulation testing (feature `sim`).
//!
//! [`SimNode`] is one Redis 7.0 master reduced to what quorumlock uses: string keys (and
//! integers, which Redis stores as strings) with per-key expiry, the two sorted sets of a
//! wait queue (waiter ids by arrival, leases by lapse time), `PUBLISH`, every Lua script of the crate implemented natively in Rust
//! with the same reply for every input (errors and partial writes included), crash and
//! restart with or without AOF persistence. It is pure: no tokio, no sockets, no clock.
//! The node's wall clock is an argument of every call, so a simulator that runs N nodes
//! from one seed can give each its own drift, pause it, or crash it between any two
//! requests, and replay the whole run from the seed.
//!
//! # How time works
//!
//! `now_us` is what `TIME` would answer on that node, in microseconds. Expiry follows
//! Redis: a key set with `PX ttl` at millisecond `now` expires at `now + ttl` and stays
//! visible up to and including that millisecond. Expired keys are invisible to every
//! request (lazy expiry); [`SimNode::advance`] removes them all (active expiry), which
//! only matters for memory.
//!
//! # What it does not model
//!
//! * Connections, latency, timeouts, pipelining and message loss: the simulator decides
//!   when a request reaches the node and whether its reply comes back.
//! * Subscriptions: `PUBLISH` answers the count set with [`SimNode::set_subscribers`], and
//!   published messages are handed to the simulator ([`SimNode::drain_published`]).
//! * Replication, failover, eviction (`maxmemory-policy` is `noeviction`), RDB snapshots
//!   (a crash keeps everything with [`Persistence::AofAlways`] and nothing otherwise).
//! * `SCRIPT LOAD` answers the script's name, not its SHA1.
//! * Commands quorumlock does not send (apart from `GET`, `SET`, `PTTL` for checkers).
//!
//! # Proof that it matches Redis
//!
//! `tests/sim_differential.rs` (features `testkit` and `sim`) runs random sequences of
//! every [`Request`] against a real `redis-server` (the real Lua scripts) and a `SimNode`
//! side by side and compares every reply and, at the end, the whole keyspace.
//!
//! # Example
//!
//! ```
//! use quorumlock::sim::{Persistence, Reply, Request, SimNode};
//!
//! let mut node = SimNode::new(Persistence::None);
//! let now = 1_764_543_600_000_000; // the node's clock, µs
//! let key = b"quorumlock:lock:{job}".to_vec();
//! let token = b"a1b2c3d4e5f6".to_vec();
//! let acquire = Request::SetNxPxGet { key: key.clone(), token: token.clone(), ttl_ms: 10_000 };
//! assert_eq!(node.execute(now, &acquire)?, Reply::Nil); // granted
//!
//! // An extension to a shorter TTL never shortens the lock (PEXPIRE … GT).
//! let extend = Request::Extend { keys: vec![key.clone()], token: token.clone(), ttl_ms: 10 };
//! assert_eq!(node.execute(now, &extend)?, Reply::Int(1));
//! assert_eq!(node.execute(now, &Request::Pttl(key.clone()))?, Reply::Int(10_000));
//!
//! // The node crashes without persistence: the lock is gone after the restart.
//! node.crash();
//! node.restart();
//! assert_eq!(node.execute(now, &Request::Get(key))?, Reply::Nil);
//! # Ok::<(), quorumlock::sim::NodeDown>(())
//! ```

mod lua;
mod node;
#[cfg(test)]
mod tests;

pub use node::{NodeDown, Persistence, Published, Reply, Request, Script, SimNode, Value};
