//! [`LocalCluster`]: N real `redis-server` processes on free loopback ports, each in its own
//! temporary directory, with per-node faults (kill, restart, pause, proxy faults, replica
//! promotion).
//!
//! # Processes
//!
//! Each server runs with `--bind 127.0.0.1 --save "" --appendonly no
//! --enable-debug-command local --maxmemory-policy noeviction` (AOF with `appendfsync always`
//! instead when [`Persistence::AofAlways`] is chosen), logging to `redis.log` in its
//! directory; start-up errors quote the end of that log. Servers are killed (SIGKILL) and
//! reaped when the cluster is dropped, also while a test unwinds from a panic. On Linux every
//! server also gets `PR_SET_PDEATHSIG = SIGKILL`, so even a test process that is killed
//! outright takes its servers with it.
//!
//! The binary is `$QUORUMLOCK_REDIS_SERVER` when set, else `redis-server` from `PATH` (or
//! `/usr/bin`, `/usr/local/bin`). Redis 7.0 or newer is needed (`--enable-debug-command`).
//!
//! With [`LocalClusterBuilder::tls`] each server also serves TLS on a second loopback port
//! and [`LocalCluster::urls`] hand out `rediss://` URLs (Debian's `redis-server` is built
//! with TLS).
//!
//! Unix only: faults are signals.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, mpsc};
use std::time::Duration;

use tempfile::TempDir;

use super::Faults;
use super::proxy::FaultProxy;
use super::resp::{self, Reply};

/// Environment variable naming the `redis-server` binary to use.
pub const REDIS_SERVER_ENV: &str = "QUORUMLOCK_REDIS_SERVER";

/// How many times a server is started on a fresh port when its port was taken meanwhile.
const PORT_ATTEMPTS: usize = 5;
/// Probe period while waiting for a server to answer.
const POLL: Duration = Duration::from_millis(5);
/// Per-probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether a node keeps its data across a kill and restart.
///
/// The default is [`Persistence::None`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// No RDB, no AOF: a restarted node comes back empty.
    #[default]
    None,
    /// AOF with `appendfsync always`: every acknowledged write survives a SIGKILL, and a
    /// restarted node reloads it from its directory.
    AofAlways,
}

/// Builder for a [`LocalCluster`], from [`LocalCluster::builder`].
///
/// # Example
///
/// ```no_run
/// use quorumlock_testkit::{LocalCluster, Persistence};
///
/// # async fn demo() -> std::io::Result<()> {
/// let cluster = LocalCluster::builder(5)
///     .persistence(Persistence::AofAlways) // every node
///     .node_persistence(4, Persistence::None) // except this one
///     .proxies(true) // urls() go through a FaultProxy per node
///     .replicated(0) // node 0 = master + replica, promotable
///     .arg("--hz").arg("100")
///     .launch()
///     .await?;
/// assert_eq!(cluster.len(), 5);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .launch() is awaited"]
pub struct LocalClusterBuilder {
    nodes: usize,
    persistence: Persistence,
    node_persistence: Vec<(usize, Persistence)>,
    proxies: bool,
    replicated: Vec<usize>,
    args: Vec<String>,
    node_args: Vec<(usize, String)>,
    startup_timeout: Duration,
    tls: Option<ServerTls>,
    tls_auth_clients: bool,
}

/// The certificate files of a TLS server (see [`LocalClusterBuilder::tls`]).
#[derive(Debug, Clone)]
struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    /// Whether clients must show a certificate signed by `ca`
    /// ([`LocalClusterBuilder::tls_auth_clients`]).
    auth_clients: bool,
}

impl LocalClusterBuilder {
    /// Persistence of every node not set with [`node_persistence`](Self::node_persistence).
    /// The default for this is [`Persistence::None`].
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Persistence of node `node` (and of its replica, for a replicated node).
    pub fn node_persistence(mut self, node: usize, persistence: Persistence) -> Self {
        self.node_persistence.push((node, persistence));
        self
    }

