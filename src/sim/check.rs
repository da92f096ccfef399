//! The invariants, checked in true (simulator) time.
//!
//! * **Two holders** (checked whenever a client starts to believe it holds the lock: an
//!   acquisition, or an extension that confirmed after the old deadline passed): no other
//!   client believes it holds it at that moment. A client believes from its decision until
//!   its deadline by its own clock, unless it released, dropped or gave the lock up, or an
//!   extension found it lost. Beliefs only ever end at the present (a release, a loss) or
//!   at a deadline known in advance, so checking at every start finds every overlap.
//! * **Validity within the quorum's hold** (checked after every event): for every
//!   believing client, the true time at which its deadline passes (by its clock) is no
//!   later than the time until which a majority of nodes still hold its token. A node
//!   holds the token until the key's expiry (node clock, translated to true time through
//!   that node's clock). A node that crashed without persistence while holding the token
//!   counts as holding it until the earlier of that expiry and its restart: while it is
//!   down it grants no one, which is what the deployment contract's delayed restart relies
//!   on. The majority is the real one (`N / 2 + 1`), whatever quorum the clients count
//!   with.
//! * **Fencing order** (checked at every fenced acquisition): its token is larger than
//!   every token returned before it, whatever the order in which the attempts started.
//! * **No key left behind**, once every client finished and the network drained: (1) no
//!   node keeps a lock key whose owner's release or clean-up request ran on that node (the
//!   key was set after the release: the release overtook it), or whose owner never issued
//!   one there, unless the owner gave the lock up on purpose; (2) once the longest TTL
//!   passed after that, no node keeps any key but a fence counter (fence counters never
//!   expire by design).

use super::node::Value;
use super::state::expiry_true;
use super::world::{Invariant, World, time};

impl World {
    /// Client `c` started to believe it holds the lock: nobody else may.
    pub(super) fn check_gain(&mut self, c: usize) {
        for d in 0..self.clients.len() {
            if d != c && self.believes(d) {
                let who = |x: usize| {
                    self.clients[x]
                        .lock
                        .as_ref()
                        .map_or(String::new(), |h| match h.fencing {
                            Some(t) => format!("a{}, fencing token {t}", h.attempt),
                            None => format!("a{}", h.attempt),
                        })
                };
                let (wc, wd) = (who(c), who(d));
                let until = self.client_deadline_true(d).unwrap_or(0);
                let waited = |x: usize| self.clients[x].lock.as_ref().is_some_and(|h| h.via_wait);
                let invariant = if waited(c) && waited(d) {
                    Invariant::HandOffToTwo
                } else {
                    Invariant::TwoHolders
                };
                self.violate(
                    invariant,
                    format!(
                        "c{c} ({wc}) holds while c{d} ({wd}) still believes it holds until {}",
                        time(until)
                    ),
                );
                return;
            }
        }
    }

    /// A fenced acquisition returned token `t`.
    pub(super) fn check_fencing(&mut self, c: usize, t: u64) {
        if let Some(max) = self.max_fence
            && t <= max
        {
            self.violate(
                Invariant::FencingOrder,
                format!("c{c} got fencing token {t}, not above {max} returned earlier"),
            );
        }
        self.max_fence = Some(self.max_fence.map_or(t, |m| m.max(t)));
    }

    /// Until when node `i` holds `token` (true µs; 0 when it does not).
    fn hold_until(&self, i: usize, token: &[u8]) -> u64 {
        let node = &self.nodes[i];
        if !node.sim.is_up() && !node.aof {
            let restart = node.restart_at.unwrap_or(u64::MAX);
            return node
                .ghosts
                .iter()
                .find(|(t, _)| t.as_slice() == token)
                .map_or(0, |(_, until)| (*until).min(restart));
        }
        let now_n = node.clock.at(self.now);
        match self.node_holder(i, now_n) {
            Some((t, at)) if t.as_slice() == token => expiry_true(node.clock, at),
            _ => 0,
        }
    }

