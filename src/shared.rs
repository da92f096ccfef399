//! What every clone of a [`Redlock`](crate::Redlock) and every lock share: the nodes, the
//! quorum, the configuration, the release notifier and the kept-lock registry
//! ([`Inner`]), and how they are set up.
//!
//! The bottom of the client layer. It may touch the configuration, the I/O layer (`node`,
//! `fanout`, `background`, `notifier`, `extender`), the plain modules (`addr`, `error`,
//! `resource`, `token`, `time`) and the protocol; never the modules that use it (`lock`,
//! `acquire`, `fencing`, `wait`, `client`, `watchdog`), so that each of those can depend on
//! it without depending on one another.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::Config;
use crate::error::Error;
use crate::extender::Registry;
use crate::groupmap::GroupMap;
use crate::metrics::ClientMetrics;
use crate::node::{CLUSTER_NODE, Node, NodeAddr, NodeSpec};
use crate::notifier::Notifier;
use crate::protocol::tally;
use crate::resource::{Keyspace, Layout, Resources};

/// How long each start-up check query may take at the least (they run in the background).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// What every clone of a `Redlock` and every `Lock` shares.
pub(crate) struct Inner {
    pub(crate) nodes: Arc<[Node]>,
    pub(crate) addrs: Vec<NodeAddr>,
    pub(crate) quorum: usize,
    pub(crate) config: Config,
    pub(crate) notifier: Option<Notifier>,
    /// The watchdog's registry of kept locks and its task, started on first use.
    pub(crate) watchdog: OnceLock<Registry>,
    /// The metric handles of this client's acquire, extend and release rounds.
    pub(crate) metrics: ClientMetrics,
    /// The client's group map and its record, shared by all its lock groups: every
    /// acquisition checks it for a mismatch and has it cover the lock's TTL.
    pub(crate) map: Arc<GroupMap>,
    /// How the group's keys are spelled: under the configured namespace, hash-tagged when
    /// its voters are Redis Clusters.
    pub(crate) keys: Keyspace,
}

/// The key layout of a group: plain for masters, hash-tagged for Redis Cluster voters.
/// A group mixing both is refused: every voter of a group holds the same keys.
pub(crate) fn layout_of(specs: &[NodeSpec]) -> Result<Layout, Error> {
    let clusters = specs.iter().filter(|s| s.is_cluster()).count();
    match clusters {
        0 => Ok(Layout::Plain),
        c if c == specs.len() => Ok(Layout::Slotted),
        c => Err(Error::config(
            "nodes",
            format!(
                "{c} of the group's {} voters are Redis Clusters (redis+cluster://) and the \
                 others single masters; a group's voters must all be of one kind, since they \
                 hold the same keys",
                specs.len()
            ),
        )),
    }
}

/// The first two voters whose identities ([`Node::identity`]) share an id: one store
/// given twice.
fn same_store(ids: &[Vec<String>]) -> Option<(usize, usize)> {
    for (i, a) in ids.iter().enumerate() {
        for (j, b) in ids.iter().enumerate().skip(i + 1) {
            if a.iter().any(|x| b.contains(x)) {
                return Some((i, j));
            }
        }
    }
    None
}

impl Inner {
    /// `res` with this group's keyspace (checked again: a Redis Cluster group needs a
    /// multi-resource lock's names in one hash slot).
    pub(crate) fn resources(&self, res: &Resources) -> Result<Resources, Error> {
        if res.keyspace() == &self.keys {
            return Ok(res.clone());
        }
        Resources::in_space(res.names(), &self.keys)
    }

