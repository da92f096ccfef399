//! An abstract, discrete-time model of quorumlock's lock and fencing protocol, for
//! exhaustive model checking with stateright (`tests/model_check.rs`).
//!
//! Three nodes, two clients, one resource. Every step of a client or a node is atomic;
//! time passes only through a global `Tick`. What the model keeps from the real protocol
//! (`src/protocol/`, `src/client.rs`, `src/fencing.rs`, `src/lock.rs`, the scripts), and
//! what it abstracts:
//!
//! * **Acquire** (`SET NX PX`; fenced: also raise the fence counter to
//!   `max(counter + 1, node clock)` and answer the new value) is sent to every node and
//!   decided as soon as the outcome is certain (the quorum granted, or can no longer).
//!   The lock is held iff `validity = ttl − elapsed − drift > 0`, and believed held until
//!   `start + validity`.
//! * **Fencing commit** is sent, once round 1 reached the quorum, to every node that did
//!   not refuse round 1, on the same connection (so behind a `SET` still in flight);
//!   where our key still holds our token it raises the counter to `max(counter, t)`,
//!   `t` being the largest grant. `t` is usable as soon as any quorum confirms; the
//!   validity is measured over both rounds.
//! * **Clean-up** of a failed attempt: a release to every node that granted or failed,
//!   and to every node still running its `SET` once that `SET` is not refused; nothing to
//!   nodes that refused.
//! * **Extend**: compare-and-`PEXPIRE … GT` on every node, only while the lock is valid.
//!   On a quorum the deadline moves to `max(old, start + validity)`; when more than
//!   `N − Q` nodes refuse, the lock is lost (deadline = now); otherwise it is unchanged.
//! * **Release**: compare-and-delete on every node; the holder stops believing at once.
//! * **Network**: one FIFO connection per (client, node). A request waits in it any
//!   number of steps and ticks (delay; reordering across connections), or is lost
//!   (bounded budget). Replies are read in the same step (`reply_delay = false`) or any
//!   time later, in any order (`reply_delay = true`). A client may stop waiting for every
//!   node it has no answer from at any time (the per-node time-out, or cancellation);
//!   the requests stay on the wire and may still land.
//! * **Nodes**: a crash (bounded budget) loses whatever is on its connections. With
//!   persistence the node comes back with its data; without, it comes back empty, which
//!   the deployment contract allows only after `restart_delay ≥ TTL` ticks down. A node
//!   is modelled as coming back as early as allowed (at once with persistence): staying
//!   down longer is the same as every request to it being delayed, which the network
//!   already does. Keys expire on a crashed node as on a running one.
//! * **Clocks**: a node with a fast clock expires a key `fast` ticks early; each node's
//!   wall clock (the fencing floor) reads `now + offset`. The contract: `drift ≥ fast`,
//!   and offsets differ by less than the restart delay.
//! * **Pauses**: nothing forces a client to act, so a client may sit still for any number
//!   of ticks (a GC pause) while it believes it holds the lock.
//!
//! **Time is relative, so there is no horizon.** Every time in the state is stored
//! relative to "now" (a key's time left, an attempt's age, a deadline's time left, fence
//! values minus now), and each is clamped where larger values can no longer change any
//! outcome (an attempt older than `ttl − drift` can no longer hold; a fence value at or
//! below `min(offset) − (ttl − drift)` can neither be returned nor beat a floor, see
//! [`Protocol::low`]). The state space is therefore finite without bounding the number of
//! ticks: the checker covers schedules of any length, bounded only by the budgets
//! (attempts, extensions, crashes, lost messages).
//!
//! **Exact reductions** (they merge states that behave alike, they remove no behaviour):
//! nodes are interchangeable (each node's clock properties travel with it) and so are
//! clients (a token is the smallest value nothing refers to any more), so each state is
//! replaced by a canonical member of its class under renaming nodes and clients
//! ([`canonical`]); a request that can no longer change anything is dropped from its
//! connection, and an expired hold forgets what only a valid hold can use
//! ([`LockModel::normalize`]); an acquisition keeps only the largest fence value granted
//! so far, which is all the protocol uses.
//!
//! Not modelled: several resources (one script per node makes a multi-resource lock
//! behave as one key), the watchdog (it extends with the same script and deadline rule),
//! waiting and queueing (a failed attempt simply ends; the one-round hand-off, its queue
//! entries and release with transfer are in [`handoff`], selected by
//! [`Protocol::handoff`]), a request overtaking an earlier one on the same connection, and
//! a wall-clock step on a node (outside the contract).

use std::fmt;
use std::hash::{Hash, Hasher};

use stateright::{Model, Property};

pub mod handoff;

/// Nodes in the model.
pub const N: usize = 3;
/// Clients in the model (the symmetry reduction swaps the two).
pub const C: usize = 2;
/// A strict majority of `N`: any two majorities share a node.
pub const MAJORITY: usize = N / 2 + 1;
/// Requests one connection can hold at once (a full queue is a bug in the bounds).
pub const QCAP: usize = 8;

const _: () = assert!(
    C == 2,
    "the client symmetry below swaps exactly two clients"
);

/// The model's parameters: the protocol's constants, the fault budgets and the mutations
/// (each default is the real protocol inside the deployment contract).
#[derive(Clone, Debug)]
pub struct Protocol {
    /// Quorum the clients count to (the real protocol: `MAJORITY`).
    pub quorum: usize,
    /// The TTL of every acquisition, in ticks.
    pub ttl: u8,
    /// The client's drift allowance in ticks (`ttl × drift_factor + 2 ms`).
    pub drift: u8,
    /// How many ticks early a node with a fast clock expires a key.
    pub fast: u8,
    /// How many nodes have a fast clock: one initial state per entry (by the nodes'
    /// symmetry, the first k are fast).
    pub fast_nodes: &'static [usize],
    /// Each node's wall-clock offset in ticks (the fencing floor reads `now + offset`).
    pub offset: [i8; N],
    /// Replies travel separately and are read later, in any order.
    pub reply_delay: bool,
    /// Acquisition attempts per client.
    pub attempts: u8,
    /// Extensions per held lock.
    pub extends: u8,
    /// The TTLs an extension may ask for.
    pub extend_ttls: &'static [u8],
    /// Node crashes over the whole run.
    pub crashes: u8,
    /// The kinds of crash explored: `true` keeps the data (persistence), `false` comes
    /// back empty after `restart_delay`.
    pub crash_kinds: &'static [bool],
    /// Lost requests over the whole run.
    pub losses: u8,
    /// Fencing tokens on (two rounds) or off (one round).
    pub fencing: bool,
    /// Ticks a node without persistence stays down before it restarts empty (the
    /// contract: at least the TTL; 0 is the unsafe immediate restart).
    pub restart_delay: u8,
    /// The extend script uses `PEXPIRE … GT` (the real one); `false`: a plain `PEXPIRE`,
    /// which can shorten an expiry.
    pub extend_gt: bool,
    /// The release script compares the token before deleting (the real one).
    pub release_checks_token: bool,
    /// The fencing commit round runs (the real protocol); `false`: the token is the
    /// largest grant of round 1, returned without a commit.
    pub fence_commit: bool,
    /// The one-round direct hand-off (queue entries, release with transfer, counting):
    /// `Some` selects [`handoff::HandoffModel`], which runs its own state; the lock model
    /// refuses it.
    pub handoff: Option<handoff::Handoff>,
}