    /// The token that holds every lock key on node `i` at its clock `now_n`, and the
    /// earliest of their expiries (node ms; `None` without expiry): the lock is held there
    /// while every key is.
    pub(super) fn node_holder(&self, i: usize, now_n: u64) -> Option<(Vec<u8>, Option<u64>)> {
        let mut holder: Option<(&[u8], Option<u64>)> = None;
        let mut found = 0;
        for (k, v, at) in self.nodes[i].sim.entries(now_n) {
            if !self.p.lock_keys.iter().any(|l| l.as_slice() == k) {
                continue;
            }
            let Value::String(t) = v else {
                return None;
            };
            found += 1;
            holder = match holder {
                None => Some((t.as_slice(), at)),
                Some((h, _)) if h != t.as_slice() => return None,
                Some((h, e)) => Some((h, min_expiry(e, at))),
            };
        }
        if found != self.p.lock_keys.len() {
            return None;
        }
        holder.map(|(t, at)| (t.to_vec(), at))
    }

    /// Every believing client's deadline is within the time a majority holds its token.
    pub(super) fn check_validity(&mut self) {
        for c in 0..self.clients.len() {
            if !self.believes(c) {
                continue;
            }
            let Some(deadline) = self.client_deadline_true(c) else {
                continue;
            };
            let Some(a) = self.clients[c].lock.as_ref().map(|h| h.attempt) else {
                continue;
            };
            let token = self.attempts[a].token.as_bytes();
            let mut holds: Vec<u64> = (0..self.p.nodes)
                .map(|i| self.hold_until(i, token))
                .collect();
            holds.sort_unstable_by(|x, y| y.cmp(x));
            let q = holds.get(self.p.majority - 1).copied().unwrap_or(0);
            if deadline > q {
                let shown: Vec<String> = (0..self.p.nodes)
                    .map(|i| match self.hold_until(i, token) {
                        0 => format!("n{i} -"),
                        u64::MAX => format!("n{i} forever"),
                        t => format!("n{i} {}", time(t)),
                    })
                    .collect();
                self.violate(
                    Invariant::ValidityBeyondQuorum,
                    format!(
                        "c{c} (a{a}) believes until {} but a majority holds its token only until {} ({})",
                        time(deadline),
                        time(q),
                        shown.join(", ")
                    ),
                );
                return;
            }
        }
    }

    /// After the drain: no lock key whose owner's release ran there, or was never sent
    /// there.
    pub(super) fn check_left_behind(&mut self) {
        for i in 0..self.p.nodes {
            let now_n = self.nodes[i].clock.at(self.now);
            let left: Vec<Vec<u8>> = self.nodes[i]
                .sim
                .entries(now_n)
                .filter(|(k, _, _)| self.p.lock_keys.iter().any(|l| l.as_slice() == *k))
                .filter_map(|(_, v, _)| match v {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect();
            for token in left {
                let Some(a) = self
                    .attempts
                    .iter()
                    .position(|a| a.token.as_bytes() == token)
                else {
                    self.violate(
                        Invariant::KeyLeftBehind,
                        format!("n{i} keeps a lock key with an unknown token"),
                    );
                    return;
                };
                let att = &self.attempts[a];
                let bit = 1u64 << i;
                if att.abandoned {
                    continue;
                }
                if att.ran & bit != 0 {
                    self.violate(
                        Invariant::KeyLeftBehind,
                        format!("n{i} keeps the key of a{a} although a{a}'s release ran there: it was set after the release"),
                    );
                    return;
                }
                if att.issued & bit == 0 {
                    self.violate(
                        Invariant::KeyLeftBehind,
                        format!(
                            "n{i} keeps the key of a{a}, and c{} never sent it a release",
                            att.client
                        ),
                    );
                    return;
                }
            }
        }
    }

    /// The longest TTL after the drain: no key but fence counters.
    pub(super) fn check_all_expired(&mut self) {
        self.now = self.now.saturating_add(self.longest_ttl_true());
        self.log(|| "the longest TTL passed".into());
        for i in 0..self.p.nodes {
            let now_n = self.nodes[i].clock.at(self.now);
            let fences = &self.p.fence_keys;
            let left: Vec<String> = self.nodes[i]
                .sim
                .entries(now_n)
                .filter(|(k, _, _)| !fences.iter().any(|f| f.as_slice() == *k))
                .map(|(k, _, _)| String::from_utf8_lossy(k).into_owned())
                .collect();
            if !left.is_empty() {
                self.violate(
                    Invariant::KeyLeftBehind,
                    format!("n{i} still keeps {left:?} after the longest TTL"),
                );
                return;
            }
        }
    }
}

/// The earlier of two expiries (`None`: never).
fn min_expiry(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}
