//! [`SimNode`]: one simulated Redis 7.0 master, running the crate's own Lua scripts
//! against a model of the commands they call.
//!
//! A request is either a plain command (its words, as a client sends them) or a script
//! (its name, `KEYS` and `ARGV`, as `EVAL`/`EVALSHA` send them). The node knows nothing of
//! what a script means: it runs the script's Lua source ([`Script`], loaded from the same
//! table the crate's node layer sends them from) with `redis.call` answered by the command
//! model, exactly as Redis would.

use std::fmt;
use std::rc::Rc;

use super::redis::{Fault, Store, expired};
use super::script;

/// What a crash keeps.
///
/// The default is [`Persistence::None`].
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, SimNode};
///
/// let node = SimNode::new(Persistence::AofAlways);
/// assert_eq!(node.persistence(), Persistence::AofAlways);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Persistence {
    /// No persistence (`--save "" --appendonly no`): a crash loses every key.
    #[default]
    None,
    /// AOF with `appendfsync always`: every acknowledged write survives a crash, expiry
    /// times included (they are absolute, by the node's clock).
    AofAlways,
}

/// One of the Lua scripts the node runs: its name, the files of `src/scripts/` it is made
/// of, its source and its SHA1.
///
/// [`scripts`](crate::sim::scripts) lists the crate's scripts, exactly as the crate sends
/// them; [`Script::replaced`] makes a variant of one with a piece of its text replaced (to
/// show that the simulator catches a known-unsafe change, see
/// [`Mutation`](crate::sim::Mutation)).
///
/// # Example
///
/// ```
/// let scripts = quorumlock::sim::scripts();
/// let extend = scripts.iter().find(|s| s.name() == "extend").ok_or("no extend")?;
/// assert_eq!(extend.files(), ["extend.lua"]);
/// assert!(extend.source().contains("PEXPIRE"));
/// assert_eq!(extend.sha1().len(), 40);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    name: &'static str,
    files: &'static [&'static str],
    source: Rc<str>,
    sha1: String,
}

impl Script {
    fn new(name: &'static str, files: &'static [&'static str], source: Rc<str>) -> Script {
        let sha1 = redis::Script::new(&source).get_hash().to_owned();
        Script {
            name,
            files,
            source,
            sha1,
        }
    }

    /// The script's name: its file under `src/scripts/` without `.lua`.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::scripts().iter().any(|s| s.name() == "release_one"));
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The files of `src/scripts/` the source is made of, in order (the wait-queue scripts
    /// have `queue.lua`'s helpers in front; the release's hand-off follows its fast path).
    ///
    /// # Example
    ///
    /// ```
    /// let all = quorumlock::sim::scripts();
    /// assert!(all.iter().any(|s| s.files() == ["release_one.lua", "queue.lua", "handoff.lua"]));
    /// ```
    pub fn files(&self) -> &'static [&'static str] {
        self.files
    }

    /// The Lua source, as sent to Redis.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::scripts().iter().all(|s| !s.source().is_empty()));
    /// ```
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The source's SHA1 in hex (what `EVALSHA` names it by).
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::scripts().iter().all(|s| s.sha1().len() == 40));
    /// ```
    pub fn sha1(&self) -> &str {
        &self.sha1
    }

    /// The same script with every occurrence of `from` in its source replaced by `to`, or
    /// `None` when the source does not contain `from` (a mutation that no longer applies
    /// must not pass silently).
    ///
    /// # Example
    ///
    /// ```
    /// let all = quorumlock::sim::scripts();
    /// let extend = all.iter().find(|s| s.name() == "extend").ok_or("no extend")?;
    /// let shortening = extend.replaced(", 'GT')", ")").ok_or("no GT")?;
    /// assert!(!shortening.source().contains("'GT'"));
    /// assert!(extend.replaced("no such text", "").is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replaced(&self, from: &str, to: &str) -> Option<Script> {
        if from.is_empty() || !self.source.contains(from) {
            return None;
        }
        let source: Rc<str> = Rc::from(self.source.replace(from, to));
        Some(Script::new(self.name, self.files, source))
    }
}

/// Every script the crate sends, in the crate's own order, exactly as it sends them (the
/// node layer's script table: one copy of each source).
///
/// # Example
///
/// ```
/// let names: Vec<&str> = quorumlock::sim::scripts().iter().map(|s| s.name()).collect();
/// assert!(names.contains(&"acquire_fenced") && names.contains(&"listen"));
/// ```
pub fn scripts() -> Vec<Script> {
    CRATE_SCRIPTS.with(|all| all.to_vec())
}

