//! The simulation's plain data and small pure helpers: clocks, connections, calls,
//! rounds, attempts, clients and the kinds of events, with what they need to construct
//! and read themselves.
//!
//! `World` (`world.rs`) owns a collection of each and runs the event loop; the behaviour
//! files (`client.rs`, `net.rs`, `check.rs`) add `impl World` blocks that act on them.
//! This module sits below all of them: it imports nothing from its siblings but `node`
//! (the simulated node's requests and replies), so no behaviour file needs another's
//! types and the imports among them form no cycle.

use std::rc::Rc;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use super::node::{Reply as SimReply, Request as SimRequest};
use crate::base::token::Token;
use crate::io::node::Answer;
use crate::protocol::{Reply, Tally};

// Clocks.

/// A clock: `base + t + t × ppm / 10^6` at true time `t` (µs), never going back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    base: u64,
    ppm: i64,
}

impl Clock {
    pub(super) fn new(base: u64, ppm: i64) -> Clock {
        Clock {
            base,
            ppm: ppm.clamp(-999_999, 999_999),
        }
    }

    pub(super) fn base(self) -> u64 {
        self.base
    }

    pub(super) fn ppm(self) -> i64 {
        self.ppm
    }

    /// The reading at true time `t`.
    pub(super) fn at(self, t: u64) -> u64 {
        let skew = (i128::from(t) * i128::from(self.ppm)).div_euclid(1_000_000);
        let r = i128::from(self.base) + i128::from(t) + skew;
        r.clamp(0, i128::from(u64::MAX)) as u64
    }

    /// The first true time at which the reading is at least `reading` (`u64::MAX` if
    /// never).
    pub(super) fn when(self, reading: u64) -> u64 {
        if reading <= self.at(0) {
            return 0;
        }
        if self.at(u64::MAX) < reading {
            return u64::MAX;
        }
        // The estimate is within a step or two of the answer: bracket it, then bisect
        // (the reading never goes back, so the first instant is well defined).
        let x = i128::from(reading) - i128::from(self.base);
        let est = (x * 1_000_000 / (1_000_000 + i128::from(self.ppm)))
            .clamp(0, i128::from(u64::MAX)) as u64;
        let (mut lo, mut hi) = (est.saturating_sub(4), est.saturating_add(4));
        if self.at(lo) >= reading {
            lo = 0;
        }
        if self.at(hi) < reading {
            hi = u64::MAX;
        }
        // Invariant: at(lo) < reading <= at(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.at(mid) < reading {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }
}

/// The true time at which a key expiring at node-clock millisecond `at` is gone (it is
/// visible through that millisecond).
pub(super) fn expiry_true(clock: Clock, at: Option<u64>) -> u64 {
    match at {
        None => u64::MAX,
        Some(ms) => clock.when(ms.saturating_add(1).saturating_mul(1000)),
    }
}

// Events.

/// A fault or a client pause.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// Draw and apply the next fault.
    Next,
    /// Draw and apply client `c`'s next pause.
    NextPause(usize),
    Crash(usize),
    /// Crashes of up to this many nodes at once, those that hold a lock key when the
    /// fault fires first (any node if none does).
    CrashHolders(usize),
    Restart(usize),
    Pause(usize, u64),
    Resume(usize, u32),
    Cut(usize, u64),
    LinkUp(usize),
    ClientPause(usize, u64),
}

pub(super) enum Kind {
    /// A request reaches its node (on connection `epoch`; `eval`: the `EVAL` fallback).
    ToNode {
        call: usize,
        epoch: u32,
        eval: bool,
    },
    /// A reply reaches its client.
    ToClient {
        call: usize,
        epoch: u32,
        reply: Raw,
    },
    /// A call's per-node timeout.
    Timeout {
        call: usize,
    },
    /// A client's timer (valid only with the client's current generation).
    Timer {
        client: usize,
        generation: u32,
    },
    Fault(Fault),
}

// Connections and calls.

