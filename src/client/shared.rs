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

use crate::base::error::Error;
use crate::base::metrics::ClientMetrics;
use crate::base::resource::{Keyspace, Layout, Resources};
use crate::client::config::Config;
use crate::io::extender::Registry;
use crate::io::groupmap::GroupMap;
use crate::io::node::{Node, NodeAddr, NodeSpec, identity};
use crate::io::notifier::Notifier;
use crate::protocol::tally;

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
        let registry = identity::Registry::new(specs.iter().map(|s| s.addr.to_string()).collect());
        let nodes = specs
            .iter()
            .enumerate()
            .map(|(i, s)| Ok(Node::new(s, config.connect_timeout)?.with_admission(&registry, i)))
            .collect::<Result<Vec<_>, Error>>()?;
        registry.set_readers(nodes.iter().map(Node::reader).collect());
        let n = nodes.len();
        if n % 2 == 0 {
            tracing::warn!(
                nodes = n,
                "quorumlock: an even number of nodes tolerates no more failures than one node fewer; use 3, 5 or 7"
            );
        }
        // Opening every connection also reads what identifies each voter, each within the
        // connect timeout: one store given twice would count its one failure twice. A
        // voter that does not answer now is not admitted until a later request reads it
        // (see `node::identity`); one that answers wrongly refuses the build.
        let reads = futures::future::join_all(
            nodes
                .iter()
                .map(|node| node.read_identity(config.connect_timeout)),
        )
        .await;
        for (node, read) in nodes.iter().zip(reads) {
            if let (true, identity::Read::Denied(why)) = (config.strict, &read) {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "{} refused this client's credentials at start ({why}); a strict \
                         build needs every node to accept them",
                        node.addr
                    ),
                ));
            }
            let no_answer = matches!(
                read,
                identity::Read::NoAnswer(_) | identity::Read::Denied(_)
            );
            if let Err(why) = node.settle_identity(read) {
                if no_answer {
                    tracing::warn!(node = %node.addr, %why, "quorumlock: voter's identity not read at start-up; its votes count once a later request reads it");
                    continue;
                }
                return Err(Error::config("nodes", why));
            }
        }
        // The checks run in the background and only warn: give each query more patience
        // than a lock request gets, so that a busy machine does not hide a warning.
        let check_timeout = config.connect_timeout.max(CHECK_TIMEOUT);
        for node in &nodes {
            let node = node.clone();
            let fencing = config.fencing;
            crate::io::background::spawn(async move {
                crate::io::node::check_deployment(&node, check_timeout, fencing).await;
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

    /// Before a held lock is extended (by a call or the watchdog), for `ttl`: `Ok` when the group-map
    /// record covers it (writing it now if needed, as [`cover`](Inner::cover)); a lock
    /// never outlives the record's coverage, even after a mismatch (see `groupmap`).
    pub(crate) async fn cover_held(&self, ttl: Duration) -> Result<(), Error> {
        self.map
            .cover_held(ttl, self.config.node_timeout_for(ttl))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
