//! The group-map record: how clients with different lock groups notice one another before
//! two of them hold one resource in two groups.
//!
//! ```text
//!  build ── read on every node (writes nothing) ── another map? ──▶ refused, nothing written
//!        └─ write ours (SET PX lease if absent, else raise its PTTL to the lease)
//!  every REFRESH while the client or a lock of it lives: write again (stops at a mismatch)
//!  before an acquisition or extension of TTL t: if the record may lapse within t, write now,
//!        and go ahead only once a quorum of every group took the write
//! ```
//!
//! Every client records its *group map* (`v<version>/<groups>/<hash>`, or `unsharded` for
//! one group without a version) in the key `<namespace>:groupmap` (`quorumlock:groupmap` by default) on every node of every group, with a
//! lease of at least [`GROUP_MAP_LEASE`], and **at least the longest TTL the client was
//! asked for plus two refresh periods**: a record outlives every lock its client took, even
//! when that client is paused or dies, so a client with another map cannot start while such
//! a lock may be valid. A node that records another map, or whose record cannot be read (a
//! value of another type, an ACL that forbids the key), makes the client refuse: the check
//! fails closed. Each answer counts as it comes: a node that records another map refuses
//! at once, whatever the slower nodes do.
//!
//! A lock is taken only while the record is *covered*: a write was taken by a quorum of
//! every group, and its lease outlives the lock. Why that is enough: a client B with another
//! map covers its record on a quorum of every group before it locks; a client A that locks
//! in a group covered its own write on a quorum of that group; the two quorums share a
//! node, and that node, holding B's record, answered A's write with B's map. When the
//! write cannot be confirmed on a quorum of some group within the lock's per-node timeout
//! (a slow, paused or dead majority; answers that say "not now"), the lock is refused with
//! [`Error::NoQuorum`] naming every node's answer: the check never decides on fewer
//! answers, and never waits past the per-node timeout. A node that does not answer is read
//! again at the next refresh; `build` never fails because a node is down.
//!
//! The first mismatch is kept for the client's life ([`GroupMap::usable`]); every
//! acquisition attempt checks it, so loops that were already waiting stop too. Locks held
//! before are not revoked: the record's lease is what keeps another map from starting
//! while they are valid.
//!
//! This module may touch the nodes and the error types; it knows nothing of routing (the
//! client's `groups`) nor of locks.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::Value;

use crate::base::error::{Error, GroupMapMismatch, NodeOutcome, NodeVote, Votes};
use crate::io::node::identity::is_denial;
use crate::io::node::{Node, Reply, group_map_request, is_transient};

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

/// The map of a client with one group and no version.
pub(crate) const UNSHARDED: &str = "unsharded";

/// One client's group map and what it knows of the record.
pub(crate) struct GroupMap {
    ours: String,
    /// The record's key on every node (`<namespace>:groupmap`, `Keyspace::record_key`).
    key: Vec<u8>,
    /// Every group's nodes, group by group, set once they are connected.
    groups: OnceLock<Vec<Vec<Node>>>,
    /// How long one node may take to answer the reads and writes at build and the
    /// background refreshes (a lock's own write waits its per-node timeout).
    timeout: Duration,
    /// The longest TTL the client accepts: no lease is longer than that plus two refreshes
    /// and its drift.
    max_ttl: Duration,
    /// The client's drift factor: a record's lease counts only less its drift, as a lock's
    /// TTL does (the nodes' clocks may run a little fast).
    drift_factor: f64,
    mismatch: OnceLock<GroupMapMismatch>,
    /// The longest TTL this client was asked for.
    longest: Mutex<Duration>,
    /// Until when the record lives at least, on the nodes that took the last write: that
    /// write's start plus its lease (`None` before any write was taken).
    covered: Mutex<Option<Instant>>,
    /// One covering write at a time on behalf of the locks (the others then find it
    /// covered).
    writing: tokio::sync::Mutex<()>,
}

/// One node's answer to the record script: its group, its index in the group, the reply.
type NodeAnswer = Pin<Box<dyn Future<Output = (usize, usize, Reply)> + Send>>;