    /// Puts a [`FaultProxy`] in front of every node: [`LocalCluster::urls`] then point at the
    /// proxies, and [`disconnect`](LocalCluster::disconnect) and the proxy modes work. The
    /// default for this is `false` (clients talk to the servers directly; replicated nodes get
    /// a proxy regardless).
    pub fn proxies(mut self, proxies: bool) -> Self {
        self.proxies = proxies;
        self
    }

    /// Makes node `node` a replicated node: a master plus a replica that replicates through a
    /// [`FaultProxy`] ([`LocalCluster::replication_link`]), behind a client-facing proxy that
    /// [`LocalCluster::promote_replica`] re-targets to the replica.
    pub fn replicated(mut self, node: usize) -> Self {
        self.replicated.push(node);
        self
    }

    /// Adds one command-line argument to every server (e.g. `.arg("--hz").arg("100")`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds command-line arguments to every server.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds one command-line argument to the servers of node `node` only.
    pub fn node_arg(mut self, node: usize, arg: impl Into<String>) -> Self {
        self.node_args.push((node, arg.into()));
        self
    }

    /// Serves TLS: every server also listens on a second loopback port with this certificate
    /// and key (PEM files), and [`LocalCluster::urls`] hand out
    /// `rediss://127.0.0.1:<tls port>`. `ca` is the PEM file of the certificate authority
    /// the server trusts for client certificates; clients are not asked for one
    /// (`--tls-auth-clients no`) unless [`tls_auth_clients`](Self::tls_auth_clients) says
    /// so. The server is started with
    /// `--tls-port <port> --tls-cert-file <cert> --tls-key-file <key> --tls-ca-cert-file <ca>`.
    ///
    /// The plain port stays open on 127.0.0.1 for the kit's own start-up probes and for raw
    /// inspection: [`LocalCluster::port`] and [`LocalCluster::direct_url`] name it, and
    /// [`LocalCluster::tls_port`] the TLS one. A client given [`LocalCluster::urls`] only
    /// ever talks TLS. The certificate must name `127.0.0.1` (an IP address subject
    /// alternative name) for a client that checks it.
    ///
    /// The default for this is no TLS. TLS nodes cannot have proxies or replicas:
    /// [`launch`](Self::launch) fails with `Unsupported` when combined with
    /// [`proxies`](Self::proxies) or [`replicated`](Self::replicated).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock_testkit::LocalCluster;
    ///
    /// # async fn demo() -> std::io::Result<()> {
    /// let cluster = LocalCluster::builder(3)
    ///     .tls("certs/server.pem", "certs/server.key", "certs/ca.pem")
    ///     .launch()
    ///     .await?;
    /// assert!(cluster.urls()[0].starts_with("rediss://127.0.0.1:"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        ca: impl Into<PathBuf>,
    ) -> Self {
        self.tls = Some(ServerTls {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            auth_clients: false,
        });
        self
    }

    /// With [`tls`](Self::tls): whether the TLS port requires a client certificate signed by
    /// the `ca` given there (`--tls-auth-clients yes`). The plain port, used by the kit's
    /// own probes and for raw inspection, is not affected.
    ///
    /// The default for this is `false` (`--tls-auth-clients no`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock_testkit::LocalCluster;
    ///
    /// # async fn demo() -> std::io::Result<()> {
    /// let cluster = LocalCluster::builder(3)
    ///     .tls("certs/server.pem", "certs/server.key", "certs/ca.pem")
    ///     .tls_auth_clients(true)
    ///     .launch()
    ///     .await?;
    /// # let _ = cluster;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls_auth_clients(mut self, required: bool) -> Self {
        self.tls_auth_clients = required;
        self
    }

    /// How long a server may take to answer `PING` after it is started. The default for this
    /// is 10 seconds.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts every server (concurrently) and waits until each answers `PING` (and each
    /// replica is in sync). Must be called inside a tokio runtime (proxies are tasks).
    ///
    /// # Errors
    ///
    /// `NotFound` when `redis-server` is missing (the message says how to install it),
    /// `InvalidInput` for zero nodes or an out-of-range node index, `Unsupported` for TLS
    /// with proxies or replicas, or the start-up failure of a server (with the end of its
    /// log; e.g. a certificate file it cannot read).
    pub async fn launch(self) -> io::Result<LocalCluster> {
        if self.nodes == 0 {
            return Err(invalid("a LocalCluster needs at least one node"));
        }
        let out_of_range = self
            .node_persistence
            .iter()
            .map(|(i, _)| *i)
            .chain(self.replicated.iter().copied())
            .chain(self.node_args.iter().map(|(i, _)| *i))
            .find(|&i| i >= self.nodes);
        if let Some(i) = out_of_range {
            return Err(invalid(format!(
                "node index {i} is out of range for a {}-node cluster",
                self.nodes
            )));
        }
        if self.tls.is_some() && (self.proxies || !self.replicated.is_empty()) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "TLS nodes cannot have proxies or replicas in the test kit",
            ));
        }
        let binary = redis_server_binary()?;
        let nodes = (0..self.nodes).map(|i| self.start_node(i, &binary));
        let nodes = futures::future::try_join_all(nodes).await?;
        tracing::info!(
            testkit.nodes = nodes.len(),
            testkit.ports = ?nodes.iter().map(|n| n.master.port).collect::<Vec<_>>(),
            "testkit.cluster started"
        );
        Ok(LocalCluster { nodes })
    }

    async fn start_node(&self, i: usize, binary: &Path) -> io::Result<Node> {
        let persistence = self
            .node_persistence
            .iter()
            .rev()
            .find(|(n, _)| *n == i)
            .map_or(self.persistence, |(_, p)| *p);
        let mut args = self.args.clone();
        args.extend(
            self.node_args
                .iter()
                .filter(|(n, _)| *n == i)
                .map(|(_, a)| a.clone()),
        );
        let spec = |label: String, replicaof: Option<SocketAddr>| ServerSpec {
            label,
            binary: binary.to_path_buf(),
            persistence,
            args: args.clone(),
            replicaof,
            startup_timeout: self.startup_timeout,
            tls: self.tls.clone().map(|t| ServerTls {
                auth_clients: self.tls_auth_clients,
                ..t
            }),
        };
        let master = Server::launch(spec(format!("node {i}"), None)).await?;
        let replicated = self.replicated.contains(&i);
        let replica = if replicated {
            let link = FaultProxy::start(master.addr()).await?;
            let server =
                Server::launch(spec(format!("node {i} replica"), Some(link.addr()))).await?;
            Some(Replica { server, link })
        } else {
            None
        };
        let proxy = if self.proxies || replicated {
            Some(FaultProxy::start(master.addr()).await?)
        } else {
            None
        };
        Ok(Node {
            index: i,
            master,
            replica,
            proxy,
            promoted: AtomicBool::new(false),
        })
    }
}

