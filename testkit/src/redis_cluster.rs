//! Local Redis Clusters: `redis-server` processes started with `--cluster-enabled yes`,
//! joined, their hash slots assigned by the kit, replicas attached, with the faults a
//! Redis Cluster has and a plain master does not: a master failed over to its replica
//! (gracefully, or after it crashed), and a hash slot migrated to another master while
//! keys live in it (in one step, or left half-way so that clients meet `ASK` redirects).
//!
//! ```text
//!   launch(masters, replicas) ──▶ LocalCluster of masters·(1 + replicas) processes
//!       ──CLUSTER MEET──▶ one cluster ──ADDSLOTSRANGE──▶ 16384 slots split evenly
//!       ──CLUSTER REPLICATE──▶ replicas ──▶ wait: cluster_state:ok, one slot map everywhere
//! ```
//!
//! Processes are numbered as in the [`LocalCluster`] underneath ([`RedisCluster::processes`]):
//! masters first (`0..masters`), then the replicas of master 0, of master 1, and so on.
//! After a failover a process's role changes; [`RedisCluster::owner`] always asks the
//! cluster which process serves a slot now.
//!
//! Every node runs with `cluster-node-timeout` 1000 ms (a crashed master is detected in
//! about a second) and `cluster-require-full-coverage no` (the other masters keep serving
//! their slots while one is down, as a deployment that prefers availability would).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::cluster::LocalCluster;
use super::resp::{self, Reply};
use quorumlock::keys::Keys;
use std::io;

pub use quorumlock::keys::{SLOTS, key_slot};

/// How long one cluster command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the cluster may take to converge after a change (join, failover, migration).
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a takeover may wait for the cluster before its replica claims a newer epoch.
const TAKEOVER_NUDGE: Duration = Duration::from_secs(5);
/// How often convergence is polled.
const POLL: Duration = Duration::from_millis(50);

/// The lock key of resource `name` on a voter that is a Redis Cluster, where every key of a
/// name carries a hash tag that puts it in the name's own slot: for faults aimed at one
/// resource's key ([`RedisCluster::crash_failover_losing`]).
///
/// # Example
///
/// ```
/// use quorumlock_testkit::redis_cluster::{cluster_lock_key, key_slot};
/// let key = cluster_lock_key("orders:42");
/// assert!(key.starts_with(b"quorumlock:lock:{"));
/// assert_eq!(key_slot(&key), key_slot(b"orders:42"));
/// ```
pub fn cluster_lock_key(name: &str) -> Vec<u8> {
    Keys::default().on_cluster().lock(name)
}

/// The release channel of resource `name` on a voter that is a Redis Cluster: a shard
/// channel (`SPUBLISH`/`SSUBSCRIBE`) in the name's own slot, which a waiter of the resource
/// subscribes to on the slot's master.
///
/// # Example
///
/// ```
/// use quorumlock_testkit::redis_cluster::{cluster_release_channel, key_slot};
/// let channel = cluster_release_channel("orders:42");
/// assert!(channel.starts_with(b"quorumlock:released:"));
/// assert_eq!(key_slot(&channel), key_slot(b"orders:42"));
/// ```
pub fn cluster_release_channel(name: &str) -> Vec<u8> {
    Keys::default().on_cluster().release_channel(name)
}

/// A local Redis Cluster: `masters` masters, each with `replicas` replicas, every slot
/// assigned. Dropping it kills every process and removes their directories.
///
/// # Example
///
/// ```no_run
/// use quorumlock_testkit::redis_cluster::{RedisCluster, key_slot};
///
/// # async fn demo() -> std::io::Result<()> {
/// let cluster = RedisCluster::launch(3, 1).await?;
/// let seeds = cluster.seed_urls(); // hand these to a cluster client
/// let slot = key_slot(b"quorumlock:lock:{orders:42}");
/// let master = cluster.owner(slot).await?;
/// let promoted = cluster.failover(master).await?; // its replica serves the slot now
/// assert_eq!(cluster.owner(slot).await?, promoted);
/// let other = (0..3).find(|&m| m != master).unwrap_or(0);
/// cluster.migrate_slot(slot, other).await?; // keys and all
/// # let _ = seeds;
/// # Ok(())
/// # }
/// ```
pub struct RedisCluster {
    processes: LocalCluster,
    topology: Topology,
}

