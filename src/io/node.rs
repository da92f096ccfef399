//! Talking to one Redis node: its address, its connection, its timeout, its scripts.
//!
//! Each node has exactly **one** multiplexed connection (redis-rs's
//! [`ConnectionManager`], which reconnects by itself), so every command quorumlock sends
//! to a node is written to one socket in the order it was issued. That ordering is what
//! lets the clean-up after a failed acquisition be sure its release lands *after* the
//! `SET` it cleans up: a release is only issued once that node's acquire future has
//! completed (answered, failed, or timed out — and a timed-out command was already
//! queued ahead of the release on the same connection).
//!
//! A Redis Cluster voter has redis-rs's cluster client, and beside it one such connection
//! per shard master for the requests whose slot is known (every lock request: a lock's
//! keys share one slot), so those go straight to the slot's master in the order issued,
//! as on a plain master ([`direct`]).
//!
//! Every command is bounded by the per-node timeout. A timed-out command may still run
//! on the server; callers treat its outcome as unknown and clean up accordingly.
//!
//! Scripts are sent with `EVALSHA`, falling back to `EVAL` on `NOSCRIPT` (a node that
//! restarted, or `SCRIPT FLUSH`), on the same connection. Keys and values only ever
//! travel as `KEYS`/`ARGV`.
//!
//! This is also the bottom of the protocol's I/O: every request is built here
//! ([`Request`], [`QueueJoin`], [`ExtendBatch`]: the only place a duration becomes a `PX`
//! or script argument, see [`millis_ceil`]), and every answer is decoded here into a typed
//! [`protocol::Reply`](crate::protocol::Reply) (or, for a wait-queue join, a
//! [`QueuePlace`]), so nothing above this module looks at a raw Redis value.
//!
//! ```text
//!   Duration ──Request::acquire / extend / acquire_fenced / read_acquire / write_acquire /
//!              sem_acquire / extend_held, QueueJoin::new──▶ millis_ceil ──▶ "PX", ARGV
//!   raw Value ──decode(Answer, raw)──▶ protocol::Reply        decode_join(raw) ──▶ QueuePlace
//! ```

mod deployment;
mod direct;
pub(crate) mod identity;
mod scripts;
mod spec;
#[cfg(feature = "tls-rustls")]
pub(crate) mod tls;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What the builder takes a node as, besides a URL: redis-rs's own conversion (named here,
/// so that the layers above `io` name no `redis` item).
pub(crate) use redis::IntoConnectionInfo;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisError, Value};

pub(crate) use crate::base::addr::NodeAddr;
use crate::base::error::Error;
use crate::base::metrics::{NodeKeys, Op, Timer};
use crate::base::resource::{Kind, Resources, RwKeys, SemKeys};
use crate::base::token::Token;
use crate::protocol::fencing;
use crate::protocol::reply::{Holder, QueuePlace, QueueState, Reply as Typed};

pub(crate) use deployment::check_deployment;
pub(crate) use scripts::*;
pub(crate) use spec::{NodeInput, NodeSpec};

pub(crate) trait KindStr {
    fn kind_str(&self) -> &'static str;
}
impl KindStr for RedisError {
    fn kind_str(&self) -> &'static str {
        match self.kind() {
            redis::ErrorKind::InvalidClientConfig => "invalid client configuration",
            _ => "unparseable",
        }
    }
}

/// What one command on one node came back with.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The node answered.
    Value(Value),
    /// The node answered with an error, or the connection failed.
    Error(RedisError),
    /// No answer within the per-node timeout: outcome unknown.
    TimedOut,
}

impl Reply {
    /// A command's result; a server error reply (`-ERR …`) becomes [`Reply::Error`].
    pub(crate) fn from_result(r: redis::RedisResult<Value>) -> Reply {
        match r {
            Ok(Value::ServerError(e)) => Reply::Error(e.into()),
            Ok(v) => Reply::Value(v),
            Err(e) => Reply::Error(e),
        }
    }

    /// The error text of a failed reply, for [`NodeOutcome::Failed`](crate::NodeOutcome).
    pub(crate) fn error_text(e: &RedisError) -> String {
        // redis-rs errors carry the server's message or the I/O error; never the URL.
        #[cfg(feature = "tls-rustls")]
        let s = match tls::failure(e) {
            Some(t) => t,
            None => e.to_string(),
        };
        #[cfg(not(feature = "tls-rustls"))]
        let s = e.to_string();
        if s.len() > 200 {
            let mut cut = 200;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…", &s[..cut])
        } else {
            s
        }
    }
}

/// One connected node.
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) addr: NodeAddr,
    conn: Conn,
    /// This node's metric keys (empty without the `metrics` feature).
    metrics: NodeKeys,
    /// Whether this voter's votes count ([`identity`]); `None`: always (a node outside a
    /// group of voters).
    admission: Option<Arc<identity::Admission>>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

impl Node {
    /// Creates the node's connection manager without connecting (the first command
    /// connects; a failed connection is retried on the next command).
    pub(crate) fn new(spec: &NodeSpec, connect_timeout: Duration) -> Result<Node, Error> {
        if let Some(seeds) = &spec.seeds {
            let client = cluster_connection(spec, seeds, connect_timeout)?;
            let direct = direct::Direct::new(seeds, cluster_tcp(), connect_timeout, client.clone());
            return Ok(Node {
                addr: spec.addr.clone(),
                conn: Conn::Cluster(ClusterConn { client, direct }),
                metrics: NodeKeys::new(&spec.addr),
                admission: None,
            });
        }
        let client = redis::Client::open(spec.info.clone())
            .map_err(|e| Error::config("nodes", format!("{}: {}", spec.addr, e.kind_str())))?;
        let config = ConnectionManagerConfig::new()
            // We bound every command ourselves; the manager must not drop a connection
            // because one reply is slow (that would reorder commands across sockets).
            .set_response_timeout(None)
            .set_connection_timeout(Some(connect_timeout))
            // One connection attempt per reconnect: a dead node fails fast instead of
            // making every command wait out a backoff loop.
            .set_number_of_retries(0)
            .set_min_delay(Duration::from_millis(1))
            .set_max_delay(Duration::from_millis(100));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| Error::config("nodes", format!("{}: {}", spec.addr, e.kind_str())))?;
        Ok(Node {
            addr: spec.addr.clone(),
            conn: Conn::Plain(conn),
            metrics: NodeKeys::new(&spec.addr),
            admission: None,
        })
    }

    /// [`Node::admit`] within `timeout`: `Ok` with the time left for the request itself.
    async fn admitted_within(&self, timeout: Duration) -> Result<Duration, String> {
        let start = std::time::Instant::now();
        self.admit(timeout).await?;
        Ok(timeout.saturating_sub(start.elapsed()))
    }

    /// Makes this node voter `index` of `registry`: its votes count only once its
    /// identity was read and differs from every other voter's ([`identity`]).
    pub(crate) fn with_admission(
        mut self,
        registry: &Arc<identity::Registry>,
        index: usize,
    ) -> Node {
        self.admission = Some(identity::Admission::new(registry.clone(), index));
        self
    }

    /// Takes in what a read of this voter's identity at build found (see
    /// [`Node::admit`]): `Err` with why it is not admitted.
    pub(crate) fn settle_identity(&self, read: identity::Read) -> Result<(), String> {
        match &self.admission {
            Some(a) => a.settle(read),
            None => Ok(()),
        }
    }

    /// Whether this voter is a Redis Cluster (its commands routed by slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Sends one command, bounded by `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> Reply {
        self.query_in(cmd, None, timeout).await
    }

    /// Sends one command whose keys are all in `slot` (on a Redis Cluster voter, straight
    /// to that slot's master: see [`direct`]), bounded by `timeout`.
    async fn query_in(&self, cmd: &Cmd, slot: Option<u16>, timeout: Duration) -> Reply {
        let mut conn = self.conn.clone();
        // Boxed: the connection manager's future is large, and every future that awaits
        // this one would otherwise copy it as it is built.
        let send = Box::pin(conn.request(cmd, slot));
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => Reply::from_result(r),
            Err(_) => Reply::TimedOut,
        }
    }

    /// Sends a pipeline of commands, bounded by `timeout`; one reply per command.
    pub(crate) async fn pipeline(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Value>, Reply> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(timeout, conn.req_packed_commands(pipe, 0, count)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Reply::Error(e)),
            Err(_) => Err(Reply::TimedOut),
        }
    }

    /// Runs a script by `EVALSHA`, falling back to `EVAL` on `NOSCRIPT` on the same
    /// connection; the caller waits at most `timeout`.
    ///
    /// For an idempotent script (release, extend, fence commit) the exchange is *finished in
    /// the background* when the caller stops waiting: a node that was paused answers
    /// `NOSCRIPT` only after it resumes, and the `EVAL` must still follow, or a release sent
    /// to a freshly restarted node would silently never run. An idempotent script is also
    /// retried once after a dropped connection (the manager reconnects), within the timeout.
    /// Acquire scripts are never finished late nor retried: their clean-up is ordered after
    /// the request it sees, and a late `EVAL` would come after it.
    async fn eval(&self, call: &Arc<ScriptCall>, timeout: Duration) -> Reply {
        let mut conn = self.conn.clone();
        let call2 = call.clone();
        let run = Box::pin(async move {
            let mut tries = if call2.idempotent { 2 } else { 1 };
            let mut migrating = Migrating::new(call2.idempotent);
            loop {
                tries -= 1;
                let slot = call2.slot;
                let reply = match Reply::from_result(conn.request(&call2.evalsha, slot).await) {
                    Reply::Error(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        Reply::from_result(conn.request(&call2.eval(), slot).await)
                    }
                    other => other,
                };
                match reply {
                    Reply::Error(e)
                        if tries > 0 && (e.is_connection_dropped() || e.is_io_error()) =>
                    {
                        continue;
                    }
                    Reply::Error(e) if migrating.again(&e).await => tries += 1,
                    other => return other,
                }
            }
        });
        wait_or_finish_late(run, timeout, call.idempotent).await
    }
}

