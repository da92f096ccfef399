//! The Docker Compose backend of the fault kit: [`ComposeCluster`] drives the five Redis
//! masters of `compose/docker-compose.yml` (and, with [`ComposeOptions::failover`], the
//! `redis-primary`/`redis-replica` pair) through the `docker compose` / `docker-compose` and
//! `docker` command-line tools, and implements [`Faults`] so the same fault scenarios run on
//! this backend and on the local-process one.
//!
//! Clients only ever talk to the ports published on `127.0.0.1`. With
//! [`ComposeOptions::clusters`], three Redis Clusters of three masters each run too (profile
//! `clusters`): their nodes use the host's network, bound to `127.0.0.1` only, because a
//! cluster node tells clients and the other nodes one address to reach it by, which a
//! published port cannot be for both. [`ComposeCluster::up`] joins them and assigns the
//! slots; [`ComposeCluster::cluster_seeds`] gives a cluster client its seeds, and
//! [`ComposeService::ClusterNode`] addresses one node for the container faults.
//!
//! How each fault maps onto Docker (measured on Docker Engine 20.10 with the userland proxy):
//!
//! | fault | Docker | what a client on `127.0.0.1` sees |
//! | --- | --- | --- |
//! | [`kill`](Faults::kill) | `docker kill -s KILL` | connections closed, new ones refused |
//! | [`start`](Faults::start) | `docker start`, then wait for `PING` | answers again (AOF data kept) |
//! | [`pause`](Faults::pause) | `docker pause` (cgroup freezer) | TCP connects, requests time out |
//! | [`resume`](Faults::resume) | `docker unpause` | queued requests are answered |
//! | [`disconnect`](Faults::disconnect) | `iptables` DROP on port 6379 inside the container's network namespace (via `nsenter`) | blackhole: TCP connects (Docker's port proxy), nothing passes either way, open connections hang |
//! | [`reconnect`](Faults::reconnect) | the DROP rules deleted | answers again |
//! | [`ComposeCluster::unplug_service`] | `docker network disconnect` | Docker unbinds the published port: open connections get EOF, new ones are refused |
//! | [`ComposeCluster::plug_service`] | `docker network connect --alias SERVICE` | the port is bound again and answers |
//!
//! [`kill`](Faults::kill) and the healing operations are idempotent, as [`Faults`] asks.
//! Every command and every wait is bounded in time; the cluster is torn down with
//! `down -v --remove-orphans` by [`ComposeCluster::down`] or, best-effort, on drop.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

use super::Faults;
use super::redis_cluster::Topology;

/// The image used when neither [`ComposeOptions::image`] nor `QUORUMLOCK_REDIS_IMAGE` is set
/// and the official image is present or can be pulled.
pub const OFFICIAL_IMAGE: &str = "redis:7.2";

/// The image `compose/build-image.sh` builds from the machine's own `redis-server` when the
/// official image cannot be pulled.
pub const LOCAL_IMAGE: &str = "quorumlock/redis:local";

/// Bound on one `docker` / `docker compose` command (except the image build).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on selecting or building the image (may run `apt-get install redis-server`).
const IMAGE_TIMEOUT: Duration = Duration::from_secs(900);
/// Bound on the teardown.
const DOWN_TIMEOUT: Duration = Duration::from_secs(90);

/// Settings for [`ComposeCluster::up`].
#[derive(Clone, Debug)]
pub struct ComposeOptions {
    /// Compose project name: every container, network and volume carries it
    /// (label `com.docker.compose.project`). Lower-case letters, digits, `_` and `-`.
    pub project: String,
    /// Host ports are `port_base + 1 ..= port_base + 5` for `redis1..redis5`,
    /// `port_base + 11` for `redis-primary` and `port_base + 12` for `redis-replica`,
    /// all on `127.0.0.1`.
    pub port_base: u16,
    /// Also start the `failover` profile (`redis-primary` with `redis-replica`).
    pub failover: bool,
    /// Also start the `clusters` profile: three Redis Clusters of three masters each
    /// (cluster `k`'s node `m`, both from 0, on port `port_base + 10·(k + 2) + m + 1`
    /// and its cluster bus 50 above), joined and every slot assigned by
    /// [`ComposeCluster::up`]. They use the host's network, bound to `127.0.0.1`.
    pub clusters: bool,
    /// The directory holding `docker-compose.yml`, `harness.sh` and `build-image.sh`.
    pub compose_dir: PathBuf,
    /// The Redis image. `None`: `QUORUMLOCK_REDIS_IMAGE`, else `compose/harness.sh image`
    /// picks [`OFFICIAL_IMAGE`] when present or pullable and otherwise builds [`LOCAL_IMAGE`].
    pub image: Option<String>,
    /// Bound on waiting for a node to answer `PING` (after `up`, `start`, `reconnect`).
    pub ready_timeout: Duration,
}

impl Default for ComposeOptions {
    /// Project `quorumlock` (or `QUORUMLOCK_COMPOSE_PROJECT`), ports 7001–7005/7011/7012 (or
    /// from `QUORUMLOCK_COMPOSE_PORT_BASE`), no failover profile, the crate's `compose/`.
    fn default() -> Self {
        let project = std::env::var("QUORUMLOCK_COMPOSE_PROJECT")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "quorumlock".to_owned());
        let port_base = std::env::var("QUORUMLOCK_COMPOSE_PORT_BASE")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(7000);
        ComposeOptions {
            project,
            port_base,
            failover: false,
            clusters: false,
            compose_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("compose"),
            image: None,
            ready_timeout: Duration::from_secs(60),
        }
    }
}