/// The nodes of one Redis Cluster by their `127.0.0.1` ports (masters first, then each
/// master's replicas), and every operation that needs only their addresses: forming the
/// cluster, asking who serves a slot, failing over, migrating. Shared by [`RedisCluster`]
/// (local processes) and the Compose harness's clusters.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    ports: Vec<u16>,
    /// Each node's cluster bus port, when not the default (the port + 10000).
    buses: Option<Vec<u16>>,
    masters: usize,
    replicas: usize,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("masters", &self.topology.masters)
            .field("replicas", &self.topology.replicas)
            .field("processes", &self.processes)
            .finish()
    }
}

impl RedisCluster {
    /// Starts `masters · (1 + replicas)` processes, joins them into one cluster, splits the
    /// 16384 slots evenly over the masters (master `m` gets the `m`-th contiguous range),
    /// attaches `replicas` replicas to each master, and waits until every node reports
    /// `cluster_state:ok` with the same slot map and every replica's link is up.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for zero masters; the start-up failure of a process (as
    /// [`LocalCluster::launch`]); `TimedOut` when the cluster does not converge within 20 s
    /// (with what it last reported).
    pub async fn launch(masters: usize, replicas: usize) -> io::Result<RedisCluster> {
        if masters == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Redis Cluster needs at least one master",
            ));
        }
        let total = masters.saturating_mul(replicas.saturating_add(1));
        let processes = LocalCluster::builder(total)
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "1000"])
            .args(["--cluster-require-full-coverage", "no"])
            .launch()
            .await?;
        let ports = (0..processes.len())
            .map(|i| processes.port(i))
            .collect::<io::Result<Vec<u16>>>()?;
        let topology = Topology::new(ports, None, masters, replicas);
        topology.form().await?;
        Ok(RedisCluster {
            processes,
            topology,
        })
    }

    /// The processes underneath, for faults on any one of them (kill, pause, restart: a
    /// restarted node rejoins with its `nodes.conf`).
    pub fn processes(&self) -> &LocalCluster {
        &self.processes
    }

    /// The number of masters the cluster was launched with.
    pub fn masters(&self) -> usize {
        self.topology.masters
    }

    /// Every process's URL (`redis://127.0.0.1:PORT`): seeds for a cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.processes.urls()
    }

    /// The cluster as one quorumlock voter: `redis+cluster://127.0.0.1:P0,127.0.0.1:P1,…`,
    /// every process a seed.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use quorumlock_testkit::redis_cluster::RedisCluster;
    /// let (a, b, c) = (
    ///     RedisCluster::launch(3, 0).await?,
    ///     RedisCluster::launch(3, 0).await?,
    ///     RedisCluster::launch(3, 0).await?,
    /// );
    /// let locks = quorumlock::Redlock::builder([a.voter_url(), b.voter_url(), c.voter_url()])
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn voter_url(&self) -> String {
        let hosts: Vec<String> = self
            .topology
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// [`crash_failover`](Self::crash_failover) of process `master`, losing `key`: once
    /// the replica is promoted, the key is deleted on it, as if the write had not reached
    /// the replica before the crash (replication is asynchronous, so a real crash may lose
    /// it so). Returns the process that is master now.
    ///
    /// # Errors
    ///
    /// As [`crash_failover`](Self::crash_failover); the new master's errors.
    pub async fn crash_failover_losing(&self, master: usize, key: &[u8]) -> io::Result<usize> {
        let promoted = self.crash_failover(master).await?;
        let key = String::from_utf8_lossy(key).into_owned();
        command(self.topology.addr(promoted)?, &["DEL", &key]).await?;
        Ok(promoted)
    }

    /// The process that serves `slot` now, as the first live node that answers says.
    ///
    /// # Errors
    ///
    /// `NotFound` when no live node knows a master for the slot.
    pub async fn owner(&self, slot: u16) -> io::Result<usize> {
        self.topology.owner(slot).await
    }

    /// Fails master `master` over to one of its replicas, gracefully (`CLUSTER FAILOVER`:
    /// the replica catches up first, so no acknowledged write is lost), and waits until
    /// the cluster agrees. Returns the process that is master now.
    ///
    /// # Errors
    ///
    /// `NotFound` when the master has no replica; the failover's error; `TimedOut` when
    /// the cluster does not agree within 20 s.
    pub async fn failover(&self, master: usize) -> io::Result<usize> {
        self.topology.failover(master).await
    }

    /// Kills master `master` (SIGKILL) and promotes one of its replicas without it
    /// (`CLUSTER FAILOVER TAKEOVER`: writes the replica had not received are lost, as in
    /// a real crash). The killed process stays down; [`LocalCluster::start`] on
    /// [`processes`](Self::processes) brings it back as a replica of the new master.
    /// Returns the process that is master now.
    ///
    /// # Errors
    ///
    /// As [`failover`](Self::failover).
    pub async fn crash_failover(&self, master: usize) -> io::Result<usize> {
        let replica = self.topology.first_replica(master).await?;
        self.processes.kill(master).await?;
        self.topology.takeover(replica).await?;
        Ok(replica)
    }

    /// Pauses master `master` (SIGSTOP: its connections stay open, unanswered) and
    /// promotes one of its replicas without it (`CLUSTER FAILOVER TAKEOVER`), as an
    /// operator does with a master that stopped answering. The paused process stays
    /// paused; [`LocalCluster::resume`] on [`processes`](Self::processes) wakes it (it
    /// then learns it lost its slots). Returns the process that is master now.
    ///
    /// # Errors
    ///
    /// As [`failover`](Self::failover).
    pub async fn pause_failover(&self, master: usize) -> io::Result<usize> {
        let replica = self.topology.first_replica(master).await?;
        self.processes.pause(master).await?;
        self.topology.takeover(replica).await?;
        Ok(replica)
    }

    /// The processes that replicate process `master` now (from each one's
    /// `INFO replication`): e.g. to wait until a crashed master, started again, follows
    /// the replica that took its place.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a process index out of range.
    pub async fn replicas_of(&self, master: usize) -> io::Result<Vec<usize>> {
        self.topology.replicas_of(master).await
    }

    /// Moves `slot`, with its keys, to master `to`, and waits until every live node
    /// agrees: [`begin_migration`](Self::begin_migration), then
    /// [`finish_migration`](Self::finish_migration).
    ///
    /// # Errors
    ///
    /// As those two.
    pub async fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        self.begin_migration(slot, to).await?;
        self.finish_migration(slot, to).await
    }

    /// Starts moving `slot` to master `to` and stops half-way: the target is
    /// `IMPORTING` and the source `MIGRATING`, and no key has moved yet. Until
    /// [`finish_migration`](Self::finish_migration), a command for a key of the slot that
    /// the source no longer has is answered `-ASK` (go to the target, for this command
    /// only), and one that names several keys of the slot, some of them moved already,
    /// fails with `-TRYAGAIN`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `to` already serves the slot; the servers' errors.
    pub async fn begin_migration(&self, slot: u16, to: usize) -> io::Result<()> {
        self.topology.begin_migration(slot, to).await
    }

    /// Moves the rest of `slot`'s keys from its current owner to `to` (`MIGRATE`, in
    /// batches) and hands the slot over (`CLUSTER SETSLOT … NODE` on the target, the
    /// source, then every other node), and waits until every live node agrees.
    ///
    /// # Errors
    ///
    /// The servers' errors; `TimedOut` when the cluster does not agree within 20 s.
    pub async fn finish_migration(&self, slot: u16, to: usize) -> io::Result<()> {
        self.topology.finish_migration(slot, to).await
    }
}