/// N real `redis-server` processes on loopback, with faults. See the [module docs](self) and
/// the [test kit docs](super).
///
/// Node operations take the node's index (`0..len()`) and return `InvalidInput` for an index
/// out of range; they never panic. For a replicated node, the process operations (kill, start,
/// pause, ...) act on the process that currently serves the node's address: the master, or
/// the replica after [`promote_replica`](Self::promote_replica).
///
/// Dropping the cluster kills and reaps every server (it does not wait for anything else) and
/// removes their directories.
///
/// # Example
///
/// ```no_run
/// use quorumlock_testkit::LocalCluster;
///
/// # async fn demo() -> std::io::Result<()> {
/// let cluster = LocalCluster::launch(3).await?;
/// let urls = cluster.urls(); // ["redis://127.0.0.1:41234", ...]
/// cluster.kill(0).await?; // SIGKILL, stays down
/// cluster.start(0).await?; // same port, empty (no persistence)
/// # let _ = urls;
/// # Ok(())
/// # }
/// ```
pub struct LocalCluster {
    nodes: Vec<Node>,
}

impl fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCluster")
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl LocalCluster {
    /// A builder for a cluster of `nodes` nodes.
    pub fn builder(nodes: usize) -> LocalClusterBuilder {
        LocalClusterBuilder {
            nodes,
            persistence: Persistence::None,
            node_persistence: Vec::new(),
            proxies: false,
            replicated: Vec::new(),
            args: Vec::new(),
            node_args: Vec::new(),
            startup_timeout: Duration::from_secs(10),
            tls: None,
            tls_auth_clients: false,
        }
    }

    /// Launches `nodes` plain nodes with the defaults (no persistence, no proxies).
    ///
    /// # Errors
    ///
    /// As [`LocalClusterBuilder::launch`].
    pub async fn launch(nodes: usize) -> io::Result<LocalCluster> {
        LocalCluster::builder(nodes).launch().await
    }

    fn node(&self, i: usize) -> io::Result<&Node> {
        self.nodes.get(i).ok_or_else(|| {
            invalid(format!(
                "node index {i} is out of range for a {}-node cluster",
                self.nodes.len()
            ))
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a cluster has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The URL clients should use for every node: its proxy's when it has one, else the
    /// server's own.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The URL clients should use for node `i` (see [`urls`](Self::urls)).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn url(&self, i: usize) -> io::Result<String> {
        Ok(self.node(i)?.url())
    }

    /// The port of the server that serves node `i` (the master, or the promoted replica).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn port(&self, i: usize) -> io::Result<u16> {
        Ok(self.node(i)?.active().port)
    }

    /// The TLS port of node `i`'s server, `None` unless the cluster was built with
    /// [`LocalClusterBuilder::tls`].
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn tls_port(&self, i: usize) -> io::Result<Option<u16>> {
        Ok(self.node(i)?.active().tls_port)
    }

    /// `redis://127.0.0.1:<port>` of the server that serves node `i`, bypassing its proxy
    /// (and its TLS port: this is the plain port, see [`LocalClusterBuilder::tls`]).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn direct_url(&self, i: usize) -> io::Result<String> {
        Ok(self.node(i)?.active().url())
    }

    /// The OS process id of the server that serves node `i`, `None` while it is down.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn pid(&self, i: usize) -> io::Result<Option<u32>> {
        Ok(self.node(i)?.active().pid())
    }

    /// The directory of the server that serves node `i` (its log is `redis.log` there).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn dir(&self, i: usize) -> io::Result<&Path> {
        Ok(self.node(i)?.active().dir.path())
    }

    /// The client-facing proxy of node `i`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range, `Unsupported` when the node has no proxy
    /// (build with [`LocalClusterBuilder::proxies`]).
    pub fn proxy(&self, i: usize) -> io::Result<&FaultProxy> {
        self.node(i)?.proxy.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("node {i} has no proxy: build the cluster with .proxies(true)"),
            )
        })
    }

    /// The proxy on the replication link of replicated node `i` (replica → master): blackhole
    /// it and the replica stops receiving writes.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range, `Unsupported` when node `i` is not
    /// replicated (see [`LocalClusterBuilder::replicated`]).
    pub fn replication_link(&self, i: usize) -> io::Result<&FaultProxy> {
        Ok(&self.replica(i)?.link)
    }

    /// The port of replicated node `i`'s replica.
    ///
    /// # Errors
    ///
    /// As [`replication_link`](Self::replication_link).
    pub fn replica_port(&self, i: usize) -> io::Result<u16> {
        Ok(self.replica(i)?.server.port)
    }

    /// `redis://127.0.0.1:<port>` of replicated node `i`'s replica.
    ///
    /// # Errors
    ///
    /// As [`replication_link`](Self::replication_link).
    pub fn replica_url(&self, i: usize) -> io::Result<String> {
        Ok(self.replica(i)?.server.url())
    }

    /// `redis://127.0.0.1:<port>` of replicated node `i`'s original master.
    ///
    /// # Errors
    ///
    /// As [`replication_link`](Self::replication_link).
    pub fn master_url(&self, i: usize) -> io::Result<String> {
        self.replica(i)?;
        Ok(self.node(i)?.master.url())
    }

    fn replica(&self, i: usize) -> io::Result<&Replica> {
        self.node(i)?.replica.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("node {i} is not replicated: build the cluster with .replicated({i})"),
            )
        })
    }

    /// Kills node `i`'s server with SIGKILL and reaps it; it stays down. A no-op when it is
    /// already down.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range, or the OS error of `kill`.
    pub async fn kill(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        tracing::info!(testkit.node = i, "testkit.cluster kill");
        node.active().kill()
    }

    /// Starts node `i`'s server again on the same port and directory, and waits until it
    /// answers `PING`. With [`Persistence::AofAlways`] it reloads its data; without, it comes
    /// back empty. A no-op when it is running (even paused).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range; the start-up failure (port taken meanwhile,
    /// no answer within the start-up timeout) with the end of the server's log.
    pub async fn start(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        tracing::info!(testkit.node = i, "testkit.cluster start");
        node.active().start().await
    }

    /// [`kill`](Self::kill), wait `delay`, [`start`](Self::start). A delay longer than the
    /// longest lock TTL is the "delayed restart" of the deployment contract.
    ///
    /// # Errors
    ///
    /// As [`kill`](Self::kill) and [`start`](Self::start).
    pub async fn restart(&self, i: usize, delay: Duration) -> io::Result<()> {
        self.kill(i).await?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        LocalCluster::start(self, i).await
    }

    /// Pauses node `i`'s server with SIGSTOP: connections stay open, nothing is answered.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range, `NotConnected` when the server is down.
    pub async fn pause(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        tracing::info!(testkit.node = i, "testkit.cluster pause");
        node.active().signal(libc::SIGSTOP)
    }

    /// Resumes node `i`'s server with SIGCONT. A no-op when it is down or not paused.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub async fn resume(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        tracing::info!(testkit.node = i, "testkit.cluster resume");
        match node.active().signal(libc::SIGCONT) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        }
    }

    /// Cuts the client's link to node `i`: its proxy goes to [`ProxyMode::Blackhole`]
    /// (both directions silent; see the proxy docs for what happens on the heal).
    ///
    /// [`ProxyMode::Blackhole`]: super::ProxyMode::Blackhole
    ///
    /// # Errors
    ///
    /// As [`proxy`](Self::proxy).
    pub async fn disconnect(&self, i: usize) -> io::Result<()> {
        tracing::info!(testkit.node = i, "testkit.cluster disconnect");
        self.proxy(i)?.blackhole();
        Ok(())
    }

    /// Restores the client's link to node `i` ([`ProxyMode::Pass`](super::ProxyMode::Pass)).
    ///
    /// # Errors
    ///
    /// As [`proxy`](Self::proxy).
    pub async fn reconnect(&self, i: usize) -> io::Result<()> {
        tracing::info!(testkit.node = i, "testkit.cluster reconnect");
        self.proxy(i)?.pass();
        Ok(())
    }

    /// Delays node `i`'s client link by `delay` each way
    /// ([`ProxyMode::Delay`](super::ProxyMode::Delay)).
    ///
    /// # Errors
    ///
    /// As [`proxy`](Self::proxy).
    pub fn delay(&self, i: usize, delay: Duration) -> io::Result<()> {
        self.proxy(i)?.delay(delay);
        Ok(())
    }

    /// Fails replicated node `i` over to its replica: `REPLICAOF NO ONE` on the replica, then
    /// the node's client-facing proxy is re-targeted to it (live connections are reset), so
    /// node `i`'s URL now reaches the former replica. The master is left as it is: kill it
    /// first to model a crash. Afterwards the process operations on node `i` act on the
    /// promoted replica.
    ///
    /// # Errors
    ///
    /// `InvalidInput`/`Unsupported` as [`replication_link`](Self::replication_link); the
    /// replica's error or silence (e.g. when it is paused or down).
    pub async fn promote_replica(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        let replica = self.replica(i)?;
        let addr = replica.server.addr();
        let reply = resp::command(addr, &["REPLICAOF", "NO", "ONE"], PROBE_TIMEOUT).await?;
        if reply != Reply::Simple("OK".into()) {
            return Err(io::Error::other(format!(
                "node {i} replica: REPLICAOF NO ONE answered {reply:?}"
            )));
        }
        *lock(&replica.server.replicaof) = None;
        node.promoted.store(true, Ordering::SeqCst);
        if let Some(proxy) = &node.proxy {
            proxy.retarget(addr);
        }
        tracing::info!(
            testkit.node = i,
            testkit.port = addr.port(),
            "testkit.cluster promoted replica"
        );
        Ok(())
    }
}