impl Protocol {
    /// The real protocol inside the deployment contract: TTL 2, drift allowance 1, every
    /// node's clock 1 tick fast, node 0's wall clock 1 tick ahead, a restart without
    /// persistence only after 2 ticks, one attempt per client, no faults.
    pub fn in_contract() -> Protocol {
        Protocol {
            quorum: MAJORITY,
            ttl: 2,
            drift: 1,
            fast: 1,
            fast_nodes: &[N],
            offset: [1, 0, 0],
            reply_delay: false,
            attempts: 1,
            extends: 0,
            extend_ttls: &[2],
            crashes: 0,
            crash_kinds: &[true, false],
            losses: 0,
            fencing: false,
            restart_delay: 2,
            extend_gt: true,
            release_checks_token: true,
            fence_commit: true,
            handoff: None,
        }
    }

    /// The fence value (relative to now) at or below which every value behaves alike.
    ///
    /// Every future floor is at least `now + min(offset)`, so a counter `c ≤ low` loses
    /// every grant to the floor (`c + 1 ≤ floor`, as `ttl − drift ≥ 1`). A token `t` comes
    /// from grants taken after its attempt started, so `t ≥ start + min(offset)`; such an
    /// attempt can hold only while `now − start < ttl − drift`, i.e. while
    /// `t > now + low`. So a value at or below `low` can never be returned, and anything
    /// that can be returned later beats it: all such values can be merged, and `low`
    /// rises with time as the values fall.
    pub fn low(&self) -> i8 {
        let least = self.offset.iter().copied().min().unwrap_or(0);
        least - self.window() as i8
    }

    /// `ttl − drift`: an attempt older than this can no longer hold.
    fn window(&self) -> u8 {
        self.ttl.saturating_sub(self.drift)
    }
}

/// A lock key on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The owner's token.
    pub tok: u8,
    /// Ticks until it expires (always ≥ 1: an expired key is gone).
    pub left: u8,
}

/// One node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// Ticks until it restarts empty after a crash without persistence (0: it runs).
    pub down: u8,
    /// The lock key, if any.
    pub key: Option<Key>,
    /// The fence counter, relative to now (never below [`Protocol::low`]).
    pub counter: i8,
    /// It came back empty at least once (for a witness).
    pub wiped: bool,
    /// Its clock runs fast (keys expire early).
    pub fast: bool,
    /// Its wall clock's offset (the fencing floor reads `now + offset`).
    pub offset: i8,
}

/// One node's answer in the current round, as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vote {
    /// No answer yet.
    Pending,
    /// The node answered (`Some(value)`: granted, with its new fence counter, relative)
    /// but the client has not read it yet.
    Unread(Option<i8>),
    /// Granted (a fenced grant's value went into the round's `best`).
    Granted,
    /// Refused (another owner's key, or our key is gone).
    Refused,
    /// Failed or timed out: unknown.
    Failed,
}

impl Vote {
    fn pending(self) -> bool {
        matches!(self, Vote::Pending | Vote::Unread(_))
    }
}

/// What a failed attempt's clean-up sends a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cleanup {
    /// Nothing: it refused round 1.
    Skip,
    /// A release once its `SET` finished, unless that `SET` was refused.
    AfterSet,
    /// A release now (it granted, failed or timed out).
    Now,
}

/// A request on a client → node connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// The acquire script.
    Set {
        /// The attempt's token.
        tok: u8,
    },
    /// The fencing commit of `t` (relative to now).
    Commit {
        /// The attempt's token.
        tok: u8,
        /// The token value to commit.
        t: i8,
    },
    /// The extend script.
    Extend {
        /// The lock's token.
        tok: u8,
        /// The TTL asked for.
        ttl: u8,
        /// Which extension of the lock it belongs to.
        seq: u8,
    },
    /// The release script.
    Release {
        /// The lock's token.
        tok: u8,
        /// Dropped if the `SET` ahead of it on this connection is refused (the clean-up
        /// of a node that had not answered).
        unless_refused: bool,
    },
}

impl Req {
    #[inline(always)]
    fn tok(self) -> u8 {
        match self {
            Req::Set { tok }
            | Req::Commit { tok, .. }
            | Req::Extend { tok, .. }
            | Req::Release { tok, .. } => tok,
        }
    }
}

/// One FIFO connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Queue(pub [Option<Req>; QCAP]);

impl Default for Queue {
    fn default() -> Queue {
        Queue::EMPTY
    }
}

impl Queue {
    /// No request.
    pub const EMPTY: Queue = Queue([None; QCAP]);

    fn is_empty(&self) -> bool {
        self.0[0].is_none()
    }

    fn push(&mut self, req: Req) {
        let Some(slot) = self.0.iter_mut().find(|r| r.is_none()) else {
            panic!("a connection holds more than {QCAP} requests: raise QCAP");
        };
        *slot = Some(req);
    }

    fn pop(&mut self) -> Option<Req> {
        let head = self.0[0];
        self.0.copy_within(1.., 0);
        self.0[QCAP - 1] = None;
        head
    }

    fn remove(&mut self, at: usize) {
        self.0.copy_within(at + 1.., at);
        self.0[QCAP - 1] = None;
    }

    fn iter(&self) -> impl Iterator<Item = Req> + '_ {
        self.0.iter().map_while(|r| *r)
    }
}

