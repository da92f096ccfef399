//! The group-map record: how clients with different lock groups notice one another before
//! two of them hold one resource in two groups.
//!
//! ```text
//!  build ── read on every node (writes nothing) ── another map? ──▶ refused, nothing written
//!        └─ write ours (SET PX lease if absent, else raise its PTTL to the lease)
//!  every REFRESH while the client or a lock of it lives: write again (stops at a mismatch)
//!  before an acquisition or extension of TTL t: if the record may lapse within t, write now
//! ```
//!
//! Every client records its *group map* (`v<version>/<groups>/<hash>`, or `unsharded` for
//! one group without a version) in the key `<namespace>:groupmap` (`quorumlock:groupmap` by default) on every node of every group, with a
//! lease of at least [`GROUP_MAP_LEASE`], and **at least the longest TTL the client was
//! asked for plus two refresh periods**: a record outlives every lock its client took, even
//! when that client is paused or dies, so a client with another map cannot start while such
//! a lock may be valid. A node that records another map, or whose record cannot be read (a
//! value of another type, an ACL that forbids the key), makes the client refuse: the check
//! fails closed. A node that does not answer is skipped (it is read again at the next
//! refresh); `build` never fails because a node is down.
//!
//! The first mismatch is kept for the client's life ([`GroupMap::usable`]); every
//! acquisition attempt checks it, so loops that were already waiting stop too. Locks held
//! before are not revoked: the record's lease is what keeps another map from starting
//! while they are valid.
//!
//! This module may touch the nodes and the error types; it knows nothing of routing (the
//! client's `groups`) nor of locks.

use std::sync::{Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::Value;

use crate::error::{Error, GroupMapMismatch};
use crate::node::{Node, Reply, group_map_request};

/// The shortest lease of a client's group-map record on a node: 30 s. Clients refresh it
/// every 10 s while they (or any lock they handed out) live, and lengthen it to their
/// longest lock TTL plus 20 s when they lock for longer, so a client with another map can
/// start only once every lock of the old map has expired.
///
/// # Example
///
/// ```
/// assert_eq!(quorumlock::GROUP_MAP_LEASE, std::time::Duration::from_secs(30));
/// ```
pub const GROUP_MAP_LEASE: Duration = Duration::from_secs(30);

/// How often the record is written again: a third of the shortest lease.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);

/// The longest lease ever asked for (a year: far beyond any TTL the builder accepts by
/// default, and a `PX` every Redis takes).
const LEASE_CAP: Duration = Duration::from_secs(365 * 86_400);

/// The map of a client with one group and no version.
pub(crate) const UNSHARDED: &str = "unsharded";

/// Server errors that say "not now" rather than "not readable": skipped like a timeout.
/// A replica (`READONLY`) or a node refusing writes for now (`OOM`, `MISCONF`,
/// `NOREPLICAS`) cannot take the record; the lock's own requests fail there too. On a Redis
/// Cluster voter, a redirection the cluster client could not follow (`MOVED`, `ASK`: the
/// record's slot is served by a master that is down, until the cluster fails it over)
/// says where the record is, not what it holds.
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

/// One client's group map and what it knows of the record.
pub(crate) struct GroupMap {
    ours: String,
    /// The record's key on every node (`<namespace>:groupmap`, `Keyspace::record_key`).
    key: Vec<u8>,
    /// Every group's nodes, set once they are connected.
    nodes: OnceLock<Vec<Node>>,
    /// How long one node may take to answer a read or a write.
    timeout: Duration,
    mismatch: OnceLock<GroupMapMismatch>,
    /// The longest TTL this client was asked for.
    longest: Mutex<Duration>,
    /// Until when the record lives at least, on the nodes that took the last write: that
    /// write's start plus its lease (`None` before any write was taken).
    covered: Mutex<Option<Instant>>,
    /// One covering write at a time (the others then find it covered, or share it).
    writing: tokio::sync::Mutex<()>,
    /// When the last write round started.
    last_write: Mutex<Option<Instant>>,
}

/// What one node said about the record.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Ours, or none (written, when writing).
    Agrees,
    /// Another map; or, for a record that cannot be read, why.
    Differs(String),
    /// No usable answer now (down, timed out, busy): read again later.
    Skipped(String),
}

impl GroupMap {
    /// A map named `ours`; its nodes come later ([`set_nodes`](GroupMap::set_nodes)).
    pub(crate) fn new(ours: String, key: Vec<u8>, timeout: Duration) -> GroupMap {
        GroupMap {
            ours,
            key,
            nodes: OnceLock::new(),
            timeout,
            mismatch: OnceLock::new(),
            longest: Mutex::new(Duration::ZERO),
            covered: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
            last_write: Mutex::new(None),
        }
    }