/// Several local Redis Clusters, each one quorumlock voter: the [`Faults`](super::Faults) backend for
/// scenarios over cluster voters. Voter `i` is [`voter(i)`](Self::voter); a fault on it acts
/// on every process of that cluster (the whole voter down, or paused), the way a fault on
/// a plain master acts on its one process. A client's link to a voter cannot be cut or
/// slowed (a cluster announces its nodes' own addresses, so no proxy stands in between):
/// [`disconnect`](super::Faults::disconnect) and [`slow`](super::Faults::slow) are `Unsupported`.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use quorumlock_testkit::Faults;
/// use quorumlock_testkit::redis_cluster::ClusterVoters;
/// let voters = ClusterVoters::launch(5, 1, 0).await?;
/// let locks = quorumlock::Redlock::builder(voters.urls()).build().await?;
/// let lock = locks.try_lock("job", std::time::Duration::from_secs(5)).await?;
/// voters.kill(0).await?; // one voter down: the lock holds on the other four
/// # Ok(()) }
/// ```
pub struct ClusterVoters {
    voters: Vec<RedisCluster>,
}

impl fmt::Debug for ClusterVoters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.voters).finish()
    }
}

impl ClusterVoters {
    /// Launches `voters` clusters of `masters` masters with `replicas` replicas each
    /// ([`RedisCluster::launch`]), concurrently.
    ///
    /// # Errors
    ///
    /// The first cluster's start-up failure.
    pub async fn launch(
        voters: usize,
        masters: usize,
        replicas: usize,
    ) -> io::Result<ClusterVoters> {
        let starts = (0..voters).map(|_| RedisCluster::launch(masters, replicas));
        let voters = futures::future::join_all(starts)
            .await
            .into_iter()
            .collect::<io::Result<Vec<_>>>()?;
        Ok(ClusterVoters { voters })
    }

