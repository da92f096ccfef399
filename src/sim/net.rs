//! Connections and calls: how a request built by `node.rs` travels to a simulated node and
//! how its answer comes back, decoded by `node.rs` (the clocks, links and calls themselves
//! are plain data in `state.rs`).
//!
//! The real node layer (`node.rs`) sends each request on the node's one connection,
//! bounded by the per-node timeout, scripts as `EVALSHA` with an `EVAL` fallback on
//! `NOSCRIPT` on the same connection, and lets an idempotent script finish in the
//! background after its caller stopped waiting. Here that I/O is re-expressed as events:
//!
//! * a **call** is one request of one client to one node; it is sent at once, or, when it
//!   must follow the lock's acquire request on that node (`lock.rs`'s `ordered`), once that
//!   request completed;
//! * each (client, node) **connection** is FIFO in both directions, each message with its
//!   own random delay; losing it (a fault) loses every message in flight on it, and messages
//!   sent while it is down are lost too (the caller sees its timeout); a request that had
//!   already reached a paused node's input still runs when the node resumes, but its reply
//!   is lost;
//! * a request reaching a crashed node fails (connection refused);
//! * the **timeout** fires on the client's own clock; a command or non-idempotent script
//!   whose caller stopped waiting is abandoned (its `NOSCRIPT` gets no `EVAL`, its reply
//!   is ignored), an idempotent one finishes in the background, for at most
//!   [`LATE_LIMIT`](crate::io::node::LATE_LIMIT); a call whose round was cancelled is dropped
//!   (no background finish).
//!
//! Each answer is turned into the `redis::Value` (or `RedisError`) redis-rs would produce
//! and decoded by `node::decode`, the function the real client uses.

use std::rc::Rc;

use redis::Value;

use super::node::{Reply as SimReply, Request as SimRequest};
use super::state::{Call, Kind, Owner, Raw, short};
use super::world::{Invariant, World};
use crate::base::metrics::Op;
use crate::io::node::{self, Answer, Sent};
use crate::protocol::Reply;

/// A request as the simulated node runs it, from what `node.rs` would put on the wire.
pub(super) struct Translated {
    pub(super) req: Rc<SimRequest>,
    pub(super) answer: Answer,
    pub(super) script: bool,
    pub(super) idempotent: bool,
    /// A release (its run on a node counts for the "no key left behind" check).
    pub(super) release: bool,
}

/// Reads a request built by `node::Request`'s constructors as a simulator request: a
/// command's words, or a script's name (found in the node layer's script table by its
/// source), keys and arguments, as they are.
pub(super) fn translate(req: &node::Request) -> Result<Translated, String> {
    let (sim, script, idempotent) = wire(req.sent())?;
    Ok(Translated {
        req: Rc::new(sim),
        answer: req.answer(),
        script,
        idempotent,
        release: req.op() == Op::Release,
    })
}

/// A wait-queue join built by `node::QueueJoin`, as the simulated node runs it.
pub(super) fn translate_join(join: &node::QueueJoin) -> Result<SimRequest, String> {
    wire(join.sent()).map(|(r, _, _)| r)
}

/// The request, whether it is a script, and whether it is idempotent.
fn wire(sent: Sent<'_>) -> Result<(SimRequest, bool, bool), String> {
    Ok(match sent {
        Sent::Cmd(words) => (
            SimRequest::Command(words.iter().map(|w| w.to_vec()).collect()),
            false,
            false,
        ),
        Sent::Script(code, idempotent, keys, args) => {
            let Some((name, _)) = node::SCRIPTS
                .iter()
                .find(|(_, lua)| std::ptr::eq(code, lua.code()))
            else {
                return Err("a script missing from the node layer's script table".to_owned());
            };
            let r = SimRequest::Script {
                name,
                keys: keys.to_vec(),
                args: args.to_vec(),
            };
            (r, true, idempotent)
        }
    })
}