    /// The nodes of every group, once.
    pub(crate) fn set_nodes(&self, nodes: Vec<Node>) {
        let _ = self.nodes.set(nodes);
    }

    /// This client's map, as recorded.
    pub(crate) fn ours(&self) -> &str {
        &self.ours
    }

    /// `Err` once a node was seen recording another map (or an unreadable record).
    pub(crate) fn usable(&self) -> Result<(), Error> {
        match self.mismatch.get() {
            Some(m) => Err(Error::GroupMapMismatch(m.clone())),
            None => Ok(()),
        }
    }

    /// The lease a write asks for now: [`GROUP_MAP_LEASE`], or the longest TTL asked of
    /// the client plus two refresh periods when that is longer.
    fn lease(&self) -> Duration {
        let longest = self.longest.lock().map_or(LEASE_CAP, |l| *l);
        GROUP_MAP_LEASE
            .max(longest.saturating_add(REFRESH.saturating_mul(2)))
            .min(LEASE_CAP)
    }

    /// Reads the record on every node, writing nothing: `Err` on the first node that
    /// records another map.
    pub(crate) async fn read(&self) -> Result<(), GroupMapMismatch> {
        self.round(Duration::ZERO).await
    }

    /// Writes the record on every node that records no other map (with the current
    /// lease), and notes until when it is covered.
    pub(crate) async fn write(&self) -> Result<(), GroupMapMismatch> {
        self.round(self.lease()).await
    }

    /// Before taking or extending a lock for `ttl`: `Err` if a mismatch was seen;
    /// otherwise makes sure the record outlives the lock, writing it now (with a longer
    /// lease) if the last write may lapse first, waiting at most `patience` (the lock's
    /// per-node timeout) for that write. Callers share one write: a round that started
    /// after a caller asked answers for it. A write that does not finish in time, or
    /// reaches no node, leaves the lock to go ahead (best effort: the lock itself needs a
    /// quorum of those nodes, and the next refresh writes the longer lease).
    pub(crate) async fn cover(&self, ttl: Duration, patience: Duration) -> Result<(), Error> {
        self.usable()?;
        if let Ok(mut longest) = self.longest.lock() {
            *longest = (*longest).max(ttl);
        }
        if self.covers(ttl) {
            return Ok(());
        }
        let asked = Instant::now();
        let write = async {
            let _one = self.writing.lock().await;
            let fresh = self
                .last_write
                .lock()
                .ok()
                .and_then(|l| *l)
                .is_some_and(|started| started >= asked);
            if !fresh && !self.covers(ttl) {
                self.write().await.map_err(Error::GroupMapMismatch)?;
            }
            Ok::<(), Error>(())
        };
        if let Ok(Err(e)) = tokio::time::timeout(patience, write).await {
            return Err(e);
        }
        self.usable()
    }

    /// Whether the last write outlives a lock of `ttl` taken now.
    fn covers(&self, ttl: Duration) -> bool {
        let Ok(covered) = self.covered.lock() else {
            return false;
        };
        match (*covered, Instant::now().checked_add(ttl)) {
            (Some(until), Some(need)) => until >= need,
            _ => false,
        }
    }

    /// Runs the record script on every node at once with `lease` (zero: read only).
    async fn round(&self, lease: Duration) -> Result<(), GroupMapMismatch> {
        let Some(nodes) = self.nodes.get() else {
            return Ok(());
        };
        let start = Instant::now();
        if !lease.is_zero()
            && let Ok(mut last) = self.last_write.lock()
        {
            *last = Some(start);
        }
        let cmd = group_map_request(&self.key, &self.ours, lease);
        let answers = join_all(nodes.iter().map(|node| node.query(&cmd, self.timeout))).await;
        let mut agreed = 0usize;
        for (node, answer) in nodes.iter().zip(answers) {
            match answer_of(answer) {
                Answer::Agrees => agreed += 1,
                Answer::Differs(other) => {
                    let m = GroupMapMismatch::new(node.addr.clone(), other, self.ours.clone());
                    if self.mismatch.set(m.clone()).is_ok() {
                        tracing::error!(error = %m, "quorumlock: group map mismatch; this client takes no lock from now on");
                    }
                    return Err(m);
                }
                Answer::Skipped(why) => {
                    tracing::debug!(node = %node.addr, %why, "quorumlock: group map not checked on this node");
                }
            }
        }
        if !lease.is_zero()
            && agreed > 0
            && let (Ok(mut covered), Some(until)) = (self.covered.lock(), start.checked_add(lease))
        {
            *covered = Some(covered.map_or(until, |c| c.max(until)));
        }
        Ok(())
    }
}

