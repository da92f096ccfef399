//! [`SimNode`]: one simulated Redis 7.0 master.

use std::collections::BTreeMap;
use std::fmt;

use super::lua;

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

/// How faithfully the node behaves: as Redis with quorumlock's scripts (the default), or
/// with one deliberate, known-unsafe deviation, so that a simulator can show that its
/// invariants catch it.
///
/// The default is [`Variant::Redis`].
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Reply, Request, SimNode, Variant};
///
/// let mut node = SimNode::new(Persistence::None).with_variant(Variant::ExtendWithoutGt);
/// let key = b"k".to_vec();
/// let token = b"t".to_vec();
/// node.execute(0, &Request::SetNxPxGet { key: key.clone(), token: token.clone(), ttl_ms: 1000 })?;
/// // Without `GT`, an extension to a shorter TTL shortens the key.
/// node.execute(0, &Request::Extend { keys: vec![key.clone()], token, ttl_ms: 10 })?;
/// assert_eq!(node.execute(0, &Request::Pttl(key))?, Reply::Int(10));
/// # Ok::<(), quorumlock::sim::NodeDown>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Variant {
    /// Redis 7.0 running quorumlock's scripts exactly.
    #[default]
    Redis,
    /// The extend script sets the new expiry with plain `PEXPIRE` (no `GT`): an extension
    /// with a shorter TTL shortens the key.
    ExtendWithoutGt,
    /// The release scripts (`release`, `release_one`) delete the lock key whatever token
    /// it holds.
    ReleaseWithoutTokenCheck,
}

/// One of the Lua scripts quorumlock runs, for [`Request::ScriptLoad`] and
/// [`SimNode::execute_sha`] (`EVALSHA` answers `NOSCRIPT` until the script was loaded or
/// run with `EVAL` since the node last started).
///
/// # Example
///
/// ```
/// use quorumlock::sim::Script;
///
/// assert_eq!(Script::Extend.name(), "extend");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Script {
    /// `acquire.lua`: take every key or none.
    Acquire,
    /// `acquire_fenced.lua`: fenced acquire, round 1.
    AcquireFenced,
    /// `commit_fence.lua`: fenced acquire, round 2.
    CommitFence,
    /// `extend.lua`: compare-and-extend.
    Extend,
    /// `release.lua`: compare-and-delete, announcing the release.
    Release,
    /// `release_one.lua`: compare-and-delete of one key, transferring to the queue's head.
    ReleaseOne,
    /// `enqueue.lua`: join or renew a place in a wait queue.
    Enqueue,
    /// `claim.lua`: a queued waiter's acquire of one key (its own token counts as granted).
    Claim,
    /// `enqueue_many.lua`: join or renew a multi-resource waiter's place in all its queues.
    EnqueueMany,
    /// `claim_many.lua`: a queued multi-resource waiter's acquire of every key or none.
    ClaimMany,
}

