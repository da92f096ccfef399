//! Lock groups: a [`Redlock`](crate::Redlock) over G independent groups of masters, each
//! resource locked in exactly one of them, and the group-map record that keeps clients
//! with different groups from running side by side.
//!
//! ```text
//!   resource ──routing_key (hash tag)──▶ rendezvous hash over the groups' identities
//!            ──▶ group g ──▶ that group's Inner: its nodes, quorum, notifier, watchdog
//! ```
//!
//! Each group is a whole Redlock deployment of its own (an [`Inner`]): a lock on a resource
//! is decided by the majority of its group's nodes, exactly as with one group, so every
//! guarantee of the single-group lock holds per resource. What sharding adds is the
//! routing, and one new way to break mutual exclusion: two clients that route a resource
//! to two different groups. The *group map* (the groups' identities, in order, and a
//! version) is therefore recorded on every node by every client that shards
//! (`quorumlock:groupmap`, a lease of [`GROUP_MAP_LEASE`], refreshed a third of it apart
//! while the client or any of its locks lives); a client that finds another map refuses
//! to lock ([`Error::GroupMapMismatch`]) at `build` and from its next refresh on.
//!
//! A client with one group and no version is *unsharded*: it records nothing (so plain
//! deployments keep no extra key) and only reads the record, at `build` and then on the
//! same period, refusing when a sharded client's map is there.
//!
//! This module may touch the client's shared state (`shared`), the configuration, the
//! nodes and the protocol's routing rules; it never reaches into a lock or an acquisition.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures::future::join_all;
use redis::Value;

use crate::addr::NodeAddr;
use crate::config::Config;
use crate::error::{Error, GroupMapMismatch};
use crate::node::{Node, NodeSpec, Reply};
use crate::protocol::groups;
use crate::resource::Resources;
use crate::shared::Inner;

/// How long a sharding client's group-map record lives on a node after the client's last
/// refresh: 30 s. Clients refresh it every 10 s while they (or any lock they handed out)
/// live, so a client with another map can start about 30 s after the last client of the
/// old map stopped.
///
/// # Example
///
/// ```
/// assert_eq!(quorumlock::GROUP_MAP_LEASE, std::time::Duration::from_secs(30));
/// ```
pub const GROUP_MAP_LEASE: Duration = Duration::from_secs(30);

/// How often the record is refreshed (and read): a third of the lease.
const REFRESH: Duration = Duration::from_secs(10);

/// The key of the record on every node.
pub(crate) const RECORD_KEY: &str = "quorumlock:groupmap";

/// What an unsharded client calls its map in errors.
const UNSHARDED: &str = "unsharded";

const SCRIPT: &str = include_str!("scripts/groupmap.lua");

/// The groups of one client and its group map.
pub(crate) struct Groups {
    members: Vec<Arc<Inner>>,
    /// Each group's identity (its nodes' canonical addresses), in the configured order.
    ids: Vec<Vec<u8>>,
    /// Every group's nodes, one after another.
    addrs: Vec<NodeAddr>,
    map: Arc<MapState>,
}

/// The map this client routes with, and the first mismatch seen.
struct MapState {
    ours: String,
    /// Whether this client writes the record (it shards), or only reads it.
    records: bool,
    mismatch: OnceLock<GroupMapMismatch>,
}

impl Groups {
    /// Connects every group (concurrently), checks the group map on every reachable node,
    /// and starts the refresher. Fails on an unusable node spec or on a node that records
    /// another map.
    pub(crate) async fn connect(
        groups: Vec<Vec<NodeSpec>>,
        version: Option<u16>,
        config: Config,
    ) -> Result<Groups, Error> {
        let connect_timeout = config.connect_timeout;
        let members: Vec<Arc<Inner>> = join_all(
            groups
                .iter()
                .map(|specs| Inner::connect(specs, config.clone())),
        )
        .await
        .into_iter()
        .map(|r| r.map(Arc::new))
        .collect::<Result<_, _>>()?;
        let ids: Vec<Vec<u8>> = groups
            .iter()
            .map(|specs| groups::identity(specs.iter().map(|s| s.addr.to_string())))
            .collect();
        let map = Arc::new(MapState {
            ours: version.map_or_else(|| UNSHARDED.to_owned(), |v| groups::fingerprint(v, &ids)),
            records: version.is_some(),
            mismatch: OnceLock::new(),
        });
        let addrs = members.iter().flat_map(|m| m.addrs.clone()).collect();
        check(&members, &map, connect_timeout)
            .await
            .map_err(Error::GroupMapMismatch)?;
        let weak: Vec<Weak<Inner>> = members.iter().map(Arc::downgrade).collect();
        let state = map.clone();
        crate::background::spawn_daemon(refresh(weak, state, connect_timeout));
        Ok(Groups {
            members,
            ids,
            addrs,
            map,
        })
    }