/// One client's connection to one node.
#[derive(Debug, Clone, Copy)]
pub(super) struct Link {
    /// Which connection: messages of an earlier one are lost.
    pub(super) epoch: u32,
    pub(super) up: bool,
    pub(super) down_until: u64,
    /// The latest arrival scheduled each way (FIFO).
    pub(super) to_node: u64,
    pub(super) to_client: u64,
}

impl Default for Link {
    fn default() -> Link {
        Link {
            epoch: 0,
            up: true,
            down_until: 0,
            to_node: 0,
            to_client: 0,
        }
    }
}

/// What comes back: the node's reply, or a failed connection.
pub(super) enum Raw {
    Node(SimReply),
    Refused,
}

/// One request of one client to one node.
pub(super) struct Call {
    pub(super) client: usize,
    pub(super) node: usize,
    /// The acquisition (token) it belongs to.
    pub(super) attempt: usize,
    pub(super) req: Rc<SimRequest>,
    pub(super) answer: Answer,
    pub(super) script: bool,
    pub(super) idempotent: bool,
    /// A release (see `Translated::release`).
    pub(super) release: bool,
    pub(super) owner: Owner,
    /// Put on the wire (false while it waits for the lock's acquire on that node).
    pub(super) sent: bool,
    /// The `EVAL` fallback was sent.
    pub(super) eval: bool,
    /// The caller still waits for it.
    pub(super) waiting: bool,
    /// Timed out, finishing in the background until `late_until` (true µs).
    pub(super) late: bool,
    pub(super) late_until: u64,
    /// Finished: answered, abandoned or dropped.
    pub(super) done: bool,
}

impl Call {
    /// Whether the exchange still goes on (the caller waits, or it finishes late).
    pub(super) fn alive(&self, now: u64) -> bool {
        !self.done && (self.waiting || (self.late && now <= self.late_until))
    }
}

// Rounds, attempts and clients.

/// Who waits for a call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// A round (its index).
    Round(usize),
    /// The clean-up of a failed attempt; `first`: a granting node, which the attempt
    /// waits for.
    Cleanup { first: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RoundKind {
    Acquire,
    Commit,
    Extend,
    Release,
    /// The release a dropped guard runs in the background.
    Drop,
}

/// `fanout::Round`: one request to every node, and the count so far.
pub(super) struct Round {
    pub(super) client: usize,
    pub(super) attempt: usize,
    pub(super) kind: RoundKind,
    /// The client's clock when the round started (read before the first send).
    pub(super) start_c: u64,
    pub(super) ttl: Duration,
    pub(super) tally: Tally,
    pub(super) replies: Vec<Option<Reply>>,
    /// Still waiting for its decision.
    pub(super) deciding: bool,
    /// A release round: the lock had expired when it started.
    pub(super) expired: bool,
    pub(super) calls: Vec<usize>,
}

/// One acquisition (one token), from its attempt to the end of its keys.
pub(super) struct Attempt {
    pub(super) client: usize,
    pub(super) token: Token,
    pub(super) fenced: bool,
    pub(super) ttl: Duration,
    pub(super) round1: usize,
    pub(super) round2: Option<usize>,
    /// The fencing token `t` of round 1.
    pub(super) t: u64,
    /// How each node's round-1 request completed (answer or time-out), whenever it did.
    pub(super) acq_done: Vec<Option<Reply>>,
    /// Calls waiting for their node's round-1 request to complete.
    pub(super) gated: Vec<usize>,
    /// Failed or cancelled: release each node still running round 1 once it completes.
    pub(super) cleanup_later: bool,
    /// Granting nodes whose clean-up release the failed attempt still waits for.
    pub(super) first_left: usize,
    /// Nodes a release or clean-up request was issued to, and nodes where one ran.
    pub(super) issued: u64,
    pub(super) ran: u64,
    /// Given up on purpose without a release: its keys may stay until they expire.
    pub(super) abandoned: bool,
    /// A waiter's: its token joined the wait queues first, and its round 1 is a claim.
    pub(super) waited: bool,
}

impl Attempt {
    /// A new attempt of `client` with `token` on `nodes` nodes, before its first round;
    /// `waited`: a waiter's, whose token joins the wait queues first.
    pub(super) fn new(
        client: usize,
        token: Token,
        fenced: bool,
        ttl: Duration,
        nodes: usize,
        waited: bool,
    ) -> Attempt {
        Attempt {
            client,
            token,
            fenced,
            ttl,
            round1: 0,
            round2: None,
            t: 0,
            acq_done: vec![None; nodes],
            gated: Vec::new(),
            cleanup_later: false,
            first_left: 0,
            issued: 0,
            ran: 0,
            abandoned: false,
            waited,
        }
    }
}

/// A lock the client holds (`lock::Lock`).
pub(super) struct Held {
    pub(super) attempt: usize,
    pub(super) ttl: Duration,
    /// Deadline on the client's clock.
    pub(super) deadline_c: u64,
    pub(super) fencing: Option<u64>,
    /// Taken by a waiter's claim (the lock handed over by a release, or found free).
    pub(super) via_wait: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Acquiring(usize),
    /// A failed attempt waits for its granting nodes' releases.
    CleaningUp(usize),
    /// A waiter's token is queued; it claims when its timer fires.
    Waiting(usize),
    Holding,
    Extending(usize),
    Releasing(usize),
    Done,
}

/// What a client does when its pending timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    None,
    Start,
    HoldAction,
    CancelAcquire(usize),
    CancelExtend(usize),
    /// The waiter of this attempt claims.
    Claim(usize),
}

