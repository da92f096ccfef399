//! The one-round direct hand-off (transfer), on top of the lock model of `super`: three
//! nodes, two clients, one resource, discrete ticks, every time relative to now.
//!
//! What it adds to the plain lock (the rules of the design, as the model runs them):
//!
//! * **Queue entries.** A waiter queues with the token `T` it will hold. Each node keeps
//!   the entries it has (token and owner). A *first join* of `T` adds it unless it is
//!   queued already or the key holds `T`; a *renewal* never adds (it answers `gone`, and
//!   whether the key holds `T`). The waiter sends one first join per (token, node), ever;
//!   so a token is queued at most once per node.
//! * **Confirmation times.** Per node the waiter keeps `s_i` as an age: the send time of the
//!   latest queue request whose reply said "still queued", before that the send time of the
//!   first join. A request carries its age; its reply is read when the node runs it (or
//!   lost, within the loss budget).
//! * **Release with transfer** (every release, on every node, atomic): drop the releaser's
//!   own entry; if the key holds the releaser's token, pop an entry and set the key to its
//!   token with the TTL, and put an announcement on the node → owner channel; with no
//!   entry, delete the key. Announcements are delivered in any order, any time later, or
//!   lost (budget).
//! * **Counting.** A waiter counts node `i` when it hears `i`'s announcement of `T`, or a
//!   renewal's reply says the key on `i` holds `T`. At a quorum, `start` = the quorum-th
//!   largest `s_i` among the counted nodes; it believes it holds until
//!   `start + ttl − drift` if that is in the future, else the hand-off failed (retire).
//! * **Fallback claim.** An ordinary attempt with `T`, where a key that holds `T` counts
//!   as granted (its expiry set to the TTL). Announcements during it are noted, not acted
//!   upon. Granted: it holds from the claim's start. Failed: retire.
//! * **Retiring** `T` (a failed claim or hand-off, or a renewal answered `gone` from a node
//!   not counted): release `T` on every node, never count `T` again, and re-join with a
//!   fresh token (within the budget) or leave. An announcement of a token the client does
//!   not wait with (retired, or a lock already released) is passed on: a release of that
//!   token to that node.
//! * **Faults** as in the lock model: delays and reordering across connections, lost
//!   requests and replies, crashes with persistence or restarts empty after the TTL, fast
//!   node clocks, pauses. A queue entry may also lapse at any time (its lease ran out: the
//!   waiter may pause for any time), within a budget.
//!
//! Abstractions: the queue order (tickets) is not modelled; a transfer may go to **any**
//! queued entry, which covers the common order and every other. Replies to acquires are
//! read when the node runs the request. Extensions, fencing, name-only entries and the
//! multi-resource path are not modelled here. Every acquisition (ordinary, claim or
//! hand-off) is believed until `start + ttl − drift` (the most the design claims; the
//! library's `start + validity` is shorter).
//!
//! Reductions (exact): nodes are interchangeable, so each state is replaced by the least of
//! its node renamings; a release that can no longer change its node (the key does not hold
//! its token, the token is not queued there and no request ahead of it can change that) is
//! dropped, and so is an announcement whose only effect would be such a release.

use std::fmt;

use stateright::{Model, Property};

use super::{Key, MAJORITY, N, Protocol, Vote};

/// Clients in the hand-off model.
pub const C: usize = 2;
/// Queue entries one node can hold at once.
const QMAX: usize = 4;
/// Requests one connection can hold at once.
const WIRE: usize = 8;

/// The hand-off's budgets and mutations (the defaults are the design).
#[derive(Clone, Copy, Debug)]
pub struct Handoff {
    /// Tokens each client may queue with (its first join, then a re-join per retired
    /// token).
    pub joins: u8,
    /// Fallback claims per client.
    pub claims: u8,
    /// Renewals (and late first joins) per client.
    pub renewals: u8,
    /// Queue entries that lapse over the whole run.
    pub lapses: u8,
    /// Both clients may queue, claim and renew (`false`: client 0 only makes ordinary
    /// attempts, client 1 only waits).
    pub both_wait: bool,
    /// Mutation: a retired token stays in use; the waiter keeps counting its announcements
    /// (and what it noted during the claim) after its clean-up.
    pub count_retired: bool,
    /// Mutation: `s_i` is the send time of the latest request to node `i`, not the latest
    /// one confirmed "still queued".
    pub s_from_latest_sent: bool,
    /// Mutation: a renewal of a token that is gone adds it again.
    pub readd_gone: bool,
}