/// How long a round waits for the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Until a quorum of every group agreed (or one node records another map): a lock's
    /// own write, which must not wait for a slow minority.
    Quorum,
    /// For every node, each within the timeout: build and the background refreshes, which
    /// look for another map on every node that answers.
    All,
}

/// What a round found when no node recorded another map.
#[derive(Debug)]
enum Round {
    /// A quorum of every group agreed.
    Confirmed,
    /// Some group had too few agreeing nodes: its votes (agreeing nodes count as granted).
    Unconfirmed(Votes),
}

/// What one node said about the record.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Ours, or none (written, when writing).
    Agrees,
    /// Another map; or, for a record that cannot be read, why.
    Differs(String),
    /// No usable answer now (down, timed out, busy): read again later.
    Skipped(String),
}

impl GroupMap {
    /// A map named `ours`; its nodes come later ([`set_groups`](GroupMap::set_groups)).
    /// `max_ttl`: the longest TTL the client accepts.
    pub(crate) fn new(
        ours: String,
        key: Vec<u8>,
        timeout: Duration,
        max_ttl: Duration,
        drift_factor: f64,
    ) -> GroupMap {
        GroupMap {
            ours,
            key,
            groups: OnceLock::new(),
            timeout,
            max_ttl,
            drift_factor,
            mismatch: OnceLock::new(),
            longest: Mutex::new(Duration::ZERO),
            covered: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// The nodes of every group, group by group, once.
    pub(crate) fn set_groups(&self, groups: Vec<Vec<Node>>) {
        let _ = self.groups.set(groups);
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

    /// The lease a write asks for now: [`GROUP_MAP_LEASE`], or, when longer, the longest
    /// TTL asked of the client plus two refresh periods and twice its drift (so that the
    /// lease less its own drift still outlives such a lock by about two refreshes).
    fn lease(&self) -> Duration {
        let lease_for = |ttl: Duration| {
            let margin = crate::protocol::tally::drift(ttl, self.drift_factor);
            ttl.saturating_add(margin.saturating_mul(2))
                .saturating_add(REFRESH.saturating_mul(2))
        };
        // Far below i64::MAX ms from any node's clock, whatever the drift factor.
        let cap = lease_for(self.max_ttl).min(Duration::from_millis(i64::MAX as u64 / 4 * 3));
        let longest = self.longest.lock().map_or(cap, |l| lease_for(*l));
        GROUP_MAP_LEASE.max(longest).min(cap)
    }

    /// Reads the record on every node, writing nothing: `Err` on the first node that
    /// records another map.
    pub(crate) async fn read(&self) -> Result<(), GroupMapMismatch> {
        self.round(Duration::ZERO, self.timeout, Wait::All)
            .await
            .map(drop)
    }

    /// Writes the record on every node that records no other map (with the current
    /// lease), waiting for every node, and notes until when it is covered if a quorum of
    /// every group took it.
    pub(crate) async fn write(&self) -> Result<(), GroupMapMismatch> {
        self.round(self.lease(), self.timeout, Wait::All)
            .await
            .map(drop)
    }

    /// Before taking a lock for `ttl`: `Err` if a mismatch was seen; otherwise makes sure
    /// the record outlives the lock on a quorum of every group, writing it now (with a
    /// longer lease) if the last covering write may lapse first. The write decides as soon
    /// as a quorum of every group agreed or one node records another map, and all of it
    /// (waiting for another caller's write included) takes at most `patience`, the lock's
    /// per-node timeout. When it cannot confirm the record on a quorum of some group, the
    /// lock is refused: [`Error::NoQuorum`] with that group's answers.
    pub(crate) async fn cover(&self, ttl: Duration, patience: Duration) -> Result<(), Error> {
        self.usable()?;
        self.cover_held(ttl, patience).await
    }

    /// Before a held lock is extended (by a call, or by the watchdog) for `ttl`: `Ok` when
    /// the record covers it; else, unless a mismatch was
    /// seen (the record is then no longer written, and a lock lives only within the
    /// coverage it has), a write as in [`cover`](GroupMap::cover). A lock never outlives
    /// the record's coverage.
    pub(crate) async fn cover_held(&self, ttl: Duration, patience: Duration) -> Result<(), Error> {
        if let Ok(mut longest) = self.longest.lock() {
            *longest = (*longest).max(ttl);
        }
        if self.covers(ttl) {
            return Ok(());
        }
        self.usable()?;
        let deadline = Instant::now().checked_add(patience);
        let left = || deadline.map_or(patience, |d| d.saturating_duration_since(Instant::now()));
        // One write at a time: a caller that waited for another's write finds it covered.
        let round = match tokio::time::timeout(left(), self.writing.lock()).await {
            Ok(_one) if self.covers(ttl) => return self.usable(),
            Ok(_one) => self
                .round(self.lease(), left(), Wait::Quorum)
                .await
                .map_err(Error::GroupMapMismatch)?,
            Err(_) => Round::Unconfirmed(self.votes_of(
                0,
                &[],
                patience,
                "another write of the group map record still under way",
            )),
        };
        self.usable()?;
        match round {
            Round::Confirmed if self.covers(ttl) => Ok(()),
            Round::Confirmed => Err(Error::NoQuorum(self.votes_of(
                0,
                &[],
                patience,
                "group map record confirmed for less than the lock's TTL",
            ))),
            Round::Unconfirmed(votes) => {
                tracing::warn!(%votes, "quorumlock: group map record not confirmed on a quorum; lock refused");
                Err(Error::NoQuorum(votes))
            }
        }
    }

    /// How long from `at` the last covering write still covers (its lease less its drift):
    /// a lock's validity, measured from its round's start, is capped at this, so that a
    /// client paused between its check and its round never holds past the record.
    /// Unbounded for a client without groups yet.
    pub(crate) fn coverage_from(&self, at: Instant) -> Duration {
        if self.groups.get().is_none() {
            return Duration::MAX;
        }
        match self.covered.lock().ok().and_then(|c| *c) {
            Some(until) => until.saturating_duration_since(at),
            None => Duration::ZERO,
        }
    }

    /// Whether the last covering write (its lease less its drift) outlives a lock of
    /// `ttl` taken now.
    fn covers(&self, ttl: Duration) -> bool {
        let Ok(covered) = self.covered.lock() else {
            return false;
        };
        match (*covered, Instant::now().checked_add(ttl)) {
            (Some(until), Some(need)) => until >= need,
            _ => false,
        }
    }

    /// Runs the record script on every node at once with `lease` (zero: read only), each
    /// node within `timeout`, counting answers as they come. `Err` (and the mismatch kept
    /// for the client's life) at the first node that records another map; otherwise
    /// whether a quorum of every group agreed, which (with a lease) covers the record
    /// until the round's start plus the lease.
    async fn round(
        &self,
        lease: Duration,
        timeout: Duration,
        wait: Wait,
    ) -> Result<Round, GroupMapMismatch> {
        let Some(groups) = self.groups.get() else {
            return Ok(Round::Confirmed);
        };
        let start = Instant::now();
        let mut pending = self.send(groups, lease, timeout);
        let mut answers: Vec<Vec<Option<Answer>>> =
            groups.iter().map(|nodes| vec![None; nodes.len()]).collect();
        while let Some((g, i, reply)) = pending.next().await {
            let answer = answer_of(reply);
            if let Some(node) = groups.get(g).and_then(|nodes| nodes.get(i)) {
                self.note(node, &answer)?;
            }
            if let Some(slot) = answers.get_mut(g).and_then(|a| a.get_mut(i)) {
                *slot = Some(answer);
            }
            if wait == Wait::Quorum && short_group(&answers).is_none() {
                break;
            }
        }
        // The slower nodes still take the write (each within the timeout): the record
        // then lives on every node that answers, not only on the quorum waited for.
        if !pending.is_empty() {
            crate::io::background::spawn(async move { while pending.next().await.is_some() {} });
        }
        match short_group(&answers) {
            None => {
                if !lease.is_zero()
                    && let (Ok(mut covered), Some(until)) = (
                        self.covered.lock(),
                        start.checked_add(lease.saturating_sub(crate::protocol::tally::drift(
                            lease,
                            self.drift_factor,
                        ))),
                    )
                {
                    *covered = Some(covered.map_or(until, |c| c.max(until)));
                }
                Ok(Round::Confirmed)
            }
            Some(g) => {
                let group = answers.get(g).map_or(&[][..], Vec::as_slice);
                Ok(Round::Unconfirmed(self.votes_of(
                    g,
                    group,
                    start.elapsed(),
                    "group map record not confirmed within the node timeout",
                )))
            }
        }
    }

    /// Sends the record script with `lease` to every node, each within `timeout`.
    fn send(
        &self,
        groups: &[Vec<Node>],
        lease: Duration,
        timeout: Duration,
    ) -> FuturesUnordered<NodeAnswer> {
        let cmd = Arc::new(group_map_request(&self.key, &self.ours, lease));
        let pending: FuturesUnordered<NodeAnswer> = FuturesUnordered::new();
        for (g, nodes) in groups.iter().enumerate() {
            for (i, node) in nodes.iter().enumerate() {
                let (node, cmd) = (node.clone(), cmd.clone());
                pending.push(Box::pin(
                    async move { (g, i, node.query(&cmd, timeout).await) },
                ));
            }
        }
        pending
    }

    /// Takes in one node's answer: `Err` (the mismatch kept for the client's life) when it
    /// records another map.
    fn note(&self, node: &Node, answer: &Answer) -> Result<(), GroupMapMismatch> {
        match answer {
            Answer::Differs(other) => {
                let m = GroupMapMismatch::new(node.addr.clone(), other.clone(), self.ours.clone());
                if self.mismatch.set(m.clone()).is_ok() {
                    tracing::error!(error = %m, "quorumlock: group map mismatch; this client takes no lock from now on");
                }
                Err(m)
            }
            Answer::Skipped(why) => {
                tracing::debug!(node = %node.addr, %why, "quorumlock: group map not checked on this node");
                Ok(())
            }
            Answer::Agrees => Ok(()),
        }
    }

    /// The answers of group `g` as votes; a node with no answer in `answers` fails with
    /// `unanswered`.
    fn votes_of(
        &self,
        g: usize,
        answers: &[Option<Answer>],
        elapsed: Duration,
        unanswered: &str,
    ) -> Votes {
        let nodes = self
            .groups
            .get()
            .and_then(|groups| groups.get(g))
            .map_or(&[][..], Vec::as_slice);
        let votes = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| NodeVote {
                node: node.addr.clone(),
                outcome: match answers.get(i) {
                    Some(Some(Answer::Agrees)) => NodeOutcome::Granted,
                    Some(Some(Answer::Skipped(why))) => {
                        NodeOutcome::Failed(format!("group map record not confirmed: {why}"))
                    }
                    Some(Some(Answer::Differs(other))) => {
                        NodeOutcome::Failed(format!("group map record: {other}"))
                    }
                    _ => NodeOutcome::Failed(unanswered.to_owned()),
                },
            })
            .collect();
        Votes::of_check(crate::protocol::tally::quorum(nodes.len()), votes, elapsed)
    }
}

/// The first group in which fewer than a quorum of the nodes agreed so far, if any.
fn short_group(answers: &[Vec<Option<Answer>>]) -> Option<usize> {
    answers.iter().position(|group| {
        let agreed = group
            .iter()
            .filter(|a| matches!(a, Some(Answer::Agrees)))
            .count();
        agreed < crate::protocol::tally::quorum(group.len())
    })
}

/// Decodes one node's answer to the record script.
fn answer_of(answer: Reply) -> Answer {
    let value = match answer {
        Reply::Value(v) => v,
        Reply::TimedOut => return Answer::Skipped("timed out".to_owned()),
        Reply::Error(e) => {
            let text = Reply::error_text(&e);
            // The node refuses to talk to this client at all (no password, a wrong one, a
            // certificate refused): it cannot say which map it records, and it grants no
            // lock either. Not an answer: read again at the next refresh, never counted as
            // agreeing.
            if is_denial(&e) {
                return Answer::Skipped(text);
            }
            return match e.code() {
                Some(_) if !is_transient(&e) => {
                    let hint = if e.code() == Some("NOPERM") {
                        ": the ACL user may not use this client's namespace (its key patterns must \
                         cover `<namespace>:*`)"
                    } else {
                        ""
                    };
                    Answer::Differs(format!("an unreadable record ({text}){hint}"))
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
    fn server_errors_fail_closed_unless_transient_or_a_refused_login() {
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
            // A node that refuses this client's credentials answers nothing about the
            // record: never agreeing, it can only withhold a confirmation.
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
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
    fn a_record_is_confirmed_only_on_a_quorum_of_every_group() {
        let agrees = || Some(Answer::Agrees);
        let skipped = || Some(Answer::Skipped("timed out".to_owned()));
        // Two groups of three: each needs two agreeing nodes.
        let both = vec![
            vec![agrees(), agrees(), None],
            vec![None, agrees(), agrees()],
        ];
        assert_eq!(short_group(&both), None);
        let second_short = vec![
            vec![agrees(), agrees(), agrees()],
            vec![agrees(), skipped(), None],
        ];
        assert_eq!(short_group(&second_short), Some(1));
        let first_short = vec![vec![agrees(), skipped(), skipped()]];
        assert_eq!(short_group(&first_short), Some(0));
        // Nothing answered yet: no group is confirmed.
        assert_eq!(short_group(&[vec![None, None, None]]), Some(0));
        // Five nodes: three are needed.
        let five = vec![vec![agrees(), agrees(), skipped(), None, None]];
        assert_eq!(short_group(&five), Some(0));
    }

    #[test]
    fn the_lease_covers_the_longest_ttl_and_two_refreshes() {
        let map = GroupMap::new(
            "v1/2/ab".to_owned(),
            b"quorumlock:groupmap".to_vec(),
            Duration::from_secs(1),
            Duration::from_secs(86_400),
            0.01,
        );
        assert_eq!(map.lease(), GROUP_MAP_LEASE);
        let note = |d: Duration| {
            if let Ok(mut l) = map.longest.lock() {
                *l = (*l).max(d);
            }
        };
        note(Duration::from_secs(5));
        assert_eq!(map.lease(), GROUP_MAP_LEASE);
        // 90 s, twice its drift (0.9 s + 2 ms), two refreshes.
        note(Duration::from_secs(90));
        assert_eq!(map.lease(), Duration::from_millis(111_804));
        note(Duration::from_secs(1));
        assert_eq!(map.lease(), Duration::from_millis(111_804));
        // At most what the longest TTL accepted would ask.
        note(Duration::MAX);
        assert_eq!(map.lease(), Duration::from_millis(88_148_004));
        // Nothing written yet: nothing is covered.
        assert!(!map.covers(Duration::ZERO));
        if let Ok(mut c) = map.covered.lock() {
            *c = Instant::now().checked_add(Duration::from_secs(60));
        }
        assert!(map.covers(Duration::from_secs(30)));
        assert!(!map.covers(Duration::from_secs(90)));
        assert!(!map.covers(Duration::MAX));
    }

    #[test]
    fn a_lease_less_its_drift_outlives_the_longest_ttl_by_a_refresh() {
        for secs in [1, 30, 3_600, 86_400, 10_000_000] {
            let ttl = Duration::from_secs(secs);
            let map = GroupMap::new(
                "unsharded".to_owned(),
                b"quorumlock:groupmap".to_vec(),
                Duration::from_secs(1),
                ttl,
                0.01,
            );
            if let Ok(mut l) = map.longest.lock() {
                *l = ttl;
            }
            let lease = map.lease();
            let counted = lease.saturating_sub(crate::protocol::tally::drift(lease, 0.01));
            assert!(
                counted >= ttl + REFRESH,
                "{ttl:?}: lease {lease:?}, counted {counted:?}"
            );
        }
    }
}