/// The value redis-rs would hand over for a simulated reply.
fn to_value(r: &SimReply) -> Value {
    match r {
        SimReply::Nil => Value::Nil,
        SimReply::Int(i) => Value::Int(*i),
        SimReply::Bulk(b) => Value::BulkString(b.clone()),
        SimReply::Status(s) if s == "OK" => Value::Okay,
        SimReply::Status(s) => Value::SimpleString(s.clone()),
        SimReply::Array(a) => Value::Array(a.iter().map(to_value).collect()),
        SimReply::Error(e) => match redis::parse_redis_value(format!("-{e}\r\n").as_bytes()) {
            Ok(v) => v,
            Err(_) => Value::SimpleString(e.clone()),
        },
    }
}

/// The raw answer redis-rs would give the node layer.
fn to_raw(r: &Raw) -> node::Reply {
    match r {
        Raw::Node(SimReply::Error(e)) => {
            node::Reply::from_result(redis::parse_redis_value(format!("-{e}\r\n").as_bytes()))
        }
        Raw::Node(v) => node::Reply::from_result(Ok(to_value(v))),
        Raw::Refused => node::Reply::Error(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (simulated node down)",
        ))),
    }
}

/// A request as one line of the trace: the command's words or the script's name and
/// arguments (long ones shortened), without the keys.
pub(super) fn show_request(r: &SimRequest) -> String {
    let words = |ws: &[Vec<u8>]| ws.iter().map(|w| short(w)).collect::<Vec<_>>().join(" ");
    match r {
        SimRequest::Command(ws) => words(ws),
        SimRequest::Script { name, args, .. } => format!("{} {}", name.to_uppercase(), words(args)),
        SimRequest::ScriptLoad(name) => format!("SCRIPT LOAD {name}"),
    }
}

fn show_reply(r: &SimReply) -> String {
    match r {
        SimReply::Nil => "nil".into(),
        SimReply::Int(i) => i.to_string(),
        SimReply::Bulk(b) => format!("\"{}\"", short(b)),
        SimReply::Status(s) => s.clone(),
        SimReply::Array(a) => format!(
            "[{}]",
            a.iter().map(show_reply).collect::<Vec<_>>().join(", ")
        ),
        SimReply::Error(e) => format!("-{e}"),
    }
}

impl World {
    /// Creates a call and sends it now (or leaves it for `send_ready` when `gated`); its
    /// timeout starts now, on the client's clock.
    pub(super) fn new_call(
        &mut self,
        client: usize,
        node: usize,
        attempt: usize,
        t: &Translated,
        owner: Owner,
        gated: bool,
    ) -> usize {
        let id = self.calls.len();
        self.calls.push(Call {
            client,
            node,
            attempt,
            req: t.req.clone(),
            answer: t.answer,
            script: t.script,
            idempotent: t.idempotent,
            release: t.release,
            owner,
            sent: false,
            eval: false,
            waiting: true,
            late: false,
            late_until: 0,
            done: false,
        });
        let clock = self.clients[client].clock;
        let at = clock.when(clock.at(self.now).saturating_add(self.p.node_timeout_us));
        self.push(at, Kind::Timeout { call: id });
        if !gated {
            self.send(id);
        }
        id
    }

    /// A gated call's node finished the lock's acquire request: send it, if anyone still
    /// wants it.
    pub(super) fn send_ready(&mut self, id: usize) {
        let now = self.now;
        if self.calls[id].sent || !self.calls[id].alive(now) {
            return;
        }
        self.send(id);
    }

    /// Puts a call on the wire: `EVALSHA` for a script (`EVAL` once `NOSCRIPT` came back),
    /// the command otherwise.
    fn send(&mut self, id: usize) {
        let call = &mut self.calls[id];
        call.sent = true;
        let eval = call.eval;
        let (c, i) = (call.client, call.node);
        let l = c * self.p.nodes + i;
        if !self.links[l].up {
            self.log(|| format!("c{c} → n{i} #{id} lost (connection down)"));
            return;
        }
        let delay = self.delay();
        let link = &mut self.links[l];
        let at = (self.now + delay).max(link.to_node);
        link.to_node = at;
        let epoch = link.epoch;
        self.push(
            at,
            Kind::ToNode {
                call: id,
                epoch,
                eval,
            },
        );
    }

