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

mod direct;
pub(crate) mod identity;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, Value};

pub(crate) use crate::addr::NodeAddr;
use crate::error::Error;
use crate::metrics::{NodeKeys, Op, Timer};
use crate::protocol::fencing;
use crate::protocol::reply::{Holder, QueuePlace, QueueState, Reply as Typed};
use crate::resource::{Kind, Resources, RwKeys, SemKeys};
use crate::token::Token;

/// A Lua script: its source (the one copy, from `src/scripts/`) and its SHA1, computed
/// once from that source on first use.
pub(crate) struct Lua {
    code: &'static str,
    /// The files of `src/scripts/` its source is made of, in order (read by the simulator).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    files: &'static [&'static str],
    hash: OnceLock<String>,
    /// Running it twice has the effect of running it once (compare-and-X scripts).
    idempotent: bool,
}

impl Lua {
    pub(crate) const fn new(
        code: &'static str,
        files: &'static [&'static str],
        idempotent: bool,
    ) -> Lua {
        Lua {
            code,
            files,
            hash: OnceLock::new(),
            idempotent,
        }
    }

    /// The script's SHA1, for `EVALSHA`.
    fn hash(&self) -> &str {
        self.hash
            .get_or_init(|| redis::Script::new(self.code).get_hash().to_owned())
    }
}

macro_rules! lua {
    ($file:literal, idempotent: $idem:literal) => {
        $crate::node::Lua::new(include_str!(concat!("scripts/", $file)), &[$file], $idem)
    };
    // With `scripts/queue.lua` (the wait-queue helpers: clock, purge, tidy) in front.
    ($file:literal, queue, idempotent: $idem:literal) => {
        $crate::node::Lua::new(
            concat!(
                include_str!("scripts/queue.lua"),
                include_str!(concat!("scripts/", $file))
            ),
            &["queue.lua", $file],
            $idem,
        )
    };
}

/// The acquire script for multi-resource locks (every key or none).
pub(crate) static ACQUIRE_MANY: Lua = lua!("acquire.lua", idempotent: false);
/// Compare-and-delete (and announce the release).
pub(crate) static RELEASE: Lua = lua!("release.lua", idempotent: true);
/// Compare-and-delete of a mutex's keys: a plain compare-and-delete where no one waits
/// (`release_one.lua`, which returns there), else the hand-off to the wait queue's head
/// (`queue.lua`, then `handoff.lua`, run only for the resources someone waits for).
pub(crate) static RELEASE_ONE: Lua = Lua::new(
    concat!(
        include_str!("scripts/release_one.lua"),
        include_str!("scripts/queue.lua"),
        include_str!("scripts/handoff.lua")
    ),
    &["release_one.lua", "queue.lua", "handoff.lua"],
    true,
);
/// Join a wait queue. Never finished late nor retried (as an acquire): a first join landing
/// after the waiter's leave release would queue a token no one waits with, and the next
/// release would transfer the lock to it (found by `faults::row06b_…`).
pub(crate) static ENQUEUE: Lua = lua!("enqueue.lua", queue, idempotent: false);
/// A queued waiter's acquire of one key: its own token there counts as granted.
pub(crate) static CLAIM: Lua = lua!("claim.lua", idempotent: false);
/// A multi-resource waiter's mark on its resources' leases: releases there announce.
pub(crate) static LISTEN: Lua = lua!("listen.lua", queue, idempotent: true);
/// Compare-and-extend.
pub(crate) static EXTEND: Lua = lua!("extend.lua", idempotent: true);
/// The fenced acquire (round 1): every lock key or none, and the fence counters raised.
pub(crate) static ACQUIRE_FENCED: Lua = lua!("acquire_fenced.lua", idempotent: false);
/// The fence commit (round 2): raise the counters where our token still holds the keys.
pub(crate) static COMMIT_FENCE: Lua = lua!("commit_fence.lua", idempotent: true);
/// A reader's acquire (read-write locks).
pub(crate) static READ_ACQUIRE: Lua = lua!("read_acquire.lua", idempotent: false);
/// The writer's acquire (read-write locks), optionally fenced; registers a waiting
/// writer's intent when refused.
pub(crate) static WRITE_ACQUIRE: Lua = lua!("write_acquire.lua", idempotent: false);
/// A semaphore permit's acquire.
pub(crate) static SEM_ACQUIRE: Lua = lua!("sem_acquire.lua", idempotent: false);
/// Compare-and-extend of a sorted-set entry (reader, permit).
pub(crate) static SHARED_EXTEND: Lua = lua!("shared_extend.lua", idempotent: true);
/// Compare-and-delete of a sorted-set entry (reader, permit, writer intent).
pub(crate) static SHARED_RELEASE: Lua = lua!("shared_release.lua", idempotent: true);