/// A voter's connection: one master's, or a Redis Cluster's.
#[derive(Clone)]
enum Conn {
    Plain(ConnectionManager),
    Cluster(ClusterConn),
}

/// A Redis Cluster voter's connections: redis-rs's cluster client, which follows `MOVED`
/// and `ASK` redirects and refreshes its slot map by itself, and the direct path to the
/// shard masters for requests whose slot is known ([`direct`]; `None` with TLS).
#[derive(Clone)]
struct ClusterConn {
    client: redis::cluster_async::ClusterConnection,
    direct: Option<Arc<direct::Direct>>,
}

impl Conn {
    /// Sends one command whose keys are all in `slot` (`None`: unknown, or no key): on a
    /// Redis Cluster voter straight to the slot's master when it can, else through the
    /// cluster client.
    async fn request(&mut self, cmd: &Cmd, slot: Option<u16>) -> redis::RedisResult<Value> {
        let Conn::Cluster(c) = self else {
            return self.req_packed_command(cmd).await;
        };
        if let (Some(d), Some(slot)) = (&c.direct, slot) {
            return d.send(cmd, slot).await;
        }
        c.client.req_packed_command(cmd).await
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.client.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.client.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.client.get_db(),
        }
    }
}

/// How many times the cluster client may send one command again: enough for a `MOVED`
/// and an `ASK` in a row (a slot migrating while the slot map is refreshed), and few, so
/// that a dead shard fails fast (every command is bounded by the node timeout anyway).
const CLUSTER_RETRIES: u32 = 3;

/// How long data sent to a Redis Cluster voter's node may stay unacknowledged before the
/// connection is given up (`TCP_USER_TIMEOUT`, Linux).
#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
const DEAD_PEER: Duration = Duration::from_secs(10);

/// A Redis Cluster voter's connection, made lazily (the first command connects).
fn cluster_connection(
    spec: &NodeSpec,
    seeds: &[ConnectionInfo],
    connect_timeout: Duration,
) -> Result<redis::cluster_async::ClusterConnection, Error> {
    let client = cluster_builder(spec, seeds, connect_timeout)
        .build()
        .map_err(|e| Error::config("nodes", format!("{}: {}", spec.addr, e.kind_str())))?;
    // We bound every command ourselves, so the client's own response timeout is off.
    let config = redis::cluster::ClusterConfig::new().set_connection_timeout(connect_timeout);
    Ok(client.get_pending_async_connection_with_config(config))
}

/// The cluster client settings of a Redis Cluster voter, shared by its command connection
/// and its release subscriptions: the seeds, [`CLUSTER_RETRIES`], short retry pauses, the
/// connect timeout, and the TLS settings (certificate authorities, client certificate) of a
/// `rediss+cluster://` voter.
pub(crate) fn cluster_builder(
    spec: &NodeSpec,
    seeds: &[ConnectionInfo],
    connect_timeout: Duration,
) -> redis::cluster::ClusterClientBuilder {
    let builder = redis::cluster::ClusterClientBuilder::new(seeds.to_vec())
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(1)
        .max_retry_wait(100)
        .connection_timeout(connect_timeout);
    // A shard's master that vanishes without closing its connections (its machine
    // crashed) is given up once data sent to it stays unacknowledged this long, so the
    // cluster client looks for the replica promoted in its place instead of writing into
    // a dead connection for the kernel's quarter of an hour. A paused process is still
    // acknowledged by its kernel: it is waited for, as our timeouts say. Requests go out
    // at once (no Nagle delay behind an unacknowledged one).
    let builder = builder.tcp_settings(cluster_tcp());
    #[cfg(feature = "tls-rustls")]
    if let Some(certs) = &spec.tls {
        return builder.certs(certs.clone());
    }
    #[cfg(not(feature = "tls-rustls"))]
    let _ = spec;
    builder
}

/// The TCP settings of a Redis Cluster voter's connections: no Nagle delay, and (Linux) a
/// peer given up after [`DEAD_PEER`] of unacknowledged data (see [`cluster_builder`]).
fn cluster_tcp() -> redis::io::tcp::TcpSettings {
    let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let tcp = tcp.set_user_timeout(DEAD_PEER);
    tcp
}

/// An idempotent script on a Redis Cluster voter whose slot is half-way through a
/// migration: Redis answers `TRYAGAIN` (a script names several keys, some of them moved
/// already) or refuses a key the script reaches that is not on this side, until the
/// migration ends, usually within a second. The script is sent again, after a pause that
/// grows from 5 to 100 ms, at most [`MIGRATING_TRIES`] times; the caller stops waiting at
/// its timeout as for any request, and an idempotent script goes on in the background
/// (within [`LATE_LIMIT`]). A non-idempotent script (an acquisition) is never sent again:
/// the voter counts as failed for it, and the clean-up release is the one that waits.
struct Migrating {
    left: u32,
    pause: Duration,
}

/// How many times an idempotent script is sent again while its slot migrates (with the
/// pauses of [`Migrating`], about 30 s in all, as [`LATE_LIMIT`]).
const MIGRATING_TRIES: u32 = 300;

impl Migrating {
    fn new(idempotent: bool) -> Migrating {
        Migrating {
            left: if idempotent { MIGRATING_TRIES } else { 0 },
            pause: Duration::from_millis(5),
        }
    }

    /// Whether `e` says the slot is migrating and another try is left (after the pause).
    async fn again(&mut self, e: &RedisError) -> bool {
        let migrating = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
            || e.detail().is_some_and(|d| d.contains("non local key"))
            || e.to_string().contains("non local key");
        if !migrating || self.left == 0 {
            return false;
        }
        self.left -= 1;
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(100));
        true
    }
}