/// An extension in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ext {
    /// Ticks since it started (clamped once it can no longer move the deadline).
    pub age: u8,
    /// The TTL asked for.
    pub ttl: u8,
    /// Which extension of the lock this is.
    pub seq: u8,
    /// The nodes' answers.
    pub votes: [Vote; N],
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not holding, not trying.
    Idle,
    /// Round 1 of an acquisition.
    Acquire {
        /// Ticks since it started (clamped at `ttl − drift`: no validity left).
        age: u8,
        /// The largest fence value granted so far (relative; fenced only).
        best: i8,
        /// The nodes' answers.
        votes: [Vote; N],
    },
    /// Round 2 (the fencing commit) of an acquisition.
    Commit {
        /// Ticks since the attempt started (clamped at `ttl − drift`).
        age: u8,
        /// The token being committed (relative to now).
        t: i8,
        /// What the clean-up sends each node, from round 1's answers at its decision.
        cleanup: [Cleanup; N],
        /// The nodes' confirmations.
        votes: [Vote; N],
    },
    /// Holding a lock that it believes valid for `deadline` more ticks (0: expired).
    Held {
        /// Ticks left before the deadline.
        deadline: u8,
        /// An extension moved the deadline (for a witness).
        extended: bool,
        /// Extensions it may still start.
        extends_left: u8,
        /// The extension in progress.
        ext: Option<Ext>,
    },
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// Where it is.
    pub phase: Phase,
    /// The current attempt's or lock's token (0 when idle).
    pub tok: u8,
    /// Attempts it may still start.
    pub attempts_left: u8,
    /// It held the lock at least once (for a witness).
    pub ever_held: bool,
}

/// The whole system. Every time is relative to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct State {
    /// The clients.
    pub clients: [Client; C],
    /// The nodes.
    pub nodes: [Node; N],
    /// The connections, `queues[client][node]`.
    pub queues: [[Queue; N]; C],
    /// The largest fencing token returned so far (relative to now).
    pub max_token: i8,
    /// An acquisition returned a token not above one returned before it.
    pub fence_regressed: bool,
    /// Crashes left.
    pub crashes_left: u8,
    /// Lost requests left.
    pub losses_left: u8,
    /// A 64-bit hash of everything above, set by [`canonical`] from the encoding it builds
    /// anyway (the checker keeps only fingerprints; hashing each field separately would
    /// dominate a debug build).
    pub fp: u64,
}

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.fp);
    }
}