/// The group-map record (see `groupmap`): sent with `EVAL`, a few times a minute per
/// node, so never cached.
pub(crate) static GROUP_MAP: Lua = lua!("groupmap.lua", idempotent: true);

/// Every script the crate sends, by name (its file under `src/scripts/` without `.lua`):
/// the one table of them, which the simulator (feature `sim`) loads too.
#[cfg_attr(not(feature = "sim"), allow(dead_code))]
pub(crate) static SCRIPTS: [(&str, &Lua); 15] = [
    ("acquire", &ACQUIRE_MANY),
    ("acquire_fenced", &ACQUIRE_FENCED),
    ("commit_fence", &COMMIT_FENCE),
    ("extend", &EXTEND),
    ("release", &RELEASE),
    ("release_one", &RELEASE_ONE),
    ("enqueue", &ENQUEUE),
    ("claim", &CLAIM),
    ("listen", &LISTEN),
    ("read_acquire", &READ_ACQUIRE),
    ("write_acquire", &WRITE_ACQUIRE),
    ("sem_acquire", &SEM_ACQUIRE),
    ("shared_extend", &SHARED_EXTEND),
    ("shared_release", &SHARED_RELEASE),
    ("groupmap", &GROUP_MAP),
];

/// The group-map record request: on the node, record `map` in `key` with `lease` (or only
/// read it, when `lease` is zero); whole milliseconds, at least 1 when not zero.
pub(crate) fn group_map_request(key: &[u8], map: &str, lease: Duration) -> Cmd {
    let ms = if lease.is_zero() {
        0
    } else {
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    };
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(GROUP_MAP.code).arg(1).arg(key).arg(map).arg(ms);
    cmd
}

/// A parsed, validated node URL, not yet connected.
#[derive(Clone)]
pub(crate) struct NodeSpec {
    pub(crate) addr: NodeAddr,
    /// The node's connection, or a Redis Cluster voter's first seed.
    pub(crate) info: ConnectionInfo,
    /// A Redis Cluster voter's seed nodes (`redis+cluster://`), `None` for one master.
    pub(crate) seeds: Option<Arc<[ConnectionInfo]>>,
    /// The TLS settings of a `rediss+cluster://` voter's nodes: the certificate authorities
    /// they are checked against and the client certificate they are shown
    /// ([`NodeSpec::with_tls`]; a single master keeps them in `info`).
    #[cfg(feature = "tls-rustls")]
    tls: Option<redis::TlsCertificates>,
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
        if let Some(seeds) = cluster_seeds(index, url)? {
            return NodeSpec::cluster(index, &seeds);
        }
        let info = NodeSpec::parse_one(index, url)?;
        Ok(NodeSpec {
            addr: NodeAddr::from_info(&info),
            info,
            seeds: None,
            #[cfg(feature = "tls-rustls")]
            tls: None,
        })
    }

    /// A Redis Cluster voter from its seed URLs (each a `redis://` or `rediss://` URL).
    fn cluster(index: usize, seeds: &[String]) -> Result<NodeSpec, Error> {
        let infos = seeds
            .iter()
            .map(|u| NodeSpec::parse_one(index, u))
            .collect::<Result<Vec<_>, Error>>()?;
        let Some(first) = infos.first().cloned() else {
            return Err(Error::config(
                "nodes",
                format!(
                    "node #{} is a redis+cluster:// URL without a host",
                    index + 1
                ),
            ));
        };
        Ok(NodeSpec {
            addr: NodeAddr::cluster(&infos),
            info: first,
            seeds: Some(infos.into()),
            #[cfg(feature = "tls-rustls")]
            tls: None,
        })
    }

    /// Whether this voter is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.seeds.is_some()
    }

    /// Parses one node's `redis://`, `rediss://` or `redis+unix://` URL.
    fn parse_one(index: usize, url: &str) -> Result<ConnectionInfo, Error> {
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
        Ok(info)
    }

    /// Whether the node is reached over TLS (`rediss://`).
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// For a `rediss://` node: these TLS settings (validated already, see
    /// [`tls::certificates`]) instead of redis-rs's defaults. Other nodes are returned
    /// unchanged.
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn with_tls(
        mut self,
        certs: &redis::TlsCertificates,
        field: &'static str,
    ) -> Result<NodeSpec, Error> {
        if !self.is_tls() {
            return Ok(self);
        }
        if self.is_cluster() {
            self.tls = Some(certs.clone());
            return Ok(self);
        }
        // The error's text is redis-rs's kind only: its detail could quote the PEM.
        let client = redis::Client::build_with_tls(self.info.clone(), certs.clone())
            .map_err(|e| Error::config(field, format!("{}: {}", self.addr, e.kind_str())))?;
        self.info = client.get_connection_info().clone();
        Ok(self)
    }

    /// Whether two specs name the same node (same address and database).
    pub(crate) fn same_node(&self, other: &NodeSpec) -> bool {
        let one = |s: &NodeSpec| {
            s.seeds
                .clone()
                .unwrap_or_else(|| Arc::new([s.info.clone()]))
        };
        let (a, b) = (one(self), one(other));
        a.iter().any(|x| {
            b.iter()
                .any(|y| x.addr() == y.addr() && x.redis_settings().db() == y.redis_settings().db())
        })
    }
}