impl Script {
    /// The script's file name under `src/scripts/`, without `.lua`.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::Script::CommitFence.name(), "commit_fence");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Script::Acquire => "acquire",
            Script::AcquireFenced => "acquire_fenced",
            Script::CommitFence => "commit_fence",
            Script::Extend => "extend",
            Script::Release => "release",
            Script::ReleaseOne => "release_one",
            Script::Enqueue => "enqueue",
            Script::Claim => "claim",
            Script::EnqueueMany => "enqueue_many",
            Script::ClaimMany => "claim_many",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// A request quorumlock sends to a node: every script (with its `KEYS` and `ARGV` typed)
/// and every plain command, plus a few inspection commands for checkers and tests.
///
/// Times and TTLs are milliseconds, as on the wire. Byte strings are keys, tokens, ids and
/// channels exactly as sent.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Reply, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let now_us = 1_764_543_600_000_000;
/// let set = Request::SetNxPxGet { key: b"k".to_vec(), token: b"t".to_vec(), ttl_ms: 1000 };
/// assert_eq!(node.execute(now_us, &set), Ok(Reply::Nil));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// `SET key token NX PX ttl GET` (the single-resource acquire): nil when set, the
    /// current value when the key exists (then nothing is written), `WRONGTYPE` when the
    /// key is not a string.
    SetNxPxGet {
        /// The lock key.
        key: Vec<u8>,
        /// Our token.
        token: Vec<u8>,
        /// The TTL in ms (0 is refused, as by Redis).
        ttl_ms: u64,
    },
    /// `acquire.lua`: 1 when every key was set, 0 when any existed, -1 when every key held
    /// this very token already.
    Acquire {
        /// The lock keys.
        keys: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// The TTL in ms.
        ttl_ms: u64,
    },
    /// `acquire_fenced.lua`: `[0]`, or `[1, largest new counter]`, or an error (no write)
    /// when a counter is not a plain decimal integer below 2^53. `KEYS` is `locks` then
    /// `fences`.
    AcquireFenced {
        /// The lock keys.
        locks: Vec<Vec<u8>>,
        /// The fence counters, one per lock key, in the same order.
        fences: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// The TTL in ms.
        ttl_ms: u64,
    },
    /// `commit_fence.lua`: 1 when every lock key holds our token (each counter is then at
    /// least `t`), 0 otherwise. `KEYS` is `locks` then `fences`.
    CommitFence {
        /// The lock keys.
        locks: Vec<Vec<u8>>,
        /// The fence counters.
        fences: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// The fencing token to commit.
        t: u64,
    },
    /// `extend.lua`: 1 when every key holds our token (expiries only ever move later,
    /// `PEXPIRE … GT`), 0 otherwise.
    Extend {
        /// The lock keys.
        keys: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// The new TTL in ms.
        ttl_ms: u64,
    },
    /// `release.lua`: `[deleted, listeners]`.
    Release {
        /// The lock keys.
        keys: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// Channels to announce the release on (none for a silent release).
        channels: Vec<Vec<u8>>,
    },
    /// `release_one.lua` (the mutex's release, on every node), each resource in order:
    /// our own entries leave its queue first; then `[0, waiters]` when its key does not
    /// hold our token; else lapsed entries are purged and the head popped: a transfer entry
    /// gets the key (`[2, waiters left, fence]`, announced
    /// `<token prefix>:>:<token>[:<fence>]`), a name-only entry is named when `loud`
    /// (`[1, waiters]`, `<token prefix>:<token>`); with no live entry the key is deleted
    /// and, when `loud`, `<token prefix>` announced. One resource answers as above;
    /// several answer `[how many resources' releases found our token, most waiters of any]`
    /// (a key handed over with an earlier resource's is not counted again).
    ReleaseOne {
        /// Our token.
        token: Vec<u8>,
        /// The queue entry the holder waited under (empty for none).
        waiter: Vec<u8>,
        /// The resources, in order.
        resources: Vec<Queued>,
        /// The releaser's set key (`enqueue_many.lua`), deleted first; empty for none.
        set: Vec<u8>,
    },
    /// `enqueue.lua` (join or renew): `[state, ahead, ticket, holds, free]`: state 0 queued
    /// (renewed), 1 added, 2 gone (never re-added); `ahead` how many entries have a
    /// lower ticket (entries with the same ticket, a waiter's retired tokens, are not
    /// ahead of it) and `ticket` its score as text (both nil when not queued); `holds` 1 when the lock key holds the
    /// token; `free` 1 when the lock key is absent.
    Enqueue {
        /// The wait queue.
        queue: Vec<u8>,
        /// The waiters' leases.
        leases: Vec<u8>,
        /// The entries' attributes.
        attrs: Vec<u8>,
        /// The lock key.
        key: Vec<u8>,
        /// The waiter's token.
        waiter: Vec<u8>,
        /// Its ticket (decimal text), or empty on a first join to have the node assign
        /// its own clock in µs.
        arrival: Vec<u8>,
        /// The lease, in ms.
        wait_ms: u64,
        /// The TTL a transfer sets the key with, in ms.
        ttl_ms: u64,
        /// The entry's kind: `t` transfer, `f` fenced transfer, `n` name-only.
        kind: u8,
        /// Whether this is the first join of this token on this node (only a first join
        /// adds it).
        first: bool,
        /// The channel a transfer to this entry is announced on (the waiter's own), or
        /// empty for the resource's channel.
        inbox: Vec<u8>,
    },
    /// `claim.lua`: nil when granted (the key was free, or already held our token: its
    /// expiry is then set to the TTL), else the holder's token.
    Claim {
        /// The lock key.
        key: Vec<u8>,
        /// Our token.
        token: Vec<u8>,
        /// The TTL in ms.
        ttl_ms: u64,
    },
    /// `enqueue_many.lua` (a multi-resource waiter's join or renewal, in every queue of
    /// its set at once; entries of kind `m`, attributes `<ttl ms>:m:<set key>`; the set
    /// key holds the channel and each resource's lock, queue, leases and attributes keys,
    /// each as `<length>:<bytes>`, and lapses with the lease): `[state, ahead, ticket,
    /// holds, free]` as [`Request::Enqueue`], with `ahead` the most in any one queue,
    /// `holds` 1 when every lock key holds the token, `free` 1 when none holds any. A renewal that finds the token missing from
    /// some queue drops it from all (gone).
    EnqueueMany {
        /// Per resource: its queue, leases, attributes and lock key.
        queues: Vec<[Vec<u8>; 4]>,
        /// The waiter's set key.
        set: Vec<u8>,
        /// The waiter's token.
        waiter: Vec<u8>,
        /// Its ticket (decimal text), or empty on a first join.
        arrival: Vec<u8>,
        /// The lease, in ms.
        wait_ms: u64,
        /// The TTL a transfer sets the keys with, in ms.
        ttl_ms: u64,
        /// Whether this is the first join of this token on this node.
        first: bool,
        /// The channel a transfer to this waiter is announced on.
        inbox: Vec<u8>,
    },
    /// `claim_many.lua`: 1 when every key was free or held our token (each now holds it
    /// with the TTL), else 0 (nothing written).
    ClaimMany {
        /// The lock keys.
        keys: Vec<Vec<u8>>,
        /// Our token.
        token: Vec<u8>,
        /// The TTL in ms.
        ttl_ms: u64,
    },
    /// `PING`: `PONG`.
    Ping,
    /// `CONFIG GET name` for `maxmemory-policy`, `appendonly`, `appendfsync`, `save`:
    /// `[name, value]` (an empty array for other names).
    ConfigGet(Vec<u8>),
    /// `INFO replication`: a bulk string with `role:master`.
    InfoReplication,
    /// `SCRIPT LOAD`: the real reply is the script's SHA1; the simulator answers the
    /// script's [name](Script::name).
    ScriptLoad(Script),
    /// `GET key` (inspection; quorumlock does not send it).
    Get(Vec<u8>),
    /// `SET key value` (no options; inspection and test set-up).
    Set {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// `PTTL key`: -2 when missing, -1 without expiry, else the ms left.
    Pttl(Vec<u8>),
}

impl Request {
    /// The script this request runs, `None` for a plain command.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Request, Script};
    ///
    /// assert_eq!(Request::Ping.script(), None);
    /// let r = Request::Extend { keys: vec![b"k".to_vec()], token: b"t".to_vec(), ttl_ms: 10 };
    /// assert_eq!(r.script(), Some(Script::Extend));
    /// ```
    pub fn script(&self) -> Option<Script> {
        Some(match self {
            Request::Acquire { .. } => Script::Acquire,
            Request::AcquireFenced { .. } => Script::AcquireFenced,
            Request::CommitFence { .. } => Script::CommitFence,
            Request::Extend { .. } => Script::Extend,
            Request::Release { .. } => Script::Release,
            Request::ReleaseOne { .. } => Script::ReleaseOne,
            Request::Enqueue { .. } => Script::Enqueue,
            Request::Claim { .. } => Script::Claim,
            Request::EnqueueMany { .. } => Script::EnqueueMany,
            Request::ClaimMany { .. } => Script::ClaimMany,
            _ => return None,
        })
    }
}

/// One resource of a [`Request::ReleaseOne`]: its keys, its channel, and whether this node
/// announces its plain releases.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Queued, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let token = b"0123456789".to_vec();
/// let resource = |name: &str| Queued {
///     key: format!("lock:{name}").into_bytes(),
///     queue: format!("queue:{name}").into_bytes(),
///     leases: format!("qlease:{name}").into_bytes(),
///     attrs: format!("qattrs:{name}").into_bytes(),
///     fence: format!("fence:{name}").into_bytes(),
///     channel: format!("released:{name}").into_bytes(),
///     loud: true,
/// };
/// node.execute(0, &Request::SetNxPxGet { key: b"lock:a".to_vec(), token: token.clone(), ttl_ms: 100 })?;
/// let release = Request::ReleaseOne {
///     token,
///     waiter: Vec::new(),
///     resources: vec![resource("a"), resource("b")],
///     set: Vec::new(),
/// };
/// node.execute(0, &release)?;
/// // Only the resource whose key held the token announces.
/// let sent = node.drain_published();
/// assert_eq!((sent.len(), sent[0].channel.as_slice()), (1, &b"released:a"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The lock key.
    pub key: Vec<u8>,
    /// The wait queue (a sorted set: tokens by ticket).
    pub queue: Vec<u8>,
    /// The waiters' leases (a sorted set: token by lapse time, server ms).
    pub leases: Vec<u8>,
    /// The entries' attributes (a hash: token -> `<ttl ms>:<kind>[:<channel>]`).
    pub attrs: Vec<u8>,
    /// The resource's fence counter (raised by a fenced transfer).
    pub fence: Vec<u8>,
    /// The resource's channel.
    pub channel: Vec<u8>,
    /// Whether plain releases are announced and name-only entries named.
    pub loud: bool,
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
    Status(&'static str),
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
/// assert_eq!(node.execute(0, &Request::Ping), Err(NodeDown));
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
/// node.execute(0, &Request::Set { key: b"k".to_vec(), value: b"v".to_vec() })?;
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

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    /// Absolute expiry in ms by the node's clock; visible while `now_ms <= expires_at`.
    expires_at: Option<u64>,
}

/// A message published by a script (`PUBLISH channel payload`).
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let key = b"k".to_vec();
/// let token = b"0123456789".to_vec();
/// node.execute(0, &Request::SetNxPxGet { key: key.clone(), token: token.clone(), ttl_ms: 100 })?;
/// node.execute(0, &Request::Release { keys: vec![key], token, channels: vec![b"c".to_vec()] })?;
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

type Res<T> = Result<T, String>;
/// A sorted set's members, `(score, member)` in Redis order.
type ZSet = Vec<(f64, Vec<u8>)>;
/// A hash's fields and values, by field.
type Hash = Vec<(Vec<u8>, Vec<u8>)>;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

/// One simulated Redis 7.0 master: keys, values and expiry in memory, every script of
/// quorumlock implemented natively, time an input.
///
/// `now_us` is the node's own wall clock in microseconds since the Unix epoch (what `TIME`
/// would answer); expiry is in milliseconds (`now_us / 1000`), a key being visible up to
/// and including its expiry millisecond, as in Redis. The caller owns the clock: it can
/// run each node's clock at its own rate, or jump it. Nothing here reads a clock, sleeps,
/// or does I/O.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Persistence, Reply, Request, SimNode};
///
/// let mut node = SimNode::new(Persistence::None);
/// let t0 = 1_764_543_600_000_000; // µs
/// let acquire = |token: &[u8]| Request::SetNxPxGet {
///     key: b"quorumlock:lock:{a}".to_vec(),
///     token: token.to_vec(),
///     ttl_ms: 100,
/// };
/// assert_eq!(node.execute(t0, &acquire(b"A")), Ok(Reply::Nil));
/// assert_eq!(node.execute(t0, &acquire(b"B")), Ok(Reply::Bulk(b"A".to_vec())));
/// // 101 ms later the key has expired.
/// assert_eq!(node.execute(t0 + 101_000, &acquire(b"B")), Ok(Reply::Nil));
/// ```
#[derive(Clone, Default)]
pub struct SimNode {
    keys: BTreeMap<Vec<u8>, Entry>,
    persistence: Persistence,
    down: bool,
    scripts: u16,
    subscribers: BTreeMap<Vec<u8>, i64>,
    published: Vec<Published>,
    variant: Variant,
}

impl fmt::Debug for SimNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimNode")
            .field("keys", &self.keys.len())
            .field("persistence", &self.persistence)
            .field("down", &self.down)
            .field("variant", &self.variant)
            .finish_non_exhaustive()
    }
}