impl Faults for LocalCluster {
    fn urls(&self) -> Vec<String> {
        LocalCluster::urls(self)
    }

    fn len(&self) -> usize {
        LocalCluster::len(self)
    }

    fn kill(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::kill(self, node)
    }

    fn start(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::start(self, node)
    }

    fn restart(&self, node: usize, delay: Duration) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::restart(self, node, delay)
    }

    fn pause(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::pause(self, node)
    }

    fn resume(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::resume(self, node)
    }

    fn disconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::disconnect(self, node)
    }

    fn reconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        LocalCluster::reconnect(self, node)
    }

    fn slow(&self, node: usize, delay: Duration) -> impl Future<Output = io::Result<()>> + Send {
        let result = LocalCluster::delay(self, node, delay);
        async move { result }
    }
}

struct Node {
    index: usize,
    master: Server,
    replica: Option<Replica>,
    proxy: Option<FaultProxy>,
    promoted: AtomicBool,
}

impl Node {
    fn active(&self) -> &Server {
        match &self.replica {
            Some(r) if self.promoted.load(Ordering::SeqCst) => &r.server,
            _ => &self.master,
        }
    }

    fn url(&self) -> String {
        match &self.proxy {
            Some(p) => p.url(),
            None => self.active().client_url(),
        }
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Node");
        d.field("index", &self.index)
            .field("url", &self.url())
            .field("master", &self.master);
        if let Some(r) = &self.replica {
            d.field("replica", &r.server)
                .field("replication_link", &r.link)
                .field("promoted", &self.promoted.load(Ordering::SeqCst));
        }
        d.field("proxy", &self.proxy).finish()
    }
}