    /// Voter `i`'s cluster, for the faults of a cluster (failover, slot migration).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an index out of range.
    pub fn voter(&self, i: usize) -> io::Result<&RedisCluster> {
        self.voters.get(i).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("voter {i} of {}", self.voters.len()),
            )
        })
    }

    /// Runs `op` on every process of voter `i`.
    async fn each<'a, F, Fut>(&'a self, i: usize, op: F) -> io::Result<()>
    where
        F: Fn(&'a LocalCluster, usize) -> Fut,
        Fut: std::future::Future<Output = io::Result<()>>,
    {
        let processes = self.voter(i)?.processes();
        for p in 0..processes.len() {
            op(processes, p).await?;
        }
        Ok(())
    }
}

impl super::Faults for ClusterVoters {
    fn urls(&self) -> Vec<String> {
        self.voters.iter().map(RedisCluster::voter_url).collect()
    }

    fn len(&self) -> usize {
        self.voters.len()
    }

    fn kill(&self, node: usize) -> impl std::future::Future<Output = io::Result<()>> + Send {
        self.each(node, |c, p| c.kill(p))
    }

    async fn start(&self, node: usize) -> io::Result<()> {
        self.each(node, |c, p| c.start(p)).await?;
        self.voter(node)?.topology.settled().await
    }

    async fn restart(&self, node: usize, delay: Duration) -> io::Result<()> {
        super::Faults::kill(self, node).await?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        super::Faults::start(self, node).await
    }

    fn pause(&self, node: usize) -> impl std::future::Future<Output = io::Result<()>> + Send {
        self.each(node, |c, p| c.pause(p))
    }

    fn resume(&self, node: usize) -> impl std::future::Future<Output = io::Result<()>> + Send {
        self.each(node, |c, p| c.resume(p))
    }

    async fn disconnect(&self, node: usize) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("voter {node}: a Redis Cluster voter's links cannot be cut (no proxy)"),
        ))
    }

    async fn reconnect(&self, node: usize) -> io::Result<()> {
        self.voter(node).map(|_| ())
    }
}

impl Topology {
    /// The nodes on `ports` (masters first, then each master's replicas, `replicas` each),
    /// gossiping on `buses` (`None`: each port + 10000, Redis's default).
    pub(crate) fn new(
        ports: Vec<u16>,
        buses: Option<Vec<u16>>,
        masters: usize,
        replicas: usize,
    ) -> Topology {
        Topology {
            ports,
            buses,
            masters,
            replicas,
        }
    }

    fn len(&self) -> usize {
        self.ports.len()
    }