impl SimNode {
    /// An empty node that is up.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, SimNode};
    ///
    /// assert!(SimNode::new(Persistence::None).is_up());
    /// ```
    pub fn new(persistence: Persistence) -> SimNode {
        SimNode {
            persistence,
            ..SimNode::default()
        }
    }

    /// The same node with a [`Variant`] (kept across crashes and restarts).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Persistence, SimNode, Variant};
    ///
    /// let node = SimNode::new(Persistence::None).with_variant(Variant::ReleaseWithoutTokenCheck);
    /// assert_eq!(node.variant(), Variant::ReleaseWithoutTokenCheck);
    /// ```
    pub fn with_variant(mut self, variant: Variant) -> SimNode {
        self.variant = variant;
        self
    }

    /// The node's [`Variant`].
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{SimNode, Variant};
    ///
    /// assert_eq!(SimNode::default().variant(), Variant::Redis);
    /// ```
    pub fn variant(&self) -> Variant {
        self.variant
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
    /// node.execute(0, &Request::Set { key: b"k".to_vec(), value: b"v".to_vec() })?;
    /// node.crash();
    /// node.restart();
    /// assert_eq!(node.execute(0, &Request::Get(b"k".to_vec()))?, Reply::Bulk(b"v".to_vec()));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn crash(&mut self) {
        self.down = true;
        if self.persistence != Persistence::AofAlways {
            self.keys.clear();
        }
        self.scripts = 0;
        self.subscribers.clear();
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
            self.subscribers.remove(channel);
        } else {
            self.subscribers.insert(channel.to_vec(), i64::from(count));
        }
    }

    /// Takes the messages scripts published since the last call, oldest first.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::SimNode::default().drain_published().is_empty());
    /// ```
    pub fn drain_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.published)
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
    /// node.execute(0, &Request::SetNxPxGet { key: b"k".to_vec(), token: b"t".to_vec(), ttl_ms: 5 })?;
    /// node.advance(6_000);
    /// assert_eq!(node.len(), 0);
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn advance(&mut self, now_us: u64) {
        let now = now_us / 1000;
        self.keys.retain(|_, e| !expired(e, now));
    }

    /// How many keys the node stores, expired ones not yet removed included.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::SimNode::default().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the node stores no key.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::SimNode::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The live keys at `now_us` in key order: key, value, absolute expiry in ms.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// node.execute(2_000, &Request::SetNxPxGet { key: b"k".to_vec(), token: b"t".to_vec(), ttl_ms: 5 })?;
    /// let (key, _, expiry) = node.entries(2_000).next().ok_or("no key")?;
    /// assert_eq!((key, expiry), (&b"k"[..], Some(7)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn entries(&self, now_us: u64) -> impl Iterator<Item = (&[u8], &Value, Option<u64>)> {
        let now = now_us / 1000;
        self.keys
            .iter()
            .filter(move |(_, e)| !expired(e, now))
            .map(|(k, e)| (k.as_slice(), &e.value, e.expires_at))
    }

    /// Runs one request at the node's clock `now_us` (scripts as by `EVAL`, which also
    /// loads them for [`execute_sha`](SimNode::execute_sha)).
    ///
    /// # Errors
    ///
    /// [`NodeDown`] while the node is crashed. Redis errors are replies
    /// ([`Reply::Error`]).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::{Reply, Request, SimNode};
    ///
    /// let mut node = SimNode::default();
    /// assert_eq!(node.execute(0, &Request::Ping)?, Reply::Status("PONG"));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn execute(&mut self, now_us: u64, req: &Request) -> Result<Reply, NodeDown> {
        if self.down {
            return Err(NodeDown);
        }
        if let Some(s) = req.script() {
            self.scripts |= s.bit();
        }
        Ok(self.run(now_us, req).unwrap_or_else(Reply::Error))
    }

    /// Runs a script request as by `EVALSHA`: `NOSCRIPT` unless the script was loaded
    /// ([`Request::ScriptLoad`] or [`execute`](SimNode::execute)) since the node started.
    /// Plain commands run as by [`execute`](SimNode::execute).
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
    /// let r = Request::Extend { keys: vec![b"k".to_vec()], token: b"t".to_vec(), ttl_ms: 10 };
    /// assert_eq!(node.execute_sha(0, &r)?.error_code(), Some("NOSCRIPT"));
    /// node.execute(0, &r)?;
    /// assert_eq!(node.execute_sha(0, &r)?, Reply::Int(0));
    /// # Ok::<(), quorumlock::sim::NodeDown>(())
    /// ```
    pub fn execute_sha(&mut self, now_us: u64, req: &Request) -> Result<Reply, NodeDown> {
        if self.down {
            return Err(NodeDown);
        }
        match req.script() {
            Some(s) if self.scripts & s.bit() == 0 => Ok(Reply::Error(NOSCRIPT.to_owned())),
            _ => Ok(self.run(now_us, req).unwrap_or_else(Reply::Error)),
        }
    }

    fn run(&mut self, now_us: u64, req: &Request) -> Res<Reply> {
        let now = now_us / 1000;
        match req {
            Request::SetNxPxGet { key, token, ttl_ms } => {
                let at = expire_at(now, *ttl_ms, "set")?;
                match self.get(key, now)? {
                    Some(old) => Ok(Reply::Bulk(old.to_vec())),
                    None => {
                        self.put(key, Value::String(token.clone()), Some(at));
                        Ok(Reply::Nil)
                    }
                }
            }
            Request::Acquire {
                keys,
                token,
                ttl_ms,
            } => {
                let mut ours = 0;
                for k in keys {
                    match self.get(k, now)? {
                        Some(held) if held == token.as_slice() => ours += 1,
                        Some(_) => return Ok(Reply::Int(0)),
                        None => {}
                    }
                }
                if ours == keys.len() {
                    return Ok(Reply::Int(-1));
                }
                if ours > 0 {
                    return Ok(Reply::Int(0));
                }
                for k in keys {
                    self.set_px(k, token, *ttl_ms, now)?;
                }
                Ok(Reply::Int(1))
            }
            Request::AcquireFenced {
                locks,
                fences,
                token,
                ttl_ms,
            } => self.acquire_fenced(now_us, locks, fences, token, *ttl_ms),
            Request::CommitFence {
                locks,
                fences,
                token,
                t,
            } => self.commit_fence(now, locks, fences, token, *t),
            Request::Extend {
                keys,
                token,
                ttl_ms,
            } => {
                for k in keys {
                    if self.get(k, now)? != Some(token.as_slice()) {
                        return Ok(Reply::Int(0));
                    }
                }
                let gt = self.variant != Variant::ExtendWithoutGt;
                for k in keys {
                    self.pexpire(k, *ttl_ms, gt, now)?;
                }
                Ok(Reply::Int(1))
            }
            Request::Release {
                keys,
                token,
                channels,
            } => {
                let mut deleted = 0;
                for k in keys {
                    if self.owned(k, token, now)? {
                        self.keys.remove(k.as_slice());
                        deleted += 1;
                    }
                }
                let mut listeners = 0;
                if deleted > 0 {
                    let payload = prefix8(token);
                    for c in channels {
                        listeners = listeners.max(self.publish(c, payload.to_vec()));
                    }
                }
                Ok(pair(deleted, listeners))
            }
            Request::ReleaseOne { .. } => self.release_one(now_us, req),
            Request::Enqueue { .. } => self.enqueue(now_us, req),
            Request::EnqueueMany { .. } => self.enqueue_many(now_us, req),
            Request::ClaimMany {
                keys,
                token,
                ttl_ms,
            } => {
                for key in keys {
                    if self
                        .get(key, now)?
                        .is_some_and(|held| held != token.as_slice())
                    {
                        return Ok(Reply::Int(0));
                    }
                }
                for key in keys {
                    self.set_px(key, token, *ttl_ms, now)?;
                }
                Ok(Reply::Int(1))
            }
            Request::Claim { key, token, ttl_ms } => {
                let at = expire_at(now, *ttl_ms, "set")?;
                match self.get(key, now)? {
                    Some(old) if old != token.as_slice() => Ok(Reply::Bulk(old.to_vec())),
                    _ => {
                        self.put(key, Value::String(token.clone()), Some(at));
                        Ok(Reply::Nil)
                    }
                }
            }
            Request::Ping => Ok(Reply::Status("PONG")),
            Request::ConfigGet(name) => {
                let aof = self.persistence == Persistence::AofAlways;
                let value: &[u8] = match name.as_slice() {
                    b"maxmemory-policy" => b"noeviction",
                    b"appendonly" if aof => b"yes",
                    b"appendonly" => b"no",
                    b"appendfsync" if aof => b"always",
                    b"appendfsync" => b"everysec",
                    b"save" => b"",
                    _ => return Ok(Reply::Array(Vec::new())),
                };
                Ok(Reply::Array(vec![
                    Reply::Bulk(name.clone()),
                    Reply::Bulk(value.to_vec()),
                ]))
            }
            Request::InfoReplication => Ok(Reply::Bulk(
                b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n".to_vec(),
            )),
            Request::ScriptLoad(s) => {
                self.scripts |= s.bit();
                Ok(Reply::Bulk(s.name().as_bytes().to_vec()))
            }
            Request::Get(key) => Ok(match self.get(key, now)? {
                Some(v) => Reply::Bulk(v.to_vec()),
                None => Reply::Nil,
            }),
            Request::Set { key, value } => {
                self.put(key, Value::String(value.clone()), None);
                Ok(Reply::Status("OK"))
            }
            Request::Pttl(key) => Ok(Reply::Int(match self.live(key, now) {
                None => -2,
                Some(Entry {
                    expires_at: None, ..
                }) => -1,
                Some(Entry {
                    expires_at: Some(at),
                    ..
                }) => i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX),
            })),
        }
    }

    fn acquire_fenced(
        &mut self,
        now_us: u64,
        locks: &[Vec<u8>],
        fences: &[Vec<u8>],
        token: &[u8],
        ttl_ms: u64,
    ) -> Res<Reply> {
        let now = now_us / 1000;
        if locks.len() != fences.len() {
            return Err("ERR simulator: one fence counter per lock key".to_owned());
        }
        let mut counters = Vec::with_capacity(locks.len());
        let one = locks.len() == 1;
        for (lock, fence) in locks.iter().zip(fences) {
            if self.exists(lock, now) {
                // One key that already holds our token counts as free (claim.lua's rule).
                let ours = one && matches!(self.get(lock, now), Ok(Some(t)) if t == token);
                if !ours {
                    return Ok(Reply::Array(vec![Reply::Int(0)]));
                }
            }
            let c = match self.get(fence, now)? {
                None => 0.0,
                Some(raw) => {
                    // A plain decimal: "0", or no sign, spaces, exponent or leading zero
                    // and at most 16 digits; then below 2^53.
                    let plain = raw == b"0"
                        || (raw.len() <= 16
                            && raw.first().is_some_and(|d| (b'1'..=b'9').contains(d))
                            && raw.iter().all(u8::is_ascii_digit));
                    if !plain {
                        return Err(not_a_counter(fence));
                    }
                    let c = lua::tonumber(raw).unwrap_or(0.0);
                    if c >= 9_007_199_254_740_992.0 {
                        return Err(format!(
                            "fence counter {} is not below 2^53",
                            String::from_utf8_lossy(fence)
                        ));
                    }
                    c
                }
            };
            counters.push(c);
        }
        // TIME as "<seconds><microseconds, 6 digits>", read as a number.
        let now_text = format!("{}{:06}", now_us / 1_000_000, now_us % 1_000_000);
        let floor = now_us as f64;
        let mut top = 0.0f64;
        for ((lock, fence), c) in locks.iter().zip(fences).zip(counters) {
            self.set_px(lock, token, ttl_ms, now)?;
            let v = if c + 1.0 > floor {
                self.incr(fence, now)? as f64
            } else {
                self.put(fence, Value::String(now_text.clone().into_bytes()), None);
                floor
            };
            if v > top {
                top = v;
            }
        }
        Ok(Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(lua::to_integer_reply(top)),
        ]))
    }

    fn commit_fence(
        &mut self,
        now: u64,
        locks: &[Vec<u8>],
        fences: &[Vec<u8>],
        token: &[u8],
        t: u64,
    ) -> Res<Reply> {
        if locks.len() != fences.len() {
            return Err("ERR simulator: one fence counter per lock key".to_owned());
        }
        let tf = t as f64;
        let mut counters = Vec::with_capacity(locks.len());
        for (lock, fence) in locks.iter().zip(fences) {
            if self.get(lock, now)? != Some(token) {
                return Ok(Reply::Int(0));
            }
            let raw = self.get(fence, now)?.unwrap_or(b"0");
            match lua::tonumber(raw) {
                Some(c) => counters.push(c),
                None => return Err(not_a_counter(fence)),
            }
        }
        for (fence, c) in fences.iter().zip(counters) {
            if c < tf {
                self.put(fence, Value::String(t.to_string().into_bytes()), None);
            }
        }
        Ok(Reply::Int(1))
    }

    fn enqueue(&mut self, now_us: u64, req: &Request) -> Res<Reply> {
        let Request::Enqueue {
            queue,
            leases,
            attrs,
            key,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            kind,
            first,
            inbox,
        } = req
        else {
            return Err("ERR simulator: not an enqueue".to_owned());
        };
        let now = now_us / 1000;
        let q = [queue.as_slice(), leases, attrs];
        self.purge_lapsed(q, now)?;
        let held = self.get(key, now)?;
        let holds = held == Some(waiter.as_slice());
        let free = held.is_none();
        // now + tonumber(ARGV[3]) is a Lua number: redis.call sends it as %.17g text.
        let lapse = lua::format_number(now as f64 + *wait_ms as f64);
        let lapse = lua::redis_double(lapse.as_bytes()).ok_or_else(|| NOT_FLOAT.to_owned())?;
        let state = if self.zscore(queue, waiter, now)?.is_some() {
            self.zadd(leases, lapse, waiter, false, now)?;
            0
        } else if *first && !holds {
            // A first join gets this node's clock in µs ('%.0f' of a Lua number, exact
            // below 2^53) unless it brings its ticket as text, which ZADD reads.
            let ticket = if arrival.is_empty() {
                now_us as f64
            } else {
                lua::redis_double(arrival).ok_or_else(|| NOT_FLOAT.to_owned())?
            };
            self.zadd(queue, ticket, waiter, false, now)?;
            self.zadd(leases, lapse, waiter, false, now)?;
            let mut attr = format!("{ttl_ms}:{}", char::from(*kind)).into_bytes();
            if !inbox.is_empty() {
                attr.push(b':');
                attr.extend_from_slice(inbox);
            }
            self.hset(attrs, waiter, attr, now)?;
            1
        } else {
            2
        };
        self.expire_with_last_lease(q, now)?;
        let rank = match self.zscore(queue, waiter, now)? {
            Some(sc) => Reply::Int(self.ahead_of(queue, attrs, key, sc, now)?),
            None => Reply::Nil,
        };
        let score = match self.zscore(queue, waiter, now)? {
            Some(s) => Reply::Bulk(lua::format_score(s).into_bytes()),
            None => Reply::Nil,
        };
        Ok(Reply::Array(vec![
            Reply::Int(state),
            rank,
            score,
            Reply::Int(i64::from(holds)),
            Reply::Int(i64::from(free)),
        ]))
    }

    fn enqueue_many(&mut self, now_us: u64, req: &Request) -> Res<Reply> {
        let Request::EnqueueMany {
            queues,
            set,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            first,
            inbox,
        } = req
        else {
            return Err("ERR simulator: not an enqueue".to_owned());
        };
        let now = now_us / 1000;
        let q = |r: &[Vec<u8>; 4]| -> [Vec<u8>; 3] { [r[0].clone(), r[1].clone(), r[2].clone()] };
        for r in queues {
            let [a, b, c] = q(r);
            self.purge_lapsed([&a, &b, &c], now)?;
        }
        let (mut all, mut any, mut free) = (true, false, true);
        for r in queues {
            let held = self.get(&r[3], now)?;
            if held == Some(waiter.as_slice()) {
                any = true;
            } else {
                all = false;
            }
            if held.is_some() {
                free = false;
            }
        }
        let mut queued = 0;
        for r in queues {
            if self.zscore(&r[0], waiter, now)?.is_some() {
                queued += 1;
            }
        }
        // now + tonumber(ARGV[3]) is a Lua number: redis.call sends it as %.17g text.
        let lapse_text = lua::format_number(now as f64 + *wait_ms as f64);
        let lapse = lua::redis_double(lapse_text.as_bytes()).ok_or_else(|| NOT_FLOAT.to_owned())?;
        let lapse_int = || -> Res<i64> {
            lapse_text
                .parse::<i64>()
                .map_err(|_| NOT_INTEGER.to_owned())
        };
        let state = if queued == queues.len() {
            for r in queues {
                self.zadd(&r[1], lapse, waiter, false, now)?;
            }
            self.pexpireat(set, lapse_int()?, now)?;
            0
        } else if queued > 0 {
            for r in queues {
                let [a, b, c] = q(r);
                self.drop_entry([&a, &b, &c], waiter, now)?;
            }
            self.keys.remove(set.as_slice());
            2
        } else if *first && !any {
            let ticket = if arrival.is_empty() {
                now_us as f64
            } else {
                lua::redis_double(arrival).ok_or_else(|| NOT_FLOAT.to_owned())?
            };
            let mut value = format!("{}:", inbox.len()).into_bytes();
            value.extend_from_slice(inbox);
            for r in queues {
                for j in [3, 0, 1, 2] {
                    value.extend_from_slice(format!("{}:", r[j].len()).as_bytes());
                    value.extend_from_slice(&r[j]);
                }
            }
            let at = lapse_int()?;
            if at <= 0 {
                return Err("ERR invalid expire time in 'set' command".to_owned());
            }
            self.put(set, Value::String(value), u64::try_from(at).ok());
            let mut attr = format!("{ttl_ms}:m:").into_bytes();
            attr.extend_from_slice(set);
            for r in queues {
                self.zadd(&r[0], ticket, waiter, false, now)?;
                self.zadd(&r[1], lapse, waiter, false, now)?;
                self.hset(&r[2], waiter, attr.clone(), now)?;
            }
            1
        } else {
            2
        };
        for r in queues {
            let [a, b, c] = q(r);
            self.expire_with_last_lease([&a, &b, &c], now)?;
        }
        let first_queue = queues.first().map(|r| r[0].clone()).unwrap_or_default();
        let score = self.zscore(&first_queue, waiter, now)?;
        let ahead = match score {
            None => Reply::Nil,
            Some(sc) => {
                let mut most = 0;
                for r in queues {
                    most = most.max(self.ahead_of(&r[0], &r[2], &r[3], sc, now)?);
                }
                Reply::Int(most)
            }
        };
        let score = match score {
            Some(sc) => Reply::Bulk(lua::format_score(sc).into_bytes()),
            None => Reply::Nil,
        };
        Ok(Reply::Array(vec![
            Reply::Int(state),
            ahead,
            score,
            Reply::Int(i64::from(all)),
            Reply::Int(i64::from(free)),
        ]))
    }

    /// `sets.lua`'s `ahead_of` (the enqueue scripts): the entries of `queue` (of the lock key `own`) with a
    /// score below `score`, not counting those of the first [`AHEAD_LOOKED_AT`] of them that
    /// are blocked multi-resource entries.
    fn ahead_of(
        &mut self,
        queue: &[u8],
        attrs: &[u8],
        own: &[u8],
        score: f64,
        now: u64,
    ) -> Res<i64> {
        let below: Vec<Vec<u8>> = self.zset(queue, now)?.map_or(Vec::new(), |z| {
            z.iter()
                .filter(|(s, _)| *s < score)
                .map(|(_, m)| m.clone())
                .collect()
        });
        let mut n = i64::try_from(below.len()).unwrap_or(i64::MAX);
        if below.is_empty() {
            return Ok(0);
        }
        let owner = self.get(own, now)?.map(<[u8]>::to_vec);
        for e in below.iter().take(AHEAD_LOOKED_AT) {
            let attr = self.hget(attrs, e, now)?;
            if self.blocked(attr.as_deref(), e, (own, owner.as_deref()), now)? {
                n -= 1;
            }
        }
        Ok(n)
    }

    /// `sets.lua`'s `blocked`: the entry `tok` is a multi-resource entry a key of
    /// whose set other than `own.0` holds another token than `own.1` (the holder of the
    /// queue's own key). (The scripts remember what each entry's keys hold within one call;
    /// reading the keys again changes nothing.)
    fn blocked(
        &mut self,
        attr: Option<&[u8]>,
        tok: &[u8],
        own: (&[u8], Option<&[u8]>),
        now: u64,
    ) -> Res<bool> {
        let (own, owner) = own;
        let Some((_, set)) = attr.and_then(parse_multi_attr) else {
            return Ok(false);
        };
        let Some(raw) = self.get(&set, now)?.map(<[u8]>::to_vec) else {
            return Ok(false);
        };
        let e = set_entries(&raw);
        let groups = e.len().saturating_sub(1) / 4;
        let mut blocked = false;
        for g in 0..groups {
            let lock = e.get(4 * g + 1).cloned().unwrap_or_default();
            let held = self.get(&lock, now)?;
            if held.is_some_and(|h| h != tok && Some(h) != owner) && lock != own {
                blocked = true;
            }
        }
        Ok(blocked)
    }

    /// `ZRANGEBYSCORE leases -inf now`, each removed from the queue and the attributes,
    /// then `ZREMRANGEBYSCORE leases -inf now`. `q`: the queue, leases and attributes.
    fn purge_lapsed(&mut self, q: [&[u8]; 3], now: u64) -> Res<()> {
        let [queue, leases, attrs] = q;
        let nowf = now as f64;
        let lapsed: Vec<Vec<u8>> = match self.zset(leases, now)? {
            Some(z) => z
                .iter()
                .take_while(|(s, _)| *s <= nowf)
                .map(|(_, m)| m.clone())
                .collect(),
            None => return Ok(()),
        };
        if lapsed.is_empty() {
            return Ok(());
        }
        for m in &lapsed {
            self.zrem(queue, m, now)?;
            self.hdel(attrs, m, now)?;
        }
        if let Some(z) = self.zset(leases, now)? {
            z.retain(|(s, _)| *s > nowf);
            if z.is_empty() {
                self.keys.remove(leases);
            }
        }
        Ok(())
    }

    /// The tail of every queue script: an empty lease set deletes the queue's keys,
    /// otherwise they expire at the latest lease (`PEXPIREAT` with the score's text).
    fn expire_with_last_lease(&mut self, q: [&[u8]; 3], now: u64) -> Res<()> {
        let [queue, leases, attrs] = q;
        match self.zlast(leases, now)? {
            None => {
                self.keys.remove(queue);
                self.keys.remove(leases);
                self.keys.remove(attrs);
            }
            Some(last) => {
                let at = score_as_integer(last)?;
                self.pexpireat(queue, at, now)?;
                self.pexpireat(leases, at, now)?;
                self.pexpireat(attrs, at, now)?;
            }
        }
        Ok(())
    }

    fn release_one(&mut self, now_us: u64, req: &Request) -> Res<Reply> {
        let Request::ReleaseOne {
            token,
            waiter,
            resources,
            set,
        } = req
        else {
            return Err("ERR simulator: not a release".to_owned());
        };
        let now = now_us / 1000;
        if resources.is_empty() {
            return Err("ERR release_one: five keys and two arguments per resource".to_owned());
        }
        if !set.is_empty() {
            self.keys.remove(set.as_slice());
        }
        // Our own entries leave every queue first (where it exists), whatever the keys hold.
        for r in resources {
            if !self.exists(&r.queue, now) {
                continue;
            }
            let q = [r.queue.as_slice(), &r.leases, &r.attrs];
            self.drop_entry(q, token, now)?;
            if !waiter.is_empty() {
                self.drop_entry(q, waiter, now)?;
            }
        }
        let mut heard = 0;
        if let [one] = resources.as_slice() {
            return self.release_queued(now_us, token, one, &mut heard);
        }
        let (mut left, mut most) = (0, 0);
        for r in resources {
            let got = self.release_queued(now_us, token, r, &mut heard)?;
            if let Reply::Array(a) = &got {
                if matches!(a.first(), Some(Reply::Int(c)) if *c > 0) {
                    left += 1;
                }
                if let Some(Reply::Int(w)) = a.get(1) {
                    most = most.max(*w);
                }
            }
        }
        Ok(pair(left, most.max(heard)))
    }

    /// One resource of `release_one.lua`.
    /// `heard`: the most subscribers a plain announcement reached, kept across resources.
    fn release_queued(
        &mut self,
        now_us: u64,
        token: &[u8],
        r: &Queued,
        heard: &mut i64,
    ) -> Res<Reply> {
        let Queued {
            key,
            queue,
            leases,
            attrs,
            fence: _,
            channel,
            loud,
        } = r;
        let now = now_us / 1000;
        let q = [queue.as_slice(), leases, attrs];
        if !self.owned(key, token, now)? {
            let waiting = self.zcard(queue, now)?;
            return Ok(pair(0, waiting));
        }
        let prefix = prefix8(token).to_vec();
        if self.exists(leases, now) {
            self.purge_lapsed(q, now)?;
            let head = self
                .zset(queue, now)?
                .and_then(|z| z.first())
                .map(|(_, m)| m.clone());
            if let Some(head) = head {
                let attr = self.hget(attrs, &head, now)?;
                if let Some((ttl, set)) = attr.as_deref().and_then(parse_multi_attr) {
                    let mut got = self.hand_set(now, token, &head, ttl, &set, None)?;
                    if got == Handed::Gone {
                        self.drop_entry(q, &head, now)?;
                    } else if got == Handed::Blocked {
                        // `ZRANGE queue 1 BACKFILL`: the first entry behind it that can be
                        // served now.
                        let behind: Vec<Vec<u8>> = self.zset(queue, now)?.map_or(Vec::new(), |z| {
                            z.iter()
                                .skip(1)
                                .take(BACKFILL)
                                .map(|(_, m)| m.clone())
                                .collect()
                        });
                        for e in behind {
                            let ea = self.hget(attrs, &e, now)?;
                            if let Some((ettl, eset)) = ea.as_deref().and_then(parse_multi_attr) {
                                if self.hand_set(
                                    now,
                                    token,
                                    &e,
                                    ettl,
                                    &eset,
                                    Some(queue.as_slice()),
                                )? == Handed::Moved
                                {
                                    got = Handed::Moved;
                                    break;
                                }
                                continue;
                            }
                            let (kind, ettl, inbox) = parse_attr(ea.as_deref());
                            if kind != b'n' {
                                let to = Entry2 {
                                    tok: &e,
                                    kind,
                                    ttl: ettl,
                                    inbox,
                                };
                                return self.give(now_us, r, token, to);
                            }
                        }
                    }
                    if got == Handed::Moved {
                        // (Its set names this key; should it not, the key still leaves our token.)
                        if self.get(key, now)? == Some(token) {
                            self.keys.remove(key.as_slice());
                        }
                        let left = self.zcard(queue, now)?;
                        return Ok(Reply::Array(vec![
                            Reply::Int(2),
                            Reply::Int(left),
                            Reply::Int(0),
                        ]));
                    }
                    self.expire_with_last_lease(q, now)?;
                    self.keys.remove(key.as_slice());
                    if *loud {
                        *heard = (*heard).max(self.publish(channel, prefix));
                    }
                    let waiting = self.zcard(queue, now)?;
                    return Ok(pair(1, waiting));
                }
                let (kind, ttl, inbox) = parse_attr(attr.as_deref());
                if kind != b'n' || *loud {
                    let to = Entry2 {
                        tok: &head,
                        kind,
                        ttl,
                        inbox,
                    };
                    return self.give(now_us, r, token, to);
                }
            }
            self.expire_with_last_lease(q, now)?;
        }
        self.keys.remove(key.as_slice());
        if *loud {
            *heard = (*heard).max(self.publish(channel, prefix));
        }
        let waiting = self.zcard(queue, now)?;
        Ok(pair(1, waiting))
    }

    /// `release_one.lua`'s `give`: hands the key of `r` to the entry `to` (kind `t` or
    /// `f`), or names a name-only one, popping it first.
    fn give(&mut self, now_us: u64, r: &Queued, token: &[u8], to: Entry2<'_>) -> Res<Reply> {
        let now = now_us / 1000;
        let Queued {
            key,
            queue,
            leases,
            attrs,
            fence,
            channel,
            ..
        } = r;
        let q = [queue.as_slice(), leases, attrs];
        let Entry2 {
            tok,
            mut kind,
            ttl,
            inbox,
        } = to;
        self.drop_entry(q, tok, now)?;
        let mut fenced: Option<u64> = None;
        if kind == b'f' {
            match self.raise_fence(now_us, fence)? {
                Some(v) => fenced = Some(v),
                None => kind = b'n',
            }
        }
        self.expire_with_last_lease(q, now)?;
        let left = self.zcard(queue, now)?;
        let mut payload = prefix8(token).to_vec();
        if kind == b'n' {
            self.keys.remove(key.as_slice());
            payload.push(b':');
            payload.extend_from_slice(tok);
            self.publish(channel, payload);
            return Ok(pair(1, left + 1));
        }
        let ttl = ttl.ok_or_else(|| NOT_INTEGER.to_owned())?;
        self.set_px(key, tok, ttl, now)?;
        payload.extend_from_slice(b":>:");
        payload.extend_from_slice(tok);
        if let Some(v) = fenced {
            payload.push(b':');
            payload.extend_from_slice(v.to_string().as_bytes());
        }
        self.publish(inbox.as_deref().unwrap_or(channel), payload);
        let v = fenced.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX));
        Ok(Reply::Array(vec![
            Reply::Int(2),
            Reply::Int(left),
            Reply::Int(v),
        ]))
    }

    /// `ZREM queue e`, `ZREM leases e`, `HDEL attrs e`.
    fn drop_entry(&mut self, q: [&[u8]; 3], entry: &[u8], now: u64) -> Res<()> {
        let [queue, leases, attrs] = q;
        self.zrem(queue, entry, now)?;
        self.zrem(leases, entry, now)?;
        self.hdel(attrs, entry, now)?;
        Ok(())
    }

    /// `release_one.lua`'s `hand_set`: a multi-resource entry `tok` gets every key of its
    /// set (`set`: the set key) or none; it must head each of its queues but `at`;
    /// `token` is the releaser's (a key holding it counts as free).
    fn hand_set(
        &mut self,
        now: u64,
        token: &[u8],
        tok: &[u8],
        ttl: u64,
        set: &[u8],
        at: Option<&[u8]>,
    ) -> Res<Handed> {
        let Some(raw) = self.get(set, now)?.map(<[u8]>::to_vec) else {
            return Ok(Handed::Gone);
        };
        let e = set_entries(&raw);
        let groups = e.len().saturating_sub(1) / 4;
        if e.is_empty() || groups < 1 {
            return Ok(Handed::Gone);
        }
        let group = |g: usize| -> [&[u8]; 4] {
            let nth = |i: usize| e.get(4 * g + i).map_or(&[][..], Vec::as_slice);
            [nth(1), nth(2), nth(3), nth(4)]
        };
        for g in 0..groups {
            let [lock, queue, leases, attrs] = group(g);
            self.purge_lapsed([queue, leases, attrs], now)?;
            if at != Some(queue) {
                let head = self
                    .zset(queue, now)?
                    .and_then(|z| z.first())
                    .map(|(_, m)| m.clone());
                if head.as_deref() != Some(tok) {
                    return Ok(Handed::Blocked);
                }
            }
            if self.get(lock, now)?.is_some_and(|held| held != token) {
                return Ok(Handed::Blocked);
            }
        }
        for g in 0..groups {
            let [lock, queue, leases, attrs] = group(g);
            self.drop_entry([queue, leases, attrs], tok, now)?;
            self.expire_with_last_lease([queue, leases, attrs], now)?;
            self.set_px(lock, tok, ttl, now)?;
        }
        self.keys.remove(set);
        let mut payload = prefix8(token).to_vec();
        payload.extend_from_slice(b":>:");
        payload.extend_from_slice(tok);
        let channel = e.first().cloned().unwrap_or_default();
        self.publish(&channel, payload);
        Ok(Handed::Moved)
    }

    /// A fenced transfer's counter: raised as `acquire_fenced.lua` raises it (to
    /// `max(counter + 1, clock in µs)`), the new value returned; `None` (nothing written)
    /// when the counter is not a plain decimal integer below 2^53.
    fn raise_fence(&mut self, now_us: u64, fence: &[u8]) -> Res<Option<u64>> {
        let now = now_us / 1000;
        let c = match self.get(fence, now)? {
            None => 0.0,
            Some(raw) => {
                let plain = raw == b"0"
                    || (raw.len() <= 16
                        && raw.first().is_some_and(|d| (b'1'..=b'9').contains(d))
                        && raw.iter().all(u8::is_ascii_digit));
                if !plain {
                    return Ok(None);
                }
                let c = lua::tonumber(raw).unwrap_or(0.0);
                if c >= 9_007_199_254_740_992.0 {
                    return Ok(None);
                }
                c
            }
        };
        let floor = now_us as f64;
        if c + 1.0 > floor {
            let v = self.incr(fence, now)?;
            Ok(Some(u64::try_from(v).unwrap_or(0)))
        } else {
            let text = format!("{}{:06}", now_us / 1_000_000, now_us % 1_000_000);
            self.put(fence, Value::String(text.into_bytes()), None);
            Ok(Some(now_us))
        }
    }

    // ---- the commands the scripts use ----

    /// The entry of a live key; removes it when expired (lazy expiry).
    fn live(&mut self, key: &[u8], now: u64) -> Option<&mut Entry> {
        if self.keys.get(key).is_some_and(|e| expired(e, now)) {
            self.keys.remove(key);
            return None;
        }
        self.keys.get_mut(key)
    }

    /// Whether a release may delete `key`: it holds `token` (with
    /// [`Variant::ReleaseWithoutTokenCheck`]: it is a live string, whatever it holds).
    fn owned(&mut self, key: &[u8], token: &[u8], now: u64) -> Res<bool> {
        let variant = self.variant;
        let value = self.get(key, now)?;
        Ok(match variant {
            Variant::ReleaseWithoutTokenCheck => value.is_some(),
            _ => value == Some(token),
        })
    }

    fn exists(&mut self, key: &[u8], now: u64) -> bool {
        self.live(key, now).is_some()
    }

    /// `GET`: the string value, `WRONGTYPE` for another type.
    fn get(&mut self, key: &[u8], now: u64) -> Res<Option<&[u8]>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::String(s),
                ..
            }) => Ok(Some(s.as_slice())),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// Replaces a key whatever its type (`SET` without `KEEPTTL`).
    fn put(&mut self, key: &[u8], value: Value, expires_at: Option<u64>) {
        let entry = Entry { value, expires_at };
        if let Some(e) = self.keys.get_mut(key) {
            *e = entry;
        } else {
            self.keys.insert(key.to_vec(), entry);
        }
    }

    /// `SET key value PX ttl` as a script sends it (the TTL as decimal text).
    fn set_px(&mut self, key: &[u8], value: &[u8], ttl_ms: u64, now: u64) -> Res<()> {
        let at = expire_at(now, ttl_ms, "set")?;
        self.put(key, Value::String(value.to_vec()), Some(at));
        Ok(())
    }

    /// `INCR`, keeping the key's expiry.
    fn incr(&mut self, key: &[u8], now: u64) -> Res<i64> {
        match self.live(key, now) {
            None => {
                self.put(key, Value::String(b"1".to_vec()), None);
                Ok(1)
            }
            Some(Entry {
                value: Value::String(s),
                ..
            }) => {
                let v = lua::string2ll(s).ok_or_else(|| NOT_INTEGER.to_owned())?;
                let v = v.checked_add(1).ok_or_else(|| OVERFLOW.to_owned())?;
                *s = v.to_string().into_bytes();
                Ok(v)
            }
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// `PEXPIRE key ttl [GT]`: 1 when set, 0 when the key is missing or GT refused.
    fn pexpire(&mut self, key: &[u8], ttl_ms: u64, gt: bool, now: u64) -> Res<i64> {
        let ttl = i64::try_from(ttl_ms).map_err(|_| NOT_INTEGER.to_owned())?;
        let base = i64::try_from(now).unwrap_or(i64::MAX);
        if ttl > i64::MAX - base {
            return Err("ERR invalid expire time in 'pexpire' command".to_owned());
        }
        let when = (base + ttl) as u64;
        let Some(e) = self.live(key, now) else {
            return Ok(0);
        };
        if gt {
            match e.expires_at {
                Some(cur) if when > cur => {}
                _ => return Ok(0),
            }
        }
        if when <= now {
            self.keys.remove(key);
        } else {
            e.expires_at = Some(when);
        }
        Ok(1)
    }

    /// The hash at `key` (`None` when missing), `WRONGTYPE` for another type.
    fn hash(&mut self, key: &[u8], now: u64) -> Res<Option<&mut Hash>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::Hash(h),
                ..
            }) => Ok(Some(h)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// `HSET key field value`.
    fn hset(&mut self, key: &[u8], field: &[u8], value: Vec<u8>, now: u64) -> Res<()> {
        let Some(h) = self.hash(key, now)? else {
            self.put(key, Value::Hash(vec![(field.to_vec(), value)]), None);
            return Ok(());
        };
        match h.binary_search_by(|(f, _)| f.as_slice().cmp(field)) {
            Ok(i) => {
                if let Some(e) = h.get_mut(i) {
                    e.1 = value;
                }
            }
            Err(i) => h.insert(i, (field.to_vec(), value)),
        }
        Ok(())
    }

    /// `HGET key field`.
    fn hget(&mut self, key: &[u8], field: &[u8], now: u64) -> Res<Option<Vec<u8>>> {
        Ok(self
            .hash(key, now)?
            .and_then(|h| h.iter().find(|(f, _)| f.as_slice() == field))
            .map(|(_, v)| v.clone()))
    }

    /// `HDEL key field`; an emptied hash is deleted.
    fn hdel(&mut self, key: &[u8], field: &[u8], now: u64) -> Res<()> {
        let Some(h) = self.hash(key, now)? else {
            return Ok(());
        };
        h.retain(|(f, _)| f.as_slice() != field);
        if h.is_empty() {
            self.keys.remove(key);
        }
        Ok(())
    }

    fn publish(&mut self, channel: &[u8], payload: Vec<u8>) -> i64 {
        self.published.push(Published {
            channel: channel.to_vec(),
            payload,
        });
        self.subscribers.get(channel).copied().unwrap_or(0)
    }

    /// The sorted set at `key` (`None` when missing), `WRONGTYPE` for another type.
    fn zset(&mut self, key: &[u8], now: u64) -> Res<Option<&mut ZSet>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::SortedSet(z),
                ..
            }) => Ok(Some(z)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// `ZADD key [NX] score member`: 1 when added, 0 when it was there (its score then
    /// updated unless `NX`).
    fn zadd(&mut self, key: &[u8], score: f64, member: &[u8], nx: bool, now: u64) -> Res<i64> {
        let Some(z) = self.zset(key, now)? else {
            self.put(key, Value::SortedSet(vec![(score, member.to_vec())]), None);
            return Ok(1);
        };
        let added = match z.iter().position(|(_, m)| m.as_slice() == member) {
            Some(_) if nx => return Ok(0),
            Some(i) => {
                z.remove(i);
                0
            }
            None => 1,
        };
        let at = z.partition_point(|(s, m)| *s < score || (*s == score && m.as_slice() < member));
        z.insert(at, (score, member.to_vec()));
        Ok(added)
    }

    /// `ZSCORE key member`.
    fn zscore(&mut self, key: &[u8], member: &[u8], now: u64) -> Res<Option<f64>> {
        Ok(self
            .zset(key, now)?
            .and_then(|z| z.iter().find(|(_, m)| m.as_slice() == member))
            .map(|(s, _)| *s))
    }

    /// The highest score (`ZRANGE key -1 -1 WITHSCORES`).
    fn zlast(&mut self, key: &[u8], now: u64) -> Res<Option<f64>> {
        Ok(self.zset(key, now)?.and_then(|z| z.last()).map(|(s, _)| *s))
    }

    /// `PEXPIREAT key at`: the key is deleted when `at` is not after now.
    fn pexpireat(&mut self, key: &[u8], at: i64, now: u64) -> Res<i64> {
        let Some(e) = self.live(key, now) else {
            return Ok(0);
        };
        match u64::try_from(at) {
            Ok(at) if at > now => e.expires_at = Some(at),
            _ => {
                self.keys.remove(key);
            }
        }
        Ok(1)
    }

    /// `ZREM key member`; an emptied set is deleted.
    fn zrem(&mut self, key: &[u8], member: &[u8], now: u64) -> Res<i64> {
        let Some(z) = self.zset(key, now)? else {
            return Ok(0);
        };
        let Some(i) = z.iter().position(|(_, m)| m.as_slice() == member) else {
            return Ok(0);
        };
        z.remove(i);
        if z.is_empty() {
            self.keys.remove(key);
        }
        Ok(1)
    }

    fn zcard(&mut self, key: &[u8], now: u64) -> Res<i64> {
        Ok(self
            .zset(key, now)?
            .map_or(0, |z| i64::try_from(z.len()).unwrap_or(i64::MAX)))
    }
}