struct Replica {
    server: Server,
    link: FaultProxy,
}

struct ServerSpec {
    label: String,
    binary: PathBuf,
    persistence: Persistence,
    args: Vec<String>,
    replicaof: Option<SocketAddr>,
    startup_timeout: Duration,
    tls: Option<ServerTls>,
}

/// One `redis-server` slot: a fixed port and directory, a process that comes and goes.
struct Server {
    label: String,
    binary: PathBuf,
    dir: TempDir,
    port: u16,
    persistence: Persistence,
    args: Vec<String>,
    replicaof: Mutex<Option<SocketAddr>>,
    child: Mutex<Option<Child>>,
    startup_timeout: Duration,
    tls: Option<ServerTls>,
    /// The TLS port, when `tls` is set.
    tls_port: Option<u16>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("label", &self.label)
            .field("port", &self.port)
            .field("tls_port", &self.tls_port)
            .field("pid", &self.pid())
            .field("persistence", &self.persistence)
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

impl Server {
    /// Creates the directory, picks a free port and starts; on a port race, tries again on a
    /// fresh port (bounded).
    async fn launch(spec: ServerSpec) -> io::Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("quorumlock-testkit-")
            .tempdir()?;
        let mut server = Server {
            label: spec.label,
            binary: spec.binary,
            dir,
            port: 0,
            persistence: spec.persistence,
            args: spec.args,
            replicaof: Mutex::new(spec.replicaof),
            child: Mutex::new(None),
            startup_timeout: spec.startup_timeout,
            tls: spec.tls,
            tls_port: None,
        };
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            if server.tls.is_some() {
                server.tls_port = Some(free_port()?);
            }
            server.spawn()?;
            match server.wait_ready(spec.replicaof.is_some()).await {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    tracing::debug!(testkit.server = %server.label, testkit.port = server.port, "port taken, retrying");
                    server.kill()?;
                    last_error = Some(e);
                }
                Err(e) => return Err(e), // Drop kills the process.
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("no port attempt made")))
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// The URL a client uses: the TLS port's when the server serves TLS.
    fn client_url(&self) -> String {
        match self.tls_port {
            Some(port) => format!("rediss://{}", SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
            None => self.url(),
        }
    }

    fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Spawns the process unless one is running.
    fn spawn(&self) -> io::Result<()> {
        let mut child = lock(&self.child);
        if let Some(c) = child.as_mut()
            && c.try_wait()?.is_none()
        {
            return Ok(());
        }
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--daemonize", "no", "--dir"])
            .arg(self.dir.path())
            .args(["--save", "", "--enable-debug-command", "local"])
            .args(["--maxmemory-policy", "noeviction"])
            .args(["--repl-diskless-sync-delay", "0"]);
        match self.persistence {
            Persistence::None => cmd.args(["--appendonly", "no"]),
            Persistence::AofAlways => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
        };
        if let Some(master) = *lock(&self.replicaof) {
            cmd.arg("--replicaof")
                .arg(master.ip().to_string())
                .arg(master.port().to_string());
        }
        if let (Some(tls), Some(port)) = (&self.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .arg("--tls-auth-clients")
                .arg(if tls.auth_clients { "yes" } else { "no" });
        }
        cmd.args(&self.args);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let spawned = spawn_child(cmd).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                not_found(&format!(
                    "{} could not be executed: {e}",
                    self.binary.display()
                ))
            } else {
                e
            }
        })?;
        tracing::debug!(testkit.server = %self.label, testkit.port = self.port, testkit.pid = spawned.id(), "testkit.cluster spawned");
        *child = Some(spawned);
        Ok(())
    }

    async fn start(&self) -> io::Result<()> {
        self.spawn()?;
        self.wait_ready(false).await
    }

    /// Polls PING (and, with `synced`, the replication link) until it answers, the process
    /// exits, or the start-up timeout passes.
    async fn wait_ready(&self, synced: bool) -> io::Result<()> {
        let deadline = tokio::time::Instant::now() + self.startup_timeout;
        let max_polls = (self.startup_timeout.as_millis() / POLL.as_millis()).max(1) + 1;
        let mut last = String::from("no answer yet");
        for _ in 0..max_polls {
            {
                let mut child = lock(&self.child);
                let Some(c) = child.as_mut() else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        format!("{} was killed while starting", self.label),
                    ));
                };
                if let Some(status) = c.try_wait()? {
                    *child = None;
                    drop(child);
                    let log = self.log_tail();
                    let kind = if log.contains("Address already in use") {
                        io::ErrorKind::AddrInUse
                    } else {
                        io::ErrorKind::Other
                    };
                    return Err(io::Error::new(
                        kind,
                        format!(
                            "{} (redis-server on port {}) exited during start-up with {status}; end of {}:\n{log}",
                            self.label,
                            self.port,
                            self.log_path().display()
                        ),
                    ));
                }
            }
            match self.probe(synced).await {
                Ok(true) => return Ok(()),
                Ok(false) => last = "replication link not up yet".into(),
                Err(e) => last = e.to_string(),
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{} (redis-server on port {}) not ready within {:?} (last: {last}); end of {}:\n{}",
                self.label,
                self.port,
                self.startup_timeout,
                self.log_path().display(),
                self.log_tail()
            ),
        ))
    }

    async fn probe(&self, synced: bool) -> io::Result<bool> {
        match resp::command(self.addr(), &["PING"], PROBE_TIMEOUT).await? {
            Reply::Simple(s) if s == "PONG" => {}
            other => return Err(io::Error::other(format!("PING answered {other:?}"))),
        }
        // The answer must come from our process: when another server took the port
        // meanwhile, ours is about to exit with "Address already in use" while that one
        // answers PING (and the start is retried on a fresh port once ours exits).
        let ours = self.pid();
        let info = resp::command(self.addr(), &["INFO", "server"], PROBE_TIMEOUT).await?;
        let pid = info.text().and_then(|t| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse::<u32>().ok())
        });
        if pid.is_none() || pid != ours {
            return Err(io::Error::other(format!(
                "port {} is answered by another server (pid {pid:?})",
                self.port
            )));
        }
        if !synced {
            return Ok(true);
        }
        let info = resp::command(self.addr(), &["INFO", "replication"], PROBE_TIMEOUT).await?;
        Ok(info
            .text()
            .is_some_and(|t| t.contains("master_link_status:up")))
    }

    /// The last lines of the server's log, for error messages.
    fn log_tail(&self) -> String {
        const TAIL: u64 = 2048;
        let read = || -> io::Result<String> {
            let mut f = File::open(self.log_path())?;
            let len = f.metadata()?.len();
            f.seek(SeekFrom::Start(len.saturating_sub(TAIL)))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf).into_owned())
        };
        read().unwrap_or_else(|e| format!("(log unavailable: {e})"))
    }

    fn kill(&self) -> io::Result<()> {
        let mut child = lock(&self.child);
        if let Some(mut c) = child.take() {
            // SIGKILL also ends a stopped (paused) process; wait() reaps it: no zombie.
            if let Err(e) = c.kill()
                && e.kind() != io::ErrorKind::InvalidInput
            {
                *child = Some(c);
                return Err(e);
            }
            c.wait()?;
            tracing::debug!(testkit.server = %self.label, testkit.port = self.port, "testkit.cluster killed");
        }
        Ok(())
    }

    fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        let mut child = lock(&self.child);
        let running = match child.as_mut() {
            Some(c) => c.try_wait()?.is_none(),
            None => false,
        };
        let pid = match child.as_ref() {
            Some(c) if running => c.id(),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("{} is not running", self.label),
                ));
            }
        };
        let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
        // SAFETY: `kill` has no memory-safety preconditions; `pid` is our own unreaped child
        // (we hold the lock, so it cannot be reaped and its pid reused meanwhile).
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port that was free a moment ago (bind `127.0.0.1:0`, read, close). Racy by nature; the
/// caller retries on `AddrInUse`.
fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn not_found(detail: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "redis-server not found ({detail}). The quorumlock test kit runs real Redis 7 servers: \
             install Debian's `redis-server` package (run `scripts/install-deps.sh`, or \
             `apt-get install redis-server`), or set {REDIS_SERVER_ENV} to the binary's path"
        ),
    )
}

