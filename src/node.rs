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
//! Every command is bounded by the per-node timeout. A timed-out command may still run
//! on the server; callers treat its outcome as unknown and clean up accordingly.
//!
//! Scripts are sent with `EVALSHA`, falling back to `EVAL` on `NOSCRIPT` (a node that
//! restarted, or `SCRIPT FLUSH`), on the same connection. Keys and values only ever
//! travel as `KEYS`/`ARGV`.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, Value};

use crate::error::Error;

/// A Lua script: its source and its SHA1, computed once.
pub(crate) struct Lua {
    code: &'static str,
    hash: LazyLock<String>,
    /// Running it twice has the effect of running it once (compare-and-X scripts).
    idempotent: bool,
}

impl Lua {
    pub(crate) const fn new(code: &'static str, hash: fn() -> String, idempotent: bool) -> Lua {
        Lua {
            code,
            hash: LazyLock::new(hash),
            idempotent,
        }
    }
}

macro_rules! lua {
    ($file:literal, idempotent: $idem:literal) => {
        $crate::node::Lua::new(
            include_str!($file),
            || {
                redis::Script::new(include_str!($file))
                    .get_hash()
                    .to_owned()
            },
            $idem,
        )
    };
}
pub(crate) use lua;

/// The acquire script for multi-resource locks (every key or none).
pub(crate) static ACQUIRE_MANY: Lua = lua!("scripts/acquire.lua", idempotent: false);
/// Compare-and-delete (and announce the release).
pub(crate) static RELEASE: Lua = lua!("scripts/release.lua", idempotent: true);
/// Compare-and-delete of one key, handing over to the wait queue's head.
pub(crate) static RELEASE_ONE: Lua = lua!("scripts/release_one.lua", idempotent: true);
/// Join a wait queue.
pub(crate) static ENQUEUE: Lua = lua!("scripts/enqueue.lua", idempotent: true);
/// Leave a wait queue.
pub(crate) static DEQUEUE: Lua = lua!("scripts/dequeue.lua", idempotent: true);
/// Compare-and-extend.
pub(crate) static EXTEND: Lua = lua!("scripts/extend.lua", idempotent: true);

/// A node's address, printed without its password.
///
/// This is how nodes appear in [`Votes`](crate::Votes), in `Debug` output and in tracing:
/// `redis://user:<redacted>@127.0.0.1:7001/0`. It never contains a password.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// let locks = quorumlock::Redlock::builder(["redis://app:s3cret@127.0.0.1:7001"]).build().await?;
/// let shown = locks.nodes()[0].to_string();
/// assert_eq!(shown, "redis://app:<redacted>@127.0.0.1:7001");
/// assert!(!format!("{locks:?}").contains("s3cret"));
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    shown: Arc<str>,
    host: Arc<str>,
    port: Option<u16>,
}

impl NodeAddr {
    pub(crate) fn from_info(info: &ConnectionInfo) -> NodeAddr {
        let rs = info.redis_settings();
        let user = match (rs.username(), rs.password()) {
            (Some(u), Some(_)) => format!("{u}:<redacted>@"),
            (None, Some(_)) => ":<redacted>@".to_owned(),
            (Some(u), None) => format!("{u}@"),
            (None, None) => String::new(),
        };
        let db = if rs.db() != 0 {
            format!("/{}", rs.db())
        } else {
            String::new()
        };
        let (scheme, host, port) = match info.addr() {
            ConnectionAddr::Tcp(h, p) => ("redis", h.clone(), Some(*p)),
            ConnectionAddr::TcpTls { host, port, .. } => ("rediss", host.clone(), Some(*port)),
            ConnectionAddr::Unix(p) => ("redis+unix", p.display().to_string(), None),
            _ => ("redis", "?".to_owned(), None),
        };
        let shown = match port {
            Some(p) if host.contains(':') => format!("{scheme}://{user}[{host}]:{p}{db}"),
            Some(p) => format!("{scheme}://{user}{host}:{p}{db}"),
            None if user.is_empty() && db.is_empty() => format!("{scheme}://{host}"),
            None => format!("{scheme}://{user}{host}{db}"),
        };
        NodeAddr {
            shown: shown.into(),
            host: host.into(),
            port,
        }
    }

