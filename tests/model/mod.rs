//! An abstract, discrete-time model of quorumlock's protocol for exhaustive model checking.
//!
//! Three nodes, two clients, one resource. Everything a client and a node do is an atomic
//! step; time passes only through a global `Tick`. What the model keeps from the real
//! protocol, and what it abstracts, is written on each item below.
//!
//! * **Acquire** (`SET NX PX`, fenced: raise the counter to `max(counter + 1, clock)`),
//!   sent to every node, decided at the quorum; held iff `ttl − elapsed − drift > 0`; the
//!   believed hold is `[decision, start + ttl − elapsed − drift)`.
//! * **Fencing commit**: sent to every node that did not refuse; raises the counter to
//!   `max(counter, t)` only where our key still holds our token; `t` is usable once a quorum
//!   confirms.
//! * **Clean-up**: a failed attempt releases on every node that did not refuse, behind the
//!   `SET` on the same connection.
//! * **Extend**: compare-and-`PEXPIRE … GT`; the deadline moves to `max(old, new)` on a
//!   quorum, to "now" when more than `N − Q` nodes refuse.
//! * **Release**: compare-and-delete on every node.
//! * **Network**: one FIFO queue per (client, node) and direction; a message is delivered,
//!   delayed (left in its queue across ticks and behind other connections' messages) or
//!   lost (bounded budget). A client may give up waiting on any node at any time (the
//!   per-node timeout, at its most pessimistic).
//! * **Nodes**: crash (bounded budget) keeps the node's data frozen; a restart either finds
//!   it (persistence) or comes back empty, which the deployment contract allows only after
//!   the node has been down for at least the TTL (a "delayed restart").
//! * **Clocks**: a node's clock may run fast, so a key set at tick `t` with TTL `ttl` may
//!   expire at `t + ttl − fast`; a node's wall clock (the fencing floor) reads `tick +
//!   offset`. The client's allowance `drift` must cover `fast` (the contract).
//! * **Pauses**: a client is never forced to act, so any client may sit still while ticks
//!   pass (a GC pause), holding a belief computed earlier.

use std::fmt;

use stateright::{Model, Property};

/// Nodes in the model.
pub const N: usize = 3;
/// Clients in the model.
pub const C: usize = 2;
/// A strict majority of `N`: what any two quorums must share a node for.
pub const MAJORITY: usize = N / 2 + 1;

/// The model's parameters: the protocol's constants, the fault budgets and the known-unsafe
/// variants (each `false`/default is the real protocol and the contract).
#[derive(Clone, Debug)]
pub struct Protocol {
    /// Quorum the clients count to (the real protocol: `MAJORITY`).
    pub quorum: usize,
    /// The lock's TTL in ticks (also every acquisition's TTL).
    pub ttl: u8,
    /// The client's drift allowance in ticks (`ttl × drift_factor + 2 ms`).
    pub drift: u8,
    /// How many ticks early a node with a fast clock can expire a key.
    pub fast: u8,
    /// Each node's wall-clock offset in ticks (the fencing floor reads `tick + offset`).
    pub offset: [u8; N],
    /// The last tick (the horizon of the exploration).
    pub max_tick: u8,
    /// Replies travel separately (delayed, read in any order) when `true`; when `false` the
    /// client reads a node's answer in the same step the node runs the request (requests
    /// are still delayed, reordered across connections and lost).
    pub reply_delay: bool,
    /// How many nodes have a fast clock (one initial state per entry; by the nodes'
    /// symmetry, the first k are fast).
    pub fast_nodes: &'static [usize],
    /// Acquisition attempts per client.
    pub attempts: u8,
    /// Extensions per held lock (each with any TTL in `extend_ttls`).
    pub extends: u8,
    /// The TTLs an extension may ask for.
    pub extend_ttls: &'static [u8],
    /// Node crashes over the whole run.
    pub crashes: u8,
    /// Lost messages over the whole run.
    pub losses: u8,
    /// Fencing tokens on (two rounds) or off (one round).
    pub fencing: bool,
    /// Ticks a node without persistence must stay down before it restarts empty (the
    /// contract: at least the TTL; 0 is the unsafe immediate restart).
    pub restart_delay: u8,
    /// The extend script uses `PEXPIRE … GT` (the real one); `false`: plain `PEXPIRE`,
    /// which can shorten an expiry while the client keeps its deadline.
    pub extend_gt: bool,
    /// The release script compares the token before deleting (the real one).
    pub release_checks_token: bool,
}

