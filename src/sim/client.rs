//! Simulated clients that run the real protocol layer.
//!
//! A client builds its requests with `node::Request`'s constructors (the ones the real
//! client uses), sends them through `net.rs` (which decodes each answer with
//! `node::decode`), counts the typed replies with [`Tally`], and acts on
//! [`verdict::acquire`], [`verdict::extend`], [`verdict::release`] and
//! [`tally::validity`]/[`tally::drift`] exactly as `client.rs`, `fencing.rs` and `lock.rs`
//! do. Every decision is theirs; what is re-expressed here, as events instead of tokio
//! futures, is only the orchestration:
//!
//! * `fanout::Round` (send to every node, decide as soon as the tally is certain, the
//!   stragglers go on) is a [`Round`] whose calls feed its tally as their answers arrive;
//!   after the decision, or when it is detached, its calls go on and their answers are
//!   ignored;
//! * `client::acquire_once` and `fencing::acquire_fenced`: round 1; for fencing,
//!   `t` = the largest counter among the granting replies, the commit sent at once to every
//!   node that did not refuse (nodes still running round 1 included), and the attempt
//!   measured over both rounds from round 1's start;
//! * `Attempt::finish`/`abandon`/`clean_up` and `fanout::Cleanup`: on failure, release the
//!   granting nodes (the attempt returns once they answered or timed out), the failed or
//!   timed-out ones, and every node still running its acquire once that request
//!   completes, unless it refused; a cancelled attempt does the same without waiting;
//! * `fanout::InFlight` and `lock::ordered`: an extend or release request to a node waits
//!   until the lock's acquire request there completed (the caller's timeout counts from
//!   the round's start; an idempotent request goes out later in the background);
//! * `Lock::extend`: refused without a round once the deadline passed; the new deadline is
//!   `max(old, start + validity)`; `Lost(NotHeld)` ends the validity at once; a cancelled
//!   extension leaves the deadline;
//! * `Lock::release` and the release on drop: the two heralds announce, the others are
//!   quiet; the guard is gone from the moment the release starts.
//!
//! What a client does (its workload) is drawn from its own random stream: attempts with
//! random TTLs and retry delays, some cancelled midway; work of random length (sometimes
//! past the validity); extensions with random TTLs, longer or shorter than the time left,
//! some cancelled; then a release, a drop, or giving the lock up without a release.

use std::time::Duration;

use rand::RngExt;