    /// The host name or IP address (or the socket path for `redis+unix://`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.nodes()[0].host(), "127.0.0.1");
    /// # Ok(()) }
    /// ```
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port, `None` for a Unix socket.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.nodes()[0].port(), Some(7001));
    /// # Ok(()) }
    /// ```
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// A parsed, validated node URL, not yet connected.
#[derive(Clone)]
pub(crate) struct NodeSpec {
    pub(crate) addr: NodeAddr,
    pub(crate) info: ConnectionInfo,
}

impl NodeSpec {
    /// Parses one URL. The error never repeats the URL (it may hold a password).
    pub(crate) fn parse(index: usize, url: &str) -> Result<NodeSpec, Error> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Error::config(
                "nodes",
                format!("node #{} has an empty URL", index + 1),
            ));
        }
        let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s));
        if !scheme_ok {
            return Err(Error::config(
                "nodes",
                format!(
                    "node #{} is not a redis://, rediss:// or redis+unix:// URL",
                    index + 1
                ),
            ));
        }
        let info = url.into_connection_info().map_err(|e| {
            Error::config(
                "nodes",
                format!(
                    "node #{} is not a valid Redis URL ({})",
                    index + 1,
                    e.kind_str()
                ),
            )
        })?;
        if let ConnectionAddr::TcpTls { insecure, .. } = info.addr() {
            if !cfg!(feature = "tls-rustls") {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} uses rediss:// but quorumlock was built without TLS \
                         (enable the `tls-rustls` feature)",
                        index + 1
                    ),
                ));
            }
            if *insecure {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} asks for #insecure (no certificate check), which quorumlock \
                         does not support: give the servers' certificate authority with \
                         tls_root_ca instead",
                        index + 1
                    ),
                ));
            }
        }
        Ok(NodeSpec {
            addr: NodeAddr::from_info(&info),
            info,
        })
    }

    /// Whether the node is reached over TLS (`rediss://`).
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// For a `rediss://` node: trust exactly these certificate authorities instead of the
    /// system's trust store. Other nodes are returned unchanged.
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn trusting(mut self, ca: &tls::RootCa) -> Result<NodeSpec, Error> {
        if !self.is_tls() {
            return Ok(self);
        }
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.pem().to_vec()),
        };
        let client = redis::Client::build_with_tls(self.info.clone(), certs).map_err(|e| {
            Error::config(
                "tls_root_ca",
                format!("{}: {}", self.addr, Reply::error_text(&e)),
            )
        })?;
        self.info = client.get_connection_info().clone();
        Ok(self)
    }

    /// Whether two specs name the same node (same address and database).
    pub(crate) fn same_node(&self, other: &NodeSpec) -> bool {
        self.info.addr() == other.info.addr()
            && self.info.redis_settings().db() == other.info.redis_settings().db()
    }
}

/// TLS set-up: the trusted certificate authorities and the crypto provider.
#[cfg(feature = "tls-rustls")]
pub(crate) mod tls {
    use std::fmt;
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use crate::error::Error;

    /// Certificate authorities (PEM) trusted for `rediss://` nodes, as the user gave them.
    /// `Debug` shows only their size.
    #[derive(Clone)]
    pub(crate) struct RootCa(Arc<[u8]>);