impl Protocol {
    /// The real protocol, inside the deployment contract, at the sizes the CI run checks.
    pub fn in_contract() -> Protocol {
        Protocol {
            quorum: MAJORITY,
            ttl: 2,
            drift: 1,
            fast: 1,
            offset: [1, 0, 0],
            fast_nodes: &[N],
            reply_delay: false,
            max_tick: 2,
            attempts: 1,
            extends: 0,
            extend_ttls: &[1, 2],
            crashes: 0,
            losses: 0,
            fencing: true,
            restart_delay: 2,
            extend_gt: true,
            release_checks_token: true,
        }
    }
}

/// A lock key on a node: whose token, and the tick at which it expires (held while
/// `tick < exp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The owner's token (unique per attempt).
    pub tok: u8,
    /// The tick the key expires at.
    pub exp: u8,
}

/// A crashed node: since when, and whether it kept its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Down {
    since: u8,
    persisted: bool,
}

/// One node's data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// The lock key, if any.
    pub key: Option<Key>,
    /// The fence counter (never expires).
    pub counter: u8,
    /// Whether its clock runs fast (keys expire `fast` ticks early).
    pub fast: bool,
    /// Its wall clock's offset (the fencing floor reads `tick + offset`).
    pub offset: u8,
    down: Option<Down>,
}

/// A node's answer for one round, as the client counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vote {
    /// Not answered yet.
    Pending,
    /// Granted; for an acquisition, with the node's new fence counter.
    Granted(u8),
    /// Refused (another owner's key, or our key is gone).
    Refused,
    /// Failed or timed out (unknown).
    Failed,
}

/// A request on a client → node connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// The acquire script.
    Set { tok: u8 },
    /// The fencing commit.
    Commit { tok: u8, t: u8 },
    /// The extend script, with its TTL and the round it belongs to.
    Extend { tok: u8, ttl: u8, seq: u8 },
    /// The release script.
    Release { tok: u8 },
}

/// A reply on a node → client connection (release replies are not modelled: nothing waits
/// for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rep {
    /// The acquire script's answer: the new counter if granted.
    Set { tok: u8, granted: Option<u8> },
    /// The commit's answer.
    Commit { tok: u8, ok: bool },
    /// The extend script's answer.
    Extend { tok: u8, seq: u8, ok: bool },
}

/// An extension in progress.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ext {
    start: u8,
    ttl: u8,
    seq: u8,
    votes: [Vote; N],
}

/// Where a client is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not holding, not trying.
    Idle,
    /// Round 1 of an acquisition.
    Acquire { start: u8, votes: [Vote; N] },
    /// Round 2 (fencing commit) of an acquisition.
    Commit {
        start: u8,
        t: u8,
        set_votes: [Vote; N],
        votes: [Vote; N],
    },
    /// Holding a `Lock` whose deadline is `deadline` (believed held while `tick < deadline`).
    Held {
        deadline: u8,
        fence: Option<u8>,
        ext: Option<Ext>,
        extends_left: u8,
    },
}

/// One client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    attempts_left: u8,
    tok: u8,
    /// The largest fencing token returned to anyone before this attempt started.
    floor: u8,
    /// Where it is.
    pub phase: Phase,
    /// Whether it ever held the lock.
    pub ever_held: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The global tick.
    pub now: u8,
    /// The nodes.
    pub nodes: [Node; N],
    /// The clients.
    pub clients: [Client; C],
    req: [[Vec<Req>; N]; C],
    rep: [[Vec<Rep>; N]; C],
    crashes_left: u8,
    losses_left: u8,
    max_returned: u8,
    /// Set when an acquisition returned a token not above one returned before it started.
    pub fence_violation: bool,
}

impl Phase {
    /// Every per-node vote array the phase holds.
    fn votes_mut(&mut self) -> Vec<&mut [Vote; N]> {
        match self {
            Phase::Idle => vec![],
            Phase::Acquire { votes, .. } => vec![votes],
            Phase::Commit {
                set_votes, votes, ..
            } => vec![set_votes, votes],
            Phase::Held { ext, .. } => ext.iter_mut().map(|e| &mut e.votes).collect(),
        }
    }
}