impl Handoff {
    /// The design: one token, one claim, one renewal per client; no lapse.
    pub fn design() -> Handoff {
        Handoff {
            joins: 1,
            claims: 1,
            renewals: 1,
            lapses: 0,
            both_wait: false,
            count_retired: false,
            s_from_latest_sent: false,
            readd_gone: false,
        }
    }
}

/// A queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    /// The waiter's token.
    pub tok: u8,
    /// The waiter.
    pub client: u8,
}

/// One node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// Its clock runs fast.
    pub fast: bool,
    /// Ticks until it restarts empty (0: it runs).
    pub down: u8,
    /// The lock key.
    pub key: Option<Key>,
    /// The queue entries, sorted.
    pub queue: [Option<Entry>; QMAX],
}

impl Node {
    fn queued(&self, tok: u8) -> bool {
        self.queue.iter().flatten().any(|e| e.tok == tok)
    }

    fn holds(&self, tok: u8) -> bool {
        matches!(self.key, Some(k) if k.tok == tok)
    }

    fn dequeue(&mut self, tok: u8) {
        let mut kept = [None; QMAX];
        for (slot, e) in kept
            .iter_mut()
            .zip(self.queue.iter().flatten().filter(|e| e.tok != tok))
        {
            *slot = Some(*e);
        }
        self.queue = kept;
    }

    fn enqueue(&mut self, e: Entry) {
        let Some(slot) = self.queue.iter_mut().find(|s| s.is_none()) else {
            panic!("a node queues more than {QMAX} entries: raise QMAX");
        };
        *slot = Some(e);
        self.queue
            .sort_by_key(|e| e.map_or((u8::MAX, 0), |e| (e.tok, e.client)));
    }
}

/// A request on a client → node connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// The acquire script (a claim's: a key holding the token counts as granted).
    Set {
        /// The token.
        tok: u8,
    },
    /// The release script, with transfer.
    Release {
        /// The token.
        tok: u8,
    },
    /// A queue request: a first join or a renewal.
    Join {
        /// The waiter's token.
        tok: u8,
        /// A first join (may add), or a renewal (never adds).
        first: bool,
        /// Ticks since it was sent (clamped at `ttl − drift`).
        age: u8,
    },
}

impl Req {
    fn tok(self) -> u8 {
        match self {
            Req::Set { tok } | Req::Release { tok } | Req::Join { tok, .. } => tok,
        }
    }
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not holding, not trying, not queued.
    Idle,
    /// Queued with its token, counting transfers.
    Waiting,
    /// An attempt: ordinary, or the waiter's fallback claim (`claim`).
    Attempt {
        /// Ticks since it started (clamped at `ttl − drift`).
        age: u8,
        /// The waiter's fallback claim with its queue token.
        claim: bool,
        /// The nodes' answers.
        votes: [Vote; N],
    },
    /// Believes it holds for `deadline` more ticks (0: expired).
    Held {
        /// Ticks left.
        deadline: u8,
    },
}

/// A waiter's view of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seen {
    /// `s_i` as an age (`None`: no join sent to this node yet).
    pub s: Option<u8>,
    /// A transfer to the token on this node was heard (or noted during a claim).
    pub counted: bool,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// Where it is.
    pub phase: Phase,
    /// Its token (attempt, queue or lock; 0: none).
    pub tok: u8,
    /// The waiter's view of each node (default unless waiting or claiming).
    pub seen: [Seen; N],
    /// Ordinary attempts left.
    pub attempts_left: u8,
    /// Queue tokens left.
    pub joins_left: u8,
    /// Claims left.
    pub claims_left: u8,
    /// Renewals left.
    pub renewals_left: u8,
}

/// Witness bits.
const HELD_BY_TRANSFER: u8 = 1;
const CLAIMED_A_TRANSFER: u8 = 2;
const RETIRED: u8 = 4;
const BOTH_HELD: u8 = 8;

/// The whole system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// The clients.
    pub clients: [Client; C],
    /// The nodes.
    pub nodes: [Node; N],
    /// Client → node connections, `wires[client][node]`, FIFO.
    pub wires: [[[Option<Req>; WIRE]; N]; C],
    /// Node → client announcements in flight, `ann[client][node]`, a bit per token.
    pub ann: [[u32; N]; C],
    /// Which client held at least once (bits), and the witness bits.
    pub seen: u8,
    /// Crashes left.
    pub crashes_left: u8,
    /// Lost messages left.
    pub losses_left: u8,
    /// Lapses left.
    pub lapses_left: u8,
}