/// The crate's scripts, shared.
pub(crate) fn crate_scripts() -> Rc<[Script]> {
    CRATE_SCRIPTS.with(Rc::clone)
}

thread_local! {
    /// The crate's scripts, their SHA1s computed once per thread (a simulator makes many
    /// nodes).
    static CRATE_SCRIPTS: Rc<[Script]> = crate::io::node::SCRIPTS
        .iter()
        .map(|(name, lua)| Script::new(name, lua.files(), Rc::from(lua.code())))
        .collect();
}

/// A request to a node: a plain command or a script.
///
/// Times and TTLs are milliseconds, as on the wire. Every word is bytes, exactly as sent.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Reply, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let now_us = 1_764_543_600_000_000;
/// let set = Request::command(["SET", "k", "t", "NX", "PX", "1000", "GET"]);
/// assert_eq!(node.execute(now_us, &set), Ok(Reply::Nil));
/// let extend = Request::eval("extend", ["k"], ["t", "5000"]);
/// assert_eq!(node.execute(now_us, &extend), Ok(Reply::Int(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// A command: its name, then its arguments.
    Command(Vec<Vec<u8>>),
    /// A script by name (`EVAL` with [`execute`](SimNode::execute), `EVALSHA` with
    /// [`execute_sha`](SimNode::execute_sha)).
    Script {
        /// The script's [name](Script::name).
        name: &'static str,
        /// `KEYS`.
        keys: Vec<Vec<u8>>,
        /// `ARGV`.
        args: Vec<Vec<u8>>,
    },
    /// `SCRIPT LOAD` of a script by name: the real reply is its SHA1, and so is the
    /// simulator's.
    ScriptLoad(&'static str),
}

impl Request {
    /// A command from its words.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::Request;
    ///
    /// assert_eq!(Request::command(["GET", "k"]), Request::Command(vec![b"GET".to_vec(), b"k".to_vec()]));
    /// ```
    pub fn command<W: AsRef<[u8]>>(words: impl IntoIterator<Item = W>) -> Request {
        Request::Command(words.into_iter().map(|w| w.as_ref().to_vec()).collect())
    }

    /// A script request from its name, `KEYS` and `ARGV`.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::Request;
    ///
    /// let r = Request::eval("extend", ["k"], ["t", "10"]);
    /// assert_eq!(r.script(), Some("extend"));
    /// ```
    pub fn eval<K: AsRef<[u8]>, A: AsRef<[u8]>>(
        name: &'static str,
        keys: impl IntoIterator<Item = K>,
        args: impl IntoIterator<Item = A>,
    ) -> Request {
        Request::Script {
            name,
            keys: keys.into_iter().map(|k| k.as_ref().to_vec()).collect(),
            args: args.into_iter().map(|a| a.as_ref().to_vec()).collect(),
        }
    }

    /// The script this request runs, `None` for a command.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::Request::command(["PING"]).script(), None);
    /// ```
    pub fn script(&self) -> Option<&'static str> {
        match self {
            Request::Script { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A node's reply, as redis-rs would see it (RESP2; Lua numbers arrive as integers).
///
/// # Example
///
/// ```
/// use quorumlock::sim::Reply;
///
/// let e = Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into());
/// assert_eq!(e.error_code(), Some("WRONGTYPE"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A nil bulk string (or Lua `false`).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A status reply such as `OK` or `PONG`.
    Status(String),
    /// An array.
    Array(Vec<Reply>),
    /// An error reply: its code first (`ERR`, `WRONGTYPE`, `NOSCRIPT`, or the first word
    /// of a script's own error), then the message.
    Error(String),
}

impl Reply {
    /// The first word of an error reply, `None` for other replies.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::Reply::Int(1).error_code(), None);
    /// ```
    pub fn error_code(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => e.split(' ').next(),
            _ => None,
        }
    }
}

/// The node is down (crashed and not restarted): the request was not executed.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{NodeDown, Persistence, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// node.crash();
/// assert_eq!(node.execute(0, &Request::command(["PING"])), Err(NodeDown));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDown;

impl fmt::Display for NodeDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simulated node is down")
    }
}

impl std::error::Error for NodeDown {}