impl ComposeOptions {
    /// Options for an isolated run: a unique project name starting with `prefix` and a port
    /// base whose seven ports are currently free on `127.0.0.1`, so that concurrent runs and a
    /// developer's own `quorumlock` project do not clash.
    pub fn isolated(prefix: &str) -> io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let project = sanitize_project(&format!("{prefix}-{}-{nanos:x}", std::process::id()));
        let port_base = free_port_base(std::process::id() ^ nanos)?;
        Ok(ComposeOptions {
            project,
            port_base,
            ..ComposeOptions::default()
        })
    }

    /// Turns the `failover` profile on or off.
    pub fn failover(mut self, on: bool) -> Self {
        self.failover = on;
        self
    }

    /// Turns the `clusters` profile on or off.
    pub fn clusters(mut self, on: bool) -> Self {
        self.clusters = on;
        self
    }

    /// The `--profile` arguments of the profiles turned on.
    fn profiles(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (on, name) in [(self.failover, "failover"), (self.clusters, "clusters")] {
            if on {
                args.extend(["--profile".to_owned(), name.to_owned()]);
            }
        }
        args
    }

    fn port(&self, offset: u16) -> u16 {
        self.port_base + offset
    }

    /// The environment the compose file reads.
    fn env(&self, image: &str) -> Vec<(String, String)> {
        let mut env = vec![("QUORUMLOCK_REDIS_IMAGE".to_owned(), image.to_owned())];
        for i in 1..=5u16 {
            env.push((
                format!("QUORUMLOCK_REDIS{i}_PORT"),
                self.port(i).to_string(),
            ));
        }
        env.push((
            "QUORUMLOCK_PRIMARY_PORT".to_owned(),
            self.port(11).to_string(),
        ));
        env.push((
            "QUORUMLOCK_REPLICA_PORT".to_owned(),
            self.port(12).to_string(),
        ));
        for (k, m) in cluster_nodes() {
            let offset = cluster_offset(k, m);
            let name = format!("QUORUMLOCK_CLUSTER{}{}", k + 1, m + 1);
            env.push((format!("{name}_PORT"), self.port(offset).to_string()));
            env.push((format!("{name}_BUS"), self.port(offset + 50).to_string()));
        }
        env.push((
            "QUORUMLOCK_COMPOSE_PROJECT".to_owned(),
            self.project.clone(),
        ));
        env.push((
            "QUORUMLOCK_COMPOSE_PORT_BASE".to_owned(),
            self.port_base.to_string(),
        ));
        env
    }
}

/// One container of a [`ComposeCluster`], for the fault operations that are not part of
/// [`Faults`] (those address only the five Redlock nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComposeService {
    /// `redis1..redis5`, numbered from 0 as in [`Faults`].
    Node(usize),
    /// `redis-primary` (profile `failover`).
    Primary,
    /// `redis-replica` (profile `failover`).
    Replica,
    /// Node `node` (0..3, its masters) of Redis Cluster `cluster` (0..3), service
    /// `cluster<cluster+1>-<node+1>` (profile `clusters`).
    ClusterNode {
        /// The cluster, from 0.
        cluster: usize,
        /// The node in the cluster, from 0.
        node: usize,
    },
}

/// The Redis Clusters of profile `clusters` and their masters each.
const CLUSTERS: usize = 3;
const CLUSTER_MASTERS: usize = 3;

/// Every `(cluster, node)` of profile `clusters`.
fn cluster_nodes() -> impl Iterator<Item = (usize, usize)> {
    (0..CLUSTERS).flat_map(|k| (0..CLUSTER_MASTERS).map(move |m| (k, m)))
}

/// The port offset of cluster `k`'s node `m` (its bus is 50 above).
fn cluster_offset(k: usize, m: usize) -> u16 {
    u16::try_from(10 * (k + 2) + m + 1).unwrap_or(99)
}

#[derive(Clone, Debug)]
struct Container {
    service: String,
    id: String,
    port: u16,
    network: String,
}

/// A Docker Compose project of five independent Redis masters (plus, optionally, a
/// master/replica pair) driven through the `docker` CLI. See the [module docs](self).
#[derive(Debug)]
pub struct ComposeCluster {
    options: ComposeOptions,
    compose: Vec<String>,
    image: String,
    nodes: Vec<Container>,
    primary: Option<Container>,
    replica: Option<Container>,
    /// The Redis Clusters of profile `clusters`: each one's containers and topology.
    clusters: Vec<(Vec<Container>, Topology)>,
    /// Container ids under [`ComposeCluster::disconnect_service`].
    blackholed: Mutex<Vec<String>>,
    torn_down: AtomicBool,
}