/// Waits at most `timeout` for a request; if it is not done by then, the caller gets
/// [`Reply::TimedOut`] and, when `finish_late`, the request goes on in the background
/// (for at most [`LATE_LIMIT`]) instead of being dropped.
///
/// The request comes boxed (so that it can go on alone), boxed where it is built: a large
/// future moved into a box later is copied once more on the way.
pub(crate) async fn wait_or_finish_late(
    mut run: Pin<Box<dyn Future<Output = Reply> + Send + 'static>>,
    timeout: Duration,
    finish_late: bool,
) -> Reply {
    tokio::select! {
        r = &mut run => r,
        () = tokio::time::sleep(timeout) => {
            if finish_late {
                crate::io::background::spawn(async move {
                    let _ = tokio::time::timeout(LATE_LIMIT, run).await;
                });
            }
            Reply::TimedOut
        }
    }
}

/// How long an idempotent script may go on in the background after its caller stopped
/// waiting (a node paused for longer simply keeps the key until its TTL).
pub(crate) const LATE_LIMIT: Duration = Duration::from_secs(30);

/// A duration in whole milliseconds, rounded up and saturating (a TTL of 1.5 ms is sent as
/// 2 ms: Redis then holds the key at least as long as we assume). The one conversion of a
/// duration into a `PX` or script argument, called only by the request builders here.
fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if !d.subsec_nanos().is_multiple_of(1_000_000) {
        ms.saturating_add(1)
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A duration as a script argument: whole milliseconds, rounded up ([`millis_ceil`]).
fn millis_arg(d: Duration) -> Vec<u8> {
    millis_ceil(d).to_string().into_bytes()
}

/// The shape of a request's answer, which says how to decode it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `SET … NX GET` (nil, or the holder's token), the acquire script (1/0), the fenced
    /// acquire (`{1, counter}`/`{0}`).
    Acquire,
    /// A compare-and-X script: 1 done, 0 our token is not there.
    Compare,
    /// A release script: `{deleted, listeners}`.
    Release,
    /// A semaphore's acquire: `{1, load}`/0, or the error `PERMITS <stored configuration>`.
    Permit,
}

/// What goes on the wire.
#[derive(Clone)]
enum Wire {
    Cmd(Cmd),
    Script(Arc<ScriptCall>),
}

/// The slot of a request command's key, its first argument after the command's name
/// (every [`Wire::Cmd`] is a single-key command: `SET key …`).
fn key_slot(cmd: &Cmd) -> Option<u16> {
    match cmd.args_iter().nth(1)? {
        redis::Arg::Simple(key) => Some(crate::base::slot::key_slot(key)),
        _ => None,
    }
}

/// What an acquisition that met a copy of itself on a node counts as (a failure).
const SENT_TWICE: &str = "the node already holds this attempt's token: the request was sent twice";

/// One prepared request, shared by every node of a round, and how its answer is read.
///
/// Built once per round by the constructors below, which are the only place a TTL becomes
/// a `PX` or script argument.
#[derive(Clone)]
pub(crate) struct Request {
    wire: Wire,
    answer: Answer,
    /// An acquisition's own token: a node answering that it already holds it was sent the
    /// same request twice (see [`Request::decode`]).
    own: Option<Holder>,
}

impl Request {
    /// Takes the lock: `SET key token NX PX ttl GET` for one key (Redis ≥ 7.0), the
    /// all-or-nothing script for several.
    pub(crate) fn acquire(keys: &[Vec<u8>], token: &Token, ttl: Duration) -> Request {
        let px = millis_ceil(ttl);
        let wire = match keys {
            [key] => {
                let mut set = redis::cmd("SET");
                set.arg(key.as_slice())
                    .arg(token.as_bytes())
                    .arg("NX")
                    .arg("PX")
                    .arg(px)
                    .arg("GET");
                Wire::Cmd(set)
            }
            _ => Wire::Script(Arc::new(ScriptCall::new(
                &ACQUIRE_MANY,
                keys.to_vec(),
                vec![token.as_bytes().to_vec(), px.to_string().into_bytes()],
            ))),
        };
        Request {
            wire,
            answer: Answer::Acquire,
            own: Some(Holder::new(token.as_bytes().to_vec())),
        }
    }

    /// A queued waiter's acquire with its own queued token (`claim.lua`): as
    /// `SET … NX PX GET`, and a key that already holds `token` (transferred to it) counts
    /// as granted, its expiry set to `ttl`. Only single-resource waiters queue; for several
    /// keys this is the plain all-or-nothing acquire.
    pub(crate) fn claim(keys: &[Vec<u8>], token: &Token, ttl: Duration) -> Request {
        let args = vec![token.as_bytes().to_vec(), millis_arg(ttl)];
        match keys {
            [key] => Request::script(&CLAIM, vec![key.clone()], args, Answer::Acquire),
            _ => Request::acquire(keys, token, ttl),
        }
    }

    fn script(script: &'static Lua, keys: Vec<Vec<u8>>, args: Vec<Vec<u8>>, a: Answer) -> Request {
        Request {
            wire: Wire::Script(Arc::new(ScriptCall::new(script, keys, args))),
            answer: a,
            own: None,
        }
    }

    /// The fenced acquire (round 1); `keys` are the lock keys, then the fence counters.
    pub(crate) fn acquire_fenced(keys: Vec<Vec<u8>>, token: &Token, ttl: Duration) -> Request {
        let px = millis_ceil(ttl).to_string().into_bytes();
        let args = vec![token.as_bytes().to_vec(), px];
        Request::script(&ACQUIRE_FENCED, keys, args, Answer::Acquire)
    }

    /// The fence commit (round 2) of `t`; `keys` as for [`Request::acquire_fenced`].
    pub(crate) fn commit_fence(keys: Vec<Vec<u8>>, token: &Token, t: u64) -> Request {
        let args = vec![token.as_bytes().to_vec(), t.to_string().into_bytes()];
        Request::script(&COMMIT_FENCE, keys, args, Answer::Compare)
    }

    /// Compare-and-extend every key to at least `ttl`.
    pub(crate) fn extend(keys: Vec<Vec<u8>>, token: &Token, ttl: Duration) -> Request {
        let px = millis_ceil(ttl).to_string().into_bytes();
        let args = vec![token.as_bytes().to_vec(), px];
        Request::script(&EXTEND, keys, args, Answer::Compare)
    }

    /// Compare-and-delete of a mutex's keys, with hand-off (`release_one.lua`): where a
    /// resource's leases key is absent (no one waits or listens) a plain compare-and-delete;
    /// else this holder's own queue entries (`token` and `waiter`) leave the queue and the
    /// key, if it holds `token`, goes to the queue's head, announced. `loud` says whether
    /// this node announces the plain releases of the resources
    /// ([`Resources::announces_on`]). The key and argument layout is built here only.
    pub(crate) fn release(res: &Resources, token: &Token, waiter: &[u8], loud: bool) -> Request {
        let mut keys = Vec::with_capacity(res.len() * 5);
        let mut args = Vec::with_capacity(2 + res.len() * 2);
        args.push(token.as_bytes().to_vec());
        args.push(waiter.to_vec());
        let space = res.keyspace();
        for name in res.names() {
            let [queue, leases, attrs] = space.queue_keys(name);
            keys.extend([space.lock_key(name), queue, leases, attrs]);
            keys.push(space.fence_key(name));
            args.push(space.channel(name));
            args.push(if loud { b"1".to_vec() } else { b"0".to_vec() });
        }
        Request::script(&RELEASE_ONE, keys, args, Answer::Release)
    }

    /// A reader's acquire on a read-write lock's keys.
    pub(crate) fn read_acquire(keys: &RwKeys, token: &Token, ttl: Duration) -> Request {
        let ks = vec![
            keys.writer.clone(),
            keys.readers.clone(),
            keys.intent.clone(),
        ];
        let args = vec![token.as_bytes().to_vec(), millis_arg(ttl)];
        Request::script(&READ_ACQUIRE, ks, args, Answer::Acquire)
    }