impl State {
    /// The representative of the state's class under renaming the nodes. Clients treat
    /// nodes alike and every per-node difference (a fast clock, a clock offset) is part of
    /// the node's state, so two states that differ only in the nodes' order behave alike;
    /// exploring one of them is enough.
    fn canonical(mut self) -> State {
        let mut clients = self.clients.clone();
        let column = |n: usize| {
            let votes: Vec<Vote> = clients
                .iter_mut()
                .flat_map(|c| c.phase.votes_mut().into_iter().map(|v| v[n]).collect::<Vec<_>>())
                .collect();
            (
                self.nodes[n].clone(),
                votes,
                self.req.iter().map(|r| r[n].clone()).collect::<Vec<_>>(),
                self.rep.iter().map(|r| r[n].clone()).collect::<Vec<_>>(),
            )
        };
        let keys: Vec<_> = (0..N).map(column).collect();
        let mut perm: [usize; N] = std::array::from_fn(|i| i);
        perm.sort_by(|a, b| keys[*a].cmp(&keys[*b]));
        if perm.iter().enumerate().all(|(i, p)| i == *p) {
            return self;
        }
        let at = |i: usize| perm[i];
        self.nodes = std::array::from_fn(|i| self.nodes[at(i)].clone());
        for c in 0..C {
            self.req[c] = std::array::from_fn(|i| self.req[c][at(i)].clone());
            self.rep[c] = std::array::from_fn(|i| self.rep[c][at(i)].clone());
            for v in self.clients[c].phase.votes_mut() {
                *v = std::array::from_fn(|i| v[at(i)]);
            }
        }
        self
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
    Deliver { client: usize, node: usize },
    /// A client reads the oldest reply on a connection.
    Reply { client: usize, node: usize },
    /// The oldest request on a connection is lost.
    LoseRequest { client: usize, node: usize },
    /// A client stops waiting for the nodes it has no answer from (timeout).
    GiveUp(usize),
    /// A holder extends with a TTL.
    Extend { client: usize, ttl: u8 },
    /// A holder releases.
    Release(usize),
    /// A node crashes, keeping its data on restart or not.
    Crash { node: usize, persisted: bool },
    /// A crashed node restarts.
    Restart(usize),
}

/// The model: a protocol variant to explore.
pub struct LockModel(pub Protocol);

fn count(votes: &[Vote; N], f: impl Fn(Vote) -> bool) -> usize {
    votes.iter().filter(|v| f(**v)).count()
}

fn granted(v: Vote) -> bool {
    matches!(v, Vote::Granted(_))
}

impl LockModel {
    fn believes(state: &State, c: usize) -> bool {
        matches!(state.clients[c].phase, Phase::Held { deadline, .. } if state.now < deadline)
    }

    /// The nodes that hold `tok` at least until `deadline` (a crashed node's frozen data
    /// counts: it comes back with it, or comes back empty only after it expired).
    fn backing(state: &State, tok: u8, deadline: u8) -> usize {
        state
            .nodes
            .iter()
            .filter(|n| matches!(n.key, Some(k) if k.tok == tok && k.exp >= deadline))
            .count()
    }

    fn send(&self, s: &mut State, c: usize, n: usize, req: Req) -> bool {
        if s.nodes[n].down.is_some() {
            return false; // connection refused
        }
        s.req[c][n].push(req);
        true
    }

    /// Sends a request to each node; the votes of nodes that are down are `Failed`.
    fn fan_out(&self, s: &mut State, c: usize, to: [bool; N], req: Req) -> [Vote; N] {
        let mut votes = [Vote::Refused; N];
        for n in 0..N {
            if to[n] {
                votes[n] = if self.send(s, c, n, req) {
                    Vote::Pending
                } else {
                    Vote::Failed
                };
            }
        }
        votes
    }

    /// Gives up an attempt: release on every node that did not refuse round 1.
    fn fail(&self, s: &mut State, c: usize, set_votes: [Vote; N]) {
        let tok = s.clients[c].tok;
        for n in 0..N {
            if set_votes[n] != Vote::Refused {
                self.send(s, c, n, Req::Release { tok });
            }
        }
        s.clients[c].phase = Phase::Idle;
    }

    /// The lock is held: validity left after the whole attempt.
    fn won(&self, s: &mut State, c: usize, start: u8, fence: Option<u8>, set_votes: [Vote; N]) {
        let p = &self.0;
        let elapsed = s.now - start;
        let validity = i16::from(p.ttl) - i16::from(elapsed) - i16::from(p.drift);
        if validity <= 0 {
            self.fail(s, c, set_votes);
            return;
        }
        if let Some(t) = fence {
            if t <= s.clients[c].floor {
                s.fence_violation = true;
            }
            s.max_returned = s.max_returned.max(t);
        }
        s.clients[c].ever_held = true;
        s.clients[c].phase = Phase::Held {
            deadline: start + validity as u8,
            fence,
            ext: None,
            extends_left: p.extends,
        };
    }