fn expired(e: &Entry, now: u64) -> bool {
    e.expires_at.is_some_and(|at| now > at)
}

/// The absolute expiry of `SET … PX ttl_ms` at `now`, or Redis's error.
fn expire_at(now: u64, ttl_ms: u64, command: &str) -> Res<u64> {
    let ttl = i64::try_from(ttl_ms).map_err(|_| NOT_INTEGER.to_owned())?;
    let base = i64::try_from(now).unwrap_or(i64::MAX);
    if ttl <= 0 || ttl > i64::MAX - base {
        return Err(format!("ERR invalid expire time in '{command}' command"));
    }
    Ok((base + ttl) as u64)
}

/// A score as the text `ZRANGE … WITHSCORES` answers (`%.17g`), read back as an integer
/// by `PEXPIREAT`: only an integral score below 10^17 prints without a point or exponent.
fn score_as_integer(score: f64) -> Res<i64> {
    if score == score.trunc() && score.abs() < 1e17 {
        Ok(score as i64)
    } else {
        Err(NOT_INTEGER.to_owned())
    }
}

fn not_a_counter(fence: &[u8]) -> String {
    format!(
        "fence counter {} is not an integer",
        String::from_utf8_lossy(fence)
    )
}

/// How many of the entries ahead of a waiter a join looks at for blocked multi-resource
/// entries (the enqueue scripts' `ahead_of`).
const AHEAD_LOOKED_AT: usize = 64;