    /// The writer's acquire on a read-write lock's keys; `intent` is the waiting writer's
    /// id (empty for an attempt that does not wait), registered for `lease` when refused.
    pub(crate) fn write_acquire(
        keys: &RwKeys,
        token: &Token,
        ttl: Duration,
        intent: &[u8],
        lease: Duration,
        fenced: bool,
    ) -> Request {
        let ks = vec![
            keys.writer.clone(),
            keys.readers.clone(),
            keys.intent.clone(),
            keys.fence.clone(),
        ];
        let fenced = if fenced { b"1" } else { b"0" };
        let args = vec![
            token.as_bytes().to_vec(),
            millis_arg(ttl),
            intent.to_vec(),
            millis_arg(lease),
            fenced.to_vec(),
        ];
        Request::script(&WRITE_ACQUIRE, ks, args, Answer::Acquire)
    }

    /// A semaphore permit's acquire, with the clients' configuration text and the
    /// per-node limit `c`.
    pub(crate) fn sem_acquire(
        keys: &SemKeys,
        token: &Token,
        ttl: Duration,
        config: &str,
        limit: u32,
    ) -> Request {
        let ks = vec![keys.holders.clone(), keys.config.clone()];
        let args = vec![
            token.as_bytes().to_vec(),
            millis_arg(ttl),
            config.as_bytes().to_vec(),
            limit.to_string().into_bytes(),
        ];
        Request::script(&SEM_ACQUIRE, ks, args, Answer::Permit)
    }

    /// The extension of a held lock of any kind: the mutex's and the writer's
    /// compare-and-extend of their keys, a reader's or a permit's extension of its entry.
    pub(crate) fn extend_held(
        kind: &Kind,
        res: &Resources,
        token: &Token,
        ttl: Duration,
    ) -> Request {
        let shared = |keys: Vec<Vec<u8>>| {
            let args = vec![token.as_bytes().to_vec(), millis_arg(ttl)];
            Request::script(&SHARED_EXTEND, keys, args, Answer::Compare)
        };
        match kind {
            Kind::Exclusive => Request::extend(res.lock_keys().to_vec(), token, ttl),
            Kind::Write(k) => Request::extend(vec![k.writer.clone()], token, ttl),
            Kind::Read(k) => shared(vec![k.readers.clone()]),
            Kind::Permit(k) => shared(vec![k.holders.clone(), k.config.clone()]),
        }
    }

    /// The release of a held lock of any kind (also the clean-up of a failed attempt and a
    /// permit's give-back). Only the mutex announces and hands over ([`Request::release`],
    /// with `loud`).
    pub(crate) fn release_held(
        kind: &Kind,
        res: &Resources,
        token: &Token,
        waiter: &[u8],
        loud: bool,
    ) -> Request {
        let shared = |keys: Vec<Vec<u8>>| {
            let args = vec![token.as_bytes().to_vec()];
            Request::script(&SHARED_RELEASE, keys, args, Answer::Release)
        };
        match kind {
            Kind::Exclusive => Request::release(res, token, waiter, loud),
            Kind::Write(k) => {
                let args = vec![token.as_bytes().to_vec()];
                Request::script(&RELEASE, vec![k.writer.clone()], args, Answer::Release)
            }
            Kind::Read(k) => shared(vec![k.readers.clone()]),
            Kind::Permit(k) => shared(vec![k.holders.clone(), k.config.clone()]),
        }
    }

    /// A waiting writer leaves: its intent `id` is removed from the intents' set.
    pub(crate) fn leave_intent(keys: &RwKeys, id: &[u8]) -> Request {
        let args = vec![id.to_vec()];
        Request::script(
            &SHARED_RELEASE,
            vec![keys.intent.clone()],
            args,
            Answer::Release,
        )
    }

    /// Decodes a raw answer to this request.
    ///
    /// An acquisition answered with its own token (`SET … GET`), or `-1` (`acquire.lua`:
    /// every key already holds it), met a copy of itself: redis-rs's cluster client sends a
    /// command again after a connection dropped before the reply, and the first copy may
    /// have run. That is no refusal (a refused node is never cleaned up, as its key is
    /// someone else's): the answer becomes a failure, so the attempt's clean-up releases
    /// the node, and the node is never counted as granted either (its key's TTL started at
    /// the first copy).
    fn decode(&self, raw: Reply) -> Typed {
        match decode(self.answer, raw) {
            Typed::HeldBy(Some(h)) if self.own.as_ref() == Some(&h) => {
                Typed::Failed(SENT_TWICE.to_owned())
            }
            other => other,
        }
    }

    /// What this request does, for the metrics' `op` label (from its script: no field).
    pub(crate) fn op(&self) -> Op {
        let Wire::Script(s) = &self.wire else {
            return Op::Acquire;
        };
        let is = |lua: &Lua| std::ptr::eq(s.code, lua.code);
        if is(&EXTEND) || is(&SHARED_EXTEND) {
            Op::Extend
        } else if is(&RELEASE) || is(&RELEASE_ONE) || is(&SHARED_RELEASE) {
            Op::Release
        } else if is(&COMMIT_FENCE) {
            Op::FenceCommit
        } else {
            Op::Acquire
        }
    }
}

/// The kind of a wait-queue entry: what a release does when it pops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// The release transfers the lock to the entry's token (`t`).
    Transfer,
    /// The same, raising the fence counter as a fenced grant does (`f`).
    FencedTransfer,
}

impl EntryKind {
    fn code(self) -> &'static [u8] {
        match self {
            EntryKind::Transfer => b"t",
            EntryKind::FencedTransfer => b"f",
        }
    }
}

/// A wait-queue join (or renewal) on one node (`enqueue.lua`).
pub(crate) struct QueueJoin {
    call: Arc<ScriptCall>,
}

/// What a wait-queue join says about the waiter, besides its keys.
pub(crate) struct JoinArgs<'a> {
    /// The waiter's token (its entry, and the lock token a transfer sets).
    pub(crate) token: &'a [u8],
    /// Its ticket, as a node printed it; empty to have the node assign one (its clock).
    pub(crate) ticket: &'a [u8],
    /// The entry's lease.
    pub(crate) lease: Duration,
    /// The TTL a transfer sets the key with.
    pub(crate) ttl: Duration,
    /// What a release does when it pops the entry.
    pub(crate) kind: EntryKind,
    /// The first join of this token on this node (only a first join adds it; a renewal
    /// of a token that is gone answers so and never adds it back).
    pub(crate) first: bool,
    /// The channel a transfer to the entry is announced on (the waiter's client's own),
    /// or empty for the resource's channel.
    pub(crate) inbox: &'a [u8],
}

/// The keys of one resource's waiting state as the queue scripts take them
/// (`enqueue.lua`, `listen.lua`): its queue, leases and attributes, then its lock key.
fn queue_group(res: &Resources, name: &str) -> [Vec<u8>; 4] {
    let space = res.keyspace();
    let [queue, leases, attrs] = space.queue_keys(name);
    [queue, leases, attrs, space.lock_key(name)]
}

impl QueueJoin {
    /// Joins or renews on the wait queue of `res`'s (first) resource.
    pub(crate) fn new(res: &Resources, a: &JoinArgs<'_>) -> QueueJoin {
        let ks = queue_group(res, res.names().first().map_or("", String::as_str)).to_vec();
        let first = if a.first { b"1" } else { b"0" };
        let args = vec![
            a.token.to_vec(),
            a.ticket.to_vec(),
            millis_arg(a.lease),
            millis_arg(a.ttl),
            a.kind.code().to_vec(),
            first.to_vec(),
            a.inbox.to_vec(),
        ];
        QueueJoin {
            call: Arc::new(ScriptCall::new(&ENQUEUE, ks, args)),
        }
    }