impl ComposeCluster {
    /// Removes the containers, networks and volumes of projects left behind by earlier runs
    /// that were killed before they could tear down: projects named by
    /// [`ComposeOptions::isolated`] with this `prefix` whose process no longer exists.
    /// Returns the project names removed. Best-effort and bounded in time.
    pub async fn remove_stale(prefix: &str) -> io::Result<Vec<String>> {
        let prefix = format!("{}-", sanitize_project(prefix));
        let mut projects = Vec::new();
        for kind in [
            &["ps", "-a"][..],
            &["network", "ls"][..],
            &["volume", "ls"][..],
        ] {
            let mut args = kind.to_vec();
            args.extend(["--filter", "label=com.docker.compose.project"]);
            args.extend(["--format", "{{.Label \"com.docker.compose.project\"}}"]);
            let out = run("docker", &args, &[], COMMAND_TIMEOUT).await?;
            for name in out.split_whitespace() {
                let Some(pid) = name.strip_prefix(&prefix).and_then(|r| r.split('-').next()) else {
                    continue;
                };
                let alive = pid
                    .parse::<u32>()
                    .map(|pid| {
                        pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
                    })
                    .unwrap_or(true);
                if !alive && !projects.iter().any(|p| p == name) {
                    projects.push(name.to_owned());
                }
            }
        }
        for project in &projects {
            remove_by_label(project).await?;
        }
        Ok(projects)
    }

    /// Whether a Docker engine answers `docker info` within a few seconds. (A compose tool is
    /// looked for by [`up`](Self::up), which fails with a clear error when there is none.)
    pub fn engine_available() -> bool {
        let child = std::process::Command::new("docker")
            .arg("info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match child {
            Ok(child) => wait_std(child, Duration::from_secs(8)).is_some_and(|s| s.success()),
            Err(_) => false,
        }
    }

    /// Selects (or builds) the image, runs `compose up -d`, finds the containers and waits
    /// until every node answers `PING` on its published `127.0.0.1` port. On failure the
    /// project is torn down again.
    pub async fn up(options: ComposeOptions) -> io::Result<Self> {
        let compose = compose_command().await?;
        let image = match options.image.clone().or_else(|| {
            std::env::var("QUORUMLOCK_REDIS_IMAGE")
                .ok()
                .filter(|s| !s.is_empty())
        }) {
            Some(image) => image,
            None => select_image(&options).await?,
        };
        let mut cluster = ComposeCluster {
            options,
            compose,
            image,
            nodes: Vec::new(),
            primary: None,
            replica: None,
            clusters: Vec::new(),
            blackholed: Mutex::new(Vec::new()),
            torn_down: AtomicBool::new(false),
        };
        // On any error below, `cluster` is dropped and Drop tears the project down.
        let mut args = cluster.compose_args();
        args.extend(cluster.options.profiles());
        args.extend(["up".to_owned(), "-d".to_owned()]);
        cluster.run_compose(&args, COMMAND_TIMEOUT).await?;

        for i in 0..5 {
            let c = cluster
                .find_container(&format!("redis{}", i + 1), 1 + i as u16)
                .await?;
            cluster.nodes.push(c);
        }
        if cluster.options.failover {
            cluster.primary = Some(cluster.find_container("redis-primary", 11).await?);
            cluster.replica = Some(cluster.find_container("redis-replica", 12).await?);
        }
        let deadline = Instant::now() + cluster.options.ready_timeout;
        let all: Vec<Container> = cluster
            .nodes
            .iter()
            .chain(cluster.primary.iter())
            .chain(cluster.replica.iter())
            .cloned()
            .collect();
        for c in &all {
            wait_ping(c, deadline).await?;
        }
        if let Some(replica) = &cluster.replica {
            wait_replica_link(replica, deadline).await?;
        }
        if cluster.options.clusters {
            for k in 0..CLUSTERS {
                let mut nodes = Vec::new();
                for m in 0..CLUSTER_MASTERS {
                    let service = format!("cluster{}-{}", k + 1, m + 1);
                    let c = cluster
                        .find_container(&service, cluster_offset(k, m))
                        .await?;
                    wait_ping(&c, deadline).await?;
                    nodes.push(c);
                }
                let ports = nodes.iter().map(|c| c.port).collect();
                let buses = (0..CLUSTER_MASTERS)
                    .map(|m| cluster.options.port(cluster_offset(k, m) + 50))
                    .collect();
                let topology = Topology::new(ports, Some(buses), CLUSTER_MASTERS, 0);
                topology.form().await?;
                cluster.clusters.push((nodes, topology));
            }
        }
        Ok(cluster)
    }

    /// The options this cluster was brought up with.
    pub fn options(&self) -> &ComposeOptions {
        &self.options
    }

    /// The compose project name.
    pub fn project(&self) -> &str {
        &self.options.project
    }

    /// The image the containers run.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// `redis://127.0.0.1:PORT` of `redis-primary` (profile `failover`).
    pub fn primary_url(&self) -> Option<String> {
        self.primary.as_ref().map(|c| url(c.port))
    }

    /// `redis://127.0.0.1:PORT` of `redis-replica` (profile `failover`).
    pub fn replica_url(&self) -> Option<String> {
        self.replica.as_ref().map(|c| url(c.port))
    }

    /// The seed URLs (`redis://127.0.0.1:PORT`, every node) of Redis Cluster `k` of
    /// profile `clusters`; `None` without that profile or for `k` out of range.
    pub fn cluster_seeds(&self, k: usize) -> Option<Vec<String>> {
        self.clusters
            .get(k)
            .map(|(nodes, _)| nodes.iter().map(|c| url(c.port)).collect())
    }