    /// A request reaches its node.
    pub(super) fn at_node(&mut self, id: usize, epoch: u32, eval: bool) {
        let (c, i) = (self.calls[id].client, self.calls[id].node);
        let l = c * self.p.nodes + i;
        if self.links[l].epoch != epoch {
            self.log(|| format!("n{i} ← c{c} #{id} lost with its connection"));
            return;
        }
        let node = &mut self.nodes[i];
        if !node.sim.is_up() {
            self.log(|| format!("n{i} ← c{c} #{id} refused: node down"));
            self.reply(id, epoch, Raw::Refused);
            return;
        }
        if node.paused {
            node.inbox.push_back((id, epoch, eval));
            return;
        }
        self.execute(i, id, epoch, eval);
    }

    /// Node `i` runs a call's request at its clock's current reading.
    pub(super) fn execute(&mut self, i: usize, id: usize, epoch: u32, eval: bool) {
        let now_n = self.nodes[i].clock.at(self.now);
        let req = self.calls[id].req.clone();
        let node = &mut self.nodes[i].sim;
        let result = if self.calls[id].script && !eval {
            node.execute_sha(now_n, &req)
        } else {
            node.execute(now_n, &req)
        };
        // Announcements are not modelled further (no subscribers).
        let _ = node.drain_published();
        let reply = match result {
            Ok(r) => r,
            Err(_) => {
                self.reply(id, epoch, Raw::Refused);
                return;
            }
        };
        self.stats.executed += 1;
        let ran = reply.error_code() != Some("NOSCRIPT");
        if ran && self.calls[id].release {
            let a = self.calls[id].attempt;
            self.attempts[a].ran |= 1u64 << i;
        }
        if self.tracing() {
            let c = self.calls[id].client;
            let (what, got) = (show_request(&req), show_reply(&reply));
            let sha = if self.calls[id].script && !eval {
                " (EVALSHA)"
            } else {
                ""
            };
            self.log(|| format!("n{i} runs c{c} #{id} {what}{sha} → {got}"));
        }
        self.reply(id, epoch, Raw::Node(reply));
    }

    /// Sends a reply back on the call's connection.
    fn reply(&mut self, id: usize, epoch: u32, raw: Raw) {
        let l = self.calls[id].client * self.p.nodes + self.calls[id].node;
        if self.links[l].epoch != epoch {
            return;
        }
        let delay = self.delay();
        let link = &mut self.links[l];
        let at = (self.now + delay).max(link.to_client);
        link.to_client = at;
        self.push(
            at,
            Kind::ToClient {
                call: id,
                epoch,
                reply: raw,
            },
        );
    }

    /// A reply reaches its client.
    pub(super) fn at_client(&mut self, id: usize, epoch: u32, raw: Raw) {
        let call = &self.calls[id];
        let (c, i) = (call.client, call.node);
        if self.links[c * self.p.nodes + i].epoch != epoch || call.done {
            return;
        }
        let now = self.now;
        if let Raw::Node(r) = &raw
            && r.error_code() == Some("NOSCRIPT")
            && call.script
            && !call.eval
        {
            // `EVALSHA` found no script: `EVAL` on the same connection, if the exchange
            // still goes on.
            if call.alive(now) {
                self.calls[id].eval = true;
                self.log(|| format!("c{c} ← n{i} #{id} NOSCRIPT: sends EVAL"));
                self.send(id);
            } else {
                self.calls[id].done = true;
            }
            return;
        }
        let waiting = call.waiting;
        self.calls[id].done = true;
        if !waiting {
            return;
        }
        let answer = self.calls[id].answer;
        let typed = node::decode(answer, to_raw(&raw));
        self.log(|| format!("c{c} ← n{i} #{id} {typed:?}"));
        self.complete(id, typed);
    }