    /// A multi-resource waiter's mark (`listen.lua`): its `id` in every resource's leases
    /// for `lease`, so the releases of those resources announce themselves. `own`: the
    /// token of the waiter's latest refused attempt, whose keys the reply counts as free.
    pub(crate) fn listen(
        res: &Resources,
        id: &[u8],
        lease: Duration,
        own: Option<&[u8]>,
    ) -> QueueJoin {
        let mut args = vec![id.to_vec(), millis_arg(lease)];
        if let Some(own) = own {
            args.push(own.to_vec());
        }
        let ks = res
            .names()
            .iter()
            .flat_map(|n| queue_group(res, n))
            .collect();
        QueueJoin {
            call: Arc::new(ScriptCall::new(&LISTEN, ks, args)),
        }
    }
}

/// Decodes a join's answer, `{state, ahead, ticket, holds[, free]}`: `None` for a failure
/// or any other shape (an unreadable answer is an absent one).
pub(crate) fn decode_join(raw: Reply) -> Option<QueuePlace> {
    let Reply::Value(Value::Array(a)) = raw else {
        return None;
    };
    let (Some(Value::Int(state)), Some(ahead), Some(Value::Int(holds))) =
        (a.first(), a.get(1), a.get(3))
    else {
        return None;
    };
    let state = match state {
        0 => QueueState::Queued,
        1 => QueueState::Added,
        2 => QueueState::Gone,
        _ => return None,
    };
    let ahead = match ahead {
        Value::Int(n) => u64::try_from(*n).ok()?,
        Value::Nil => 0,
        _ => return None,
    };
    let score = match a.get(2) {
        Some(Value::BulkString(s)) => Some(s.clone()),
        _ => None,
    };
    Some(QueuePlace {
        state,
        ahead,
        score,
        holds: *holds == 1,
        free: matches!(a.get(4), Some(Value::Int(1))),
    })
}

/// The error code `sem_acquire.lua` refuses a mismatched configuration with.
const PERMITS_MISMATCH: &str = "PERMITS";

/// Turns a raw answer into a typed reply; anything of the wrong shape is a failure.
pub(crate) fn decode(answer: Answer, raw: Reply) -> Typed {
    let v = match raw {
        Reply::TimedOut => return Typed::TimedOut,
        Reply::Error(e) if answer == Answer::Permit && e.code() == Some(PERMITS_MISMATCH) => {
            return Typed::Mismatch(e.detail().unwrap_or_default().trim().to_owned());
        }
        Reply::Error(e) => return Typed::Failed(Reply::error_text(&e)),
        Reply::Value(v) => v,
    };
    let typed = match (answer, &v) {
        (Answer::Acquire, Value::Nil | Value::Okay | Value::Int(1)) => Some(Typed::Granted),
        (Answer::Permit, Value::Int(0)) => Some(Typed::HeldBy(None)),
        (Answer::Permit, Value::Array(a)) => match (a.first(), a.get(1)) {
            (Some(Value::Int(1)), Some(Value::Int(n))) => {
                u64::try_from(*n).ok().map(|load| Typed::Admitted { load })
            }
            _ => None,
        },
        (Answer::Compare, Value::Int(1)) => Some(Typed::Granted),
        (Answer::Acquire | Answer::Compare, Value::Int(0)) => Some(Typed::HeldBy(None)),
        (Answer::Acquire, Value::Int(-1)) => Some(Typed::Failed(SENT_TWICE.to_owned())),
        (Answer::Acquire, Value::BulkString(owner)) => {
            Some(Typed::HeldBy(Some(Holder::new(owner.clone()))))
        }
        (Answer::Acquire, Value::Array(a)) => match (a.first(), a.get(1)) {
            (Some(Value::Int(0)), _) => Some(Typed::HeldBy(None)),
            (Some(Value::Int(1)), Some(Value::Int(t))) => fencing::token_of(*t).map(Typed::Fenced),
            _ => None,
        },
        // The uncontended release of one resource (`release_one.lua`'s first path).
        (Answer::Release, Value::Int(d @ (0 | 1))) => Some(Typed::Released {
            deleted: d.unsigned_abs(),
            listeners: 0,
        }),
        (Answer::Release, Value::Array(a)) => match (a.first(), a.get(1), a.get(2)) {
            // A transfer (`release_one.lua`): the key left our token, to the queue's head.
            (Some(Value::Int(2)), Some(Value::Int(l)), Some(Value::Int(_))) => {
                Some(Typed::Released {
                    deleted: 1,
                    listeners: u64::try_from(*l).unwrap_or(0),
                })
            }
            (Some(Value::Int(d)), Some(Value::Int(l)), None) => Some(Typed::Released {
                deleted: u64::try_from(*d).unwrap_or(0),
                listeners: u64::try_from(*l).unwrap_or(0),
            }),
            _ => None,
        },
        _ => None,
    };
    typed.unwrap_or_else(|| Typed::Failed(format!("unexpected reply: {}", short_value(&v))))
}

/// What a request puts on the wire, for the simulator (`sim::client`), which runs the very
/// requests built here against simulated nodes.
#[cfg(feature = "sim")]
pub(crate) enum Sent<'a> {
    /// A command's words.
    Cmd(Vec<&'a [u8]>),
    /// A script: its source (one of the statics above), whether it is idempotent, its
    /// keys and its arguments.
    Script(&'static str, bool, &'a [Vec<u8>], &'a [Vec<u8>]),
}

#[cfg(feature = "sim")]
impl Request {
    /// How the answer is read ([`decode`]).
    pub(crate) fn answer(&self) -> Answer {
        self.answer
    }

    /// What is sent.
    pub(crate) fn sent(&self) -> Sent<'_> {
        match &self.wire {
            Wire::Cmd(c) => Sent::Cmd(
                c.args_iter()
                    .filter_map(|a| match a {
                        redis::Arg::Simple(w) => Some(w),
                        _ => None,
                    })
                    .collect(),
            ),
            Wire::Script(s) => Sent::Script(s.code, s.idempotent, &s.keys, &s.args),
        }
    }
}

#[cfg(feature = "sim")]
impl QueueJoin {
    /// What is sent.
    pub(crate) fn sent(&self) -> Sent<'_> {
        Sent::Script(
            self.call.code,
            self.call.idempotent,
            &self.call.keys,
            &self.call.args,
        )
    }
}

#[cfg(feature = "sim")]
impl Lua {
    /// The script's source.
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }
}

#[cfg(feature = "sim")]
impl Lua {
    /// The files of `src/scripts/` its source is made of.
    pub(crate) fn files(&self) -> &'static [&'static str] {
        self.files
    }
}