    /// The node (0..3) of Redis Cluster `k` that serves `slot` now (see
    /// [`redis_cluster::key_slot`](super::redis_cluster::key_slot)).
    ///
    /// # Errors
    ///
    /// `InvalidInput` without profile `clusters` or for `k` out of range; `NotFound` when
    /// no live node of the cluster knows a master for the slot.
    pub async fn cluster_owner(&self, k: usize, slot: u16) -> io::Result<usize> {
        let (_, topology) = self.clusters.get(k).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "no Redis Cluster {k} (profile clusters: {})",
                    self.options.clusters
                ),
            )
        })?;
        topology.owner(slot).await
    }

    /// The URL of any container of the cluster.
    pub fn url_of(&self, service: ComposeService) -> io::Result<String> {
        Ok(url(self.container(service)?.port))
    }

    /// The Docker container id of any container of the cluster.
    pub fn container_id(&self, service: ComposeService) -> io::Result<String> {
        Ok(self.container(service)?.id.clone())
    }

    /// Promotes `redis-replica` to a master (`REPLICAOF NO ONE`, run inside the container
    /// with `docker exec … redis-cli`): it stops replicating and accepts writes.
    pub async fn promote_replica(&self) -> io::Result<()> {
        let c = self.container(ComposeService::Replica)?;
        let out = run(
            "docker",
            &[
                "exec",
                &c.id,
                "redis-cli",
                "-p",
                "6379",
                "REPLICAOF",
                "NO",
                "ONE",
            ],
            &[],
            COMMAND_TIMEOUT,
        )
        .await?;
        if out.trim() != "OK" {
            return Err(io::Error::other(format!(
                "REPLICAOF NO ONE answered {:?}",
                out.trim()
            )));
        }
        Ok(())
    }

    /// `docker kill -s KILL` on any container of the cluster (paused or not). A no-op when it
    /// is not running.
    pub async fn kill_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.container(service)?;
        if !matches!(
            state(c).await?.0.as_str(),
            "running" | "paused" | "restarting"
        ) {
            return Ok(());
        }
        docker(&["kill", "-s", "KILL", &c.id]).await
    }

    /// Makes any container of the cluster answer again: `docker start` when it is stopped,
    /// `docker unpause` when it is paused, nothing when it runs; then waits (bounded by
    /// [`ComposeOptions::ready_timeout`]) until it answers `PING` on its published port. A
    /// container that was [`disconnect`](Self::disconnect_service)ed stays cut off: the
    /// blackhole is put back before the wait, which then pings from inside the container.
    pub async fn start_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.container(service)?;
        match state(c).await?.0.as_str() {
            "running" => {}
            "paused" => docker(&["unpause", &c.id]).await?,
            _ => docker(&["start", &c.id]).await?,
        }
        let deadline = Instant::now() + self.options.ready_timeout;
        if self.is_blackholed(c) {
            blackhole(c, true).await?;
            wait_inner_ping(c, deadline).await
        } else {
            wait_ping(c, deadline).await
        }
    }

    /// `docker pause` (cgroup freezer) on any container of the cluster: TCP connections are
    /// still accepted, nothing is answered. A no-op when it is already paused.
    pub async fn pause_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.container(service)?;
        if state(c).await?.0 == "paused" {
            return Ok(());
        }
        docker(&["pause", &c.id]).await
    }

    /// `docker unpause` on any container of the cluster. A no-op when it is not paused.
    pub async fn resume_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.container(service)?;
        if state(c).await?.0 != "paused" {
            return Ok(());
        }
        docker(&["unpause", &c.id]).await
    }

    /// Blackholes the container's Redis links: `iptables` DROP rules for TCP port 6379
    /// (served and outgoing, in and out, loopback excepted; so a replica's own replication
    /// link is cut too) inside **the container's own network namespace**
    /// (`nsenter -t PID -n iptables …`; the host's rules are never touched). A client on
    /// `127.0.0.1` still connects (to Docker's port proxy) but nothing passes in either
    /// direction, on new and on open connections; a replica of a blackholed primary loses
    /// its link too. Survives [`kill`](Self::kill_service)/[`start`](Self::start_service).
    /// Needs root, `nsenter` and `iptables` on the host, else `Unsupported`; `Unsupported`
    /// for a [`ComposeService::ClusterNode`] too (it runs on the host's network), as are
    /// the other link operations.
    pub async fn disconnect_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.linked_container(service)?;
        self.set_blackholed(c, true);
        if state(c).await?.1 == 0 {
            return Ok(()); // not running: applied when it starts
        }
        blackhole(c, true).await
    }

    /// Lifts the blackhole of [`disconnect`](Self::disconnect_service) and, when the
    /// container runs and is not paused, waits until it answers `PING` on its published port.
    /// A no-op when it is not disconnected.
    pub async fn reconnect_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.linked_container(service)?;
        self.set_blackholed(c, false);
        let (status, pid) = state(c).await?;
        if pid == 0 {
            return Ok(());
        }
        blackhole(c, false).await?;
        if status == "running" {
            wait_ping(c, Instant::now() + self.options.ready_timeout).await?;
        }
        Ok(())
    }

    /// Unplugs the container from the project network (`docker network disconnect`). Unlike
    /// the blackhole of [`disconnect`](Self::disconnect_service), Docker then **unbinds the
    /// published port**: open client connections get EOF at once and new ones are refused
    /// (a fast, visible failure). A replica loses its link to the primary. A no-op when
    /// already unplugged.
    pub async fn unplug_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.linked_container(service)?;
        if !networks(c).await?.iter().any(|n| n == &c.network) {
            return Ok(());
        }
        docker(&["network", "disconnect", &c.network, &c.id]).await
    }

    /// Plugs the container back (`docker network connect --alias SERVICE`, so replication by
    /// service name keeps working); Docker binds the published port again. Waits until it
    /// answers `PING` when it runs and is not blackholed. A no-op when plugged in.
    pub async fn plug_service(&self, service: ComposeService) -> io::Result<()> {
        let c = self.linked_container(service)?;
        if !networks(c).await?.iter().any(|n| n == &c.network) {
            docker(&[
                "network", "connect", "--alias", &c.service, &c.network, &c.id,
            ])
            .await?;
        }
        if state(c).await?.0 == "running" && !self.is_blackholed(c) {
            wait_ping(c, Instant::now() + self.options.ready_timeout).await?;
        }
        Ok(())
    }

    fn is_blackholed(&self, c: &Container) -> bool {
        self.blackholed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|id| id == &c.id)
    }

    fn set_blackholed(&self, c: &Container, on: bool) {
        let mut set = self.blackholed.lock().unwrap_or_else(|e| e.into_inner());
        set.retain(|id| id != &c.id);
        if on {
            set.push(c.id.clone());
        }
    }

    /// Tears the project down: unpauses what is paused, then `compose down -v
    /// --remove-orphans`, then force-removes whatever still carries the project label
    /// (containers, networks, volumes). Bounded in time.
    pub async fn down(self) -> io::Result<()> {
        self.torn_down.store(true, Ordering::SeqCst);
        let project = self.options.project.clone();
        for c in self.all_containers() {
            let _ = run("docker", &["unpause", &c.id], &[], Duration::from_secs(20)).await;
        }
        let mut args = self.compose_args();
        args.extend(down_args());
        let first = self.run_compose(&args, DOWN_TIMEOUT).await;
        // Whatever compose left behind (e.g. after a timeout) is removed by label.
        remove_by_label(&project).await?;
        first.map(|_| ())
    }

    fn all_containers(&self) -> Vec<&Container> {
        self.nodes
            .iter()
            .chain(self.primary.iter())
            .chain(self.replica.iter())
            .chain(self.clusters.iter().flat_map(|(nodes, _)| nodes.iter()))
            .collect()
    }

    /// A container whose network the link faults may change: not a Redis Cluster node,
    /// which runs on the host's network (a rule there would change the host's).
    fn linked_container(&self, service: ComposeService) -> io::Result<&Container> {
        if matches!(service, ComposeService::ClusterNode { .. }) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{service:?} runs on the host's network: its link cannot be cut or unplugged"
                ),
            ));
        }
        self.container(service)
    }

    fn container(&self, service: ComposeService) -> io::Result<&Container> {
        let found = match service {
            ComposeService::Node(i) => self.nodes.get(i),
            ComposeService::Primary => self.primary.as_ref(),
            ComposeService::Replica => self.replica.as_ref(),
            ComposeService::ClusterNode { cluster, node } => self
                .clusters
                .get(cluster)
                .and_then(|(nodes, _)| nodes.get(node)),
        };
        found.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{service:?} is not part of compose project {} (failover profile: {}, clusters profile: {})",
                    self.options.project, self.options.failover, self.options.clusters
                ),
            )
        })
    }

    /// `[compose…, -p, project, -f, file, --project-directory, dir]`
    fn compose_args(&self) -> Vec<String> {
        let dir = &self.options.compose_dir;
        let mut args: Vec<String> = self.compose[1..].to_vec();
        args.extend([
            "-p".to_owned(),
            self.options.project.clone(),
            "-f".to_owned(),
            dir.join("docker-compose.yml")
                .to_string_lossy()
                .into_owned(),
            "--project-directory".to_owned(),
            dir.to_string_lossy().into_owned(),
        ]);
        args
    }

    async fn run_compose(&self, args: &[String], limit: Duration) -> io::Result<String> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env = self.options.env(&self.image);
        run(&self.compose[0], &args, &env, limit).await
    }

    async fn find_container(&self, service: &str, port_offset: u16) -> io::Result<Container> {
        let mut args = self.compose_args();
        args.extend(self.options.profiles());
        args.extend(["ps".to_owned(), "-q".to_owned(), service.to_owned()]);
        let out = self.run_compose(&args, COMMAND_TIMEOUT).await?;
        let id = out
            .split_whitespace()
            .next()
            .ok_or_else(|| io::Error::other(format!("compose has no container for {service}")))?
            .to_owned();
        let nets = run(
            "docker",
            &[
                "inspect",
                "-f",
                "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                &id,
            ],
            &[],
            COMMAND_TIMEOUT,
        )
        .await?;
        let network = nets
            .split_whitespace()
            .next()
            .ok_or_else(|| io::Error::other(format!("container {id} ({service}) has no network")))?
            .to_owned();
        Ok(Container {
            service: service.to_owned(),
            id,
            port: self.options.port(port_offset),
            network,
        })
    }
}

