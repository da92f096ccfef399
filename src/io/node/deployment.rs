//! The start-up check of a node against the deployment contract (persistence, eviction,
//! a master not a replica), shard by shard on a Redis Cluster voter: warnings only.

use super::*;

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The start-up warnings given in this process, as `(node, shard, what)`: each is given
/// once per process, however many clients are built on the node.
static GIVEN: Mutex<BTreeSet<(String, String, &'static str)>> = Mutex::new(BTreeSet::new());

/// Whether the warning `what` about `node` (`shard`) is given for the first time in this
/// process (and records it).
fn first_time(node: &str, shard: &str, what: &'static str) -> bool {
    GIVEN
        .lock()
        .map(|mut given| given.insert((node.to_owned(), shard.to_owned(), what)))
        .unwrap_or(true)
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
        // One field names where: the voter, and the shard's master on a cluster voter.
        let at = if shard.is_empty() {
            node.to_string()
        } else {
            format!("{node} (shard {shard})")
        };
        let once = |what| first_time(&at, "", what);
        let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".to_owned());
        match self.maxmemory_policy.as_deref() {
            Some("noeviction") => {}
            Some(p) if once("eviction") => tracing::warn!(node = %at, maxmemory_policy = %p,
                "quorumlock: node evicts keys under memory pressure (maxmemory-policy is not noeviction): a held lock can silently disappear"),
            Some(_) => {}
            None => {
                tracing::debug!(node = %at, "quorumlock: could not read maxmemory-policy (CONFIG disabled?)")
            }
        }
        let (aof, fsync) = (&self.appendonly, &self.appendfsync);
        match (aof.as_deref(), fsync.as_deref()) {
            (Some("yes"), Some("always")) => {}
            (Some(_), Some(_)) if once("persistence") => {
                tracing::warn!(node = %at, appendonly = %shown(aof), appendfsync = %shown(fsync),
                "quorumlock: node does not persist every write (appendfsync always): after a crash, restart it only once the longest TTL has passed")
            }
            (Some(_), Some(_)) => {}
            _ => {
                tracing::debug!(node = %at, "quorumlock: could not read persistence settings")
            }
        }
        if fencing
            && aof.as_deref() != Some("yes")
            && self.save.as_deref().is_some_and(|s| !s.trim().is_empty())
            && once("fencing-rdb")
        {
            tracing::warn!(node = %at, save = %shown(&self.save),
                "quorumlock: fencing with RDB snapshots: a restart brings back stale fence counters; tokens stay ordered only if a crashed node is restarted after the longest TTL with its clock in sync (as for a node without persistence); use AOF with appendfsync always to restart at once");
        }
        let lines = || self.info.lines().map(str::trim);
        if shard.is_empty() && lines().any(|l| l == "role:slave") && once("replica") {
            tracing::warn!(node = %at,
                "quorumlock: node is a replica; Redlock needs independent masters (writes will fail with READONLY)");
        }
        let replicas = lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if !shard.is_empty()
            && replicas > 0
            && self.no_failover.as_deref() != Some("yes")
            && once("failover")
        {
            tracing::warn!(node = %at, replicas,
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