fn short_value(v: &Value) -> String {
    let s = format!("{v:?}");
    if s.len() > 80 {
        let mut cut = 80;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

impl Node {
    /// Joins (or renews) a wait-queue place, bounded by `timeout` (never finished late
    /// nor retried, see [`ENQUEUE`]).
    pub(crate) async fn join_queue(
        &self,
        join: &QueueJoin,
        timeout: Duration,
    ) -> Option<QueuePlace> {
        // A queue join counts as a vote: it reports a key transferred to the waiter.
        let timeout = self.admitted_within(timeout).await.ok()?;
        decode_join(self.eval(&join.call, timeout).await)
    }

    /// Marks a multi-resource waiter as listening ([`QueueJoin::listen`]), bounded by
    /// `timeout`: whether no lock key of its set is held there (`None`: no answer).
    pub(crate) async fn listen(&self, join: &QueueJoin, timeout: Duration) -> Option<bool> {
        let timeout = self.admitted_within(timeout).await.ok()?;
        match self.eval(&join.call, timeout).await {
            Reply::Value(Value::Int(free)) => Some(free == 1),
            _ => None,
        }
    }

    /// Sends a prepared request, bounded by `timeout`, and decodes the answer.
    pub(crate) async fn send(&self, req: &Request, timeout: Duration) -> Typed {
        let timer = Timer::start();
        let reply = req.decode(self.send_raw(req, timeout).await);
        self.metrics.request(timer, req.op(), &reply);
        reply
    }

    async fn send_raw(&self, req: &Request, timeout: Duration) -> Reply {
        // A release only deletes our own token: always sent. Every other request votes:
        // a voter read now (not admitted at build) leaves the request the rest of the time.
        let timeout = if req.op() == Op::Release {
            timeout
        } else {
            match self.admitted_within(timeout).await {
                Ok(left) => left,
                Err(why) => return identity::refusal(why),
            }
        };
        match &req.wire {
            Wire::Cmd(c) => {
                let slot = if self.is_cluster() { key_slot(c) } else { None };
                self.query_in(c, slot, timeout).await
            }
            Wire::Script(s) => self.eval(s, timeout).await,
        }
    }

    /// Sends a prepared request once `ready` completes (another request of ours to this
    /// node finished), the caller waiting at most `timeout` in all. An idempotent script
    /// still goes out in the background when the caller stopped waiting (see
    /// [`Node::eval`]).
    pub(crate) async fn send_after<W>(
        &self,
        ready: W,
        req: Arc<Request>,
        timeout: Duration,
    ) -> Typed
    where
        W: Future<Output = ()> + Send + 'static,
    {
        let late = matches!(&req.wire, Wire::Script(s) if s.idempotent);
        let (node, sent) = (self.clone(), req.clone());
        let timer = Timer::start();
        let run = Box::pin(async move {
            ready.await;
            node.send_raw(&sent, timeout).await
        });
        let reply = req.decode(wait_or_finish_late(run, timeout, late).await);
        self.metrics.request(timer, req.op(), &reply);
        reply
    }

    /// Runs a batch of extensions in one pipeline (see [`ExtendBatch`]); one reply per
    /// lock, in order.
    pub(crate) async fn extend_batch(&self, batch: &ExtendBatch, timeout: Duration) -> Vec<Typed> {
        let timer = Timer::start();
        let replies = self.extend_replies(batch, timeout).await;
        self.metrics.batch(timer, &replies);
        replies
    }

    async fn extend_replies(&self, batch: &ExtendBatch, timeout: Duration) -> Vec<Typed> {
        let timeout = match self.admitted_within(timeout).await {
            Ok(left) => left,
            Err(why) => {
                return batch
                    .answers
                    .iter()
                    .map(|a| decode(*a, identity::refusal(why.clone())))
                    .collect();
            }
        };
        if self.is_cluster() {
            // The locks' keys are in many slots, so each extension goes to its own shard.
            let sends = batch.requests.iter().map(|r| self.send_raw(r, timeout));
            let replies = futures::future::join_all(sends).await;
            return batch
                .requests
                .iter()
                .zip(replies)
                .map(|(r, raw)| r.decode(raw))
                .collect();
        }
        let count = batch.answers.len();
        match self
            .pipeline(&batch.pipe, batch.loads + count, timeout)
            .await
        {
            Ok(values) => batch
                .answers
                .iter()
                .enumerate()
                .map(|(k, a)| match values.get(batch.loads + k) {
                    Some(v) => decode(*a, Reply::from_result(Ok(v.clone()))),
                    None => Typed::Failed("missing pipeline reply".to_owned()),
                })
                .collect(),
            // Every extension of the pipeline met the same failure (or time-out).
            Err(raw) => vec![decode(Answer::Compare, raw); count],
        }
    }
}

/// Several locks' extensions for one node: `SCRIPT LOAD` of each extend script they use
/// (so the `EVALSHA`s that follow find it even on a node that restarted), then one
/// `EVALSHA` per lock, each lock's own prepared extension ([`Request::extend_held`]).
pub(crate) struct ExtendBatch {
    /// The extensions one by one, for a Redis Cluster voter (one pipeline cannot span slots).
    requests: Vec<Request>,
    pipe: redis::Pipeline,
    /// The `SCRIPT LOAD`s ahead of the extensions.
    loads: usize,
    /// How each extension's answer is read, in order.
    answers: Vec<Answer>,
}

impl ExtendBatch {
    /// A batch of prepared extensions.
    pub(crate) fn new<'a>(requests: impl IntoIterator<Item = &'a Request>) -> ExtendBatch {
        let requests: Vec<&Request> = requests.into_iter().collect();
        let mut pipe = redis::pipe();
        let mut loaded: Vec<&'static str> = Vec::new();
        for r in &requests {
            if let Wire::Script(s) = &r.wire
                && !loaded.iter().any(|c| std::ptr::eq(*c, s.code))
            {
                pipe.cmd("SCRIPT").arg("LOAD").arg(s.code);
                loaded.push(s.code);
            }
        }
        for r in &requests {
            match &r.wire {
                Wire::Script(s) => pipe.add_command(s.evalsha.clone()),
                Wire::Cmd(c) => pipe.add_command(c.clone()),
            };
        }
        ExtendBatch {
            pipe,
            loads: loaded.len(),
            answers: requests.iter().map(|r| r.answer).collect(),
            requests: requests.iter().map(|r| (*r).clone()).collect(),
        }
    }
}

/// A prepared script invocation (keys and arguments), shared by every node of a round.
struct ScriptCall {
    code: &'static str,
    idempotent: bool,
    /// The slot of its first key (a script's keys all share one on Redis Cluster voters).
    slot: Option<u16>,
    evalsha: Cmd,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    fn new(script: &'static Lua, keys: Vec<Vec<u8>>, args: Vec<Vec<u8>>) -> ScriptCall {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.hash()).arg(keys.len());
        for k in &keys {
            evalsha.arg(k.as_slice());
        }
        for a in &args {
            evalsha.arg(a.as_slice());
        }
        ScriptCall {
            code: script.code,
            idempotent: script.idempotent,
            slot: keys.first().map(|k| crate::base::slot::key_slot(k)),
            evalsha,
            keys,
            args,
        }
    }

    fn eval(&self) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(self.code).arg(self.keys.len());
        for k in &self.keys {
            eval.arg(k.as_slice());
        }
        for a in &self.args {
            eval.arg(a.as_slice());
        }
        eval
    }
}

/// Server errors that say "not now" rather than "not this": a node busy with a script,
/// loading its data, or without a quorum of its own. A replica (`READONLY`) or a node
/// refusing writes for now (`OOM`, `MISCONF`, `NOREPLICAS`) cannot take a write; on a
/// Redis Cluster voter, a redirection the cluster client could not follow (`MOVED`, `ASK`:
/// the slot's master is down until the cluster fails it over) says where a key is, not
/// what it holds. The guards that fail closed (the group-map record, a voter's identity)
/// treat these as no answer: read again later, never a grant.
const TRANSIENT: &[&str] = &[
    "BUSY",
    "LOADING",
    "TRYAGAIN",
    "MOVED",
    "ASK",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "READONLY",
    "OOM",
    "MISCONF",
    "NOREPLICAS",
];