/// Folds a word into a hash (the splitmix64 finaliser: every input bit affects every
/// output bit).
#[inline(always)]
fn mix(h: u64, w: u64) -> u64 {
    let mut x = h ^ w;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A fixed-capacity byte writer.
#[derive(Clone, Copy)]
struct Bytes<const K: usize> {
    buf: [u8; K],
    len: usize,
}

/// The most bytes of one node's column: the node, then each client's view of it.
const COL: usize = 6 + C * (4 + 3 * QCAP);
/// The bytes of one client's own part.
const CLIENT: usize = 8;

impl<const K: usize> Bytes<K> {
    #[inline(always)]
    fn new() -> Self {
        Bytes {
            buf: [0; K],
            len: 0,
        }
    }
    #[inline(always)]
    fn put(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }
    #[inline(always)]
    fn i(&mut self, v: i8) {
        self.put(v as u8);
    }
    #[inline(always)]
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// Folds the bytes (and their length) into `h`, eight at a time.
    fn fold(&self, mut h: u64) -> u64 {
        h = mix(h, self.len as u64);
        let b = &self.buf;
        let mut i = 0;
        while i + 8 <= self.len {
            let w = [
                b[i],
                b[i + 1],
                b[i + 2],
                b[i + 3],
                b[i + 4],
                b[i + 5],
                b[i + 6],
                b[i + 7],
            ];
            h = mix(h, u64::from_le_bytes(w));
            i += 8;
        }
        let mut last = 0u64;
        while i < self.len {
            last = (last << 8) | u64::from(b[i]);
            i += 1;
        }
        mix(h, last)
    }
    fn vote(&mut self, v: Option<Vote>) {
        let (tag, x) = match v {
            None => (0, 0),
            Some(Vote::Pending) => (1, 0),
            Some(Vote::Unread(None)) => (2, 0),
            Some(Vote::Unread(Some(x))) => (3, x),
            Some(Vote::Granted) => (4, 0),
            Some(Vote::Refused) => (5, 0),
            Some(Vote::Failed) => (6, 0),
        };
        self.put(tag);
        self.i(x);
    }
}

impl State {
    /// Node `n`'s column: everything in the state indexed by that node, in `COL` bytes.
    fn column<const K: usize>(&self, n: usize, e: &mut Bytes<K>) {
        let node = &self.nodes[n];
        e.put(node.down);
        match node.key {
            None => {
                e.put(0);
                e.put(0);
            }
            Some(k) => {
                e.put(1 + k.tok);
                e.put(k.left);
            }
        }
        e.i(node.counter);
        e.put(u8::from(node.wiped) | (u8::from(node.fast) << 1));
        e.i(node.offset);
        for c in 0..C {
            let (vote, step) = match &self.clients[c].phase {
                Phase::Idle | Phase::Held { ext: None, .. } => (None, 0),
                Phase::Acquire { votes, .. } => (Some(votes[n]), 0),
                Phase::Commit { cleanup, votes, .. } => (Some(votes[n]), 1 + cleanup[n] as u8),
                Phase::Held { ext: Some(x), .. } => (Some(x.votes[n]), 0),
            };
            e.vote(vote);
            e.put(step);
            // Index loops: a debug build calls a function per iterator step.
            let q = &self.queues[c][n].0;
            let mut slot = 0;
            while slot < QCAP {
                let (kind, tok, arg) = match q[slot] {
                    None => break,
                    Some(Req::Set { tok }) => (1, tok, 0),
                    Some(Req::Commit { tok, t }) => (2, tok, t as u8),
                    Some(Req::Extend { tok, ttl, seq }) => (3, tok, (ttl << 4) | seq),
                    Some(Req::Release {
                        tok,
                        unless_refused,
                    }) => (4 + u8::from(unless_refused), tok, 0),
                };
                e.put(kind);
                e.put(tok);
                e.put(arg);
                slot += 1;
            }
            e.put(0);
        }
    }
}

/// Everything that can happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Time passes by one tick; expired keys disappear.
    Tick,
    /// A client starts an acquisition.
    Acquire(usize),
    /// A node runs the oldest request on a connection.
    Deliver {
        /// Whose connection.
        client: usize,
        /// Which node.
        node: usize,
    },
    /// A client reads a node's answer (only with `reply_delay`).
    Read {
        /// The client.
        client: usize,
        /// The node.
        node: usize,
    },
    /// The oldest request on a connection is lost.
    Lose {
        /// Whose connection.
        client: usize,
        /// Which node.
        node: usize,
    },
    /// A client stops waiting for every node it has no answer from.
    GiveUp(usize),
    /// A holder starts an extension.
    Extend {
        /// The holder.
        client: usize,
        /// The TTL it asks for.
        ttl: u8,
    },
    /// A holder releases.
    Release(usize),
    /// A node crashes. With persistence it comes back at once with its data; without,
    /// it comes back empty exactly `restart_delay` ticks later (a `Tick` restarts it).
    Crash {
        /// The node.
        node: usize,
        /// It keeps its data.
        persisted: bool,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Whether client `c` believes it holds the lock.
pub fn believes(s: &State, c: usize) -> bool {
    matches!(s.clients[c].phase, Phase::Held { deadline, .. } if deadline > 0)
}

/// The nodes that hold `tok` for at least `ticks` more ticks (a crashed node's data
/// counts: it comes back with it, or empty only once it expired).
pub fn backing(s: &State, tok: u8, ticks: u8) -> usize {
    s.nodes
        .iter()
        .filter(|n| matches!(n.key, Some(k) if k.tok == tok && k.left >= ticks))
        .count()
}

/// Safety: at most one client believes it holds the lock.
pub fn mutual_exclusion(s: &State) -> bool {
    (0..C).filter(|&c| believes(s, c)).count() <= 1
}

/// Safety: every fencing token returned was larger than every token returned before it.
pub fn tokens_rise(s: &State) -> bool {
    !s.fence_regressed
}

/// Safety: whatever `remaining()` reports, a majority of nodes holds the token at least
/// that long.
pub fn remaining_backed(s: &State) -> bool {
    (0..C).all(|c| match s.clients[c].phase {
        Phase::Held { deadline, .. } if deadline > 0 => {
            backing(s, s.clients[c].tok, deadline) >= MAJORITY
        }
        _ => true,
    })
}

/// A one-line account of a state for counterexamples: each client, each node, each
/// non-empty connection (times are ticks from now).
pub fn describe(s: &State) -> String {
    let mut out = String::new();
    for (c, cl) in s.clients.iter().enumerate() {
        let phase = match cl.phase {
            Phase::Idle => "idle".to_string(),
            Phase::Acquire { age, votes, .. } => format!("acquiring (age {age}) {votes:?}"),
            Phase::Commit { age, t, votes, .. } => {
                format!("committing t={t} (age {age}) {votes:?}")
            }
            Phase::Held { deadline, ext, .. } => {
                let ext = ext.map_or(String::new(), |e| format!(", extending {:?}", e.votes));
                format!("holds, remaining {deadline}{ext}")
            }
        };
        out += &format!("client {c} [tok {}]: {phase}; ", cl.tok);
    }
    for (n, node) in s.nodes.iter().enumerate() {
        let key = node.key.map_or("no key".to_string(), |k| {
            format!("key tok {} for {}", k.tok, k.left)
        });
        out += &format!(
            "node {n}: {key}, counter {}, {:?}; ",
            node.counter, node.down
        );
    }
    for (c, row) in s.queues.iter().enumerate() {
        for (n, q) in row.iter().enumerate() {
            if !q.is_empty() {
                out += &format!("{c}->{n}: {:?}; ", q.iter().collect::<Vec<_>>());
            }
        }
    }
    out + &format!("largest token returned {}", s.max_token)
}

/// The names of the safety properties.
pub const MUTUAL_EXCLUSION: &str = "mutual exclusion";
/// See [`tokens_rise`].
pub const TOKENS_RISE: &str = "fencing tokens rise";
/// See [`remaining_backed`].
pub const REMAINING_BACKED: &str = "remaining is backed by a quorum";

/// The model: a protocol variant to explore. The TTL must exceed the drift allowance
/// (the client refuses such a TTL, and [`Protocol::low`] relies on it).
pub struct LockModel(pub Protocol);

fn count(votes: &[Vote; N], f: impl Fn(Vote) -> bool) -> usize {
    votes.iter().filter(|v| f(**v)).count()
}

fn granted(v: Vote) -> bool {
    v == Vote::Granted
}

impl LockModel {
    /// The initial states: one per entry of `fast_nodes`.
    pub fn initial(&self) -> Vec<State> {
        let p = &self.0;
        assert!(
            p.ttl > p.drift,
            "a TTL within the drift allowance is refused"
        );
        assert!(
            p.handoff.is_none(),
            "the hand-off runs in handoff::HandoffModel"
        );
        p.fast_nodes
            .iter()
            .map(|&k| State {
                clients: [Client {
                    phase: Phase::Idle,
                    tok: 0,
                    attempts_left: p.attempts,
                    ever_held: false,
                }; C],
                nodes: std::array::from_fn(|n| Node {
                    down: 0,
                    key: None,
                    counter: p.low(),
                    wiped: false,
                    fast: n < k && p.fast > 0,
                    // Wall clocks only matter to fencing; equal offsets keep the nodes
                    // interchangeable otherwise.
                    offset: if p.fencing { p.offset[n] } else { 0 },
                }),
                queues: Default::default(),
                max_token: p.low(),
                fence_regressed: false,
                crashes_left: p.crashes,
                losses_left: p.losses,
                fp: 0,
            })
            .map(canonical)
            .collect()
    }

    /// Sends `req` to node `n` on client `c`'s connection; `false` if the node is down
    /// (connection refused).
    fn send(s: &mut State, c: usize, n: usize, req: Req) -> bool {
        if s.nodes[n].down > 0 {
            return false;
        }
        s.queues[c][n].push(req);
        true
    }

    /// Sends `req` to every node in `to`; a node that is down fails at once, a node not
    /// in `to` counts as refused.
    fn fan_out(s: &mut State, c: usize, to: [bool; N], req: Req) -> [Vote; N] {
        std::array::from_fn(|n| {
            if !to[n] {
                Vote::Refused
            } else if Self::send(s, c, n, req) {
                Vote::Pending
            } else {
                Vote::Failed
            }
        })
    }

    /// What the clean-up sends each node, from round 1's answers at the decision.
    fn cleanup_plan(votes: &[Vote; N]) -> [Cleanup; N] {
        votes.map(|v| match v {
            Vote::Refused | Vote::Unread(None) => Cleanup::Skip,
            Vote::Pending => Cleanup::AfterSet,
            Vote::Granted | Vote::Unread(Some(_)) | Vote::Failed => Cleanup::Now,
        })
    }

    /// The attempt failed: clean up and go idle.
    fn fail(s: &mut State, c: usize, plan: [Cleanup; N]) {
        let tok = s.clients[c].tok;
        for (n, step) in plan.into_iter().enumerate() {
            let unless_refused = match step {
                Cleanup::Skip => continue,
                Cleanup::AfterSet => true,
                Cleanup::Now => false,
            };
            Self::send(
                s,
                c,
                n,
                Req::Release {
                    tok,
                    unless_refused,
                },
            );
        }
        s.clients[c].phase = Phase::Idle;
        s.clients[c].tok = 0;
    }

    /// The quorum was reached `age` ticks after the attempt started: held if validity is
    /// left, else cleaned up.
    fn finish(&self, s: &mut State, c: usize, age: u8, token: Option<i8>, plan: [Cleanup; N]) {
        let p = &self.0;
        if age >= p.window() {
            Self::fail(s, c, plan);
            return;
        }
        if let Some(t) = token {
            if t <= s.max_token {
                s.fence_regressed = true;
            }
            s.max_token = s.max_token.max(t);
        }
        // deadline = start + (ttl − elapsed − drift), and start = now − age.
        let deadline = (i16::from(p.window()) - 2 * i16::from(age)).max(0) as u8;
        let cl = &mut s.clients[c];
        cl.ever_held = true;
        cl.phase = Phase::Held {
            deadline,
            extended: false,
            extends_left: p.extends,
            ext: None,
        };
    }

    /// Decides whatever client `c` can decide now.
    fn decide(&self, s: &mut State, c: usize) {
        let p = &self.0;
        let q = p.quorum;
        match s.clients[c].phase {
            Phase::Idle => {}
            Phase::Acquire {
                age,
                best: t,
                votes,
            } => {
                let g = count(&votes, granted);
                if g >= q {
                    let plan = Self::cleanup_plan(&votes);
                    if !p.fencing {
                        self.finish(s, c, age, None, plan);
                        return;
                    }
                    if !p.fence_commit {
                        self.finish(s, c, age, Some(t), plan);
                        return;
                    }
                    let tok = s.clients[c].tok;
                    let to = votes.map(|v| v != Vote::Refused);
                    let votes = Self::fan_out(s, c, to, Req::Commit { tok, t });
                    s.clients[c].phase = Phase::Commit {
                        age,
                        t,
                        cleanup: plan,
                        votes,
                    };
                    self.decide(s, c);
                } else if g + count(&votes, Vote::pending) < q {
                    Self::fail(s, c, Self::cleanup_plan(&votes));
                }
            }
            Phase::Commit {
                age,
                t,
                cleanup,
                votes,
            } => {
                let g = count(&votes, granted);
                if g >= q {
                    self.finish(s, c, age, Some(t), cleanup);
                } else if g + count(&votes, Vote::pending) < q {
                    Self::fail(s, c, cleanup);
                }
            }
            Phase::Held {
                deadline,
                extended,
                extends_left,
                ext: Some(ext),
            } => {
                let g = count(&ext.votes, granted);
                let refused = count(&ext.votes, |v| v == Vote::Refused);
                let (mut deadline, mut extended) = (deadline, extended);
                if g >= q {
                    if ext.age < ext.ttl.saturating_sub(p.drift) {
                        let d = i16::from(ext.ttl) - i16::from(p.drift) - 2 * i16::from(ext.age);
                        let d = d.max(0) as u8;
                        if d > deadline {
                            deadline = d;
                            extended = true;
                        }
                    }
                } else if refused > N - q {
                    deadline = 0; // lost: fewer than a quorum can still hold it
                } else if g + count(&ext.votes, Vote::pending) >= q {
                    return; // not decided yet
                }
                s.clients[c].phase = Phase::Held {
                    deadline,
                    extended,
                    extends_left,
                    ext: None,
                };
            }
            Phase::Held { ext: None, .. } => {}
        }
    }

    /// Node `n` runs `req` from client `c`; if the client waits for the answer, it reads
    /// it now, or it is left unread (`reply_delay`).
    fn run(&self, s: &mut State, c: usize, n: usize, req: Req) {
        let p = &self.0;
        let node = &mut s.nodes[n];
        let early = if node.fast { p.fast } else { 0 };
        let answer = match req {
            Req::Set { tok } => {
                if node.key.is_some() {
                    // The clean-up's release behind a refused SET is not sent.
                    let q = &mut s.queues[c][n];
                    let behind = q.iter().position(|r| {
                        r == Req::Release {
                            tok,
                            unless_refused: true,
                        }
                    });
                    if let Some(at) = behind {
                        q.remove(at);
                    }
                    None
                } else {
                    let left = p.ttl.saturating_sub(early);
                    node.key = (left > 0).then_some(Key { tok, left });
                    if p.fencing {
                        node.counter = node.counter.saturating_add(1).max(node.offset);
                    }
                    Some(if p.fencing { node.counter } else { 0 })
                }
            }
            Req::Commit { tok, t } => {
                let ok = matches!(node.key, Some(k) if k.tok == tok);
                if ok {
                    node.counter = node.counter.max(t);
                }
                ok.then_some(0)
            }
            Req::Extend { tok, ttl, .. } => match &mut node.key {
                Some(k) if k.tok == tok => {
                    let left = ttl.saturating_sub(early);
                    let left = if p.extend_gt { k.left.max(left) } else { left };
                    if left == 0 {
                        node.key = None;
                    } else {
                        k.left = left;
                    }
                    Some(0)
                }
                _ => None,
            },
            Req::Release { tok, .. } => {
                if matches!(node.key, Some(k) if !p.release_checks_token || k.tok == tok) {
                    node.key = None;
                }
                return;
            }
        };
        // Is the answer awaited? Then it is read now, or left unread.
        let cl = &mut s.clients[c];
        if !Self::awaited(cl, n, req) {
            return;
        }
        if p.reply_delay {
            if let Some(votes) = Self::votes_mut(&mut cl.phase) {
                votes[n] = Vote::Unread(answer);
            }
        } else {
            Self::record(&mut cl.phase, n, answer);
            self.decide(s, c);
        }
    }

    /// The client reads node `n`'s answer in its current round.
    fn record(phase: &mut Phase, n: usize, answer: Option<i8>) {
        if let (Phase::Acquire { best, .. }, Some(v)) = (&mut *phase, answer) {
            *best = (*best).max(v);
        }
        if let Some(votes) = Self::votes_mut(phase) {
            votes[n] = if answer.is_some() {
                Vote::Granted
            } else {
                Vote::Refused
            };
        }
    }

    /// The votes of client `c`'s current round.
    fn votes_mut(phase: &mut Phase) -> Option<&mut [Vote; N]> {
        match phase {
            Phase::Acquire { votes, .. } | Phase::Commit { votes, .. } => Some(votes),
            Phase::Held { ext: Some(ext), .. } => Some(&mut ext.votes),
            _ => None,
        }
    }

    /// Whether client `cl` waits for node `n`'s answer to `req`.
    fn awaited(cl: &Client, n: usize, req: Req) -> bool {
        if req.tok() != cl.tok {
            return false;
        }
        match (&cl.phase, req) {
            (Phase::Acquire { votes, .. }, Req::Set { .. })
            | (Phase::Commit { votes, .. }, Req::Commit { .. }) => votes[n] == Vote::Pending,
            (Phase::Held { ext: Some(ext), .. }, Req::Extend { seq, .. }) => {
                ext.seq == seq && ext.votes[n] == Vote::Pending
            }
            _ => false,
        }
    }

    /// Merges states that differ only in what can no longer matter (an exact reduction):
    /// an expired hold with no extension in flight can only be released, and a request
    /// that can no longer change a node or a client is dropped from its connection. Keys
    /// are only created by a `SET` of the same token on the same connection, so a release,
    /// commit or extension whose token is neither the node's key nor behind a `SET` ahead
    /// of it does nothing (and if no one waits for its answer, it is not needed); a commit
    /// of a value the counter already reached does nothing either (both fall together).
    pub fn normalize(&self, s: &mut State) {
        let p = &self.0;
        for cl in &mut s.clients {
            if let Phase::Held {
                deadline: 0,
                ext: None,
                extended,
                extends_left,
            } = &mut cl.phase
            {
                *extended = false;
                *extends_left = 0;
            }
        }
        // Index loops: this runs for every state, and a debug build calls a function for
        // every iterator step.
        let mut c = 0;
        while c < C {
            let mut n = 0;
            while n < N {
                let node = &s.nodes[n];
                let key = match node.key {
                    Some(k) => k.tok,
                    None => 0,
                };
                let client = &s.clients[c];
                let q = &mut s.queues[c][n].0;
                let mut set_ahead = 0u32;
                let (mut read, mut write) = (0, 0);
                while read < QCAP {
                    let Some(r) = q[read] else { break };
                    let tok = r.tok();
                    let live = key == tok || set_ahead & (1 << tok) != 0;
                    let keep = match r {
                        Req::Set { .. } => {
                            set_ahead |= 1 << tok;
                            true
                        }
                        Req::Release { .. } => live || !p.release_checks_token,
                        Req::Commit { t, .. } => {
                            (live && (t > node.counter || set_ahead != 0))
                                || Self::awaited(client, n, r)
                        }
                        Req::Extend { .. } => live || Self::awaited(client, n, r),
                    };
                    if keep {
                        q[write] = Some(r);
                        write += 1;
                    }
                    read += 1;
                }
                while write < read {
                    q[write] = None;
                    write += 1;
                }
                n += 1;
            }
            c += 1;
        }
    }

    /// The smallest token no request, key or client refers to.
    fn fresh_token(s: &State) -> u8 {
        let mut used = 1u32; // 0 means "no token"
        for cl in &s.clients {
            used |= 1 << cl.tok;
        }
        for node in &s.nodes {
            if let Some(k) = node.key {
                used |= 1 << k.tok;
            }
        }
        for q in s.queues.iter().flatten() {
            for r in q.iter() {
                used |= 1 << r.tok();
            }
        }
        (!used).trailing_zeros() as u8
    }

    /// One tick: every relative time moves by one, clamped where it stops mattering.
    fn tick(&self, s: &mut State) {
        let p = &self.0;
        let low = p.low();
        let fall = |v: i8| v.saturating_sub(1).max(low);
        let window = p.window();
        for node in &mut s.nodes {
            if let Some(k) = &mut node.key {
                k.left -= 1;
                if k.left == 0 {
                    node.key = None;
                }
            }
            node.counter = fall(node.counter);
            if node.down > 0 {
                node.down -= 1;
                if node.down == 0 {
                    // Back, empty (keys and counter lost).
                    node.key = None;
                    node.counter = low;
                    node.wiped = true;
                }
            }
        }
        let fall_vote = |v: &mut Vote| {
            if let Vote::Unread(Some(x)) = v {
                *x = fall(*x);
            }
        };
        for cl in &mut s.clients {
            match &mut cl.phase {
                Phase::Idle => {}
                Phase::Acquire { age, best, votes } => {
                    *age = (*age + 1).min(window);
                    if p.fencing {
                        *best = fall(*best);
                        votes.iter_mut().for_each(fall_vote);
                    }
                }
                Phase::Commit { age, t, .. } => {
                    *age = (*age + 1).min(window);
                    *t = fall(*t);
                }
                Phase::Held { deadline, ext, .. } => {
                    *deadline = deadline.saturating_sub(1);
                    if let Some(ext) = ext {
                        ext.age = (ext.age + 1).min(ext.ttl.saturating_sub(p.drift));
                    }
                }
            }
        }
        if p.fencing {
            for q in s.queues.iter_mut().flatten() {
                for r in q.0.iter_mut().map_while(|r| r.as_mut()) {
                    if let Req::Commit { t, .. } = r {
                        *t = fall(*t);
                    }
                }
            }
        }
        s.max_token = fall(s.max_token);
    }
}

/// Reorders the nodes by their columns (a canonical order under renaming the nodes:
/// nodes whose columns are equal are interchangeable).
fn sort_nodes(s: State) -> (State, [Bytes<COL>; N]) {
    let mut cols = [Bytes::<COL>::new(), Bytes::new(), Bytes::new()];
    s.column(0, &mut cols[0]);
    s.column(1, &mut cols[1]);
    s.column(2, &mut cols[2]);
    // Three elements: a sorting network of three compare-exchanges (a debug build calls a
    // function for every iterator step and every `swap`).
    let mut perm = [0, 1, 2];
    for (i, j) in [(0, 1), (1, 2), (0, 1)] {
        if cols[perm[i]].as_slice() > cols[perm[j]].as_slice() {
            (perm[i], perm[j]) = (perm[j], perm[i]);
        }
    }
    if perm == [0, 1, 2] {
        return (s, cols);
    }
    let [a, b, c] = perm;
    (permute_nodes(s, perm), [cols[a], cols[b], cols[c]])
}

/// The state with node `perm[i]` renamed `i`.
fn permute_nodes(mut s: State, perm: [usize; N]) -> State {
    let [a, b, c] = perm;
    let old = s;
    s.nodes = [old.nodes[a], old.nodes[b], old.nodes[c]];
    let mut k = 0;
    while k < C {
        let q = &old.queues[k];
        s.queues[k] = [q[a], q[b], q[c]];
        let permute = |v: &mut [Vote; N]| *v = [v[a], v[b], v[c]];
        match &mut s.clients[k].phase {
            Phase::Idle | Phase::Held { ext: None, .. } => {}
            Phase::Acquire { votes, .. } => permute(votes),
            Phase::Commit { cleanup, votes, .. } => {
                permute(votes);
                *cleanup = [cleanup[a], cleanup[b], cleanup[c]];
            }
            Phase::Held { ext: Some(e), .. } => permute(&mut e.votes),
        }
        k += 1;
    }
    s
}

/// The state with its two clients swapped.
fn swap_clients(mut s: State) -> State {
    s.clients.swap(0, 1);
    s.queues.swap(0, 1);
    s
}

/// Every renaming of `s`'s nodes and clients (12 states, `s` among them).
pub fn renamings(s: &State) -> Vec<State> {
    const PERMS: [[usize; N]; 6] = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    PERMS
        .iter()
        .flat_map(|&perm| {
            [
                permute_nodes(*s, perm),
                permute_nodes(swap_clients(*s), perm),
            ]
        })
        .collect()
}

impl Client {
    /// The client's own part of the state (nothing indexed by node).
    fn own(&self) -> Bytes<CLIENT> {
        let mut e = Bytes::new();
        self.encode(&mut e);
        e
    }

    fn encode<const K: usize>(&self, e: &mut Bytes<K>) {
        let before = e.len;
        e.put(self.tok);
        e.put(self.attempts_left | (u8::from(self.ever_held) << 7));
        match self.phase {
            Phase::Idle => e.put(0),
            Phase::Acquire { age, best, .. } => {
                e.put(1);
                e.put(age);
                e.i(best);
            }
            Phase::Commit { age, t, .. } => {
                e.put(2);
                e.put(age);
                e.i(t);
            }
            Phase::Held {
                deadline,
                extended,
                extends_left,
                ext,
            } => {
                e.put(3);
                e.put(deadline);
                e.put(extends_left | (u8::from(extended) << 7));
                match ext {
                    None => e.put(0),
                    Some(x) => {
                        e.put(1 + x.seq);
                        e.put(x.age);
                        e.put(x.ttl);
                    }
                }
            }
        }
        e.len = before + CLIENT;
    }
}

/// The state with every token renamed by `map` (`map[old] = new`; 0 stays 0). Index
/// loops: this runs for every state, and a debug build calls a function for every
/// iterator step.
fn rename_tokens(mut s: State, map: &[u8; 32]) -> State {
    let r = |t: &mut u8| *t = map[usize::from(*t)];
    r(&mut s.clients[0].tok);
    r(&mut s.clients[1].tok);
    let mut n = 0;
    while n < N {
        if let Some(k) = &mut s.nodes[n].key {
            r(&mut k.tok);
        }
        let mut c = 0;
        while c < C {
            let q = &mut s.queues[c][n].0;
            let mut i = 0;
            while i < QCAP {
                match &mut q[i] {
                    None => break,
                    Some(
                        Req::Set { tok }
                        | Req::Commit { tok, .. }
                        | Req::Extend { tok, .. }
                        | Req::Release { tok, .. },
                    ) => r(tok),
                }
                i += 1;
            }
            c += 1;
        }
        n += 1;
    }
    s
}

/// The tokens no client holds any more (left in keys and on connections), in order of
/// value, and how many there are.
fn orphans(s: &State) -> ([u8; 8], usize) {
    let mut seen = 0u32;
    let mut n = 0;
    while n < N {
        if let Some(k) = s.nodes[n].key {
            seen |= 1 << k.tok;
        }
        let mut c = 0;
        while c < C {
            let q = &s.queues[c][n].0;
            let mut i = 0;
            while i < QCAP {
                let Some(r) = q[i] else { break };
                seen |= 1 << r.tok();
                i += 1;
            }
            c += 1;
        }
        n += 1;
    }
    seen &= !(1 << s.clients[0].tok);
    seen &= !(1 << s.clients[1].tok);
    let mut out = [0u8; 8];
    let mut k = 0;
    while seen != 0 {
        out[k] = seen.trailing_zeros() as u8;
        seen &= seen - 1;
        k += 1;
    }
    (out, k)
}

/// Calls `visit` with every order of `items` (Heap's algorithm; few items: at most 4
/// tokens exist at once in the sizes checked).
fn each_order(items: &mut [u8], visit: &mut impl FnMut(&[u8])) {
    let k = items.len();
    visit(items);
    let mut c = [0usize; 8];
    let mut i = 1;
    while i < k {
        if c[i] < i {
            let j = if i % 2 == 0 { 0 } else { c[i] };
            items.swap(j, i);
            visit(items);
            c[i] += 1;
            i = 1;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
}

/// A canonical member of `s`'s class under renaming nodes, clients and tokens (only
/// equality of tokens matters, and a new one is any value not in use): the clients in
/// the order of their own parts regardless of token values (both orders tried when
/// those are equal); the clients' tokens renamed 1 and 2, the other tokens after them
/// (every order tried); then the nodes in the order of their columns; the least of the
/// candidates.
pub fn canonical(mut s: State) -> State {
    s.fp = 0;
    let key = |cl: &Client| {
        let mut anonymous = *cl;
        anonymous.tok = u8::from(cl.tok != 0);
        anonymous.own()
    };
    let (first, second) = (key(&s.clients[0]), key(&s.clients[1]));
    let (both, one);
    let starts: &[State] = match first.as_slice().cmp(second.as_slice()) {
        std::cmp::Ordering::Less => {
            one = [s];
            &one
        }
        std::cmp::Ordering::Greater => {
            one = [swap_clients(s)];
            &one
        }
        std::cmp::Ordering::Equal => {
            both = [s, swap_clients(s)];
            &both
        }
    };
    let (mut orphaned, k) = orphans(&s);
    let mut best: Option<(State, [Bytes<COL>; N])> = None;
    for start in starts {
        each_order(&mut orphaned[..k], &mut |order| {
            let mut map = [0u8; 32];
            let mut next = 1;
            for t in [start.clients[0].tok, start.clients[1].tok] {
                if t != 0 {
                    map[usize::from(t)] = next;
                    next += 1;
                }
            }
            for &t in order {
                map[usize::from(t)] = next;
                next += 1;
            }
            let identity = (1..next).all(|t| map[usize::from(t)] == t);
            let renamed = if identity {
                *start
            } else {
                rename_tokens(*start, &map)
            };
            let candidate = sort_nodes(renamed);
            if best.as_ref().is_none_or(|(b, _)| candidate.0 < *b) {
                best = Some(candidate);
            }
        });
    }
    let Some((mut s, cols)) = best else {
        unreachable!("at least one candidate");
    };
    // The state's encoding (own parts, columns in node order, globals) is injective;
    // hash it as it stands.
    let mut h = s.clients[0].own().fold(0x51_7cc1_b727_220a);
    h = s.clients[1].own().fold(h);
    for col in &cols {
        h = col.fold(h);
    }
    let globals = u64::from(s.max_token as u8)
        | u64::from(s.fence_regressed) << 8
        | u64::from(s.crashes_left) << 16
        | u64::from(s.losses_left) << 24;
    s.fp = mix(h, globals);
    s
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.initial()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let p = &self.0;
        actions.push(Action::Tick);
        for c in 0..C {
            let cl = &s.clients[c];
            match &cl.phase {
                Phase::Idle => {
                    if cl.attempts_left > 0 {
                        actions.push(Action::Acquire(c));
                    }
                }
                Phase::Acquire { votes, .. } | Phase::Commit { votes, .. } => {
                    if votes.iter().any(|v| v.pending()) {
                        actions.push(Action::GiveUp(c));
                    }
                }
                Phase::Held {
                    deadline,
                    extends_left,
                    ext,
                    ..
                } => {
                    match ext {
                        Some(e) if e.votes.iter().any(|v| v.pending()) => {
                            actions.push(Action::GiveUp(c))
                        }
                        Some(_) => {}
                        None if *extends_left > 0 && *deadline > 0 => {
                            for &ttl in p.extend_ttls {
                                actions.push(Action::Extend { client: c, ttl });
                            }
                        }
                        None => {}
                    }
                    actions.push(Action::Release(c));
                }
            }
            for n in 0..N {
                if !s.queues[c][n].is_empty() {
                    if s.nodes[n].down == 0 {
                        actions.push(Action::Deliver { client: c, node: n });
                    }
                    if s.losses_left > 0 {
                        actions.push(Action::Lose { client: c, node: n });
                    }
                }
            }
            let mut phase = cl.phase;
            if let Some(votes) = Self::votes_mut(&mut phase) {
                for (n, v) in votes.iter().enumerate() {
                    if matches!(v, Vote::Unread(_)) {
                        actions.push(Action::Read { client: c, node: n });
                    }
                }
            }
        }
        if s.crashes_left > 0 {
            for n in 0..N {
                if s.nodes[n].down == 0 {
                    for &persisted in p.crash_kinds {
                        actions.push(Action::Crash { node: n, persisted });
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let p = &self.0;
        let mut s = *last;
        match action {
            Action::Tick => self.tick(&mut s),
            Action::Acquire(c) => {
                let tok = Self::fresh_token(&s);
                let cl = &mut s.clients[c];
                cl.attempts_left -= 1;
                cl.tok = tok;
                let votes = Self::fan_out(&mut s, c, [true; N], Req::Set { tok });
                s.clients[c].phase = Phase::Acquire {
                    age: 0,
                    best: p.low(),
                    votes,
                };
                self.decide(&mut s, c);
            }
            Action::Deliver { client, node } => {
                let req = s.queues[client][node].pop()?;
                self.run(&mut s, client, node, req);
            }
            Action::Read { client, node } => {
                let votes = Self::votes_mut(&mut s.clients[client].phase)?;
                let Vote::Unread(answer) = votes[node] else {
                    return None;
                };
                Self::record(&mut s.clients[client].phase, node, answer);
                self.decide(&mut s, client);
            }
            Action::Lose { client, node } => {
                s.queues[client][node].pop()?;
                s.losses_left -= 1;
            }
            Action::GiveUp(c) => {
                let votes = Self::votes_mut(&mut s.clients[c].phase)?;
                for v in votes.iter_mut() {
                    if v.pending() {
                        *v = Vote::Failed;
                    }
                }
                self.decide(&mut s, c);
            }
            Action::Extend { client, ttl } => {
                let tok = s.clients[client].tok;
                let Phase::Held {
                    deadline,
                    extended,
                    extends_left,
                    ext: None,
                } = s.clients[client].phase
                else {
                    return None;
                };
                let seq = p.extends - extends_left;
                let votes = Self::fan_out(&mut s, client, [true; N], Req::Extend { tok, ttl, seq });
                s.clients[client].phase = Phase::Held {
                    deadline,
                    extended,
                    extends_left: extends_left - 1,
                    ext: Some(Ext {
                        age: 0,
                        ttl,
                        seq,
                        votes,
                    }),
                };
                self.decide(&mut s, client);
            }
            Action::Release(c) => {
                let tok = s.clients[c].tok;
                for n in 0..N {
                    Self::send(
                        &mut s,
                        c,
                        n,
                        Req::Release {
                            tok,
                            unless_refused: false,
                        },
                    );
                }
                s.clients[c].phase = Phase::Idle;
                s.clients[c].tok = 0;
            }
            Action::Crash { node, persisted } => {
                s.crashes_left -= 1;
                // Its connections break: whatever was on them is lost.
                for c in 0..C {
                    s.queues[c][node] = Queue::EMPTY;
                }
                // With persistence it comes back with its data: at once (staying down
                // longer is the same as delaying every request to it). Without, it stays
                // down exactly `restart_delay` ticks (longer is again only a delay).
                let n = &mut s.nodes[node];
                if !persisted {
                    if p.restart_delay == 0 {
                        n.key = None;
                        n.counter = p.low();
                        n.wiped = true;
                    } else {
                        n.down = p.restart_delay;
                    }
                }
            }
        }
        self.normalize(&mut s);
        Some(canonical(s))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let p = &self.0;
        let mut props = vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
            Property::always(TOKENS_RISE, |_, s: &State| tokens_rise(s)),
            Property::always(REMAINING_BACKED, |_, s: &State| remaining_backed(s)),
            Property::sometimes("a client acquires", |_, s: &State| {
                (0..C).any(|c| believes(s, c))
            }),
        ];
        props.push(Property::sometimes(
            "both clients hold in turn",
            |_, s: &State| s.clients.iter().all(|c| c.ever_held),
        ));
        if p.crashes > 0 && !p.crash_kinds.is_empty() {
            props.push(Property::sometimes(
                "a client acquires after a crash",
                |m: &LockModel, s: &State| {
                    s.crashes_left < m.0.crashes && (0..C).any(|c| believes(s, c))
                },
            ));
            if p.crash_kinds.contains(&false) && p.restart_delay > 0 {
                props.push(Property::sometimes(
                    "a client acquires while a node is down",
                    |_, s: &State| {
                        s.nodes.iter().any(|n| n.down > 0) && (0..C).any(|c| believes(s, c))
                    },
                ));
                props.push(Property::sometimes(
                    "a client acquires after a node came back empty",
                    |_, s: &State| {
                        (0..C).any(|c| believes(s, c))
                            && s.nodes.iter().any(|n| n.wiped && n.down == 0)
                    },
                ));
            }
        }
        if p.extends > 0 {
            props.push(Property::sometimes(
                "an extension moves the deadline",
                |_, s: &State| {
                    s.clients.iter().any(|c| {
                        matches!(
                            c.phase,
                            Phase::Held {
                                extended: true,
                                deadline: 1..,
                                ..
                            }
                        )
                    })
                },
            ));
        }
        props
    }
}
