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
//! to two different groups. The client's group map is therefore recorded on every node
//! and checked ([`groupmap`](crate::io::groupmap)); this module builds the map from the
//! groups and routes with it.
//!
//! A multi-resource mutex whose resources fall in several groups is split here
//! ([`Groups::split`]) and taken group by group (`spanning`); every other kind of lock
//! names one resource, in one group ([`Groups::route`]).
//!
//! This module may touch the client's shared state (`shared`), the configuration, the
//! nodes, the group-map record and the protocol's routing rules; it never reaches into a
//! lock or an acquisition.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::join_all;

use crate::base::addr::NodeAddr;
use crate::base::error::Error;
use crate::base::resource::{Keyspace, Layout, Resources};
use crate::client::config::Config;
use crate::client::shared::Inner;
use crate::io::groupmap::{self, GroupMap};
use crate::io::node::NodeSpec;
use crate::protocol::groups;

/// The groups of one client and its group map.
pub(crate) struct Groups {
    members: Vec<Arc<Inner>>,
    /// Each group's identity (its nodes' canonical addresses), in the configured order.
    ids: Vec<Vec<u8>>,
    /// Every group's nodes, one after another.
    addrs: Vec<NodeAddr>,
    map: Arc<GroupMap>,
}

impl Groups {
    /// Connects every group (concurrently), checks the group map on every reachable node
    /// (reading first, so that a refused client writes nothing), records it, and starts
    /// the refresher. Fails on an unusable node spec, or on a node that records another
    /// map (or a record it cannot read).
    pub(crate) async fn connect(
        groups: Vec<Vec<NodeSpec>>,
        version: Option<u16>,
        config: Config,
    ) -> Result<Groups, Error> {
        let ids: Vec<Vec<u8>> = groups
            .iter()
            .map(|specs| groups::identity(specs.iter().map(|s| s.addr.place())))
            .collect();
        let ours = version.map_or_else(
            || groupmap::UNSHARDED.to_owned(),
            |v| groups::fingerprint(v, &ids),
        );
        let key = Keyspace::new(config.namespace.clone(), Layout::Plain).record_key();
        let map = Arc::new(GroupMap::new(
            ours,
            key,
            config.connect_timeout,
            config.max_ttl,
            config.drift_factor,
        ));
        let members: Vec<Arc<Inner>> = join_all(
            groups
                .iter()
                .map(|specs| Inner::connect(specs, config.clone(), map.clone())),
        )
        .await
        .into_iter()
        .map(|r| r.map(Arc::new))
        .collect::<Result<_, _>>()?;
        map.set_groups(members.iter().map(|m| m.nodes.to_vec()).collect());
        map.read().await.map_err(Error::GroupMapMismatch)?;
        map.write().await.map_err(Error::GroupMapMismatch)?;
        crate::io::background::spawn_daemon(groupmap::refresh(Arc::downgrade(&map)));
        let addrs = members.iter().flat_map(|m| m.addrs.clone()).collect();
        Ok(Groups {
            members,
            ids,
            addrs,
            map,
        })
    }

    /// The group `res` is locked in, or why no lock may be taken: a map mismatch seen, or
    /// resources in different groups (a lock that takes several resources, the mutex's,
    /// is split with [`Groups::split`] instead; every other names one resource).
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

    /// The group the resource `name` is locked in (without checking the group map: see
    /// [`Groups::usable`]).
    pub(crate) fn member_of(&self, name: &str) -> Result<&Arc<Inner>, Error> {
        self.members
            .get(self.group_of(name))
            .ok_or_else(|| Error::invalid("resources", "no lock group"))
    }

    /// The mutex's resources split by lock group, in the groups' configured order (the
    /// same order for every client with the same group map, which the map's fingerprint
    /// includes): one part when they share a group. `Err` after a map mismatch.
    pub(crate) fn split(&self, res: &Resources) -> Result<Vec<(Arc<Inner>, Resources)>, Error> {
        self.usable()?;
        let mut by_group: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for name in res.names() {
            by_group.entry(self.group_of(name)).or_default().push(name);
        }
        if by_group.len() <= 1 {
            let g = by_group.keys().next().copied().unwrap_or(0);
            let inner = self
                .members
                .get(g)
                .ok_or_else(|| Error::invalid("resources", "no lock group"))?;
            return Ok(vec![(inner.clone(), res.clone())]);
        }
        by_group
            .into_iter()
            .map(|(g, names)| {
                let inner = self
                    .members
                    .get(g)
                    .ok_or_else(|| Error::invalid("resources", "no lock group"))?;
                Ok((inner.clone(), Resources::new(&names)?))
            })
            .collect()
    }

    /// `Err` once a node was seen recording another map.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        self.map.usable()
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
        self.map.ours()
    }
}