/// Whether a server error is one of [`TRANSIENT`] (an error without a code is not).
pub(crate) fn is_transient(e: &RedisError) -> bool {
    e.code().is_some_and(|code| TRANSIENT.contains(&code))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client certificate goes wherever the certificate authorities go: into a single
    /// master's connection settings (read by its command connection, its connection manager
    /// and its release subscription), and into a Redis Cluster voter's TLS settings (read by
    /// [`cluster_builder`], so its commands and sharded subscriptions on every node).
    #[cfg(feature = "tls-rustls")]
    #[test]
    fn the_client_certificate_reaches_single_masters_and_cluster_voters() -> Result<(), Error> {
        let fail = |e: rcgen::Error| Error::config("test", e.to_string());
        let key = rcgen::KeyPair::generate().map_err(fail)?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .map_err(fail)?
            .self_signed(&key)
            .map_err(fail)?;
        let ca = tls::RootCa::new(cert.pem().into_bytes());
        let auth = tls::ClientAuth::new(cert.pem().into_bytes(), key.serialize_pem().into_bytes());
        ca.validate()?;
        auth.validate()?;
        let Some(certs) = tls::certificates(None, Some(&auth)) else {
            return Err(Error::config(
                "test",
                "no TLS settings for a client certificate",
            ));
        };
        assert!(certs.client_tls.is_some() && certs.root_cert.is_none());
        assert!(tls::certificates(None, None).is_none());
        let Some(both) = tls::certificates(Some(&ca), Some(&auth)) else {
            return Err(Error::config("test", "no TLS settings"));
        };
        assert!(both.client_tls.is_some() && both.root_cert.is_some());

        let cluster = NodeSpec::parse(0, "rediss+cluster://127.0.0.1:1,127.0.0.1:2")?
            .with_tls(&both, "tls_client_auth")?;
        let Some(kept) = &cluster.tls else {
            return Err(Error::config(
                "test",
                "the cluster voter lost its TLS settings",
            ));
        };
        assert!(kept.client_tls.is_some() && kept.root_cert.is_some());

        let single =
            NodeSpec::parse(0, "rediss://127.0.0.1:1")?.with_tls(&both, "tls_client_auth")?;
        assert!(matches!(
            single.info.addr(),
            ConnectionAddr::TcpTls {
                tls_params: Some(_),
                ..
            }
        ));
        // A plain node is left alone.
        let plain =
            NodeSpec::parse(0, "redis://127.0.0.1:1")?.with_tls(&both, "tls_client_auth")?;
        assert!(plain.tls.is_none());
        assert!(matches!(plain.info.addr(), ConnectionAddr::Tcp(..)));
        Ok(())
    }

    #[test]
    fn a_request_is_routed_by_its_keys_slot() -> Result<(), Error> {
        let token = Token::generate()?;
        let key = b"quorumlock:lock:{1f3}orders:42".to_vec();
        let want = Some(crate::base::slot::key_slot(&key));
        let acquire = Request::acquire(std::slice::from_ref(&key), &token, Duration::from_secs(1));
        let Wire::Cmd(set) = &acquire.wire else {
            return Err(Error::invalid(
                "wire",
                "the acquisition of one key is a command",
            ));
        };
        assert_eq!(key_slot(set), want);
        let keys = vec![key.clone(), b"quorumlock:lock:{1f3}orders:43".to_vec()];
        let many = Request::acquire(&keys, &token, Duration::from_secs(1));
        let Wire::Script(call) = &many.wire else {
            return Err(Error::invalid(
                "wire",
                "the acquisition of several keys is a script",
            ));
        };
        assert_eq!(call.slot, want);
        assert_eq!(key_slot(&redis::cmd("PING")), None);
        Ok(())
    }

    #[test]
    fn millis_round_up() {
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::from_millis(7)), 7);
        assert_eq!(millis_ceil(Duration::from_nanos(1)), 1);
        assert_eq!(millis_ceil(Duration::ZERO), 0);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn cluster_voter_urls() {
        let spec =
            NodeSpec::parse(0, "redis+cluster://u:secret@127.0.0.1:7002,127.0.0.1:7001/").unwrap();
        assert!(spec.is_cluster());
        let seeds = spec.seeds.as_deref().unwrap();
        assert_eq!(seeds.len(), 2);
        assert_eq!(seeds[1].redis_settings().password(), Some("secret"));
        assert_eq!(seeds[1].redis_settings().username(), Some("u"));
        // Shown without the password; placed with the seeds sorted (the group map's
        // fingerprint does not depend on their order).
        assert_eq!(
            spec.addr.to_string(),
            "redis+cluster://u:<redacted>@127.0.0.1:7002,127.0.0.1:7001"
        );
        assert_eq!(
            spec.addr.place(),
            "redis+cluster://127.0.0.1:7001,127.0.0.1:7002"
        );
        let other = NodeSpec::parse(1, "redis+cluster://127.0.0.1:7001,127.0.0.1:7002").unwrap();
        assert_eq!(other.addr.place(), spec.addr.place());
        // Sharing a seed is sharing the voter.
        let one = NodeSpec::parse(2, "redis://127.0.0.1:7002").unwrap();
        assert!(spec.same_node(&one) && one.same_node(&spec));
        assert!(
            !NodeSpec::parse(3, "redis://127.0.0.1:7003")
                .unwrap()
                .same_node(&spec)
        );
        assert!(
            !NodeSpec::parse(4, "redis://127.0.0.1:7001")
                .unwrap()
                .is_cluster()
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://127.0.0.1:7001,,127.0.0.1:7002",
            "redis+cluster://127.0.0.1:7001/2",
            "redis+cluster://127.0.0.1:7001?protocol=resp3",
            "redis+cluster://127.0.0.1:notaport",
            "redis+cluster://u:secret@127.0.0.1:1,v:secret@127.0.0.1:2",
        ] {
            let Err(e) = NodeSpec::parse(0, bad) else {
                panic!("{bad} was accepted");
            };
            assert!(!e.to_string().contains("secret"), "{e}");
        }
        #[cfg(not(feature = "tls-rustls"))]
        assert!(matches!(
            NodeSpec::parse(0, "rediss+cluster://127.0.0.1:7001"),
            Err(_)
        ));
    }

    /// An acquisition that meets its own token (a copy of itself, resent by the cluster
    /// client after a lost reply) is a failure, which the clean-up releases; another
    /// owner's token stays a refusal.
    #[test]
    fn an_acquisition_sent_twice_is_a_failure_not_a_refusal() {
        let token = Token::generate().unwrap();
        let v = |v: Value| Reply::Value(v);
        let ours = Value::BulkString(token.as_bytes().to_vec());
        let theirs = Value::BulkString(b"someone-else".to_vec());
        let one = Request::acquire(&[b"k".to_vec()], &token, Duration::from_secs(1));
        assert!(matches!(one.decode(v(ours)), Typed::Failed(e) if e == SENT_TWICE));
        assert!(matches!(one.decode(v(theirs)), Typed::HeldBy(Some(_))));
        assert_eq!(one.decode(v(Value::Nil)), Typed::Granted);
        let many = Request::acquire(
            &[b"a".to_vec(), b"b".to_vec()],
            &token,
            Duration::from_secs(1),
        );
        assert!(matches!(many.decode(v(Value::Int(-1))), Typed::Failed(e) if e == SENT_TWICE));
        assert_eq!(many.decode(v(Value::Int(0))), Typed::HeldBy(None));
        assert_eq!(many.decode(v(Value::Int(1))), Typed::Granted);
        // A compare script's refusal is not an acquisition's: it stays a refusal.
        let ext = Request::extend(vec![b"k".to_vec()], &token, Duration::from_secs(1));
        assert_eq!(ext.decode(v(Value::Int(0))), Typed::HeldBy(None));
    }

    /// Each raw answer shape decodes to the reply the protocol counts.
    #[test]
    fn decoding() {
        let v = |v: Value| Reply::Value(v);
        let int = |i| v(Value::Int(i));
        let arr = |a: Vec<Value>| v(Value::Array(a));
        assert_eq!(decode(Answer::Acquire, v(Value::Nil)), Typed::Granted);
        assert_eq!(decode(Answer::Acquire, int(1)), Typed::Granted);
        assert_eq!(decode(Answer::Acquire, int(0)), Typed::HeldBy(None));
        assert_eq!(
            decode(Answer::Acquire, v(Value::BulkString(b"t".to_vec()))),
            Typed::HeldBy(Some(Holder::new(b"t".to_vec())))
        );
        assert_eq!(
            decode(Answer::Acquire, arr(vec![Value::Int(1), Value::Int(9)])),
            Typed::Fenced(9)
        );
        assert_eq!(
            decode(Answer::Acquire, arr(vec![Value::Int(0)])),
            Typed::HeldBy(None)
        );
        assert!(matches!(
            decode(Answer::Acquire, arr(vec![Value::Int(1), Value::Int(-1)])),
            Typed::Failed(_)
        ));
        assert_eq!(decode(Answer::Compare, int(1)), Typed::Granted);
        assert_eq!(decode(Answer::Compare, int(0)), Typed::HeldBy(None));
        assert!(matches!(
            decode(Answer::Compare, v(Value::Nil)),
            Typed::Failed(_)
        ));
        assert_eq!(
            decode(Answer::Release, arr(vec![Value::Int(1), Value::Int(3)])),
            Typed::Released {
                deleted: 1,
                listeners: 3
            }
        );
        // The uncontended release of one resource answers 1 (deleted) or 0 (not ours).
        for d in [0, 1] {
            assert_eq!(
                decode(Answer::Release, int(d)),
                Typed::Released {
                    deleted: d.unsigned_abs(),
                    listeners: 0
                }
            );
        }
        for bad in [-1, 2] {
            assert!(matches!(
                decode(Answer::Release, int(bad)),
                Typed::Failed(_)
            ));
        }
        assert_eq!(decode(Answer::Compare, Reply::TimedOut), Typed::TimedOut);

        // A fenced grant's counter is a token only in 1..2^53.
        for bad in [0, 1 << 53] {
            assert!(matches!(
                decode(Answer::Acquire, arr(vec![Value::Int(1), Value::Int(bad)])),
                Typed::Failed(_)
            ));
        }
    }

    /// A semaphore's acquire: 1/0, and the refusal of a mismatched configuration as a
    /// typed reply naming the stored one.
    #[test]
    fn decoding_permits() {
        let int = |i| Reply::Value(Value::Int(i));
        let arr = |a: Vec<Value>| Reply::Value(Value::Array(a));
        assert_eq!(
            decode(Answer::Permit, arr(vec![Value::Int(1), Value::Int(2)])),
            Typed::Admitted { load: 2 }
        );
        assert_eq!(decode(Answer::Permit, int(0)), Typed::HeldBy(None));
        for bad in [
            int(1),
            arr(vec![Value::Int(1), Value::Int(-1)]),
            arr(vec![]),
        ] {
            assert!(matches!(decode(Answer::Permit, bad), Typed::Failed(_)));
        }
        // The error a semaphore node refuses a mismatched configuration with.
        let server = |raw: &[u8]| Reply::from_result(redis::parse_redis_value(raw));
        assert_eq!(
            decode(Answer::Permit, server(b"-PERMITS 3:2:3:5\r\n")),
            Typed::Mismatch("3:2:3:5".to_owned())
        );
        // Only the semaphore's acquire reads it so; any other error is a failure.
        assert!(matches!(
            decode(Answer::Acquire, server(b"-PERMITS 3:2:3:5\r\n")),
            Typed::Failed(_)
        ));
        assert!(matches!(
            decode(Answer::Permit, server(b"-ERR boom\r\n")),
            Typed::Failed(_)
        ));
    }

    /// A join's `{state, ahead, ticket, holds}`; anything else reads as no answer.
    #[test]
    fn decoding_joins() {
        let arr = |a: Vec<Value>| Reply::Value(Value::Array(a));
        let score = Value::BulkString(b"1700000000000001".to_vec());
        assert_eq!(
            decode_join(arr(vec![
                Value::Int(1),
                Value::Int(2),
                score,
                Value::Int(0)
            ])),
            Some(QueuePlace {
                state: QueueState::Added,
                ahead: 2,
                score: Some(b"1700000000000001".to_vec()),
                holds: false,
                free: false,
            })
        );
        assert_eq!(
            decode_join(arr(vec![
                Value::Int(2),
                Value::Nil,
                Value::Nil,
                Value::Int(1)
            ])),
            Some(QueuePlace {
                state: QueueState::Gone,
                ahead: 0,
                score: None,
                holds: true,
                free: false,
            })
        );
        // A fifth element: 1 when no key (of the set) is held.
        assert!(
            decode_join(arr(vec![
                Value::Int(0),
                Value::Int(0),
                Value::BulkString(b"5".to_vec()),
                Value::Int(0),
                Value::Int(1)
            ]))
            .is_some_and(|p| p.free && !p.holds)
        );
        let queued = arr(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Nil,
            Value::Int(0),
        ]);
        assert_eq!(
            decode_join(queued).map(|p| p.state),
            Some(QueueState::Queued)
        );
    }

    /// A join's answer of any other shape reads as no answer.
    #[test]
    fn decoding_bad_joins() {
        let arr = |a: Vec<Value>| Reply::Value(Value::Array(a));
        assert_eq!(
            decode_join(arr(vec![
                Value::Int(0),
                Value::Int(-1),
                Value::Nil,
                Value::Int(0)
            ])),
            None
        );
        assert_eq!(
            decode_join(arr(vec![
                Value::Int(3),
                Value::Int(0),
                Value::Nil,
                Value::Int(0)
            ])),
            None
        );
        assert_eq!(decode_join(arr(vec![Value::Int(0), Value::Int(0)])), None);
        assert_eq!(decode_join(Reply::TimedOut), None);
    }

    /// The transfer release's answers: a transfer is a release for its releaser.
    #[test]
    fn decoding_transfers() {
        let arr = |a: Vec<Value>| Reply::Value(Value::Array(a));
        assert_eq!(
            decode(
                Answer::Release,
                arr(vec![Value::Int(2), Value::Int(3), Value::Int(77)])
            ),
            Typed::Released {
                deleted: 1,
                listeners: 3
            }
        );
        assert_eq!(
            decode(Answer::Release, arr(vec![Value::Int(0), Value::Int(4)])),
            Typed::Released {
                deleted: 0,
                listeners: 4
            }
        );
        assert!(matches!(
            decode(
                Answer::Release,
                arr(vec![Value::Int(1), Value::Int(3), Value::Int(7)])
            ),
            Typed::Failed(_)
        ));
    }

    /// Each script's hash is computed from its one copy of the source, as Redis computes it.
    #[test]
    fn scripts_hash_their_source() {
        for lua in [
            &ACQUIRE_MANY,
            &RELEASE,
            &RELEASE_ONE,
            &ENQUEUE,
            &CLAIM,
            &LISTEN,
            &EXTEND,
            &ACQUIRE_FENCED,
            &COMMIT_FENCE,
            &READ_ACQUIRE,
            &WRITE_ACQUIRE,
            &SEM_ACQUIRE,
            &SHARED_EXTEND,
            &SHARED_RELEASE,
        ] {
            assert_eq!(lua.hash(), redis::Script::new(lua.code).get_hash());
            assert_eq!(lua.hash().len(), 40);
        }
        assert_ne!(RELEASE.hash(), RELEASE_ONE.hash());
    }

    /// A queue join's lease and TTL travel as whole milliseconds, rounded up, with the
    /// kind and the first-join flag.
    #[test]
    fn join_lease_in_millis() {
        let res = Resources::new(&["r"]).unwrap();
        let args = JoinArgs {
            token: b"id",
            ticket: b"",
            lease: Duration::from_micros(2_500),
            ttl: Duration::from_millis(10),
            kind: EntryKind::FencedTransfer,
            first: true,
            inbox: b"quorumlock:inbox:c",
        };
        let j = QueueJoin::new(&res, &args);
        assert_eq!(
            j.call.args,
            vec![
                b"id".to_vec(),
                Vec::new(),
                b"3".to_vec(),
                b"10".to_vec(),
                b"f".to_vec(),
                b"1".to_vec(),
                b"quorumlock:inbox:c".to_vec()
            ]
        );
        assert_eq!(j.call.keys.len(), 4);
    }
}