/// `$QUORUMLOCK_REDIS_SERVER`, else `redis-server` on `PATH`, else the usual locations.
fn redis_server_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(REDIS_SERVER_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(not_found(&format!(
                "{REDIS_SERVER_ENV}={} is not a file",
                path.display()
            )))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| not_found("not on PATH, nor in /usr/bin or /usr/local/bin"))
}

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Spawns children from one thread that lives as long as the process, so that on Linux
/// `PR_SET_PDEATHSIG` (which fires when the *thread* that forked exits) means "when the test
/// process dies", not "when some tokio worker thread exits".
fn spawn_child(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("quorumlock-testkit-spawner".into())
            .spawn(move || {
                for mut req in rx {
                    set_parent_death_signal(&mut req.cmd);
                    let _ = req.reply.send(req.cmd.spawn());
                }
            })
            .ok()
            .map(|_| tx)
    });
    let mut cmd = cmd;
    let Some(spawner) = spawner else {
        return cmd.spawn();
    };
    let (reply, answer) = mpsc::channel();
    spawner
        .send(SpawnRequest { cmd, reply })
        .map_err(|_| io::Error::other("testkit spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("testkit spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl, which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_error_says_how_to_install() {
        let e = not_found("not on PATH");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let msg = e.to_string();
        assert!(msg.contains("scripts/install-deps.sh"), "{msg}");
        assert!(msg.contains("apt-get install redis-server"), "{msg}");
        assert!(msg.contains(REDIS_SERVER_ENV), "{msg}");
    }

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port().ok(), Some(0));
    }

    #[test]
    fn public_types_are_send_sync() {
        fn bounds<T: Send + Sync + 'static>() {}
        bounds::<LocalCluster>();
        bounds::<LocalClusterBuilder>();
        bounds::<FaultProxy>();
    }
}