/// How many entries behind a blocked multi-resource head a release looks at
/// (`release_one.lua`'s `BACKFILL`).
const BACKFILL: usize = 8;

/// An entry a release hands its key to (`give`): its token, kind, TTL and channel.
struct Entry2<'a> {
    tok: &'a [u8],
    kind: u8,
    ttl: Option<u64>,
    inbox: Option<Vec<u8>>,
}

/// What `hand_set` did with a multi-resource head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handed {
    /// Every key of its set is its now.
    Moved,
    /// A key of its set is held by another, or it is not the head of one of its queues.
    Blocked,
    /// Its set key is gone (lapsed) or holds no resource.
    Gone,
}

/// A multi-resource entry's attributes, `^(%d+):m:(.+)$` with a TTL above zero: the TTL
/// and the set key. A TTL that does not fit in a `u64` is read as the largest one (the
/// `SET … PX` then fails as Redis's does).
fn parse_multi_attr(attr: &[u8]) -> Option<(u64, Vec<u8>)> {
    let colon = attr.iter().position(|b| *b == b':')?;
    let (ttl, rest) = attr.split_at(colon);
    let set = rest.strip_prefix(b":m:")?;
    if ttl.is_empty() || !ttl.iter().all(u8::is_ascii_digit) || set.is_empty() {
        return None;
    }
    if ttl.iter().all(|d| *d == b'0') {
        return None;
    }
    let ms = std::str::from_utf8(ttl)
        .ok()?
        .parse::<u64>()
        .unwrap_or(u64::MAX);
    Some((ms, set.to_vec()))
}