/// Decodes one node's answer to the record script.
fn answer_of(answer: Reply) -> Answer {
    let value = match answer {
        Reply::Value(v) => v,
        Reply::TimedOut => return Answer::Skipped("timed out".to_owned()),
        Reply::Error(e) => {
            let text = Reply::error_text(&e);
            return match e.code() {
                Some(code) if !TRANSIENT.contains(&code) => {
                    Answer::Differs(format!("an unreadable record ({text})"))
                }
                _ => Answer::Skipped(text),
            };
        }
    };
    let Value::Array(parts) = value else {
        return Answer::Differs(format!("an unreadable record (reply {value:?})"));
    };
    match parts.as_slice() {
        [Value::Int(1), ..] => Answer::Agrees,
        [Value::Int(0), Value::BulkString(other)] => {
            Answer::Differs(String::from_utf8_lossy(other).into_owned())
        }
        other => Answer::Differs(format!("an unreadable record (reply {other:?})")),
    }
}

/// Writes the record every [`REFRESH`] while the map lives (it lives while the client or
/// any of its locks does, in any group), and stops at the first mismatch, which
/// [`GroupMap::usable`] then reports.
pub(crate) async fn refresh(map: Weak<GroupMap>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let Some(map) = map.upgrade() else {
            return;
        };
        if map.write().await.is_err() {
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
        let v = |parts: Vec<Value>| answer_of(Reply::Value(Value::Array(parts)));
        assert_eq!(v(vec![Value::Int(1), bulk("v1/2/ab")]), Answer::Agrees);
        assert_eq!(
            v(vec![Value::Int(0), bulk("v2/3/cd")]),
            Answer::Differs("v2/3/cd".to_owned())
        );
        assert!(matches!(v(vec![Value::Int(0)]), Answer::Differs(_)));
        assert!(matches!(
            answer_of(Reply::Value(Value::Int(1))),
            Answer::Differs(_)
        ));
        assert!(matches!(answer_of(Reply::TimedOut), Answer::Skipped(_)));
    }

    #[test]
    fn server_errors_fail_closed_unless_transient() {
        let server = |raw: &str| {
            answer_of(Reply::from_result(redis::parse_redis_value(
                format!("-{raw}\r\n").as_bytes(),
            )))
        };
        for closed in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOPERM No permissions to access a key",
            "ERR Error running script",
        ] {
            assert!(
                matches!(server(closed), Answer::Differs(ref t) if t.starts_with("an unreadable record")),
                "{closed}: {:?}",
                server(closed)
            );
        }
        for open in [
            "BUSY Redis is busy running a script",
            "LOADING Redis is loading the dataset in memory",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "READONLY You can't write against a read only replica.",
            "MOVED 3967 127.0.0.1:7001",
            "ASK 3967 127.0.0.1:7002",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(
                matches!(server(open), Answer::Skipped(_)),
                "{open}: {:?}",
                server(open)
            );
        }
        let io = answer_of(Reply::Error(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ))));
        assert!(matches!(io, Answer::Skipped(_)), "{io:?}");
    }

    #[test]
    fn the_lease_covers_the_longest_ttl_and_two_refreshes() {
        let map = GroupMap::new(
            "v1/2/ab".to_owned(),
            b"quorumlock:groupmap".to_vec(),
            Duration::from_secs(1),
        );
        assert_eq!(map.lease(), GROUP_MAP_LEASE);
        let note = |d: Duration| {
            if let Ok(mut l) = map.longest.lock() {
                *l = (*l).max(d);
            }
        };
        note(Duration::from_secs(5));
        assert_eq!(map.lease(), GROUP_MAP_LEASE);
        note(Duration::from_secs(90));
        assert_eq!(map.lease(), Duration::from_secs(110));
        note(Duration::from_secs(1));
        assert_eq!(map.lease(), Duration::from_secs(110));
        note(Duration::MAX);
        assert_eq!(map.lease(), LEASE_CAP);
        // Nothing written yet: nothing is covered.
        assert!(!map.covers(Duration::ZERO));
        if let Ok(mut c) = map.covered.lock() {
            *c = Instant::now().checked_add(Duration::from_secs(60));
        }
        assert!(map.covers(Duration::from_secs(30)));
        assert!(!map.covers(Duration::from_secs(90)));
        assert!(!map.covers(Duration::MAX));
    }
}