impl Faults for ComposeCluster {
    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|c| url(c.port)).collect()
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn kill(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.kill_service(ComposeService::Node(node))
    }

    fn start(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.start_service(ComposeService::Node(node))
    }

    async fn restart(&self, node: usize, delay: Duration) -> io::Result<()> {
        self.kill_service(ComposeService::Node(node)).await?;
        tokio::time::sleep(delay).await;
        self.start_service(ComposeService::Node(node)).await
    }

    fn pause(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.pause_service(ComposeService::Node(node))
    }

    fn resume(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.resume_service(ComposeService::Node(node))
    }

    fn disconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.disconnect_service(ComposeService::Node(node))
    }

    fn reconnect(&self, node: usize) -> impl Future<Output = io::Result<()>> + Send {
        self.reconnect_service(ComposeService::Node(node))
    }
}

impl Drop for ComposeCluster {
    /// Best-effort, bounded teardown when [`ComposeCluster::down`] was not called.
    fn drop(&mut self) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        for c in self.all_containers() {
            let _ = run_std("docker", &["unpause", &c.id], &[], Duration::from_secs(20));
        }
        let mut args = self.compose_args();
        args.extend(down_args());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env = self.options.env(&self.image);
        if run_std(&self.compose[0], &args, &env, DOWN_TIMEOUT).is_err() {
            let label = format!("label=com.docker.compose.project={}", self.options.project);
            if let Ok(ids) = run_std(
                "docker",
                &["ps", "-aq", "--filter", &label],
                &[],
                COMMAND_TIMEOUT,
            ) {
                for id in ids.split_whitespace() {
                    let _ = run_std("docker", &["rm", "-f", "-v", id], &[], COMMAND_TIMEOUT);
                }
            }
        }
    }
}