/// Everything that can happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes by one tick.
    Tick,
    /// An ordinary attempt with a fresh token.
    Acquire(usize),
    /// An idle client queues with a fresh token (first joins to every node).
    Join(usize),
    /// A waiter renews on a node (a first join if it never reached it).
    Renew(usize, usize),
    /// A waiter's fallback claim.
    Claim(usize),
    /// An attempt stops waiting for the nodes that have not answered.
    GiveUp(usize),
    /// A holder releases (with transfer) on every node.
    Release(usize),
    /// A node runs the oldest request on a connection; a release that transfers gives the
    /// key to the `pick`-th entry; `reply_lost`: a queue request's reply never arrives.
    Deliver {
        /// The client.
        client: usize,
        /// The node.
        node: usize,
        /// Which entry a transfer pops.
        pick: usize,
        /// The reply is lost.
        reply_lost: bool,
    },
    /// The oldest request on a connection is lost.
    Lose(usize, usize),
    /// The client hears node's announcement of a token.
    Hear {
        /// The client.
        client: usize,
        /// The node.
        node: usize,
        /// The token.
        tok: u8,
    },
    /// An announcement is lost.
    LoseAnnouncement {
        /// The client.
        client: usize,
        /// The node.
        node: usize,
        /// The token.
        tok: u8,
    },
    /// A queue entry lapses.
    Lapse {
        /// The node.
        node: usize,
        /// The entry's token.
        tok: u8,
    },
    /// A node crashes (see the lock model).
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

/// The hand-off model: the lock protocol's constants and fault budgets from a
/// [`Protocol`] whose `handoff` is set.
pub struct HandoffModel {
    p: Protocol,
    h: Handoff,
}

/// Whether client `c` believes it holds the lock.
pub fn believes(s: &State, c: usize) -> bool {
    matches!(s.clients[c].phase, Phase::Held { deadline } if deadline > 0)
}

/// Safety: at most one client believes it holds.
pub fn mutual_exclusion(s: &State) -> bool {
    (0..C).filter(|&c| believes(s, c)).count() <= 1
}

/// Safety: a believer's token is on a majority of nodes for at least its remaining time.
pub fn remaining_backed(s: &State) -> bool {
    (0..C).all(|c| match s.clients[c].phase {
        Phase::Held { deadline } if deadline > 0 => {
            let tok = s.clients[c].tok;
            s.nodes
                .iter()
                .filter(|n| matches!(n.key, Some(k) if k.tok == tok && k.left >= deadline))
                .count()
                >= MAJORITY
        }
        _ => true,
    })
}

/// A one-line account of a state for counterexamples.
pub fn describe(s: &State) -> String {
    let mut out = String::new();
    for (c, cl) in s.clients.iter().enumerate() {
        out += &format!("client {c} [tok {}]: {:?}", cl.tok, cl.phase);
        if !matches!(cl.phase, Phase::Idle | Phase::Held { .. }) {
            out += &format!(" seen {:?}", cl.seen.map(|x| (x.s, x.counted)));
        }
        out += "; ";
    }
    for (n, node) in s.nodes.iter().enumerate() {
        let key = node.key.map_or("no key".to_string(), |k| {
            format!("key tok {} for {}", k.tok, k.left)
        });
        let queue: Vec<u8> = node.queue.iter().flatten().map(|e| e.tok).collect();
        out += &format!("node {n}: {key}, queue {queue:?}, down {}; ", node.down);
    }
    for c in 0..C {
        for n in 0..N {
            let wire: Vec<Req> = s.wires[c][n].iter().flatten().copied().collect();
            if !wire.is_empty() {
                out += &format!("{c}->{n}: {wire:?}; ");
            }
            if s.ann[c][n] != 0 {
                out += &format!("announced {n}->{c}: {:b}; ", s.ann[c][n]);
            }
        }
    }
    out
}

fn push(wire: &mut [Option<Req>; WIRE], req: Req) {
    let Some(slot) = wire.iter_mut().find(|r| r.is_none()) else {
        panic!("a connection holds more than {WIRE} requests: raise WIRE");
    };
    *slot = Some(req);
}

fn pop(wire: &mut [Option<Req>; WIRE]) -> Option<Req> {
    let head = wire[0];
    wire.copy_within(1.., 0);
    wire[WIRE - 1] = None;
    head
}