    /// A call's per-node timeout.
    pub(super) fn call_timeout(&mut self, id: usize) {
        let call = &mut self.calls[id];
        if call.done || !call.waiting {
            return;
        }
        call.waiting = false;
        if call.idempotent {
            call.late = true;
            call.late_until = self.now.saturating_add(node::LATE_LIMIT.as_micros() as u64);
        } else {
            // The request future is dropped: nothing more happens on our side.
            call.done = true;
        }
        let (c, i) = (call.client, call.node);
        self.log(|| format!("c{c} #{id} (n{i}) timed out"));
        self.complete(id, Reply::TimedOut);
    }

    /// The caller dropped the call (its round was cancelled): no background finish.
    pub(super) fn drop_call(&mut self, id: usize) {
        let call = &mut self.calls[id];
        call.waiting = false;
        call.late = false;
        call.done = true;
    }

    /// Records that the simulator met something it cannot model.
    pub(super) fn sim_error(&mut self, what: String) {
        self.violate(Invariant::Simulator, what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::resource::Resources;
    use crate::base::token::Token;
    use crate::io::node::Request;
    use std::time::Duration;

    /// A request the client builds reads as the same words (a command) or the same
    /// script, keys and arguments (a script), with its release flag.
    #[test]
    fn translation_keeps_the_wire_as_built() {
        let res = Resources::new(&["r"]).unwrap();
        let token = Token::from_bytes([0xab; 16]);
        let tok = token.as_bytes().to_vec();
        let key = res.lock_keys()[0].clone();
        let ttl = Duration::from_micros(1_500);
        let t = translate(&Request::acquire(res.lock_keys(), &token, ttl)).unwrap();
        let words: Vec<Vec<u8>> = [&b"SET"[..], &key, &tok, b"NX", b"PX", b"2", b"GET"]
            .iter()
            .map(|w| w.to_vec())
            .collect();
        assert_eq!(*t.req, SimRequest::Command(words));
        assert!(!t.script && !t.release);
        let t = translate(&Request::extend(vec![key.clone()], &token, ttl)).unwrap();
        assert_eq!(
            *t.req,
            SimRequest::Script {
                name: "extend",
                keys: vec![key.clone()],
                args: vec![tok.clone(), b"2".to_vec()],
            }
        );
        assert!(t.script && t.idempotent && !t.release);
        let t = translate(&Request::release(&res, &token, b"w", true)).unwrap();
        assert!(
            matches!(
                &*t.req,
                SimRequest::Script {
                    name: "release_one",
                    ..
                }
            ) && t.release
        );
        let many = Resources::new(&["a", "b"]).unwrap();
        let t = translate(&Request::acquire(many.lock_keys(), &token, ttl)).unwrap();
        assert!(
            matches!(&*t.req, SimRequest::Script { name: "acquire", keys, .. } if keys.len() == 2)
        );
    }

    /// Simulated replies decode through `node::decode` as the real ones do.
    #[test]
    fn decoding() {
        let d = |a, r| node::decode(a, to_raw(&r));
        assert_eq!(d(Answer::Acquire, Raw::Node(SimReply::Nil)), Reply::Granted);
        assert!(matches!(
            d(Answer::Acquire, Raw::Node(SimReply::Bulk(b"x".to_vec()))),
            Reply::HeldBy(Some(_))
        ));
        assert_eq!(
            d(
                Answer::Acquire,
                Raw::Node(SimReply::Array(vec![SimReply::Int(1), SimReply::Int(9)]))
            ),
            Reply::Fenced(9)
        );
        match d(
            Answer::Compare,
            Raw::Node(SimReply::Error("WRONGTYPE Operation".into())),
        ) {
            Reply::Failed(t) => assert!(t.contains("WRONGTYPE"), "{t}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(d(Answer::Release, Raw::Refused), Reply::Failed(_)));
        let noscript = redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n");
        match node::Reply::from_result(noscript) {
            node::Reply::Error(e) => assert_eq!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            ),
            other => panic!("{other:?}"),
        }
    }
}