    /// The group `res` is locked in, or why no lock may be taken: a map mismatch seen, or
    /// resources in different groups.
    pub(crate) fn route(&self, res: &Resources) -> Result<&Arc<Inner>, Error> {
        self.usable()?;
        let mut chosen: Option<(usize, &str)> = None;
        for name in res.names() {
            let g = self.group_of(name);
            match chosen {
                None => chosen = Some((g, name)),
                Some((h, first)) if h != g => {
                    return Err(Error::invalid(
                        "resources",
                        format!(
                            "{first:?} is in lock group #{} and {name:?} in lock group #{}; the resources of one lock must share a group: give them a common hash tag, as in order:{{42}}:stock and order:{{42}}:invoice",
                            h + 1,
                            g + 1
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let g = chosen.map_or(0, |(g, _)| g);
        self.members
            .get(g)
            .ok_or_else(|| Error::invalid("resources", "no lock group"))
    }

    /// `Err` once a node was seen recording another map.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        match self.map.mismatch.get() {
            Some(m) => Err(Error::GroupMapMismatch(m.clone())),
            None => Ok(()),
        }
    }

    /// The index of the group `name` is locked in.
    pub(crate) fn group_of(&self, name: &str) -> usize {
        if self.members.len() == 1 {
            return 0;
        }
        groups::route(&self.ids, groups::routing_key(name)).unwrap_or(0)
    }

    /// The groups, in the configured order.
    pub(crate) fn members(&self) -> &[Arc<Inner>] {
        &self.members
    }

    /// The first group (every client has one).
    pub(crate) fn first(&self) -> Option<&Arc<Inner>> {
        self.members.first()
    }

    /// Every group's nodes, one group after another.
    pub(crate) fn addrs(&self) -> &[NodeAddr] {
        &self.addrs
    }

    /// The group map this client routes with: `v<version>/<groups>/<hash>`, or
    /// `unsharded`.
    pub(crate) fn map(&self) -> &str {
        &self.map.ours
    }
}

/// Runs the record script on every node of every group at once; the first node that
/// records another map, if any. Nodes that fail or time out are skipped (they are read
/// again at the next refresh).
async fn check(
    members: &[Arc<Inner>],
    map: &MapState,
    timeout: Duration,
) -> Result<(), GroupMapMismatch> {
    let lease_ms = if map.records {
        GROUP_MAP_LEASE.as_millis().to_string()
    } else {
        "0".to_owned()
    };
    let nodes: Vec<&Node> = members.iter().flat_map(|m| m.nodes.iter()).collect();
    let answers = join_all(nodes.iter().map(|node| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT)
            .arg(1)
            .arg(RECORD_KEY)
            .arg(&map.ours)
            .arg(&lease_ms);
        async move { node.query(&cmd, timeout).await }
    }))
    .await;
    for (node, answer) in nodes.iter().zip(answers) {
        match recorded(answer) {
            Ok(None) => {}
            Ok(Some(other)) => {
                let m = GroupMapMismatch::new(node.addr.clone(), other, map.ours.clone());
                if map.mismatch.set(m.clone()).is_ok() {
                    tracing::error!(error = %m, "quorumlock: group map mismatch; this client takes no lock from now on");
                }
                return Err(m);
            }
            Err(why) => {
                tracing::debug!(node = %node.addr, %why, "quorumlock: group map not checked on this node")
            }
        }
    }
    Ok(())
}

/// Decodes the script's reply: `None` when the node records no other map, the other map
/// when it does, `Err` when the node did not answer usably.
fn recorded(answer: Reply) -> Result<Option<String>, String> {
    let value = match answer {
        Reply::Value(v) => v,
        Reply::Error(e) => return Err(Reply::error_text(&e)),
        Reply::TimedOut => return Err("timed out".to_owned()),
    };
    let Value::Array(parts) = value else {
        return Err(format!("unexpected reply {value:?}"));
    };
    match parts.as_slice() {
        [Value::Int(1), ..] => Ok(None),
        [Value::Int(0), Value::BulkString(other)] => {
            Ok(Some(String::from_utf8_lossy(other).into_owned()))
        }
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Refreshes (or, unsharded, reads) the record every [`REFRESH`] while any group of the
/// client lives, and stops at the first mismatch, which [`Groups::usable`] then reports.
/// Bounded by the client's life: it ends once every group's shared state is dropped.
async fn refresh(members: Vec<Weak<Inner>>, map: Arc<MapState>, timeout: Duration) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let alive: Vec<Arc<Inner>> = members.iter().filter_map(Weak::upgrade).collect();
        if alive.is_empty() {
            return;
        }
        if check(&alive, &map, timeout).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_the_record_reply() {
        assert_eq!(
            recorded(Reply::Value(Value::Array(vec![
                Value::Int(1),
                bulk("v1/2/ab")
            ]))),
            Ok(None)
        );
        assert_eq!(
            recorded(Reply::Value(Value::Array(vec![
                Value::Int(0),
                bulk("v2/3/cd")
            ]))),
            Ok(Some("v2/3/cd".to_owned()))
        );
        assert!(recorded(Reply::Value(Value::Array(vec![Value::Int(0)]))).is_err());
        assert!(recorded(Reply::Value(Value::Int(1))).is_err());
        assert!(recorded(Reply::TimedOut).is_err());
    }
}