/// What a queue request's reply says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JoinReply {
    Queued,
    Gone { holds: bool },
}

impl HandoffModel {
    /// The model of `p` (whose `handoff` must be set).
    pub fn new(p: Protocol) -> HandoffModel {
        let Some(h) = p.handoff else {
            panic!("the hand-off model needs Protocol::handoff");
        };
        assert!(
            p.ttl > p.drift,
            "a TTL within the drift allowance is refused"
        );
        assert!(!p.fencing, "fencing is not modelled with the hand-off");
        HandoffModel { p, h }
    }

    fn window(&self) -> u8 {
        self.p.ttl.saturating_sub(self.p.drift)
    }

    fn key_ttl(&self, node: &Node) -> u8 {
        self.p
            .ttl
            .saturating_sub(if node.fast { self.p.fast } else { 0 })
    }

    fn send(s: &mut State, c: usize, n: usize, req: Req) -> bool {
        if s.nodes[n].down > 0 {
            return false;
        }
        push(&mut s.wires[c][n], req);
        true
    }

    /// The smallest token nothing refers to.
    fn fresh_token(s: &State) -> u8 {
        let mut used = 1u32;
        for cl in &s.clients {
            used |= 1 << cl.tok;
        }
        for node in &s.nodes {
            if let Some(k) = node.key {
                used |= 1 << k.tok;
            }
            for e in node.queue.iter().flatten() {
                used |= 1 << e.tok;
            }
        }
        for wire in s.wires.iter().flatten() {
            for r in wire.iter().flatten() {
                used |= 1 << r.tok();
            }
        }
        for a in s.ann.iter().flatten() {
            used |= a;
        }
        (!used).trailing_zeros() as u8
    }

    /// Client `c` queues with a fresh token: a first join to every node that is up.
    fn join(&self, s: &mut State, c: usize) {
        let tok = Self::fresh_token(s);
        let cl = &mut s.clients[c];
        cl.joins_left -= 1;
        cl.tok = tok;
        cl.phase = Phase::Waiting;
        let mut seen = [Seen::default(); N];
        for (n, x) in seen.iter_mut().enumerate() {
            let req = Req::Join {
                tok,
                first: true,
                age: 0,
            };
            if Self::send(s, c, n, req) {
                x.s = Some(0);
            }
        }
        s.clients[c].seen = seen;
    }

    /// Client `c` retires its queue token: a release of it to every node, then a re-join
    /// with a fresh token, or idle.
    fn retire(&self, s: &mut State, c: usize) {
        let tok = s.clients[c].tok;
        for n in 0..N {
            Self::send(s, c, n, Req::Release { tok });
        }
        s.seen |= RETIRED;
        if self.h.count_retired {
            // The mutation: the token stays in use, with what was counted and noted.
            s.clients[c].phase = Phase::Waiting;
            return;
        }
        s.clients[c].seen = [Seen::default(); N];
        if s.clients[c].joins_left > 0 {
            self.join(s, c);
        } else {
            s.clients[c].phase = Phase::Idle;
            s.clients[c].tok = 0;
        }
    }

    /// Client `c` now holds, believed for `deadline` ticks.
    fn hold(s: &mut State, c: usize, deadline: u8) {
        let cl = &mut s.clients[c];
        cl.phase = Phase::Held { deadline };
        cl.seen = [Seen::default(); N];
        s.seen |= 1 << (4 + c);
        if s.seen & (3 << 4) == 3 << 4 {
            s.seen |= BOTH_HELD;
        }
    }

    /// A waiter decides on its counted transfers.
    fn count(&self, s: &mut State, c: usize) {
        let cl = &s.clients[c];
        if cl.phase != Phase::Waiting {
            return;
        }
        let counted = cl.seen.iter().filter(|x| x.counted).count();
        if counted < self.p.quorum {
            return;
        }
        let mut ages: Vec<u8> = cl
            .seen
            .iter()
            .filter(|x| x.counted)
            .map(|x| x.s.unwrap_or(u8::MAX))
            .collect();
        ages.sort_unstable();
        // The quorum-th largest s_i is the quorum-th smallest age.
        let age = ages[self.p.quorum - 1];
        if age < self.window() {
            Self::hold(s, c, self.window() - age);
            s.seen |= HELD_BY_TRANSFER;
        } else {
            self.retire(s, c);
        }
    }