use super::net::{Translated, translate, translate_join};
use super::state::{Attempt, Held, Kind, Owner, Phase, Round, RoundKind, Timer, between, short};
use super::world::{EXTEND_MIN_TTL_MS, World};
use crate::base::token::Token;
use crate::io::node::{Answer, EntryKind, JoinArgs, QueueJoin, Request};
use crate::protocol::{Ballot, Decision, Loss, Reply, Tally, Verdict, tally, verdict};

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl World {
    /// The client's clock now.
    pub(super) fn client_now(&self, c: usize) -> u64 {
        self.clients[c].clock.at(self.now)
    }

    /// The true time at which client `c`'s lock expires by its own clock, if it holds one.
    pub(super) fn client_deadline_true(&self, c: usize) -> Option<u64> {
        let cl = &self.clients[c];
        cl.lock.as_ref().map(|h| cl.clock.when(h.deadline_c))
    }

    /// Whether client `c` believes it holds the lock now.
    pub(super) fn believes(&self, c: usize) -> bool {
        let cl = &self.clients[c];
        cl.lock
            .as_ref()
            .is_some_and(|h| cl.clock.at(self.now) < h.deadline_c)
    }

    fn set_timer(&mut self, c: usize, after_c: u64, timer: Timer) {
        let cl = &mut self.clients[c];
        cl.timer_gen += 1;
        cl.timer = timer;
        let generation = cl.timer_gen;
        let at = cl.clock.when(cl.clock.at(self.now).saturating_add(after_c));
        self.push(
            at,
            Kind::Timer {
                client: c,
                generation,
            },
        );
    }

    fn clear_timer(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.timer_gen += 1;
        cl.timer = Timer::None;
    }

    pub(super) fn client_timer(&mut self, c: usize, generation: u32) {
        if self.clients[c].timer_gen != generation {
            return;
        }
        let timer = std::mem::replace(&mut self.clients[c].timer, Timer::None);
        match timer {
            Timer::None => {}
            Timer::Start => self.start_attempt(c),
            Timer::HoldAction => self.hold_action(c),
            Timer::CancelAcquire(a) => self.cancel_attempt(c, a),
            Timer::CancelExtend(r) => self.cancel_extend(c, r),
            Timer::Claim(a) => self.start_claim(c, a),
        }
    }

    /// The client's first operation starts after a short random delay.
    pub(super) fn client_begin(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.tries_left = cl.rng.random_range(1..=4);
        let after = between(&mut cl.rng, 0, 2_000);
        self.set_timer(c, after, Timer::Start);
    }

    /// An operation (a lock, held and given up, or attempts that all failed) ended.
    fn op_finished(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.ops_left = cl.ops_left.saturating_sub(1);
        if cl.ops_left == 0 {
            cl.phase = Phase::Done;
            self.clear_timer(c);
            self.log(|| format!("c{c} done"));
            return;
        }
        cl.phase = Phase::Idle;
        cl.tries_left = cl.rng.random_range(1..=4);
        let think = between(&mut cl.rng, 0, self.p.max_ttl_ms * 1000 / 2);
        self.set_timer(c, think, Timer::Start);
    }

    fn draw_ttl(&mut self, c: usize, lo_ms: u64) -> Duration {
        let hi = self.p.max_ttl_ms;
        let ms = between(&mut self.clients[c].rng, lo_ms, hi);
        Duration::from_millis(ms)
    }

    fn translate_or_fail(&mut self, req: &Request) -> Option<Translated> {
        match translate(req) {
            Ok(t) => Some(t),
            Err(e) => {
                self.sim_error(e);
                None
            }
        }
    }

    fn new_round(&mut self, c: usize, attempt: usize, kind: RoundKind, ttl: Duration) -> usize {
        let n = self.p.nodes;
        self.rounds.push(Round {
            client: c,
            attempt,
            kind,
            start_c: self.client_now(c),
            ttl,
            tally: Tally::new(n, self.p.quorum),
            replies: vec![None; n],
            deciding: true,
            expired: false,
            calls: Vec::with_capacity(n),
        });
        self.rounds.len() - 1
    }

    /// The drift allowance the client subtracts (zero under the mutation).
    fn drift(&self, ttl: Duration) -> Duration {
        if self.p.no_drift {
            Duration::ZERO
        } else {
            tally::drift(ttl, self.p.drift_factor)
        }
    }

    // ---- acquire (client::acquire_once, fencing::acquire_fenced) ----

    fn start_attempt(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Idle {
            return;
        }
        let ttl = self.draw_ttl(c, self.p.min_ttl_ms);
        let mut raw = [0u8; 16];
        self.clients[c].rng.fill(&mut raw);
        let token = Token::from_bytes(raw);
        let fenced = self.p.fencing;
        let req = if fenced {
            let mut keys = self.p.res.lock_keys().to_vec();
            keys.extend(self.p.res.fence_keys());
            Request::acquire_fenced(keys, &token, ttl)
        } else {
            Request::acquire(self.p.res.lock_keys(), &token, ttl)
        };
        let Some(tr) = self.translate_or_fail(&req) else {
            return;
        };
        let a = self.attempts.len();
        let n = self.p.nodes;
        self.attempts
            .push(Attempt::new(c, token, fenced, ttl, n, false));
        self.stats.attempts += 1;
        let r = self.new_round(c, a, RoundKind::Acquire, ttl);
        self.attempts[a].round1 = r;
        self.clients[c].phase = Phase::Acquiring(a);
        let tok = short(self.attempts[a].token.as_bytes());
        self.log(|| {
            format!(
                "c{c} attempt a{a}: {} ttl {} ms, token {tok}",
                if fenced { "fenced acquire" } else { "acquire" },
                ttl.as_millis(),
            )
        });
        for i in 0..n {
            let id = self.new_call(c, i, a, &tr, Owner::Round(r), false);
            self.rounds[r].calls.push(id);
        }
        // Some attempts are cancelled midway (a caller's own timeout, a dropped task).
        if self.clients[c].rng.random_bool(0.06) {
            let after = between(&mut self.clients[c].rng, 0, self.p.node_timeout_us * 2);
            self.set_timer(c, after, Timer::CancelAcquire(a));
        } else {
            self.clear_timer(c);
        }
    }

    /// A call completed (answered, or timed out): the only way answers reach a client.
    pub(super) fn complete(&mut self, id: usize, reply: Reply) {
        let call = &self.calls[id];
        let (i, a, owner) = (call.node, call.attempt, call.owner);
        match owner {
            Owner::Round(r) => {
                if self.rounds[r].kind == RoundKind::Acquire {
                    self.acquire_completed(a, i, &reply);
                }
                let round = &mut self.rounds[r];
                if !round.deciding {
                    return;
                }
                round.tally.record(reply.ballot());
                if let Some(slot) = round.replies.get_mut(i) {
                    *slot = Some(reply);
                }
                if let Some(d) = round.tally.decision() {
                    round.deciding = false;
                    self.decided(r, d);
                }
            }
            Owner::Cleanup { first: true } => {
                let att = &mut self.attempts[a];
                att.first_left = att.first_left.saturating_sub(1);
                let c = att.client;
                if att.first_left == 0 && self.clients[c].phase == Phase::CleaningUp(a) {
                    self.attempt_failed(c);
                }
            }
            Owner::Cleanup { first: false } => {}
        }
    }

    /// Node `i`'s round-1 request of attempt `a` completed: release the calls that were
    /// waiting for it, and clean the node up if the attempt failed meanwhile.
    fn acquire_completed(&mut self, a: usize, i: usize, reply: &Reply) {
        let att = &mut self.attempts[a];
        if let Some(slot) = att.acq_done.get_mut(i) {
            *slot = Some(reply.clone());
        }
        let calls = &self.calls;
        let (ready, waiting): (Vec<usize>, Vec<usize>) =
            att.gated.iter().partition(|&&g| calls[g].node == i);
        att.gated = waiting;
        let later = att.cleanup_later && (reply.ballot() != Ballot::Refused || att.waited);
        for g in ready {
            self.send_ready(g);
        }
        if later {
            self.cleanup_release(a, i, false);
        }
    }

    fn decided(&mut self, r: usize, d: Decision) {
        let round = &self.rounds[r];
        let (c, a, kind) = (round.client, round.attempt, round.kind);
        let t = self.rounds[r].tally;
        self.log(|| {
            format!(
                "c{c} {kind:?} round of a{a} decided {d:?} (granted {}, refused {}, answered {} of {})",
                t.granted(),
                t.refused(),
                t.answered(),
                t.nodes()
            )
        });
        match kind {
            RoundKind::Acquire if self.attempts[a].fenced && d == Decision::Reached => {
                self.start_commit(a);
            }
            RoundKind::Acquire => self.finish_attempt(a, d, None),
            RoundKind::Commit if d == Decision::Reached => {
                let t = self.attempts[a].t;
                self.finish_attempt(a, Decision::Reached, Some(t));
            }
            RoundKind::Commit => {
                // `Attempt::abandon`: the commit missed the quorum.
                self.log(|| format!("c{c} a{a} fencing commit missed the quorum"));
                self.stats.failed += 1;
                self.clean_up(a, true);
            }
            RoundKind::Extend => self.extend_decided(r, d),
            RoundKind::Release => self.release_decided(r, d),
            RoundKind::Drop => {}
        }
    }

    /// Fenced round 2: commit `t` on every node that did not refuse round 1.
    fn start_commit(&mut self, a: usize) {
        let att = &self.attempts[a];
        let (c, r1, ttl) = (att.client, att.round1, att.ttl);
        let mut t = 0u64;
        let n = self.p.nodes;
        let mut refused = vec![false; n];
        for (i, reply) in self.rounds[r1].replies.iter().enumerate() {
            match reply {
                Some(Reply::Fenced(top)) => t = t.max(*top),
                Some(r) if r.ballot() == Ballot::Refused => refused[i] = true,
                _ => {}
            }
        }
        self.attempts[a].t = t;
        if !self.p.fencing_commit {
            self.finish_attempt(a, Decision::Reached, Some(t));
            return;
        }
        let mut keys = self.p.res.lock_keys().to_vec();
        keys.extend(self.p.res.fence_keys());
        let req = Request::commit_fence(keys, &self.attempts[a].token, t);
        let Some(tr) = self.translate_or_fail(&req) else {
            return;
        };
        let r2 = self.new_round(c, a, RoundKind::Commit, ttl);
        self.attempts[a].round2 = Some(r2);
        self.log(|| format!("c{c} a{a} commits fencing token {t}"));
        for (i, skip) in refused.iter().enumerate() {
            if *skip {
                // A refusing node holds another owner's key: not sent, counted refused.
                let round = &mut self.rounds[r2];
                round.tally.record(Ballot::Refused);
                round.replies[i] = Some(Reply::HeldBy(None));
            } else {
                let id = self.new_call(c, i, a, &tr, Owner::Round(r2), false);
                self.rounds[r2].calls.push(id);
            }
        }
        if let Some(d) = self.rounds[r2].tally.decision() {
            self.rounds[r2].deciding = false;
            self.decided(r2, d);
        }
    }

    /// `Attempt::finish`: measure from round 1's start, and hold or clean up.
    fn finish_attempt(&mut self, a: usize, d: Decision, fencing: Option<u64>) {
        let att = &self.attempts[a];
        let (c, r1, ttl) = (att.client, att.round1, att.ttl);
        let start = self.rounds[r1].start_c;
        let elapsed = Duration::from_micros(self.client_now(c).saturating_sub(start));
        let validity = tally::validity(ttl, elapsed, self.drift(ttl));
        let v = verdict::acquire(d, &self.rounds[r1].tally, validity, Duration::ZERO);
        self.log(|| {
            format!(
                "c{c} a{a} {} after {} µs, validity {} µs",
                v.label("acquired"),
                elapsed.as_micros(),
                validity.as_micros()
            )
        });
        if let Verdict::Held { validity } = v {
            let deadline_c = start.saturating_add(micros(validity));
            let via_wait = self.attempts[a].waited;
            self.clients[c].lock = Some(Held {
                attempt: a,
                ttl,
                deadline_c,
                fencing,
                via_wait,
            });
            self.stats.acquired += 1;
            if via_wait {
                self.stats.claimed += 1;
            }
            self.check_gain(c);
            if let Some(t) = fencing {
                self.check_fencing(c, t);
            }
            let cl = &mut self.clients[c];
            cl.phase = Phase::Holding;
            cl.extends_left = cl.rng.random_range(0..=3);
            self.schedule_hold_action(c);
            return;
        }
        self.stats.failed += 1;
        if v == Verdict::HeldByOther
            && self.p.waiting
            && !self.attempts[a].waited
            && !self.attempts[a].fenced
        {
            self.clients[c].wait_next = self.clients[c].rng.random_bool(0.6);
        }
        match v {
            Verdict::HeldByOther => self.stats.failed_held += 1,
            Verdict::Timeout => self.stats.failed_no_validity += 1,
            _ => {}
        }
        self.clean_up(a, true);
    }

    /// `Attempt::clean_up`: release every node that may hold the attempt's key, each only
    /// once its round-1 request completed. With `wait`, the client goes on once the
    /// granting nodes answered (or timed out).
    fn clean_up(&mut self, a: usize, wait: bool) {
        let att = &self.attempts[a];
        let (c, r1) = (att.client, att.round1);
        let mut first = Vec::new();
        let mut now = Vec::new();
        let mut pending = false;
        let all = self.p.cleanup_all;
        // A waiter's token may still be queued on a node that refused it: its release
        // there leaves the queues, so no later hand-off gives it a key it never releases.
        let leave = all && att.waited;
        for i in 0..self.p.nodes {
            match &self.rounds[r1].replies[i] {
                Some(r) => match r.ballot() {
                    Ballot::Granted if wait => first.push(i),
                    Ballot::Granted => now.push(i),
                    Ballot::Failed if all => now.push(i),
                    Ballot::Refused if leave => now.push(i),
                    Ballot::Failed | Ballot::Refused => {}
                },
                None if !all => {}
                // A straggler: released once it completes, unless it refused.
                None => match &att.acq_done[i] {
                    Some(r) if r.ballot() != Ballot::Refused || leave => now.push(i),
                    Some(_) => {}
                    None => pending = true,
                },
            }
        }
        self.attempts[a].cleanup_later = pending;
        self.attempts[a].first_left = first.len();
        self.log(|| format!("c{c} a{a} cleans up: first {first:?}, now {now:?}, later: {pending}"));
        for &i in &first {
            self.cleanup_release(a, i, true);
        }
        for &i in &now {
            self.cleanup_release(a, i, false);
        }
        if wait && !first.is_empty() {
            self.clients[c].phase = Phase::CleaningUp(a);
        } else if wait {
            self.attempt_failed(c);
        }
    }

    fn cleanup_release(&mut self, a: usize, i: usize, first: bool) {
        let req = Request::release(&self.p.res, &self.attempts[a].token, &[], false);
        let Some(tr) = self.translate_or_fail(&req) else {
            return;
        };
        let c = self.attempts[a].client;
        self.attempts[a].issued |= 1u64 << i;
        self.new_call(c, i, a, &tr, Owner::Cleanup { first }, false);
    }

    /// A failed attempt returned: wait in the queues (after a refusal, sometimes), retry
    /// after a random delay, or give the operation up.
    fn attempt_failed(&mut self, c: usize) {
        if std::mem::take(&mut self.clients[c].wait_next) {
            self.start_wait(c);
            return;
        }
        let cl = &mut self.clients[c];
        cl.tries_left = cl.tries_left.saturating_sub(1);
        if cl.tries_left == 0 {
            self.op_finished(c);
            return;
        }
        cl.phase = Phase::Idle;
        let delay = between(
            &mut cl.rng,
            1_000,
            (self.p.min_ttl_ms * 1000 / 4).max(2_000),
        );
        self.set_timer(c, delay, Timer::Start);
    }

    /// The attempt's future is dropped before it decided (`Attempt`'s `Drop`).
    fn cancel_attempt(&mut self, c: usize, a: usize) {
        if self.clients[c].phase != Phase::Acquiring(a) {
            return;
        }
        self.stats.cancelled += 1;
        self.log(|| format!("c{c} a{a} cancelled"));
        let r1 = self.attempts[a].round1;
        self.rounds[r1].deciding = false;
        if let Some(r2) = self.attempts[a].round2 {
            // Round 2's futures are dropped with the attempt; round 1's stragglers are
            // handed to the clean-up.
            self.rounds[r2].deciding = false;
            let calls = self.rounds[r2].calls.clone();
            for id in calls {
                self.drop_call(id);
            }
        }
        self.clean_up(a, false);
        self.attempt_failed(c);
    }

    // ---- waiting (wait queues, hand-off, claim) ----

    /// A refused client waits with a fresh token on every node, built by `node::QueueJoin`,
    /// then claims after a while. For one resource it queues (`enqueue.lua`): a release
    /// that found it at the head of the queue handed the key to its token, and the claim
    /// (`claim.lua`) counts a key holding its own token as granted. For several it listens
    /// (`listen.lua`: its token marks every resource, so their releases announce) and its
    /// claim is the plain all-or-nothing acquire (`acquire.lua`) of every key.
    fn start_wait(&mut self, c: usize) {
        let ttl = self.draw_ttl(c, self.p.min_ttl_ms);
        let mut raw = [0u8; 16];
        self.clients[c].rng.fill(&mut raw);
        let token = Token::from_bytes(raw);
        // The entry lapses well within the longest TTL (the end-of-run check waits that).
        let lease = Duration::from_millis((self.p.max_ttl_ms / 2).max(1));
        let args = JoinArgs {
            token: token.as_bytes(),
            ticket: b"",
            lease,
            ttl,
            kind: EntryKind::Transfer,
            first: true,
            inbox: b"",
        };
        let res = &self.p.res;
        let join = if res.len() == 1 {
            QueueJoin::new(res, &args)
        } else {
            // Notify-and-claim: the token is the listener's id, dropped by its release.
            QueueJoin::listen(res, token.as_bytes(), lease, None)
        };
        let req = match translate_join(&join) {
            Ok(r) => r,
            Err(e) => {
                self.sim_error(e);
                return;
            }
        };
        let tr = Translated {
            req: std::rc::Rc::new(req),
            answer: Answer::Compare,
            script: true,
            idempotent: false,
            release: false,
        };
        let a = self.attempts.len();
        let n = self.p.nodes;
        self.attempts
            .push(Attempt::new(c, token, false, ttl, n, true));
        self.stats.waits += 1;
        let tok = short(self.attempts[a].token.as_bytes());
        self.log(|| format!("c{c} a{a}: waits in the queues, token {tok}"));
        for i in 0..n {
            // The join's answer is not needed: the claim tells.
            self.new_call(c, i, a, &tr, Owner::Cleanup { first: false }, false);
        }
        self.clients[c].phase = Phase::Waiting(a);
        let hi = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
        let after = between(&mut self.clients[c].rng, hi / 5, hi);
        self.set_timer(c, after, Timer::Claim(a));
    }

    /// The waiter's claim (`claim.lua`, or `acquire.lua` for several resources): round 1
    /// of its attempt.
    fn start_claim(&mut self, c: usize, a: usize) {
        if self.clients[c].phase != Phase::Waiting(a) {
            return;
        }
        let ttl = self.attempts[a].ttl;
        let req = Request::claim(&self.p.lock_keys, &self.attempts[a].token, ttl);
        let Some(tr) = self.translate_or_fail(&req) else {
            return;
        };
        self.stats.attempts += 1;
        let r = self.new_round(c, a, RoundKind::Acquire, ttl);
        self.attempts[a].round1 = r;
        self.clients[c].phase = Phase::Acquiring(a);
        self.log(|| format!("c{c} a{a} claims, ttl {} ms", ttl.as_millis()));
        for i in 0..self.p.nodes {
            let id = self.new_call(c, i, a, &tr, Owner::Round(r), false);
            self.rounds[r].calls.push(id);
        }
        self.clear_timer(c);
    }

    // ---- the held lock (lock::Lock) ----

    fn schedule_hold_action(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        let Some(h) = &cl.lock else {
            return;
        };
        let left = h.deadline_c.saturating_sub(cl.clock.at(self.now));
        // Mostly well within the validity; sometimes past it.
        let work = match cl.rng.random_range(0..10u8) {
            0..=6 => between(&mut cl.rng, 0, left / 2),
            7..=8 => between(&mut cl.rng, left / 2, left),
            _ => between(&mut cl.rng, left, left.saturating_mul(2).max(1)),
        };
        self.set_timer(c, work, Timer::HoldAction);
    }

    fn hold_action(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Holding {
            return;
        }
        let cl = &mut self.clients[c];
        let roll = cl.rng.random_range(0..100u8);
        if cl.extends_left > 0 && roll < 60 {
            cl.extends_left -= 1;
            let ttl = self.draw_ttl(c, EXTEND_MIN_TTL_MS);
            self.start_extend(c, ttl);
        } else if roll < 85 {
            self.start_release(c, false);
        } else if roll < 94 {
            self.start_release(c, true);
        } else {
            self.abandon(c);
        }
    }

    /// Calls of one request to every node, each waiting for the lock's acquire request
    /// on its node (`lock::ordered`).
    fn ordered_calls(&mut self, c: usize, a: usize, r: usize, trs: &[Translated]) {
        for i in 0..self.p.nodes {
            let Some(tr) = trs.get(i).or(trs.last()) else {
                return;
            };
            let gated = self.attempts[a].acq_done[i].is_none();
            let id = self.new_call(c, i, a, tr, Owner::Round(r), gated);
            if gated {
                self.attempts[a].gated.push(id);
            }
            self.rounds[r].calls.push(id);
        }
    }

    fn start_extend(&mut self, c: usize, ttl: Duration) {
        let Some(h) = &self.clients[c].lock else {
            return;
        };
        let a = h.attempt;
        if !self.believes(c) {
            // `Lock::extend` on an expired lock: lost, no round.
            self.stats.lost += 1;
            self.log(|| format!("c{c} a{a} extend refused: the lock expired"));
            self.start_release(c, false);
            return;
        }
        let req = Request::extend(
            self.p.res.lock_keys().to_vec(),
            &self.attempts[a].token,
            ttl,
        );
        let Some(tr) = self.translate_or_fail(&req) else {
            return;
        };
        let r = self.new_round(c, a, RoundKind::Extend, ttl);
        self.log(|| format!("c{c} a{a} extends to {} ms", ttl.as_millis()));
        self.ordered_calls(c, a, r, std::slice::from_ref(&tr));
        self.clients[c].phase = Phase::Extending(r);
        if self.clients[c].rng.random_bool(0.05) {
            let after = between(&mut self.clients[c].rng, 0, self.p.node_timeout_us * 2);
            self.set_timer(c, after, Timer::CancelExtend(r));
        } else {
            self.clear_timer(c);
        }
    }

    fn extend_decided(&mut self, r: usize, d: Decision) {
        let (c, start, ttl) = (
            self.rounds[r].client,
            self.rounds[r].start_c,
            self.rounds[r].ttl,
        );
        if self.clients[c].phase != Phase::Extending(r) {
            return;
        }
        self.clear_timer(c);
        let now_c = self.client_now(c);
        let elapsed = Duration::from_micros(now_c.saturating_sub(start));
        let validity = tally::validity(ttl, elapsed, self.drift(ttl));
        let still_valid = self.believes(c);
        let v = verdict::extend(
            d,
            &self.rounds[r].tally,
            validity,
            Duration::ZERO,
            still_valid,
        );
        self.log(|| {
            format!(
                "c{c} extension {} (validity {} µs)",
                v.label("extended"),
                validity.as_micros()
            )
        });
        let Some(h) = self.clients[c].lock.as_mut() else {
            return;
        };
        match v {
            Verdict::Held { validity } => {
                h.deadline_c = h.deadline_c.max(start.saturating_add(micros(validity)));
                h.ttl = ttl;
                self.stats.extended += 1;
                if !still_valid && self.believes(c) {
                    self.check_gain(c);
                }
            }
            Verdict::Lost(Loss::NotHeld) => {
                h.deadline_c = h.deadline_c.min(now_c);
                self.stats.lost += 1;
            }
            Verdict::Lost(_) => {
                self.stats.lost += 1;
            }
            _ => self.stats.extend_failed += 1,
        }
        self.clients[c].phase = Phase::Holding;
        if self.believes(c) {
            self.schedule_hold_action(c);
        } else {
            // The caller learns the lock is lost (or gone by its clock): it releases.
            self.start_release(c, false);
        }
    }

    /// The extension's future is dropped before it decided.
    fn cancel_extend(&mut self, c: usize, r: usize) {
        if self.clients[c].phase != Phase::Extending(r) {
            return;
        }
        self.log(|| format!("c{c} extension cancelled"));
        self.stats.extend_failed += 1;
        self.rounds[r].deciding = false;
        let calls = self.rounds[r].calls.clone();
        for id in calls {
            self.drop_call(id);
        }
        self.clients[c].phase = Phase::Holding;
        self.schedule_hold_action(c);
    }

    /// `Lock::release` (`background`: the release a dropped guard runs).
    fn start_release(&mut self, c: usize, background: bool) {
        let Some(h) = self.clients[c].lock.take() else {
            return;
        };
        self.clear_timer(c);
        let a = h.attempt;
        let expired = self.clients[c].clock.at(self.now) >= h.deadline_c;
        let token = &self.attempts[a].token;
        let loud = Request::release(&self.p.res, token, &[], true);
        let quiet = Request::release(&self.p.res, token, &[], false);
        let (Some(loud), Some(quiet)) = (
            self.translate_or_fail(&loud),
            self.translate_or_fail(&quiet),
        ) else {
            return;
        };
        let n = self.p.nodes;
        let per_node: Vec<Translated> = (0..n)
            .map(|i| {
                let t = if self.p.res.announces_on(i, n) {
                    &loud
                } else {
                    &quiet
                };
                Translated {
                    req: t.req.clone(),
                    answer: t.answer,
                    script: t.script,
                    idempotent: t.idempotent,
                    release: t.release,
                }
            })
            .collect();
        let kind = if background {
            RoundKind::Drop
        } else {
            RoundKind::Release
        };
        let r = self.new_round(c, a, kind, h.ttl);
        self.rounds[r].expired = expired;
        self.log(|| {
            format!(
                "c{c} a{a} {}{}",
                if background {
                    "dropped: releases in the background"
                } else {
                    "releases"
                },
                if expired { " (expired)" } else { "" }
            )
        });
        self.attempts[a].issued |= u64::MAX >> (64 - n.clamp(1, 64));
        self.ordered_calls(c, a, r, &per_node);
        if background {
            self.op_finished(c);
        } else {
            self.clients[c].phase = Phase::Releasing(r);
        }
    }

    fn release_decided(&mut self, r: usize, d: Decision) {
        let c = self.rounds[r].client;
        let v = verdict::release(d, &self.rounds[r].tally, self.rounds[r].expired);
        self.log(|| format!("c{c} release: {}", v.label("released")));
        match v {
            Verdict::Released => self.stats.released += 1,
            Verdict::Lost(_) => self.stats.lost += 1,
            _ => {}
        }
        if self.clients[c].phase == Phase::Releasing(r) {
            self.op_finished(c);
        }
    }

    /// The holder goes away without releasing (a process that exits): the keys expire.
    fn abandon(&mut self, c: usize) {
        let Some(h) = self.clients[c].lock.take() else {
            return;
        };
        self.attempts[h.attempt].abandoned = true;
        self.stats.abandoned += 1;
        self.log(|| format!("c{c} a{} gives the lock up without a release", h.attempt));
        self.op_finished(c);
    }
}