/// One simulated client: its workload's random stream, its clock, and where it is.
pub(super) struct Client {
    pub(super) rng: StdRng,
    pub(super) clock: Clock,
    pub(super) paused_until: u64,
    pub(super) phase: Phase,
    pub(super) timer: Timer,
    pub(super) timer_gen: u32,
    pub(super) lock: Option<Held>,
    pub(super) ops_left: u32,
    pub(super) tries_left: u32,
    pub(super) extends_left: u32,
    /// The attempt that just failed was refused: wait in the queues instead of retrying.
    pub(super) wait_next: bool,
}

impl Client {
    pub(super) fn new(mut rng: StdRng, clock: Clock) -> Client {
        let ops_left = rng.random_range(1..=4);
        Client {
            rng,
            clock,
            paused_until: 0,
            phase: Phase::Idle,
            timer: Timer::None,
            timer_gen: 0,
            lock: None,
            ops_left,
            tries_left: 0,
            extends_left: 0,
            wait_next: false,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }
}

// Helpers.

/// A random number in `lo..=hi` (`lo` when the range is empty).
pub(super) fn between(rng: &mut StdRng, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// A short text for a token: its first 8 characters.
pub(super) fn short(token: &[u8]) -> String {
    String::from_utf8_lossy(token.get(..8).unwrap_or(token)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `when` is the first instant at which the clock shows a reading.
        #[test]
        fn when_inverts_at(base in 0u64..1u64 << 52, ppm in -10_000i64..10_000, reading in 0u64..1u64 << 53) {
            let c = Clock::new(base, ppm);
            let t = c.when(reading);
            prop_assert!(c.at(t) >= reading);
            prop_assert!(t == 0 || c.at(t - 1) < reading);
        }

        /// The clock never goes back.
        #[test]
        fn monotonic(base in 0u64..1u64 << 52, ppm in -999_999i64..999_999, t in 0u64..1u64 << 50) {
            let c = Clock::new(base, ppm);
            prop_assert!(c.at(t) <= c.at(t + 1));
        }
    }

    #[test]
    fn clock_edges() {
        let c = Clock::new(u64::MAX - 10, 5_000);
        assert_eq!(c.at(u64::MAX), u64::MAX);
        assert_eq!(c.when(u64::MAX), c.when(u64::MAX));
        let slow = Clock::new(0, -3_000);
        assert_eq!(slow.at(1_000_000), 997_000);
        assert_eq!(slow.when(997_000), 1_000_000);
        assert_eq!(Clock::new(5, 0).when(3), 0);
    }
}