/// The seed URLs of a `redis+cluster://` or `rediss+cluster://` voter URL, `None` for
/// any other URL. The form is `redis+cluster://[user[:password]@]host:port[,host:port…]`:
/// the credentials apply to every node, and a cluster has no database to choose.
fn cluster_seeds(index: usize, url: &str) -> Result<Option<Vec<String>>, Error> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Error::config(
            "nodes",
            format!(
                "node #{} is not a valid redis+cluster:// URL ({why})",
                index + 1
            ),
        )
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    if user.contains(',') {
        return Err(bad(
            "credentials for each seed: give them once, before the hosts",
        ));
    }
    if hosts.contains('/') || hosts.contains('?') {
        return Err(bad("a path, database or parameter after the hosts"));
    }
    let seeds: Vec<String> = hosts
        .split(',')
        .map(|h| format!("{scheme}://{user}{}", h.trim()))
        .collect();
    if hosts.split(',').any(|h| h.trim().is_empty()) {
        return Err(bad("an empty host in the list"));
    }
    Ok(Some(seeds))
}

/// TLS set-up: the trusted certificate authorities and the crypto provider.
#[cfg(feature = "tls-rustls")]
pub(crate) mod tls {
    use std::fmt;
    use std::sync::Arc;

    use rustls::pki_types::pem::{self, PemObject};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::sign::CertifiedKey;

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

    /// A client certificate (chain) and its private key (PEM), shown to `rediss://` servers
    /// that ask for one (`tls-auth-clients yes`). `Debug` shows the certificate's size and
    /// never the key.
    #[derive(Clone)]
    pub(crate) struct ClientAuth {
        cert: Arc<[u8]>,
        key: Arc<[u8]>,
    }