    /// Creates every node's connection, opens them concurrently (waiting at most the
    /// connect timeout), and checks each reachable node against the deployment contract in
    /// the background. Fails only on an unusable node spec; unreachable nodes are retried on
    /// every request.
    pub(crate) async fn connect(
        specs: &[NodeSpec],
        config: Config,
        map: Arc<GroupMap>,
    ) -> Result<Inner, Error> {
        let keys = Keyspace::new(config.namespace.clone(), layout_of(specs)?);
        let nodes = specs
            .iter()
            .map(|s| Node::new(s, config.connect_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        let n = nodes.len();
        if n % 2 == 0 {
            tracing::warn!(
                nodes = n,
                "quorumlock: an even number of nodes tolerates no more failures than one node fewer; use 3, 5 or 7"
            );
        }
        // Opening every connection (at most the connect timeout in all) also reads what
        // identifies each voter: one store given twice would count its one failure twice.
        let warmup = futures::future::join_all(
            nodes
                .iter()
                .map(|node| node.identity(config.connect_timeout)),
        );
        let ids = tokio::time::timeout(config.connect_timeout, warmup)
            .await
            .unwrap_or_default();
        if let Some(i) = ids.iter().position(|v| v.iter().any(|x| x == CLUSTER_NODE)) {
            return Err(Error::config(
                "nodes",
                format!(
                    "voter #{} ({}) is a node of a Redis Cluster, given as one master; give \
                     the cluster as one voter, redis+cluster://host:port[,host:port…] (its \
                     keys are spread over its shards)",
                    i + 1,
                    nodes[i].addr
                ),
            ));
        }
        if let Some((i, j)) = same_store(&ids) {
            return Err(Error::config(
                "nodes",
                format!(
                    "voters #{} ({}) and #{} ({}) are one Redis server or one Redis Cluster \
                     under two addresses; every voter must be an independent store, or one \
                     failure counts twice",
                    i + 1,
                    nodes[i].addr,
                    j + 1,
                    nodes[j].addr
                ),
            ));
        }
        // The checks run in the background and only warn: give each query more patience
        // than a lock request gets, so that a busy machine does not hide a warning.
        let check_timeout = config.connect_timeout.max(CHECK_TIMEOUT);
        for node in &nodes {
            let node = node.clone();
            let fencing = config.fencing;
            crate::background::spawn(async move {
                crate::node::check_deployment(&node, check_timeout, fencing).await;
            });
        }
        let addrs = nodes.iter().map(|n| n.addr.clone()).collect();
        let notifier = config.notify.then(|| Notifier::new(specs, &keys));
        Ok(Inner {
            nodes: nodes.into(),
            addrs,
            quorum: tally::quorum(n),
            config,
            notifier,
            watchdog: OnceLock::new(),
            metrics: ClientMetrics::new(),
            map,
            keys,
        })
    }

    /// Before a lock for `ttl` is taken, handed over or extended: `Err` once the client saw
    /// another group map; otherwise the group-map record is made to outlive the lock,
    /// waiting for that write at most the lock's per-node timeout (see `groupmap`).
    pub(crate) async fn cover(&self, ttl: Duration) -> Result<(), Error> {
        self.map.cover(ttl, self.config.node_timeout_for(ttl)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_store_given_twice_is_found() {
        let ids = |v: &[&[&str]]| -> Vec<Vec<String>> {
            v.iter()
                .map(|s| s.iter().map(|x| x.to_string()).collect())
                .collect()
        };
        assert_eq!(same_store(&ids(&[&["a"], &["b"], &["c"]])), None);
        assert_eq!(
            same_store(&ids(&[&["a"], &[], &[]])),
            None,
            "unanswered voters"
        );
        assert_eq!(
            same_store(&ids(&[&["a", "x"], &["b"], &["y", "x"]])),
            Some((0, 2))
        );
    }

    #[test]
    fn a_group_is_all_masters_or_all_clusters() {
        let spec = |i, u: &str| NodeSpec::parse(i, u).unwrap();
        let masters = [
            spec(0, "redis://127.0.0.1:7001"),
            spec(1, "redis://127.0.0.1:7002"),
        ];
        assert_eq!(layout_of(&masters).unwrap(), Layout::Plain);
        let clusters = [
            spec(0, "redis+cluster://127.0.0.1:7001"),
            spec(1, "redis+cluster://127.0.0.1:7101"),
        ];
        assert_eq!(layout_of(&clusters).unwrap(), Layout::Slotted);
        let mixed = [
            spec(0, "redis://127.0.0.1:7001"),
            spec(1, "redis+cluster://127.0.0.1:7101"),
        ];
        let e = layout_of(&mixed).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        assert!(e.to_string().contains("1 of the group's 2 voters"), "{e}");
    }
}