    impl fmt::Debug for RootCa {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "<{} bytes of PEM>", self.0.len())
        }
    }

    impl RootCa {
        pub(crate) fn new(pem: Vec<u8>) -> RootCa {
            RootCa(pem.into())
        }

        pub(crate) fn pem(&self) -> &[u8] {
            &self.0
        }

        /// Checks that the PEM holds at least one certificate and that each is usable as a
        /// trust anchor.
        pub(crate) fn validate(&self) -> Result<(), Error> {
            let field = "tls_root_ca";
            let certs = CertificateDer::pem_slice_iter(&self.0)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Error::config(field, format!("not a valid PEM certificate: {e}")))?;
            if certs.is_empty() {
                return Err(Error::config(
                    field,
                    "no certificate in the PEM (expected one or more \
                     -----BEGIN CERTIFICATE----- blocks)",
                ));
            }
            let mut store = rustls::RootCertStore::empty();
            for (i, cert) in certs.iter().enumerate() {
                store.add(cert.clone()).map_err(|e| {
                    Error::config(
                        field,
                        format!(
                            "certificate #{} is not a usable certificate authority: {e}",
                            i + 1
                        ),
                    )
                })?;
            }
            Ok(())
        }
    }

    /// The text of a failed TLS handshake, when `e` is one: rustls's reason, said to be a
    /// TLS failure, with a hint for a rejected server certificate. `None` for other errors.
    pub(crate) fn failure(e: &redis::RedisError) -> Option<String> {
        use std::error::Error as StdError;
        type Shared = Arc<dyn StdError + Send + Sync>;
        // redis-rs keeps an I/O error behind an `Arc`; tokio-rustls puts the rustls error
        // inside the I/O error. Walk that chain, a bounded number of steps.
        let mut cur: Option<&(dyn StdError + 'static)> = StdError::source(e);
        for _ in 0..8 {
            let err = cur?;
            if let Some(t) = err.downcast_ref::<rustls::Error>() {
                return Some(match t {
                    // The hint comes first: a long reason may be cut at the end.
                    rustls::Error::InvalidCertificate(_) => format!(
                        "TLS handshake failed, server certificate rejected \
                         (see tls_root_ca): {t}"
                    ),
                    _ => format!("TLS handshake failed: {t}"),
                });
            }
            cur = if let Some(shared) = err.downcast_ref::<Shared>() {
                Some(&**shared as &(dyn StdError + 'static))
            } else if let Some(io) = err.downcast_ref::<std::io::Error>() {
                match io.get_ref() {
                    Some(inner) => Some(inner as &(dyn StdError + 'static)),
                    None => return None,
                }
            } else {
                err.source()
            };
        }
        None
    }

    /// Makes sure rustls has a process-level crypto provider, so that opening a TLS
    /// connection never panics: installs rustls's `ring` provider unless the application
    /// (or another library) installed one first, which is then kept.
    pub(crate) fn ensure_crypto_provider() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // An error means another thread installed a provider meanwhile: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }
}

trait KindStr {
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
    conn: ConnectionManager,
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
            conn,
        })
    }

    /// Sends one command, bounded by `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> Reply {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(timeout, conn.send_packed_command(cmd)).await {
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
        match tokio::time::timeout(timeout, conn.send_packed_commands(pipe, 0, count)).await {
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
    pub(crate) async fn eval(&self, call: &Arc<ScriptCall>, timeout: Duration) -> Reply {
        let mut conn = self.conn.clone();
        let call2 = call.clone();
        let run = async move {
            let mut tries = if call2.idempotent { 2 } else { 1 };
            loop {
                tries -= 1;
                let reply = match Reply::from_result(conn.send_packed_command(&call2.evalsha).await)
                {
                    Reply::Error(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        Reply::from_result(conn.send_packed_command(&call2.eval()).await)
                    }
                    other => other,
                };
                match reply {
                    Reply::Error(e)
                        if tries > 0 && (e.is_connection_dropped() || e.is_io_error()) =>
                    {
                        continue;
                    }
                    other => return other,
                }
            }
        };
        wait_or_finish_late(run, timeout, call.idempotent).await
    }
}

/// Waits at most `timeout` for a request; if it is not done by then, the caller gets
/// [`Reply::TimedOut`] and, when `finish_late`, the request goes on in the background
/// (for at most [`LATE_LIMIT`]) instead of being dropped.
pub(crate) async fn wait_or_finish_late<F>(run: F, timeout: Duration, finish_late: bool) -> Reply
where
    F: Future<Output = Reply> + Send + 'static,
{
    let mut run = Box::pin(run);
    tokio::select! {
        r = &mut run => r,
        () = tokio::time::sleep(timeout) => {
            if finish_late {
                crate::fanout::spawn(async move {
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

/// One prepared request, shared by every node of a round.
pub(crate) enum Request {
    /// A plain command (`SET … NX PX …`).
    Cmd(Cmd),
    /// A script.
    Script(Arc<ScriptCall>),
}

impl Node {
    /// Sends a prepared request, bounded by `timeout`.
    pub(crate) async fn request(&self, req: &Request, timeout: Duration) -> Reply {
        match req {
            Request::Cmd(c) => self.query(c, timeout).await,
            Request::Script(s) => self.eval(s, timeout).await,
        }
    }
}

/// A prepared script invocation (keys and arguments), shared by every node of a round.
pub(crate) struct ScriptCall {
    code: &'static str,
    idempotent: bool,
    evalsha: Cmd,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static Lua, keys: Vec<Vec<u8>>, args: Vec<Vec<u8>>) -> ScriptCall {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.hash.as_str()).arg(keys.len());
        for k in &keys {
            evalsha.arg(k.as_slice());
        }
        for a in &args {
            evalsha.arg(a.as_slice());
        }
        ScriptCall {
            code: script.code,
            idempotent: script.idempotent,
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

/// Checks a node against the deployment contract and warns through `tracing` about
/// every breach it can see. Never fails: a node that cannot be checked (down, `CONFIG`
/// disabled by ACL) is only noted at debug level.
pub(crate) async fn check_deployment(node: &Node, timeout: Duration, fencing: bool) {
    let addr = &node.addr;
    match node.query(&redis::cmd("PING"), timeout).await {
        Reply::Value(_) => {}
        Reply::Error(e) => {
            tracing::warn!(node = %addr, error = %Reply::error_text(&e), "quorumlock: node unreachable at start-up; it will be retried on every request");
            return;
        }
        Reply::TimedOut => {
            tracing::warn!(node = %addr, "quorumlock: node did not answer at start-up; it will be retried on every request");
            return;
        }
    }
    let config_get = |name: &str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("GET").arg(name);
        c
    };
    let get = |reply: Reply| -> Option<String> {
        match reply {
            Reply::Value(v) => {
                let pairs: Vec<String> = redis::from_redis_value(v).ok()?;
                pairs.get(1).cloned()
            }
            _ => None,
        }
    };
    match get(node.query(&config_get("maxmemory-policy"), timeout).await) {
        Some(p) if p == "noeviction" => {}
        Some(p) => tracing::warn!(node = %addr, maxmemory_policy = %p,
            "quorumlock: node evicts keys under memory pressure (maxmemory-policy is not noeviction): a held lock can silently disappear"),
        None => {
            tracing::debug!(node = %addr, "quorumlock: could not read maxmemory-policy (CONFIG disabled?)")
        }
    }
    let aof = get(node.query(&config_get("appendonly"), timeout).await);
    let fsync = get(node.query(&config_get("appendfsync"), timeout).await);
    match (aof.as_deref(), fsync.as_deref()) {
        (Some("yes"), Some("always")) => {}
        (Some(_), Some(_)) => tracing::warn!(node = %addr, appendonly = ?aof, appendfsync = ?fsync,
            "quorumlock: node does not persist every write (appendfsync always): after a crash, restart it only once the longest TTL has passed"),
        _ => tracing::debug!(node = %addr, "quorumlock: could not read persistence settings"),
    }
    if fencing && aof.as_deref() != Some("yes") {
        let save = get(node.query(&config_get("save"), timeout).await);
        if save.as_deref().is_some_and(|s| !s.trim().is_empty()) {
            tracing::warn!(node = %addr, save = ?save,
                "quorumlock: fencing with RDB snapshots: a restart brings back stale fence counters; tokens stay ordered only if a crashed node is restarted after the longest TTL with its clock in sync (as for a node without persistence); use AOF with appendfsync always to restart at once");
        }
    }
    if let Reply::Value(v) = node
        .query(redis::cmd("INFO").arg("replication"), timeout)
        .await
    {
        let text: String = redis::from_redis_value(v).unwrap_or_default();
        if text.lines().any(|l| l.trim() == "role:slave") {
            tracing::warn!(node = %addr,
                "quorumlock: node is a replica; Redlock needs independent masters (writes will fail with READONLY)");
        }
    }
}