    /// Decides whatever can be decided for client `c` now.
    fn decide(&self, s: &mut State, c: usize) {
        let p = &self.0;
        let q = p.quorum;
        match s.clients[c].phase.clone() {
            Phase::Idle => {}
            Phase::Acquire { start, votes } => {
                let g = count(&votes, granted);
                let pending = count(&votes, |v| v == Vote::Pending);
                if g >= q {
                    if p.fencing {
                        let t = votes
                            .iter()
                            .filter_map(|v| match v {
                                Vote::Granted(x) => Some(*x),
                                _ => None,
                            })
                            .max()
                            .unwrap_or(0);
                        let tok = s.clients[c].tok;
                        let to = votes.map(|v| v != Vote::Refused);
                        let cv = self.fan_out(s, c, to, Req::Commit { tok, t });
                        s.clients[c].phase = Phase::Commit {
                            start,
                            t,
                            set_votes: votes,
                            votes: cv,
                        };
                        self.decide(s, c);
                    } else {
                        self.won(s, c, start, None, votes);
                    }
                } else if g + pending < q {
                    self.fail(s, c, votes);
                }
            }
            Phase::Commit {
                start,
                t,
                set_votes,
                votes,
            } => {
                let g = count(&votes, granted);
                let pending = count(&votes, |v| v == Vote::Pending);
                if g >= q {
                    self.won(s, c, start, Some(t), set_votes);
                } else if g + pending < q {
                    self.fail(s, c, set_votes);
                }
            }
            Phase::Held {
                deadline,
                fence,
                ext: Some(ext),
                extends_left,
            } => {
                let g = count(&ext.votes, granted);
                let refused = count(&ext.votes, |v| v == Vote::Refused);
                let pending = count(&ext.votes, |v| v == Vote::Pending);
                let mut deadline = deadline;
                let done = if g >= q {
                    let elapsed = s.now - ext.start;
                    let validity =
                        i16::from(ext.ttl) - i16::from(elapsed) - i16::from(p.drift);
                    if validity > 0 {
                        deadline = deadline.max(ext.start + validity as u8);
                    }
                    true
                } else if refused > N - q {
                    deadline = deadline.min(s.now); // lost: a quorum no longer holds it
                    true
                } else {
                    g + pending < q
                };
                s.clients[c].phase = Phase::Held {
                    deadline,
                    fence,
                    ext: if done { None } else { Some(ext) },
                    extends_left,
                };
            }
            Phase::Held { ext: None, .. } => {}
        }
    }

    /// A node runs a request.
    fn run(&self, s: &mut State, n: usize, req: Req) -> Option<Rep> {
        let p = &self.0;
        let now = s.now;
        let node = &mut s.nodes[n];
        let fast = if node.fast { p.fast } else { 0 };
        let expiry = |ttl: u8| (now + ttl).saturating_sub(fast);
        match req {
            Req::Set { tok } => {
                if node.key.is_some() {
                    return Some(Rep::Set { tok, granted: None });
                }
                node.key = Some(Key {
                    tok,
                    exp: expiry(p.ttl),
                });
                node.counter = (node.counter + 1).max(now + node.offset);
                Some(Rep::Set {
                    tok,
                    granted: Some(node.counter),
                })
            }
            Req::Commit { tok, t } => {
                let ok = matches!(node.key, Some(k) if k.tok == tok);
                if ok {
                    node.counter = node.counter.max(t);
                }
                Some(Rep::Commit { tok, ok })
            }
            Req::Extend { tok, ttl, seq } => {
                let ok = match &mut node.key {
                    Some(k) if k.tok == tok => {
                        k.exp = if p.extend_gt {
                            k.exp.max(expiry(ttl))
                        } else {
                            expiry(ttl)
                        };
                        true
                    }
                    _ => false,
                };
                if matches!(node.key, Some(k) if k.exp <= now) {
                    node.key = None;
                }
                Some(Rep::Extend { tok, seq, ok })
            }
            Req::Release { tok } => {
                if !p.release_checks_token || matches!(node.key, Some(k) if k.tok == tok) {
                    node.key = None;
                }
                None
            }
        }
    }