/// `(status, pid)` of a container: `running`, `paused`, `exited`, …; pid 0 when not running.
async fn state(c: &Container) -> io::Result<(String, u32)> {
    let out = run(
        "docker",
        &["inspect", "-f", "{{.State.Status}} {{.State.Pid}}", &c.id],
        &[],
        COMMAND_TIMEOUT,
    )
    .await?;
    let mut parts = out.split_whitespace();
    let status = parts.next().unwrap_or("unknown").to_owned();
    let pid = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Ok((status, pid))
}

/// Names of the networks a container is attached to.
async fn networks(c: &Container) -> io::Result<Vec<String>> {
    let out = run(
        "docker",
        &[
            "inspect",
            "-f",
            "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
            &c.id,
        ],
        &[],
        COMMAND_TIMEOUT,
    )
    .await?;
    Ok(out.split_whitespace().map(str::to_owned).collect())
}

/// The DROP rules of the blackhole, in the container's network namespace.
/// Served connections (to our port 6379) and outgoing ones (to another node's 6379: a
/// replica's replication link) are both cut.
const BLACKHOLE_RULES: [[&str; 11]; 4] = [
    [
        "INPUT", "!", "-i", "lo", "-p", "tcp", "-m", "tcp", "--dport", "6379", "-j",
    ],
    [
        "OUTPUT", "!", "-o", "lo", "-p", "tcp", "-m", "tcp", "--sport", "6379", "-j",
    ],
    [
        "OUTPUT", "!", "-o", "lo", "-p", "tcp", "-m", "tcp", "--dport", "6379", "-j",
    ],
    [
        "INPUT", "!", "-i", "lo", "-p", "tcp", "-m", "tcp", "--sport", "6379", "-j",
    ],
];

/// Inserts (`on`) or deletes the blackhole rules in the container's network namespace;
/// idempotent.
async fn blackhole(c: &Container, on: bool) -> io::Result<()> {
    let (_, pid) = state(c).await?;
    if pid == 0 {
        return Ok(());
    }
    let pid = pid.to_string();
    for rule in BLACKHOLE_RULES {
        let iptables = |op: &'static str| {
            let mut args = vec!["-t", pid.as_str(), "-n", "iptables", "-w", "5", op];
            args.extend(rule);
            args.push("DROP");
            args.iter().map(|a| a.to_string()).collect::<Vec<String>>()
        };
        let present = |args: Vec<String>| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("nsenter", &args, &[], COMMAND_TIMEOUT).await.is_ok()
        };
        // At most a few rounds: a rule may have been inserted twice by hand.
        for _ in 0..4 {
            let has = present(iptables("-C")).await;
            if has == on {
                break;
            }
            let args = iptables(if on { "-I" } else { "-D" });
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("nsenter", &args, &[], COMMAND_TIMEOUT)
                .await
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "blackholing {} needs root, nsenter and iptables on the host \
                         (use unplug_service for a port-unbinding cut instead): {e}",
                            c.service
                        ),
                    )
                })?;
        }
    }
    Ok(())
}