    /// Client `c` sends an attempt (`claim`: a fallback claim) with token `tok` to every
    /// node and decides at once if the outcome is already certain.
    fn attempt(&self, s: &mut State, c: usize, tok: u8, claim: bool) {
        let votes = std::array::from_fn(|n| {
            if Self::send(s, c, n, Req::Set { tok }) {
                Vote::Pending
            } else {
                Vote::Failed
            }
        });
        s.clients[c].phase = Phase::Attempt {
            age: 0,
            claim,
            votes,
        };
        self.decide(s, c);
    }

    /// An attempt decides what it can.
    fn decide(&self, s: &mut State, c: usize) {
        let Phase::Attempt { age, claim, votes } = s.clients[c].phase else {
            return;
        };
        let granted = votes.iter().filter(|v| **v == Vote::Granted).count();
        let pending = votes.iter().filter(|v| **v == Vote::Pending).count();
        if granted >= self.p.quorum && age < self.window() {
            Self::hold(s, c, self.window() - age);
        } else if granted >= self.p.quorum || granted + pending < self.p.quorum {
            if claim {
                self.retire(s, c);
            } else {
                let tok = s.clients[c].tok;
                for n in 0..N {
                    Self::send(s, c, n, Req::Release { tok });
                }
                s.clients[c].phase = Phase::Idle;
                s.clients[c].tok = 0;
            }
        }
    }

    /// Node `n` runs `req` from client `c`.
    fn run(&self, s: &mut State, c: usize, n: usize, req: Req, pick: usize, reply_lost: bool) {
        let ttl = self.key_ttl(&s.nodes[n]);
        let node = &mut s.nodes[n];
        match req {
            Req::Set { tok } => {
                let transferred = node.holds(tok);
                let granted = match node.key {
                    None => true,
                    Some(k) => k.tok == tok,
                };
                if granted {
                    node.key = (ttl > 0).then_some(Key { tok, left: ttl });
                }
                let cl = &mut s.clients[c];
                if cl.tok != tok {
                    return;
                }
                if let Phase::Attempt { votes, claim, .. } = &mut cl.phase
                    && votes[n] == Vote::Pending
                {
                    votes[n] = if granted {
                        Vote::Granted
                    } else {
                        Vote::Refused
                    };
                    if transferred && *claim {
                        s.seen |= CLAIMED_A_TRANSFER;
                    }
                    self.decide(s, c);
                }
            }
            Req::Release { tok } => {
                node.dequeue(tok);
                if !node.holds(tok) {
                    return;
                }
                match node.queue.iter().flatten().nth(pick).copied() {
                    Some(w) => {
                        node.dequeue(w.tok);
                        node.key = (ttl > 0).then_some(Key {
                            tok: w.tok,
                            left: ttl,
                        });
                        s.ann[usize::from(w.client)][n] |= 1 << w.tok;
                    }
                    None => node.key = None,
                }
            }
            Req::Join { tok, first, age } => {
                let reply = if node.queued(tok) {
                    JoinReply::Queued
                } else if node.holds(tok) {
                    JoinReply::Gone { holds: true }
                } else if first || self.h.readd_gone {
                    node.enqueue(Entry {
                        tok,
                        client: c as u8,
                    });
                    JoinReply::Queued
                } else {
                    JoinReply::Gone { holds: false }
                };
                let cl = &mut s.clients[c];
                if reply_lost || cl.tok != tok {
                    return;
                }
                let claiming = matches!(cl.phase, Phase::Attempt { claim: true, .. });
                if cl.phase != Phase::Waiting && !claiming {
                    return;
                }
                match reply {
                    JoinReply::Queued => {
                        if !self.h.s_from_latest_sent {
                            cl.seen[n].s = Some(age);
                        }
                    }
                    JoinReply::Gone { holds: true } => {
                        cl.seen[n].counted = true;
                        self.count(s, c);
                    }
                    JoinReply::Gone { holds: false } => {
                        if !claiming && !cl.seen[n].counted {
                            self.retire(s, c);
                        }
                    }
                }
            }
        }
    }

    /// Client `c` hears node `n`'s announcement of `tok`.
    fn hear(&self, s: &mut State, c: usize, n: usize, tok: u8) {
        let cl = &mut s.clients[c];
        let waiting = matches!(
            cl.phase,
            Phase::Waiting | Phase::Attempt { claim: true, .. }
        );
        if cl.tok == tok && waiting {
            cl.seen[n].counted = true;
            self.count(s, c);
        } else if cl.tok == tok && matches!(cl.phase, Phase::Held { .. }) {
            // It holds with this token already.
        } else {
            // A retired token, or a lock already released: pass the transfer on.
            Self::send(s, c, n, Req::Release { tok });
        }
    }