/// A key's value.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Request, SimNode, Value};
///
/// let mut node = SimNode::new(Persistence::None);
/// node.execute(0, &Request::command(["SET", "k", "v"]))?;
/// let (_, value, expiry) = node.entries(0).next().ok_or("no key")?;
/// assert_eq!(value, &Value::String(b"v".to_vec()));
/// assert_eq!(expiry, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A string (integers are strings, as in Redis).
    String(Vec<u8>),
    /// A sorted set: `(score, member)` in Redis order (score, then member bytes).
    SortedSet(Vec<(f64, Vec<u8>)>),
    /// A hash: `(field, value)` by field.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
}

impl Value {
    /// The name `TYPE` answers: `string`, `zset` or `hash`.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::Value::String(Vec::new()).type_name(), "string");
    /// ```
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::SortedSet(_) => "zset",
            Value::Hash(_) => "hash",
        }
    }
}

/// A message published by a script (`PUBLISH channel payload`).
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// node.execute(0, &Request::command(["SET", "k", "0123456789"]))?;
/// let release = Request::eval("release", ["k"], ["0123456789", "c"]);
/// node.execute(0, &release)?;
/// let sent = node.drain_published();
/// assert_eq!(sent[0].payload, b"01234567");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The channel.
    pub channel: Vec<u8>,
    /// The message.
    pub payload: Vec<u8>,
}

const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

/// One simulated Redis 7.0 master: keys, values and expiry in memory, the crate's Lua
/// scripts run by an embedded Lua 5.1 as Redis runs them, time an input.
///
/// `now_us` is the node's own wall clock in microseconds since the Unix epoch (what `TIME`
/// answers); expiry is in milliseconds (`now_us / 1000`), a key being visible up to and
/// including its expiry millisecond, as in Redis. The caller owns the clock: it can run
/// each node's clock at its own rate, or jump it. Nothing here reads a clock, sleeps, or
/// does I/O.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Reply, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let t0 = 1_764_543_600_000_000; // µs
/// let acquire = |token: &str| Request::command(["SET", "quorumlock:lock:{a}", token, "NX", "PX", "100", "GET"]);
/// assert_eq!(node.execute(t0, &acquire("A")), Ok(Reply::Nil));
/// assert_eq!(node.execute(t0, &acquire("B")), Ok(Reply::Bulk(b"A".to_vec())));
/// // 101 ms later the key has expired.
/// assert_eq!(node.execute(t0 + 101_000, &acquire("B")), Ok(Reply::Nil));
/// ```
#[derive(Clone)]
pub struct SimNode {
    store: Store,
    persistence: Persistence,
    down: bool,
    /// Which of `scripts` were loaded since the node started (by index).
    loaded: Vec<bool>,
    scripts: Rc<[Script]>,
}

impl Default for SimNode {
    fn default() -> SimNode {
        SimNode::new(Persistence::None)
    }
}