/// Force-removes every container, network and volume labelled with `project`.
async fn remove_by_label(project: &str) -> io::Result<()> {
    let label = format!("label=com.docker.compose.project={project}");
    let ids = run(
        "docker",
        &["ps", "-aq", "--filter", &label],
        &[],
        COMMAND_TIMEOUT,
    )
    .await?;
    for id in ids.split_whitespace() {
        docker(&["rm", "-f", "-v", id]).await?;
    }
    let nets = run(
        "docker",
        &["network", "ls", "-q", "--filter", &label],
        &[],
        COMMAND_TIMEOUT,
    )
    .await?;
    for id in nets.split_whitespace() {
        remove_network(id).await?;
    }
    let vols = run(
        "docker",
        &["volume", "ls", "-q", "--filter", &label],
        &[],
        COMMAND_TIMEOUT,
    )
    .await?;
    for id in vols.split_whitespace() {
        docker(&["volume", "rm", "-f", id]).await?;
    }
    Ok(())
}

fn down_args() -> Vec<String> {
    [
        "--profile",
        "failover",
        "--profile",
        "promote",
        "--profile",
        "clusters",
        "down",
        "-v",
        "--remove-orphans",
        "-t",
        "2",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// Compose project names: lower-case letters, digits, `_` and `-`, starting with a letter or
/// digit (what both compose implementations accept unchanged).
fn sanitize_project(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s = s.trim_start_matches(['-', '_']).to_owned();
    if s.is_empty() {
        "quorumlock".to_owned()
    } else {
        s
    }
}

/// A port base in 20000..32700 whose ports +1..=+5, +11, +12 bind on 127.0.0.1 right now.
fn free_port_base(seed: u32) -> io::Result<u16> {
    // Bases 20000, 20100, …, 32600 (each with offsets below 100): below the kernel's
    // ephemeral ports (32768 and up), from which every other test's sockets and local
    // servers take theirs. A base picked from that range could be free when checked and
    // taken by another test before Docker binds it.
    let slots = 127u32;
    for k in 0..slots {
        let base = 20000 + ((seed.wrapping_add(k.wrapping_mul(7919))) % slots) * 100;
        let base = base as u16;
        let clusters = cluster_nodes().flat_map(|(k, m)| {
            let o = cluster_offset(k, m);
            [o, o + 50]
        });
        let free = [1u16, 2, 3, 4, 5, 11, 12]
            .into_iter()
            .chain(clusters)
            .all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok());
        if free {
            return Ok(base);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no free port base on 127.0.0.1 in 20000..32700",
    ))
}

/// `docker compose` when the v2 plugin works, else `docker-compose`; `QUORUMLOCK_COMPOSE_CMD`
/// overrides (split on whitespace).
async fn compose_command() -> io::Result<Vec<String>> {
    if let Ok(cmd) = std::env::var("QUORUMLOCK_COMPOSE_CMD") {
        let parts: Vec<String> = cmd.split_whitespace().map(str::to_owned).collect();
        if !parts.is_empty() {
            return Ok(parts);
        }
    }
    let limit = Duration::from_secs(20);
    if run("docker", &["compose", "version"], &[], limit)
        .await
        .is_ok()
    {
        return Ok(vec!["docker".to_owned(), "compose".to_owned()]);
    }
    if run("docker-compose", &["version"], &[], limit)
        .await
        .is_ok()
    {
        return Ok(vec!["docker-compose".to_owned()]);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "neither `docker compose` nor `docker-compose` works (install the Compose plugin)",
    ))
}

/// Runs `compose/harness.sh image`, which picks the official image or builds the local one,
/// and returns the last line it prints.
async fn select_image(options: &ComposeOptions) -> io::Result<String> {
    let script = options.compose_dir.join("harness.sh");
    let script = script.to_string_lossy().into_owned();
    let out = run("bash", &[&script, "image"], &options.env(""), IMAGE_TIMEOUT)
        .await
        .map_err(|e| {
            io::Error::new(e.kind(), format!("selecting/building the Redis image: {e}"))
        })?;
    out.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| io::Error::other("harness.sh image printed no image"))
}