/// The entries of a set key's text, `<length>:<bytes>` each (`sets.lua`'s
/// `entries`: a malformed rest is ignored; a length past the end takes what is left).
fn set_entries(raw: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let digits = raw[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || raw.get(i + digits) != Some(&b':') {
            return out;
        }
        let len = std::str::from_utf8(&raw[i..i + digits])
            .ok()
            .and_then(|d| d.parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        let start = i + digits + 1;
        let end = start.saturating_add(len).min(raw.len());
        out.push(raw[start..end].to_vec());
        i = start.saturating_add(len);
    }
    out
}

/// An entry's attributes, `<ttl ms>:<kind>` (as `release_one.lua` matches them): its kind
/// and TTL; anything else (or a TTL of 0) reads as a name-only entry.
fn parse_attr(attr: Option<&[u8]>) -> (u8, Option<u64>, Option<Vec<u8>>) {
    let parsed = attr.and_then(|a| {
        let (ttl, rest) = a.split_at(a.iter().position(|b| *b == b':')?);
        // `^(%d+):([tfn]):(.+)$`, else `^(%d+):([tfn])$`.
        let (kind, inbox) = match rest {
            [b':', k @ (b't' | b'f' | b'n')] => (*k, None),
            [b':', k @ (b't' | b'f' | b'n'), b':', c @ ..] if !c.is_empty() => {
                (*k, Some(c.to_vec()))
            }
            _ => return None,
        };
        if ttl.is_empty() || !ttl.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let ms = lua::tonumber(ttl)?;
        let ttl = std::str::from_utf8(ttl)
            .ok()
            .and_then(|t| t.parse::<u64>().ok());
        (ms != 0.0).then_some((kind, ttl, inbox))
    });
    match parsed {
        Some((kind, ttl, inbox)) => (kind, ttl, inbox),
        None => (b'n', None, None),
    }
}

fn prefix8(token: &[u8]) -> &[u8] {
    token.get(..8).unwrap_or(token)
}

fn pair(a: i64, b: i64) -> Reply {
    Reply::Array(vec![Reply::Int(a), Reply::Int(b)])
}