    /// Whether client `c` would act on reply `rep` from node `n`.
    fn awaited(cl: &Client, n: usize, rep: Rep) -> bool {
        match (&cl.phase, rep) {
            (Phase::Acquire { votes, .. }, Rep::Set { tok, .. })
            | (Phase::Commit { votes, .. }, Rep::Commit { tok, .. }) => {
                tok == cl.tok && votes[n] == Vote::Pending
            }
            (Phase::Held { ext: Some(ext), .. }, Rep::Extend { tok, seq, .. }) => {
                tok == cl.tok && seq == ext.seq && ext.votes[n] == Vote::Pending
            }
            _ => false,
        }
    }

    /// Drops every reply its client would ignore (a late answer to a round that is over).
    /// Reading such a reply changes nothing, so dropping it at once is equivalent, and it
    /// keeps states that differ only in unread garbage apart no longer.
    fn forget_ignored_replies(s: &mut State) {
        for c in 0..C {
            for n in 0..N {
                let cl = &s.clients[c];
                s.rep[c][n].retain(|r| Self::awaited(cl, n, *r));
            }
        }
    }

    /// A client reads a reply.
    fn read(&self, s: &mut State, c: usize, n: usize, rep: Rep) {
        let me = s.clients[c].tok;
        let vote = |ok: bool| if ok { Vote::Granted(0) } else { Vote::Refused };
        match (&mut s.clients[c].phase, rep) {
            (Phase::Acquire { votes, .. }, Rep::Set { tok, granted }) if tok == me => {
                if votes[n] == Vote::Pending {
                    votes[n] = granted.map_or(Vote::Refused, Vote::Granted);
                }
            }
            (Phase::Commit { votes, .. }, Rep::Commit { tok, ok }) if tok == me => {
                if votes[n] == Vote::Pending {
                    votes[n] = vote(ok);
                }
            }
            (
                Phase::Held { ext: Some(ext), .. },
                Rep::Extend { tok, seq, ok },
            ) if tok == me && seq == ext.seq => {
                if ext.votes[n] == Vote::Pending {
                    ext.votes[n] = vote(ok);
                }
            }
            _ => return, // a late answer to a round that is over
        }
        self.decide(s, c);
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Which nodes' clocks run fast: by the symmetry of the nodes, the first k.
        self.0
            .fast_nodes
            .iter()
            .map(|&k| State {
                now: 0,
                nodes: std::array::from_fn(|n| Node {
                    key: None,
                    counter: 0,
                    fast: n < k && self.0.fast > 0,
                    offset: self.0.offset[n],
                    down: None,
                }),
                clients: std::array::from_fn(|_| Client {
                    attempts_left: self.0.attempts,
                    tok: 0,
                    floor: 0,
                    phase: Phase::Idle,
                    ever_held: false,
                }),
                req: Default::default(),
                rep: Default::default(),
                crashes_left: self.0.crashes,
                losses_left: self.0.losses,
                max_returned: 0,
                fence_violation: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let p = &self.0;
        if s.now < p.max_tick {
            actions.push(Action::Tick);
        }
        for c in 0..C {
            let cl = &s.clients[c];
            match &cl.phase {
                Phase::Idle if cl.attempts_left > 0 => actions.push(Action::Acquire(c)),
                Phase::Idle => {}
                Phase::Acquire { votes, .. } | Phase::Commit { votes, .. } => {
                    if votes.contains(&Vote::Pending) {
                        actions.push(Action::GiveUp(c));
                    }
                }
                Phase::Held {
                    deadline,
                    ext,
                    extends_left,
                    ..
                } => {
                    match ext {
                        Some(ext) if ext.votes.contains(&Vote::Pending) => {
                            actions.push(Action::GiveUp(c))
                        }
                        Some(_) => {}
                        None if *extends_left > 0 && s.now < *deadline => {
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
                if !s.req[c][n].is_empty() {
                    if s.nodes[n].down.is_none() {
                        actions.push(Action::Deliver { client: c, node: n });
                    }
                    if s.losses_left > 0 {
                        actions.push(Action::LoseRequest { client: c, node: n });
                    }
                }
                if !s.rep[c][n].is_empty() {
                    actions.push(Action::Reply { client: c, node: n });
                }
            }
        }
        for n in 0..N {
            match s.nodes[n].down {
                None if s.crashes_left > 0 => {
                    actions.push(Action::Crash {
                        node: n,
                        persisted: true,
                    });
                    actions.push(Action::Crash {
                        node: n,
                        persisted: false,
                    });
                }
                None => {}
                Some(d) => {
                    if d.persisted || s.now >= d.since + p.restart_delay {
                        actions.push(Action::Restart(n));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let p = &self.0;
        let mut s = last.clone();
        match action {
            Action::Tick => {
                s.now += 1;
                for node in &mut s.nodes {
                    if matches!(node.key, Some(k) if k.exp <= s.now) {
                        node.key = None;
                    }
                }
            }
            Action::Acquire(c) => {
                let cl = &mut s.clients[c];
                cl.attempts_left -= 1;
                cl.tok = (c as u8) * 16 + (p.attempts - cl.attempts_left);
                cl.floor = s.max_returned;
                let tok = cl.tok;
                let votes = self.fan_out(&mut s, c, [true; N], Req::Set { tok });
                s.clients[c].phase = Phase::Acquire {
                    start: s.now,
                    votes,
                };
                self.decide(&mut s, c);
            }
            Action::Deliver { client, node } => {
                let req = s.req[client][node].remove(0);
                if let Some(rep) = self.run(&mut s, node, req) {
                    if p.reply_delay {
                        s.rep[client][node].push(rep);
                    } else {
                        self.read(&mut s, client, node, rep);
                    }
                }
            }
            Action::Reply { client, node } => {
                let rep = s.rep[client][node].remove(0);
                self.read(&mut s, client, node, rep);
            }
            Action::LoseRequest { client, node } => {
                s.req[client][node].remove(0);
                s.losses_left -= 1;
            }
            Action::GiveUp(c) => {
                let fail_pending = |votes: &mut [Vote; N]| {
                    for v in votes.iter_mut() {
                        if *v == Vote::Pending {
                            *v = Vote::Failed;
                        }
                    }
                };
                match &mut s.clients[c].phase {
                    Phase::Acquire { votes, .. } | Phase::Commit { votes, .. } => {
                        fail_pending(votes)
                    }
                    Phase::Held { ext: Some(ext), .. } => fail_pending(&mut ext.votes),
                    _ => return None,
                }
                self.decide(&mut s, c);
            }
            Action::Extend { client, ttl } => {
                let tok = s.clients[client].tok;
                let Phase::Held {
                    deadline,
                    fence,
                    extends_left,
                    ..
                } = s.clients[client].phase.clone()
                else {
                    return None;
                };
                let seq = p.extends - extends_left;
                let votes = self.fan_out(&mut s, client, [true; N], Req::Extend { tok, ttl, seq });
                s.clients[client].phase = Phase::Held {
                    deadline,
                    fence,
                    ext: Some(Ext {
                        start: s.now,
                        ttl,
                        seq,
                        votes,
                    }),
                    extends_left: extends_left - 1,
                };
                self.decide(&mut s, client);
            }
            Action::Release(c) => {
                let tok = s.clients[c].tok;
                for n in 0..N {
                    self.send(&mut s, c, n, Req::Release { tok });
                }
                s.clients[c].phase = Phase::Idle;
            }
            Action::Crash { node, persisted } => {
                s.crashes_left -= 1;
                s.nodes[node].down = Some(Down {
                    since: s.now,
                    persisted,
                });
                // The connections break: whatever was in flight to or from it is lost.
                for c in 0..C {
                    s.req[c][node].clear();
                    s.rep[c][node].clear();
                }
            }
            Action::Restart(n) => {
                let node = &mut s.nodes[n];
                if let Some(d) = node.down.take()
                    && !d.persisted
                {
                    node.key = None;
                    node.counter = 0;
                }
            }
        }
        Self::forget_ignored_replies(&mut s);
        Some(s.canonical())
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("mutual exclusion", |_, s: &State| {
                (0..C).filter(|&c| LockModel::believes(s, c)).count() <= 1
            }),
            Property::always("fencing tokens rise", |_, s: &State| !s.fence_violation),
            Property::always("remaining is backed by a quorum", |_, s: &State| {
                (0..C).all(|c| match s.clients[c].phase {
                    Phase::Held { deadline, .. } if s.now < deadline => {
                        LockModel::backing(s, s.clients[c].tok, deadline) >= MAJORITY
                    }
                    _ => true,
                })
            }),
            Property::sometimes("a client acquires", |_, s: &State| {
                (0..C).any(|c| LockModel::believes(s, c))
            }),
            Property::sometimes("both clients hold in turn", |_, s: &State| {
                s.clients.iter().all(|c| c.ever_held)
            }),
            Property::sometimes("a client acquires while a node is down", |_, s: &State| {
                s.nodes.iter().any(|n| n.down.is_some())
                    && (0..C).any(|c| LockModel::believes(s, c))
            }),
        ]
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