/// Removes a network. The daemon detaches a removed container's endpoint asynchronously,
/// so on a busy machine `network rm` can still see "active endpoints" just after the
/// containers are gone: force-disconnect whatever is still attached and try again, at most
/// 20 times over about 10 s.
///
/// A network that lists no container at all and still reports active endpoints after that
/// is a known state of the Docker daemon (a stale endpoint record that only a daemon
/// restart clears). It holds no process of ours and does not stand in the way of another
/// project (each has its own network): it is reported on stderr and left, not an error.
async fn remove_network(id: &str) -> io::Result<()> {
    let mut last = Ok(());
    for _ in 0..20 {
        last = docker(&["network", "rm", id]).await;
        if last.is_ok() {
            return last;
        }
        let attached = run(
            "docker",
            &[
                "network",
                "inspect",
                "-f",
                "{{range $k, $v := .Containers}}{{$k}} {{end}}",
                id,
            ],
            &[],
            COMMAND_TIMEOUT,
        )
        .await
        .unwrap_or_default();
        for c in attached.split_whitespace() {
            let _ = docker(&["network", "disconnect", "-f", id, c]).await;
        }
        if attached.trim().is_empty()
            && last
                .as_ref()
                .err()
                .is_some_and(|e| e.to_string().contains("active endpoints"))
        {
            eprintln!(
                "quorumlock testkit: docker network {id} lists no container but the daemon \
                 reports active endpoints (a stale record only a daemon restart clears); left in place"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

async fn docker(args: &[&str]) -> io::Result<()> {
    run("docker", args, &[], COMMAND_TIMEOUT).await.map(|_| ())
}

fn describe(program: &str, args: &[&str]) -> String {
    let mut s = program.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Runs a command with a time bound (the child is killed on timeout) and returns its stdout;
/// a non-zero exit becomes an error carrying stderr. An empty value in `env` removes the
/// variable (so an unset image falls back to the script's own choice).
async fn run(
    program: &str,
    args: &[&str],
    env: &[(String, String)],
    limit: Duration,
) -> io::Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.kill_on_drop(true);
    for (k, v) in env {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", describe(program, args))))?;
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} timed out after {limit:?}", describe(program, args)),
            )
        })??;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "{} failed ({}): {}",
            describe(program, args),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Blocking variant of [`run`] for `Drop` (no async runtime needed); output is discarded
/// except stdout, which is read after exit (it is small for the commands used here).
fn run_std(
    program: &str,
    args: &[&str],
    env: &[(String, String)],
    limit: Duration,
) -> io::Result<String> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let mut child = cmd.spawn()?;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(out) = stdout.as_mut() {
            let _ = std::io::Read::read_to_string(out, &mut s);
        }
        s
    });
    match wait_std(child, limit) {
        Some(status) if status.success() => Ok(reader.join().unwrap_or_default()),
        Some(status) => Err(io::Error::other(format!(
            "{} failed ({status})",
            describe(program, args)
        ))),
        None => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{} timed out", describe(program, args)),
        )),
    }
}

/// Waits for a child at most `limit`; kills and reaps it on timeout (returns `None`).
fn wait_std(mut child: std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Sends one command (RESP array) to `127.0.0.1:port` and reads one reply, as text. Bounded by
/// `limit`. Only what the readiness checks need: simple strings, errors, bulk strings.
async fn command(port: u16, args: &[&str], limit: Duration) -> io::Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(reply) = parse_reply(&buf)? {
                return Ok(reply);
            }
        }
    };
    tokio::time::timeout(limit, exchange).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("127.0.0.1:{port}: no reply within {limit:?}"),
        )
    })?
}

/// `Some(text)` once `buf` holds a whole reply; errors (`-ERR …`) become `Err`.
fn parse_reply(buf: &[u8]) -> io::Result<Option<String>> {
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = String::from_utf8_lossy(&buf[1..eol]).into_owned();
    match buf.first() {
        Some(b'+') | Some(b':') => Ok(Some(line)),
        Some(b'-') => Err(io::Error::other(line)),
        Some(b'$') => {
            let len: i64 = line
                .parse()
                .map_err(|_| io::Error::other("bad bulk length"))?;
            if len < 0 {
                return Ok(Some(String::new()));
            }
            let start = eol + 2;
            let end = start + len as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            Ok(Some(String::from_utf8_lossy(&buf[start..end]).into_owned()))
        }
        _ => Err(io::Error::other("unexpected reply type")),
    }
}

/// Polls `PING` on the container's published port until `+PONG` or the deadline.
async fn wait_ping(c: &Container, deadline: Instant) -> io::Result<()> {
    loop {
        let last = match command(c.port, &["PING"], Duration::from_secs(2)).await {
            Ok(reply) if reply == "PONG" => return Ok(()),
            Ok(reply) => reply,
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} (127.0.0.1:{}) not answering PING: {last}",
                    c.service, c.port
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `redis-cli PING` inside the container (over its loopback, which the blackhole
/// spares) until `PONG` or the deadline.
async fn wait_inner_ping(c: &Container, deadline: Instant) -> io::Result<()> {
    loop {
        let r = run(
            "docker",
            &["exec", &c.id, "redis-cli", "-p", "6379", "PING"],
            &[],
            Duration::from_secs(5),
        )
        .await;
        if matches!(&r, Ok(out) if out.trim() == "PONG") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} not answering PING inside its container: {r:?}",
                    c.service
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `INFO replication` on the replica until `master_link_status:up`.
async fn wait_replica_link(c: &Container, deadline: Instant) -> io::Result<()> {
    loop {
        if let Ok(info) = command(c.port, &["INFO", "replication"], Duration::from_secs(2)).await
            && info.lines().any(|l| l.trim() == "master_link_status:up")
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: replication link not up", c.service),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_names_are_sanitized() {
        assert_eq!(sanitize_project("QL Compose.Test"), "ql-compose-test");
        assert_eq!(sanitize_project("--x"), "x");
        assert_eq!(sanitize_project("!!"), "quorumlock");
    }

    #[test]
    fn replies_parse() {
        assert_eq!(parse_reply(b"+PONG\r\n").unwrap().as_deref(), Some("PONG"));
        assert_eq!(
            parse_reply(b"$3\r\nabc\r\n").unwrap().as_deref(),
            Some("abc")
        );
        assert_eq!(parse_reply(b"$3\r\nab").unwrap(), None);
        assert_eq!(parse_reply(b"$-1\r\n").unwrap().as_deref(), Some(""));
        assert!(parse_reply(b"-LOADING x\r\n").is_err());
        assert_eq!(parse_reply(b"+PO").unwrap(), None);
    }
}