    impl fmt::Debug for ClientAuth {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "<certificate: {} bytes of PEM, private key: redacted>",
                self.cert.len()
            )
        }
    }

    impl ClientAuth {
        pub(crate) fn new(cert: Vec<u8>, key: Vec<u8>) -> ClientAuth {
            ClientAuth {
                cert: cert.into(),
                key: key.into(),
            }
        }

        /// Checks that the certificate PEM holds at least one certificate, the key PEM a
        /// private key of a kind rustls signs with, and that the key is the first
        /// certificate's. No error text quotes the key PEM, nor any detail parsed from it.
        pub(crate) fn validate(&self) -> Result<(), Error> {
            let field = "tls_client_auth";
            let certs = CertificateDer::pem_slice_iter(&self.cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    Error::config(field, format!("the certificate is not valid PEM: {e}"))
                })?;
            if certs.is_empty() {
                return Err(Error::config(
                    field,
                    "no certificate in the certificate PEM (expected one or more \
                     -----BEGIN CERTIFICATE----- blocks, the client's own first)",
                ));
            }
            let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| match e {
                pem::Error::NoItemsFound => Error::config(
                    field,
                    "no private key in the key PEM (expected a PKCS#8, RSA or EC private key \
                     block)",
                ),
                // The parser's own text may quote a line of the key: never shown.
                _ => Error::config(field, "the private key is not valid PEM"),
            })?;
            let provider = rustls::crypto::ring::default_provider();
            match CertifiedKey::from_der(certs, key, &provider) {
                Ok(_) => Ok(()),
                Err(rustls::Error::InconsistentKeys(_)) => Err(Error::config(
                    field,
                    "the private key does not belong to the certificate (the first \
                     certificate of the PEM must be the client's own)",
                )),
                Err(rustls::Error::InvalidCertificate(e)) => Err(Error::config(
                    field,
                    format!("the certificate does not parse: {e:?}"),
                )),
                Err(_) => Err(Error::config(
                    field,
                    "the private key is not usable (an RSA, ECDSA or Ed25519 key is expected)",
                )),
            }
        }

        /// The certificate and key as redis-rs takes them.
        pub(crate) fn config(&self) -> redis::ClientTlsConfig {
            redis::ClientTlsConfig {
                client_cert: self.cert.to_vec(),
                client_key: self.key.to_vec(),
            }
        }
    }

    /// The redis-rs TLS settings for these options, `None` when neither is set (redis-rs's
    /// defaults: the system's trust store, no client certificate). Both must be validated.
    pub(crate) fn certificates(
        root_ca: Option<&RootCa>,
        client: Option<&ClientAuth>,
    ) -> Option<redis::TlsCertificates> {
        if root_ca.is_none() && client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: client.map(ClientAuth::config),
            root_cert: root_ca.map(|ca| ca.pem().to_vec()),
        })
    }

    /// The text of a failed TLS handshake, when `e` is one: rustls's reason, said to be a
    /// TLS failure, with a hint for a rejected server certificate or a refused client
    /// certificate. `None` for other errors.
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
                    rustls::Error::AlertReceived(alert) if client_refused(*alert) => format!(
                        "TLS handshake failed, client certificate refused by the server \
                         (see tls_client_auth): {t}"
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

    /// Whether a TLS alert from the server says it did not accept our client certificate
    /// (none given, or not signed by a certificate authority it trusts).
    fn client_refused(alert: rustls::AlertDescription) -> bool {
        use rustls::AlertDescription as A;
        matches!(
            alert,
            A::CertificateRequired
                | A::BadCertificate
                | A::UnknownCA
                | A::CertificateUnknown
                | A::UnsupportedCertificate
                | A::CertificateExpired
                | A::CertificateRevoked
                | A::AccessDenied
        )
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
                crate::background::spawn(async move {
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
        redis::Arg::Simple(key) => Some(crate::slot::key_slot(key)),
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
    /// for `lease`, so the releases of those resources announce themselves.
    pub(crate) fn listen(res: &Resources, id: &[u8], lease: Duration) -> QueueJoin {
        let ks = res
            .names()
            .iter()
            .flat_map(|n| queue_group(res, n))
            .collect();
        QueueJoin {
            call: Arc::new(ScriptCall::new(
                &LISTEN,
                ks,
                vec![id.to_vec(), millis_arg(lease)],
            )),
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

#[cfg(any(feature = "sim", feature = "testkit"))]
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
            slot: keys.first().map(|k| crate::slot::key_slot(k)),
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

/// Checks a node against the deployment contract and warns through `tracing` about
/// every breach it can see. Never fails: a node that cannot be checked (down, `CONFIG`
/// disabled by ACL) is only noted at debug level. A Redis Cluster voter is checked shard
/// by shard: every master's settings, each warning naming the master.
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
    for (shard, settings) in settings(node, timeout).await {
        settings.warn(addr, &shard, fencing);
    }
}

/// The settings of a node that the deployment contract is about, as read by `CONFIG GET`
/// and `INFO` (`None`: could not be read).
#[derive(Debug, Default)]
struct Settings {
    maxmemory_policy: Option<String>,
    appendonly: Option<String>,
    appendfsync: Option<String>,
    save: Option<String>,
    /// `cluster-replica-no-failover` (a Redis Cluster's shards only).
    no_failover: Option<String>,
    /// `INFO replication` and `INFO cluster`, to tell a replica or a cluster node.
    info: String,
}

/// Reads the settings of a master, or of every master of a Redis Cluster voter, with the
/// address of each (empty for a master given directly).
async fn settings(node: &Node, timeout: Duration) -> Vec<(String, Settings)> {
    // One `CONFIG GET` of every name (Redis ≥ 7.0, as `SET … GET` needs already).
    let mut c = redis::cmd("CONFIG");
    c.arg("GET").arg(&[
        "maxmemory-policy",
        "appendonly",
        "appendfsync",
        "save",
        "cluster-replica-no-failover",
    ]);
    let mut shards: Vec<(String, Settings)> = Vec::new();
    for (shard, value) in node.on_masters(&c, timeout).await {
        let mut read: std::collections::HashMap<String, String> =
            redis::from_redis_value(value).unwrap_or_default();
        let mut take = |name: &str| read.remove(name);
        let settings = Settings {
            maxmemory_policy: take("maxmemory-policy"),
            appendonly: take("appendonly"),
            appendfsync: take("appendfsync"),
            save: take("save"),
            no_failover: take("cluster-replica-no-failover"),
            info: String::new(),
        };
        shards.push((shard, settings));
    }
    for (shard, value) in node
        .on_masters(
            redis::cmd("INFO").arg("replication").arg("cluster"),
            timeout,
        )
        .await
    {
        if let Some((_, st)) = shards.iter_mut().find(|(s, _)| *s == shard) {
            st.info = redis::from_redis_value(value).unwrap_or_default();
        }
    }
    shards
}

impl Settings {
    /// Warns about every breach of the deployment contract these settings show.
    fn warn(&self, node: &NodeAddr, shard: &str, fencing: bool) {
        match self.maxmemory_policy.as_deref() {
            Some("noeviction") => {}
            Some(p) => tracing::warn!(node = %node, shard, maxmemory_policy = %p,
                "quorumlock: node evicts keys under memory pressure (maxmemory-policy is not noeviction): a held lock can silently disappear"),
            None => {
                tracing::debug!(node = %node, shard, "quorumlock: could not read maxmemory-policy (CONFIG disabled?)")
            }
        }
        let (aof, fsync) = (&self.appendonly, &self.appendfsync);
        match (aof.as_deref(), fsync.as_deref()) {
            (Some("yes"), Some("always")) => {}
            (Some(_), Some(_)) => {
                tracing::warn!(node = %node, shard, appendonly = ?aof, appendfsync = ?fsync,
                "quorumlock: node does not persist every write (appendfsync always): after a crash, restart it only once the longest TTL has passed")
            }
            _ => {
                tracing::debug!(node = %node, shard, "quorumlock: could not read persistence settings")
            }
        }
        if fencing
            && aof.as_deref() != Some("yes")
            && self.save.as_deref().is_some_and(|s| !s.trim().is_empty())
        {
            tracing::warn!(node = %node, shard, save = ?self.save,
                "quorumlock: fencing with RDB snapshots: a restart brings back stale fence counters; tokens stay ordered only if a crashed node is restarted after the longest TTL with its clock in sync (as for a node without persistence); use AOF with appendfsync always to restart at once");
        }
        let lines = || self.info.lines().map(str::trim);
        if shard.is_empty() && lines().any(|l| l == "role:slave") {
            tracing::warn!(node = %node,
                "quorumlock: node is a replica; Redlock needs independent masters (writes will fail with READONLY)");
        }
        let replicas = lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if !shard.is_empty() && replicas > 0 && self.no_failover.as_deref() != Some("yes") {
            tracing::warn!(node = %node, shard, replicas,
                "quorumlock: a shard of this Redis Cluster voter fails over to a replica by itself; replication is asynchronous, so a failover can lose a lock key, and the voter then forgets the lock as a master restarted at once without persistence would (safe only within the margin docs/safety.md gives); set cluster-replica-no-failover yes to make a failover an operator's step, taken after the longest TTL");
        }
    }
}

impl Node {
    /// Sends a keyless command to this master, or to every master of a Redis Cluster
    /// voter: each answer with the master's address (empty for a master given directly).
    /// Failures are left out.
    async fn on_masters(&self, cmd: &Cmd, timeout: Duration) -> Vec<(String, Value)> {
        let Conn::Cluster(ClusterConn { client: conn, .. }) = &self.conn else {
            return match self.query(cmd, timeout).await {
                Reply::Value(v) => vec![(String::new(), v)],
                _ => Vec::new(),
            };
        };
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let route = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let mut conn = conn.clone();
        let asked = conn.route_command(cmd.clone(), route);
        let Ok(Ok(Value::Map(answers))) = tokio::time::timeout(timeout, asked).await else {
            return Vec::new();
        };
        answers
            .into_iter()
            .filter_map(|(k, v)| Some((redis::from_redis_value::<String>(k).ok()?, v)))
            .collect()
    }
}

/// Test seams of the direct path to a Redis Cluster voter's shard masters.
#[cfg(all(test, feature = "testkit"))]
impl Node {
    /// Sends `cmd` (its keys in `slot`) by the direct path: `None` without one.
    pub(crate) async fn send_direct(
        &self,
        cmd: &Cmd,
        slot: u16,
    ) -> Option<redis::RedisResult<Value>> {
        let Conn::Cluster(c) = &self.conn else {
            return None;
        };
        Some(c.direct.as_ref()?.send(cmd, slot).await)
    }

    /// The master (`host:port`) the direct path routes `slot` to.
    pub(crate) fn direct_master(&self, slot: u16) -> Option<String> {
        let Conn::Cluster(c) = &self.conn else {
            return None;
        };
        c.direct.as_ref()?.master_of(slot)
    }
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
        let want = Some(crate::slot::key_slot(&key));
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
        assert!(matches!(decode(Answer::Release, int(1)), Typed::Failed(_)));
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