    /// Joins the processes, assigns the slots, attaches the replicas and waits.
    pub(crate) async fn form(&self) -> io::Result<()> {
        // Every node gets its own configuration epoch before it meets the others, as
        // `redis-cli --cluster create` does. Left at 0, the epochs are made unique by
        // collisions resolved over gossip after the cluster looks settled; a replica
        // promoted by a takeover meanwhile may claim an epoch the others already gave its
        // old master, and they then keep the old master's slots for ever.
        for i in 0..self.len() {
            let epoch = (i + 1).to_string();
            ok(command(self.addr(i)?, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]).await?)?;
        }
        let first = self.addr(0)?;
        for i in 1..self.len() {
            let port = self.port(i)?.to_string();
            let mut meet = vec!["CLUSTER", "MEET", "127.0.0.1", &port];
            let bus = self
                .buses
                .as_ref()
                .and_then(|b| b.get(i))
                .map(u16::to_string);
            if let Some(bus) = &bus {
                meet.push(bus);
            }
            ok(command(first, &meet).await?)?;
        }
        let per = usize::from(SLOTS) / self.masters;
        for m in 0..self.masters {
            let start = m * per;
            let end = if m + 1 == self.masters {
                usize::from(SLOTS) - 1
            } else {
                (m + 1) * per - 1
            };
            let (start, end) = (start.to_string(), end.to_string());
            ok(command(self.addr(m)?, &["CLUSTER", "ADDSLOTSRANGE", &start, &end]).await?)?;
        }
        self.converge(|s| s.known == self.len(), "every node known")
            .await?;
        for m in 0..self.masters {
            let id = self.id(m).await?;
            for r in 0..self.replicas {
                let replica = self.masters + m * self.replicas + r;
                self.replicate(replica, &id).await?;
            }
        }
        self.settled().await
    }

    /// Makes `replica` a replica of the node `id`. A node counts a peer still in its
    /// handshake among the known nodes, under a temporary id, so the replica may not know
    /// the master's id yet: `Unknown node` is asked again every 50 ms, for up to
    /// [`CONVERGE_TIMEOUT`].
    async fn replicate(&self, replica: usize, id: &str) -> io::Result<()> {
        let addr = self.addr(replica)?;
        let end = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            match command(addr, &["CLUSTER", "REPLICATE", id]).await? {
                Reply::Error(e) if e.contains("Unknown node") && Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return ok(other),
            }
        }
    }

    /// Waits until every live node reports `cluster_state:ok` and the same slot map, and
    /// every live replica's replication link is up.
    async fn settled(&self) -> io::Result<()> {
        let want = self.len();
        self.converge(
            |s| s.ok == s.live && s.maps_agree && s.links_up && s.known == want,
            "cluster_state:ok, one slot map, replicas linked",
        )
        .await
    }

    /// Polls the cluster until `done` holds of its state, at most [`CONVERGE_TIMEOUT`].
    async fn converge(&self, done: impl Fn(&State) -> bool, what: &str) -> io::Result<()> {
        let end = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let state = self.state().await;
            if done(&state) {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the Redis Cluster did not converge ({what}) within {CONVERGE_TIMEOUT:?}: {state:?}"
                    ),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What every live node reports now.
    async fn state(&self) -> State {
        let mut state = State::default();
        let mut maps: Vec<Vec<(u16, u16, u16)>> = Vec::new();
        for i in 0..self.len() {
            let Ok(addr) = self.addr(i) else { continue };
            let Ok(Reply::Bulk(Some(info))) = command(addr, &["CLUSTER", "INFO"]).await else {
                continue;
            };
            state.live += 1;
            let info = String::from_utf8_lossy(&info);
            if info.contains("cluster_state:ok") {
                state.ok += 1;
            }
            // The fewest nodes any live node knows.
            let known = field(&info, "cluster_known_nodes").map_or(0, |k| k.parse().unwrap_or(0));
            state.known = if state.live == 1 {
                known
            } else {
                state.known.min(known)
            };
            if let Ok(map) = self.slot_map(addr).await {
                maps.push(map);
            }
            if let Ok(Reply::Bulk(Some(repl))) = command(addr, &["INFO", "replication"]).await {
                let repl = String::from_utf8_lossy(&repl);
                if field(&repl, "role") == Some("slave")
                    && field(&repl, "master_link_status") != Some("up")
                {
                    state.links_down += 1;
                }
            }
        }
        state.links_up = state.links_down == 0;
        state.maps_agree = maps.windows(2).all(|w| w[0] == w[1]) && !maps.is_empty();
        state
    }

    /// The slot map as `addr` sees it: `(first slot, last slot, serving port)`, sorted.
    async fn slot_map(&self, addr: SocketAddr) -> io::Result<Vec<(u16, u16, u16)>> {
        let Reply::Array(Some(ranges)) = command(addr, &["CLUSTER", "SLOTS"]).await? else {
            return Err(io::Error::other("CLUSTER SLOTS did not answer an array"));
        };
        let mut map = Vec::new();
        for range in ranges {
            let Reply::Array(Some(parts)) = range else {
                continue;
            };
            let (Some(Reply::Integer(a)), Some(Reply::Integer(b)), Some(Reply::Array(Some(m)))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            let Some(Reply::Integer(port)) = m.get(1) else {
                continue;
            };
            let narrow = |v: i64| u16::try_from(v).unwrap_or(u16::MAX);
            map.push((narrow(*a), narrow(*b), narrow(*port)));
        }
        map.sort_unstable();
        Ok(map)
    }

    fn port(&self, i: usize) -> io::Result<u16> {
        self.ports.get(i).copied().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node {i} is out of range for a {}-node cluster", self.len()),
            )
        })
    }

    fn addr(&self, i: usize) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, self.port(i)?)))
    }

    /// The process serving port `port`.
    fn process_of_port(&self, port: u16) -> io::Result<usize> {
        (0..self.len())
            .find(|&i| self.ports.get(i) == Some(&port))
            .ok_or_else(|| io::Error::other(format!("no process on port {port}")))
    }

    /// Process `i`'s cluster node id.
    async fn id(&self, i: usize) -> io::Result<String> {
        command(self.addr(i)?, &["CLUSTER", "MYID"])
            .await?
            .text()
            .ok_or_else(|| io::Error::other(format!("process {i}: no CLUSTER MYID")))
    }

    /// The process that serves `slot` now, as the first live node that answers says.
    ///
    /// # Errors
    ///
    /// `NotFound` when no live node knows a master for the slot.
    pub(crate) async fn owner(&self, slot: u16) -> io::Result<usize> {
        for i in 0..self.len() {
            let Ok(addr) = self.addr(i) else { continue };
            let Ok(map) = self.slot_map(addr).await else {
                continue;
            };
            if let Some(&(_, _, port)) = map.iter().find(|(a, b, _)| (*a..=*b).contains(&slot)) {
                return self.process_of_port(port);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no live node knows a master for slot {slot}"),
        ))
    }

    /// The processes that replicate process `master` now (from its own `INFO replication`).
    async fn replicas_of(&self, master: usize) -> io::Result<Vec<usize>> {
        let port = self.port(master)?;
        let mut out = Vec::new();
        for i in 0..self.len() {
            let Ok(addr) = self.addr(i) else { continue };
            let Ok(Reply::Bulk(Some(repl))) = command(addr, &["INFO", "replication"]).await else {
                continue;
            };
            let repl = String::from_utf8_lossy(&repl);
            if field(&repl, "master_port") == Some(port.to_string().as_str()) {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Fails master `master` over to one of its replicas, gracefully (`CLUSTER FAILOVER`:
    /// the replica catches up first, so no acknowledged write is lost), and waits until
    /// the cluster agrees. Returns the process that is master now.
    ///
    /// # Errors
    ///
    /// `NotFound` when the master has no replica; the failover's error; `TimedOut` when
    /// the cluster does not agree within 20 s.
    pub(crate) async fn failover(&self, master: usize) -> io::Result<usize> {
        let replica = self.first_replica(master).await?;
        ok(command(self.addr(replica)?, &["CLUSTER", "FAILOVER"]).await?)?;
        self.wait_master(replica).await?;
        Ok(replica)
    }

    /// Promotes `replica` without its master's agreement (`CLUSTER FAILOVER TAKEOVER`, for
    /// a master that is down) and waits until the cluster agrees.
    pub(crate) async fn takeover(&self, replica: usize) -> io::Result<()> {
        ok(command(self.addr(replica)?, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await?)?;
        if self.wait_master_within(replica, TAKEOVER_NUDGE).await? {
            return Ok(());
        }
        // A takeover claims an epoch without the others' agreement; if the replica's view
        // of the epochs was behind, its claim loses to the old master's and is never
        // adopted. `BUMPEPOCH` claims a newer one once its view has caught up.
        ok(command(self.addr(replica)?, &["CLUSTER", "BUMPEPOCH"]).await?)?;
        self.wait_master(replica).await
    }

    pub(crate) async fn first_replica(&self, master: usize) -> io::Result<usize> {
        self.replicas_of(master)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("process {master} has no replica"),
                )
            })
    }

    /// Waits until `process` is a master serving slots on every live node's map.
    async fn wait_master(&self, process: usize) -> io::Result<()> {
        if self.wait_master_within(process, CONVERGE_TIMEOUT).await? {
            return Ok(());
        }
        let (seen, live) = self.master_seen(process).await?;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "process {process} not a master on every node after {CONVERGE_TIMEOUT:?} ({seen}/{live})"
            ),
        ))
    }

    /// Whether `process` becomes a master serving slots on every live node's map within
    /// `limit`.
    async fn wait_master_within(&self, process: usize, limit: Duration) -> io::Result<bool> {
        let end = Instant::now() + limit;
        loop {
            let (seen, live) = self.master_seen(process).await?;
            if live > 0 && seen == live {
                return Ok(true);
            }
            if Instant::now() >= end {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// How many live nodes' maps show `process` serving slots, of how many live nodes.
    async fn master_seen(&self, process: usize) -> io::Result<(usize, usize)> {
        let port = self.port(process)?;
        let mut live = 0;
        let mut seen = 0;
        for i in 0..self.len() {
            let Ok(addr) = self.addr(i) else { continue };
            let Ok(map) = self.slot_map(addr).await else {
                continue;
            };
            live += 1;
            if map.iter().any(|(_, _, p)| *p == port) {
                seen += 1;
            }
        }
        Ok((seen, live))
    }

    /// Starts moving `slot` to master `to` and stops half-way: the target is
    /// `IMPORTING` and the source `MIGRATING`, and no key has moved yet. Until
    /// [`finish_migration`](Self::finish_migration), a command for a key of the slot that
    /// the source no longer has is answered `-ASK` (go to the target, for this command
    /// only), and one that creates a key on the source while another key of the same
    /// command already moved fails with `-TRYAGAIN`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `to` already serves the slot; the servers' errors.
    pub(crate) async fn begin_migration(&self, slot: u16, to: usize) -> io::Result<()> {
        let from = self.owner(slot).await?;
        if from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("process {to} already serves slot {slot}"),
            ));
        }
        let s = slot.to_string();
        let (from_id, to_id) = (self.id(from).await?, self.id(to).await?);
        ok(command(
            self.addr(to)?,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id],
        )
        .await?)?;
        ok(command(
            self.addr(from)?,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id],
        )
        .await?)
    }

    /// Moves the rest of `slot`'s keys from its current owner to `to` (`MIGRATE`, in
    /// batches) and hands the slot over (`CLUSTER SETSLOT … NODE` on the target, the
    /// source, then every other master), and waits until every live node agrees.
    ///
    /// # Errors
    ///
    /// The servers' errors; `TimedOut` when the cluster does not agree within 20 s.
    pub(crate) async fn finish_migration(&self, slot: u16, to: usize) -> io::Result<()> {
        let from = self.owner(slot).await?;
        let s = slot.to_string();
        let to_port = self.port(to)?.to_string();
        // Bounded: each round moves up to 100 keys; a slot of a test holds far fewer.
        for _ in 0..10_000 {
            let Reply::Array(Some(keys)) =
                command(self.addr(from)?, &["CLUSTER", "GETKEYSINSLOT", &s, "100"]).await?
            else {
                return Err(io::Error::other("GETKEYSINSLOT did not answer an array"));
            };
            let keys: Vec<String> = keys.iter().filter_map(Reply::text).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let reply = command(self.addr(from)?, &args).await?;
            if !matches!(&reply, Reply::Simple(s) if s == "OK" || s == "NOKEY") {
                return Err(io::Error::other(format!("MIGRATE answered {reply:?}")));
            }
        }
        let to_id = self.id(to).await?;
        let mut order = vec![to, from];
        order.extend((0..self.len()).filter(|i| *i != to && *i != from));
        for i in order {
            let Ok(addr) = self.addr(i) else { continue };
            // A replica or a dead node refuses or does not answer; the masters matter.
            let _ = command(addr, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]).await;
        }
        let to_port: u16 = self.port(to)?;
        let end = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let mut agree = true;
            for i in 0..self.len() {
                let Ok(addr) = self.addr(i) else { continue };
                let Ok(map) = self.slot_map(addr).await else {
                    continue;
                };
                let serves = map
                    .iter()
                    .any(|(a, b, p)| (*a..=*b).contains(&slot) && *p == to_port);
                agree &= serves;
            }
            if agree {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "slot {slot} not on process {to} everywhere after {CONVERGE_TIMEOUT:?}"
                    ),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// What the live nodes reported in one poll.
#[derive(Debug, Default)]
struct State {
    live: usize,
    ok: usize,
    known: usize,
    maps_agree: bool,
    links_down: usize,
    links_up: bool,
}

/// `name:value` from an `INFO`-style text.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

async fn command(addr: SocketAddr, args: &[&str]) -> io::Result<Reply> {
    resp::command(addr, args, COMMAND_TIMEOUT).await
}

fn ok(reply: Reply) -> io::Result<()> {
    match reply {
        Reply::Simple(s) if s == "OK" => Ok(()),
        other => Err(io::Error::other(format!("expected OK, got {other:?}"))),
    }
}