    fn tick(&self, s: &mut State) {
        let window = self.window();
        let age = |a: &mut u8| *a = (*a + 1).min(window);
        for node in &mut s.nodes {
            if let Some(k) = &mut node.key {
                k.left -= 1;
                if k.left == 0 {
                    node.key = None;
                }
            }
            if node.down > 0 {
                node.down -= 1;
                if node.down == 0 {
                    node.key = None;
                    node.queue = [None; QMAX];
                }
            }
        }
        for cl in &mut s.clients {
            match &mut cl.phase {
                Phase::Attempt { age: a, .. } => age(a),
                Phase::Held { deadline } => *deadline = deadline.saturating_sub(1),
                Phase::Idle | Phase::Waiting => {}
            }
            for x in &mut cl.seen {
                if let Some(a) = &mut x.s {
                    age(a);
                }
            }
        }
        for wire in s.wires.iter_mut().flatten() {
            for r in wire.iter_mut().flatten() {
                if let Req::Join { age: a, .. } = r {
                    age(a);
                }
            }
        }
    }

    /// Drops what can no longer change anything (an exact reduction).
    fn normalize(&self, s: &mut State) {
        for c in 0..C {
            for n in 0..N {
                let node = s.nodes[n];
                let cl = s.clients[c];
                let wire = &mut s.wires[c][n];
                let mut ahead = 0u32; // tokens with a `Set` or first join ahead
                let mut kept = [None; WIRE];
                let mut k = 0;
                for r in wire.iter().flatten().copied() {
                    let tok = r.tok();
                    let keep = match r {
                        Req::Set { .. } => {
                            ahead |= 1 << tok;
                            true
                        }
                        Req::Join { first, .. } => {
                            if first || self.h.readd_gone {
                                ahead |= 1 << tok;
                            }
                            first || self.h.readd_gone || cl.tok == tok
                        }
                        Req::Release { .. } => {
                            node.holds(tok) || node.queued(tok) || ahead & (1 << tok) != 0
                        }
                    };
                    if keep {
                        kept[k] = Some(r);
                        k += 1;
                    }
                }
                *wire = kept;
                // An announcement whose only effect is a useless release.
                let mut bits = s.ann[c][n];
                while bits != 0 {
                    let tok = bits.trailing_zeros() as u8;
                    bits &= bits - 1;
                    let current = cl.tok == tok
                        && matches!(
                            cl.phase,
                            Phase::Waiting | Phase::Attempt { claim: true, .. }
                        );
                    let held = cl.tok == tok && matches!(cl.phase, Phase::Held { .. });
                    let pending = s.wires[c][n].iter().flatten().any(|r| r.tok() == tok);
                    if held || (!current && !node.holds(tok) && !node.queued(tok) && !pending) {
                        s.ann[c][n] &= !(1 << tok);
                    }
                }
            }
        }
    }

    /// The least renaming of the nodes.
    fn canonical(s: State) -> State {
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
            .map(|&perm| rename_tokens(permute(&s, perm)))
            .min()
            .unwrap_or(s)
    }
}

/// `s` with node `perm[i]` renamed `i`.
pub fn permute(s: &State, perm: [usize; N]) -> State {
    let mut t = *s;
    for i in 0..N {
        t.nodes[i] = s.nodes[perm[i]];
        for c in 0..C {
            t.wires[c][i] = s.wires[c][perm[i]];
            t.ann[c][i] = s.ann[c][perm[i]];
            t.clients[c].seen[i] = s.clients[c].seen[perm[i]];
            if let (Phase::Attempt { votes: to, .. }, Phase::Attempt { votes: from, .. }) =
                (&mut t.clients[c].phase, &s.clients[c].phase)
            {
                to[i] = from[perm[i]];
            }
        }
    }
    t
}