impl fmt::Debug for SimNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimNode")
            .field("keys", &self.store.keys.len())
            .field("persistence", &self.persistence)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl SimNode {
    /// An empty node that is up, with the crate's [`scripts`](crate::sim::scripts).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, SimNode};
    ///
    /// assert!(SimNode::new(Persistence::None).is_up());
    /// ```
    pub fn new(persistence: Persistence) -> SimNode {
        SimNode::with_scripts(persistence, crate_scripts())
    }

    /// An empty node that runs `scripts` (for instance with one of them
    /// [replaced](Script::replaced)) instead of the crate's. Nodes can share one list.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, Reply, Request, SimNode, scripts};
    ///
    /// let mutated: Vec<_> = scripts()
    ///     .into_iter()
    ///     .map(|s| if s.name() == "extend" { s.replaced(", 'GT')", ")").unwrap_or(s) } else { s })
    ///     .collect();
    /// let mut node = SimNode::with_scripts(Persistence::None, mutated.into());
    /// node.execute(0, &Request::command(["SET", "k", "t", "PX", "1000"]))?;
    /// // Without `GT`, an extension to a shorter TTL shortens the key.
    /// node.execute(0, &Request::eval("extend", ["k"], ["t", "10"]))?;
    /// assert_eq!(node.execute(0, &Request::command(["PTTL", "k"]))?, Reply::Int(10));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn with_scripts(persistence: Persistence, scripts: Rc<[Script]>) -> SimNode {
        SimNode {
            store: Store::default(),
            persistence,
            down: false,
            loaded: vec![false; scripts.len()],
            scripts,
        }
    }

    /// The scripts this node runs (and loaded when it was made), in the crate's order.
    ///
    /// # Example
    ///
    /// ```
    /// let node = quorumlock::sim::SimNode::default();
    /// assert!(node.scripts().iter().any(|s| s.name() == "listen"));
    /// ```
    pub fn scripts(&self) -> &[Script] {
        &self.scripts
    }

    /// The node's persistence.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, SimNode};
    ///
    /// assert_eq!(SimNode::default().persistence(), Persistence::None);
    /// ```
    pub fn persistence(&self) -> Persistence {
        self.persistence
    }

    /// Whether the node is up (not crashed, or restarted since).
    ///
    /// # Example
    ///
    /// ```
    /// let mut node = quorumlock::sim::SimNode::default();
    /// node.crash();
    /// assert!(!node.is_up());
    /// ```
    pub fn is_up(&self) -> bool {
        !self.down
    }

    /// Kills the process: with [`Persistence::None`] every key is lost; with
    /// [`Persistence::AofAlways`] every acknowledged write survives. The script cache and
    /// subscribers (connections) are lost either way. Requests fail with [`NodeDown`]
    /// until [`restart`](SimNode::restart).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, Reply, Request, SimNode};
    ///
    /// let mut node = SimNode::new(Persistence::AofAlways);
    /// node.execute(0, &Request::command(["SET", "k", "v"]))?;
    /// node.crash();
    /// node.restart();
    /// assert_eq!(node.execute(0, &Request::command(["GET", "k"]))?, Reply::Bulk(b"v".to_vec()));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn crash(&mut self) {
        self.down = true;
        if self.persistence != Persistence::AofAlways {
            self.store.keys.clear();
        }
        self.loaded.iter_mut().for_each(|l| *l = false);
        self.store.subscribers.clear();
    }

    /// Starts the process again after [`crash`](SimNode::crash) (a no-op when up).
    ///
    /// # Example
    ///
    /// ```
    /// let mut node = quorumlock::sim::SimNode::default();
    /// node.crash();
    /// node.restart();
    /// assert!(node.is_up());
    /// ```
    pub fn restart(&mut self) {
        self.down = false;
    }

    /// Sets how many connections are subscribed to `channel` (what `PUBLISH` answers).
    /// The default is 0 for every channel.
    ///
    /// # Example
    ///
    /// ```
    /// let mut node = quorumlock::sim::SimNode::default();
    /// node.set_subscribers(b"quorumlock:released:{a}", 2);
    /// ```
    pub fn set_subscribers(&mut self, channel: &[u8], count: u32) {
        if count == 0 {
            self.store.subscribers.remove(channel);
        } else {
            self.store
                .subscribers
                .insert(channel.to_vec(), i64::from(count));
        }
    }

    /// Takes the messages published since the last call, oldest first.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::SimNode::default().drain_published().is_empty());
    /// ```
    pub fn drain_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.store.published)
    }

    /// Active expiry: removes every key expired at `now_us`. Never needed for
    /// correctness (expired keys are invisible to every request), only to bound memory
    /// and to make [`len`](SimNode::len) exact.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// node.execute(0, &Request::command(["SET", "k", "t", "PX", "5"]))?;
    /// node.advance(6_000);
    /// assert_eq!(node.len(), 0);
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn advance(&mut self, now_us: u64) {
        let now = now_us / 1000;
        self.store.keys.retain(|_, e| !expired(e, now));
    }

    /// How many keys the node stores, expired ones not yet removed included.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::SimNode::default().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.store.keys.len()
    }

    /// Whether the node stores no key.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::SimNode::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.store.keys.is_empty()
    }

    /// The live keys at `now_us` in key order: key, value, absolute expiry in ms.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// node.execute(2_000, &Request::command(["SET", "k", "t", "PX", "5"]))?;
    /// let (key, _, expiry) = node.entries(2_000).next().ok_or("no key")?;
    /// assert_eq!((key, expiry), (&b"k"[..], Some(7)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn entries(&self, now_us: u64) -> impl Iterator<Item = (&[u8], &Value, Option<u64>)> {
        let now = now_us / 1000;
        self.store
            .keys
            .iter()
            .filter(move |(_, e)| !expired(e, now))
            .map(|(k, e)| (k.as_slice(), &e.value, e.expires_at))
    }

    /// Runs one request at the node's clock `now_us` (a script as by `EVAL`, which also
    /// loads it for [`execute_sha`](SimNode::execute_sha)).
    ///
    /// # Errors
    ///
    /// [`NodeDown`] while the node is crashed. Redis errors are replies
    /// ([`Reply::Error`]), an unknown script's name too.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Reply, Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// assert_eq!(node.execute(0, &Request::command(["PING"]))?, Reply::Status("PONG".into()));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn execute(&mut self, now_us: u64, req: &Request) -> Result<Reply, NodeDown> {
        self.run(now_us, req, false)
    }

    /// Runs a script request as by `EVALSHA`: `NOSCRIPT` unless the script was loaded
    /// ([`Request::ScriptLoad`] or [`execute`](SimNode::execute)) since the node started.
    /// Other requests run as by [`execute`](SimNode::execute).
    ///
    /// # Errors
    ///
    /// [`NodeDown`] while the node is crashed.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Reply, Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// let r = Request::eval("extend", ["k"], ["t", "10"]);
    /// assert_eq!(node.execute_sha(0, &r)?.error_code(), Some("NOSCRIPT"));
    /// node.execute(0, &r)?;
    /// assert_eq!(node.execute_sha(0, &r)?, Reply::Int(0));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn execute_sha(&mut self, now_us: u64, req: &Request) -> Result<Reply, NodeDown> {
        self.run(now_us, req, true)
    }

    fn run(&mut self, now_us: u64, req: &Request, sha: bool) -> Result<Reply, NodeDown> {
        if self.down {
            return Err(NodeDown);
        }
        Ok(match req {
            Request::Command(words) => self.command(now_us, words),
            Request::ScriptLoad(name) => match self.index(name) {
                Some(i) => {
                    self.loaded[i] = true;
                    Reply::Bulk(self.scripts[i].sha1.clone().into_bytes())
                }
                None => Reply::Error(format!("ERR simulator: no script named {name}")),
            },
            Request::Script { name, keys, args } => {
                let Some(i) = self.index(name) else {
                    return Ok(Reply::Error(format!(
                        "ERR simulator: no script named {name}"
                    )));
                };
                if sha && !self.loaded[i] {
                    return Ok(Reply::Error(NOSCRIPT.to_owned()));
                }
                self.loaded[i] = true;
                let s = &self.scripts[i];
                let source = script::Source {
                    sha: &s.sha1,
                    code: &s.source,
                };
                script::eval(&mut self.store, now_us, &source, keys, args)
            }
        })
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.scripts.iter().position(|s| s.name == name)
    }

    /// A command from a client, worded as Redis words a client's mistakes.
    fn command(&mut self, now_us: u64, words: &[Vec<u8>]) -> Reply {
        if let Some(reply) = self.admin(words) {
            return reply;
        }
        match self.store.command(now_us, words) {
            Ok(r) => r,
            Err(Fault::Arity(name)) => Reply::Error(format!(
                "ERR wrong number of arguments for '{name}' command"
            )),
            Err(Fault::Unknown) => {
                let name = words
                    .first()
                    .map_or(String::new(), |w| String::from_utf8_lossy(w).into_owned());
                Reply::Error(format!(
                    "ERR unknown command '{name}', with args beginning with: "
                ))
            }
        }
    }

    /// The deployment checks' commands (`CONFIG GET`, `INFO replication`), answered as a
    /// contract node does.
    fn admin(&self, words: &[Vec<u8>]) -> Option<Reply> {
        let upper = |i: usize| words.get(i).map(|w| w.to_ascii_uppercase());
        match (upper(0)?.as_slice(), words.len()) {
            (b"CONFIG", 3) if upper(1)?.as_slice() == b"GET" => {
                let name = words.get(2)?;
                let aof = self.persistence == Persistence::AofAlways;
                let value: &[u8] = match name.as_slice() {
                    b"maxmemory-policy" => b"noeviction",
                    b"appendonly" if aof => b"yes",
                    b"appendonly" => b"no",
                    b"appendfsync" if aof => b"always",
                    b"appendfsync" => b"everysec",
                    b"save" => b"",
                    _ => return Some(Reply::Array(Vec::new())),
                };
                Some(Reply::Array(vec![
                    Reply::Bulk(name.clone()),
                    Reply::Bulk(value.to_vec()),
                ]))
            }
            (b"INFO", _) => Some(Reply::Bulk(
                b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n".to_vec(),
            )),
            _ => None,
        }
    }
}