/// `s` with its tokens renamed 1, 2, ... in the order they first appear (clients, then
/// each node's key and queue, then the connections, then the announcements). Only
/// equality of tokens matters, so this merges states that behave alike.
fn rename_tokens(mut s: State) -> State {
    let mut map = [0u8; 32];
    let mut next = 1u8;
    let mut see = |t: u8| {
        if t != 0 && map[usize::from(t)] == 0 {
            map[usize::from(t)] = next;
            next += 1;
        }
    };
    for cl in &s.clients {
        see(cl.tok);
    }
    for node in &s.nodes {
        if let Some(k) = node.key {
            see(k.tok);
        }
        for e in node.queue.iter().flatten() {
            see(e.tok);
        }
    }
    for wire in s.wires.iter().flatten() {
        for r in wire.iter().flatten() {
            see(r.tok());
        }
    }
    for a in s.ann.iter().flatten() {
        let mut bits = *a;
        while bits != 0 {
            see(bits.trailing_zeros() as u8);
            bits &= bits - 1;
        }
    }
    let r = |t: &mut u8| *t = map[usize::from(*t)];
    for cl in &mut s.clients {
        r(&mut cl.tok);
    }
    for node in &mut s.nodes {
        if let Some(k) = &mut node.key {
            r(&mut k.tok);
        }
        for e in node.queue.iter_mut().flatten() {
            r(&mut e.tok);
        }
        node.queue
            .sort_by_key(|e| e.map_or((u8::MAX, 0), |e| (e.tok, e.client)));
    }
    for wire in s.wires.iter_mut().flatten() {
        for req in wire.iter_mut().flatten() {
            match req {
                Req::Set { tok } | Req::Release { tok } | Req::Join { tok, .. } => r(tok),
            }
        }
    }
    for a in s.ann.iter_mut().flatten() {
        let mut bits = *a;
        let mut renamed = 0u32;
        while bits != 0 {
            renamed |= 1 << map[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        *a = renamed;
    }
    s
}

impl Model for HandoffModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let (p, h) = (&self.p, &self.h);
        p.fast_nodes
            .iter()
            .map(|&k| State {
                clients: std::array::from_fn(|c| {
                    let waits = h.both_wait || c == 1;
                    let waiter = |budget: u8| if waits { budget } else { 0 };
                    Client {
                        phase: Phase::Idle,
                        tok: 0,
                        seen: [Seen::default(); N],
                        attempts_left: if h.both_wait || c == 0 { p.attempts } else { 0 },
                        joins_left: waiter(h.joins),
                        claims_left: waiter(h.claims),
                        renewals_left: waiter(h.renewals),
                    }
                }),
                nodes: std::array::from_fn(|n| Node {
                    fast: n < k && p.fast > 0,
                    down: 0,
                    key: None,
                    queue: [None; QMAX],
                }),
                wires: [[[None; WIRE]; N]; C],
                ann: [[0; N]; C],
                seen: 0,
                crashes_left: p.crashes,
                losses_left: p.losses,
                lapses_left: h.lapses,
            })
            .map(Self::canonical)
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        for c in 0..C {
            let cl = &s.clients[c];
            match cl.phase {
                Phase::Idle => {
                    if cl.attempts_left > 0 {
                        actions.push(Action::Acquire(c));
                    }
                    if cl.joins_left > 0 {
                        actions.push(Action::Join(c));
                    }
                }
                Phase::Waiting => {
                    if cl.claims_left > 0 {
                        actions.push(Action::Claim(c));
                    }
                    if cl.renewals_left > 0 {
                        for n in 0..N {
                            if s.nodes[n].down == 0 {
                                actions.push(Action::Renew(c, n));
                            }
                        }
                    }
                }
                Phase::Attempt { votes, .. } => {
                    if votes.contains(&Vote::Pending) {
                        actions.push(Action::GiveUp(c));
                    }
                }
                Phase::Held { .. } => actions.push(Action::Release(c)),
            }
            for n in 0..N {
                if let Some(head) = s.wires[c][n][0] {
                    if s.nodes[n].down == 0 {
                        let node = &s.nodes[n];
                        let picks = match head {
                            Req::Release { tok } if node.holds(tok) => node
                                .queue
                                .iter()
                                .flatten()
                                .filter(|e| e.tok != tok)
                                .count()
                                .max(1),
                            _ => 1,
                        };
                        for pick in 0..picks {
                            actions.push(Action::Deliver {
                                client: c,
                                node: n,
                                pick,
                                reply_lost: false,
                            });
                        }
                        if matches!(head, Req::Join { .. }) && s.losses_left > 0 {
                            actions.push(Action::Deliver {
                                client: c,
                                node: n,
                                pick: 0,
                                reply_lost: true,
                            });
                        }
                    }
                    if s.losses_left > 0 {
                        actions.push(Action::Lose(c, n));
                    }
                }
                let mut bits = s.ann[c][n];
                while bits != 0 {
                    let tok = bits.trailing_zeros() as u8;
                    bits &= bits - 1;
                    actions.push(Action::Hear {
                        client: c,
                        node: n,
                        tok,
                    });
                    if s.losses_left > 0 {
                        actions.push(Action::LoseAnnouncement {
                            client: c,
                            node: n,
                            tok,
                        });
                    }
                }
            }
        }
        for n in 0..N {
            if s.lapses_left > 0 {
                for e in s.nodes[n].queue.iter().flatten() {
                    actions.push(Action::Lapse {
                        node: n,
                        tok: e.tok,
                    });
                }
            }
            if s.crashes_left > 0 && s.nodes[n].down == 0 {
                for &persisted in self.p.crash_kinds {
                    actions.push(Action::Crash { node: n, persisted });
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = *last;
        match action {
            Action::Tick => self.tick(&mut s),
            Action::Acquire(c) => {
                let tok = Self::fresh_token(&s);
                let cl = &mut s.clients[c];
                cl.attempts_left -= 1;
                cl.tok = tok;
                self.attempt(&mut s, c, tok, false);
            }
            Action::Join(c) => self.join(&mut s, c),
            Action::Renew(c, n) => {
                let cl = &mut s.clients[c];
                cl.renewals_left -= 1;
                let first = cl.seen[n].s.is_none();
                let tok = cl.tok;
                if Self::send(&mut s, c, n, Req::Join { tok, first, age: 0 })
                    && (first || self.h.s_from_latest_sent)
                {
                    s.clients[c].seen[n].s = Some(0);
                }
            }
            Action::Claim(c) => {
                let tok = s.clients[c].tok;
                s.clients[c].claims_left -= 1;
                self.attempt(&mut s, c, tok, true);
            }
            Action::GiveUp(c) => {
                if let Phase::Attempt { votes, .. } = &mut s.clients[c].phase {
                    for v in votes.iter_mut().filter(|v| **v == Vote::Pending) {
                        *v = Vote::Failed;
                    }
                }
                self.decide(&mut s, c);
            }
            Action::Release(c) => {
                let tok = s.clients[c].tok;
                for n in 0..N {
                    Self::send(&mut s, c, n, Req::Release { tok });
                }
                s.clients[c].phase = Phase::Idle;
                s.clients[c].tok = 0;
            }
            Action::Deliver {
                client,
                node,
                pick,
                reply_lost,
            } => {
                let req = pop(&mut s.wires[client][node])?;
                if reply_lost {
                    s.losses_left -= 1;
                }
                self.run(&mut s, client, node, req, pick, reply_lost);
            }
            Action::Lose(c, n) => {
                pop(&mut s.wires[c][n])?;
                s.losses_left -= 1;
            }
            Action::Hear { client, node, tok } => {
                s.ann[client][node] &= !(1 << tok);
                self.hear(&mut s, client, node, tok);
            }
            Action::LoseAnnouncement { client, node, tok } => {
                s.ann[client][node] &= !(1 << tok);
                s.losses_left -= 1;
            }
            Action::Lapse { node, tok } => {
                s.nodes[node].dequeue(tok);
                s.lapses_left -= 1;
            }
            Action::Crash { node, persisted } => {
                s.crashes_left -= 1;
                for c in 0..C {
                    s.wires[c][node] = [None; WIRE];
                }
                if !persisted {
                    let n = &mut s.nodes[node];
                    if self.p.restart_delay == 0 {
                        n.key = None;
                        n.queue = [None; QMAX];
                    } else {
                        n.down = self.p.restart_delay;
                    }
                }
            }
        }
        self.normalize(&mut s);
        Some(Self::canonical(s))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::always(super::MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
            Property::always(super::REMAINING_BACKED, |_, s: &State| remaining_backed(s)),
            Property::sometimes("a waiter holds by counted transfers", |_, s: &State| {
                s.seen & HELD_BY_TRANSFER != 0
            }),
            Property::sometimes("both clients hold in turn", |_, s: &State| {
                s.seen & BOTH_HELD != 0
            }),
        ];
        if self.h.claims > 0 {
            props.push(Property::sometimes(
                "a claim is granted by a transferred key",
                |_, s: &State| s.seen & CLAIMED_A_TRANSFER != 0,
            ));
            props.push(Property::sometimes(
                "a waiter retires a token",
                |_, s: &State| s.seen & RETIRED != 0,
            ));
        }
        props
    }
}
