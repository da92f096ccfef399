//! Which store a voter is, and whether its votes count.
//!
//! One store given as two voters (one server under two addresses, two databases of one
//! server, one Redis Cluster under two seeds) would count its one failure twice: with three
//! voters of which two are one server, that server alone grants a quorum. So every voter's
//! identity is read (`INFO server` and `INFO cluster` on a master: its `run_id`; `CLUSTER
//! NODES` on a Redis Cluster voter: every node id), and the check fails closed:
//!
//! ```text
//!  build: each voter read at once, each within the connect timeout
//!     ├─ answered, distinct from every voter read so far ──▶ admitted: its votes count
//!     ├─ answered, shares an id with another voter ───────▶ build refused
//!     ├─ refused the read (an ACL without INFO, …) ────────▶ build refused
//!     └─ no answer (down, paused, loading) ────────────────▶ not admitted yet
//!  every request that votes (acquire, extend, fence, queue join) to a voter not admitted:
//!     read it first, within the request's own timeout ── admitted, or the request fails
//!     on that voter without being sent (a duplicate found now: refused for good)
//! ```
//!
//! A voter that is not admitted is a failed vote, never a grant: a slow or dead minority
//! at build, or a read that the ACL refuses, can cost availability, never safety.
//! Releases are always sent (they only delete our own token).
//!
//! This module may touch one node's connection (through [`Node::query`]) and nothing else.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::RedisError;

use super::{Node, Reply};

/// In a master's identity: the master is a Redis Cluster node (given as one master, its
/// keys would be refused by the shards that do not serve their slots).
pub(crate) const CLUSTER_NODE: &str = "cluster_enabled:1";

/// The least time between two reads of a voter that did not answer, so that a burst of
/// requests to a dead voter does not become a burst of reads.
const RETRY_GAP: Duration = Duration::from_millis(100);

/// What one read of a voter's identity found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// The ids that identify the store (never empty).
    Ids(Vec<String>),
    /// The voter answered, but not with what identifies it (the ACL forbids the command,
    /// an unknown command, a reply without a `run_id`): why.
    Refused(String),
    /// No usable answer now (down, paused, loading, timed out): why.
    NoAnswer(String),
    /// A voter given as a Redis Cluster (`redis+cluster://`) answered as a single master
    /// (cluster support disabled).
    NotCluster,
}

/// Every voter's identity in one group of voters, to tell a voter that is another's store.
#[derive(Debug)]
pub(crate) struct Registry {
    /// The ids of each voter admitted so far, by the voter's index.
    known: Mutex<Vec<Option<Vec<String>>>>,
    /// Each voter's address, for the messages.
    addrs: Vec<String>,
}

impl Registry {
    /// A registry for voters with these addresses, none admitted.
    pub(crate) fn new(addrs: Vec<String>) -> Arc<Registry> {
        Arc::new(Registry {
            known: Mutex::new(vec![None; addrs.len()]),
            addrs,
        })
    }

    /// Admits voter `i` with `ids` unless another voter already admitted shares one of
    /// them: `Err(j)` names that voter.
    pub(crate) fn admit(&self, i: usize, ids: Vec<String>) -> Result<(), usize> {
        let Ok(mut known) = self.known.lock() else {
            return Err(i);
        };
        if let Some(j) = same_store(&known, i, &ids) {
            return Err(j);
        }
        if let Some(slot) = known.get_mut(i) {
            *slot = Some(ids);
        }
        Ok(())
    }

    /// Voter `j`'s address.
    pub(crate) fn addr(&self, j: usize) -> &str {
        self.addrs.get(j).map_or("?", String::as_str)
    }
}

/// The first voter other than `i` that shares an id with `ids`.
fn same_store(known: &[Option<Vec<String>>], i: usize, ids: &[String]) -> Option<usize> {
    known
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .find_map(|(j, k)| {
            k.as_ref()
                .is_some_and(|k| k.iter().any(|x| ids.contains(x)))
                .then_some(j)
        })
}

/// Whether one voter's votes count.
#[derive(Debug)]
pub(crate) struct Admission {
    registry: Arc<Registry>,
    index: usize,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
enum State {
    /// Not read yet: when the last read started, and whether one is under way.
    Unknown {
        last: Option<Instant>,
        reading: bool,
    },
    /// Distinct from every other voter: its votes count.
    Admitted,
    /// Never counts: why (another voter's store, or a read the voter refuses).
    Refused(String),
}

impl Admission {
    /// Voter `index` of `registry`, not admitted yet.
    pub(crate) fn new(registry: Arc<Registry>, index: usize) -> Arc<Admission> {
        Arc::new(Admission {
            registry,
            index,
            state: Mutex::new(State::Unknown {
                last: None,
                reading: false,
            }),
        })
    }

    /// Takes in what a read found: `Ok` when the voter is admitted now, `Err` with why
    /// not (for good when it is refused; for now when it did not answer).
    pub(crate) fn settle(&self, read: Read) -> Result<(), String> {
        let me = format!(
            "voter #{} ({})",
            self.index + 1,
            self.registry.addr(self.index)
        );
        let outcome = match read {
            Read::Ids(ids) if ids.iter().any(|x| x == CLUSTER_NODE) => State::Refused(format!(
                "{me} is a node of a Redis Cluster, given as one master; give the cluster as \
                 one voter, redis+cluster://host:port[,host:port…] (its keys are spread over \
                 its shards)"
            )),
            Read::Ids(ids) => match self.registry.admit(self.index, ids) {
                Ok(()) => State::Admitted,
                Err(j) => State::Refused(format!(
                    "voters #{} ({}) and #{} ({}) are one Redis server or one Redis Cluster under \
                     two addresses; every voter must be an independent store, or one failure \
                     counts twice",
                    j.min(self.index) + 1,
                    self.registry.addr(j.min(self.index)),
                    j.max(self.index) + 1,
                    self.registry.addr(j.max(self.index)),
                )),
            },
            Read::Refused(why) => State::Refused(format!(
                "{me}: cannot tell which store it is ({why}); quorumlock reads INFO (server, \
                 cluster) on a master and CLUSTER NODES on a Redis Cluster voter to tell that \
                 voters are distinct stores: allow the ACL user those commands"
            )),
            Read::NotCluster => State::Refused(format!(
                "{me} is not a Redis Cluster (cluster support is disabled on it), given as \
                 redis+cluster://; give a single master as redis://host:port"
            )),
            Read::NoAnswer(why) => {
                self.set_unknown_done();
                return Err(format!("identity not read yet ({why})"));
            }
        };
        let Ok(mut state) = self.state.lock() else {
            return Err("identity state unavailable".to_owned());
        };
        if let State::Refused(why) = &*state {
            return Err(why.clone());
        }
        *state = outcome.clone();
        match outcome {
            State::Admitted => Ok(()),
            State::Refused(why) => {
                tracing::error!(voter = self.index + 1, %why, "quorumlock: voter refused; it never counts towards a quorum");
                Err(why)
            }
            State::Unknown { .. } => Err("identity not read yet".to_owned()),
        }
    }

    fn set_unknown_done(&self) {
        if let Ok(mut state) = self.state.lock()
            && let State::Unknown { reading, .. } = &mut *state
        {
            *reading = false;
        }
    }

    /// `Ok(None)` when the voter is admitted, `Err(why)` when it is refused for good or a
    /// read is under way (or was tried a moment ago), `Ok(Some(guard))` when the caller
    /// should read it now (the guard marks the read as under way until it is dropped).
    fn begin(&self) -> Result<Option<Reading<'_>>, String> {
        let Ok(mut state) = self.state.lock() else {
            return Err("identity state unavailable".to_owned());
        };
        match &mut *state {
            State::Admitted => Ok(None),
            State::Refused(why) => Err(why.clone()),
            State::Unknown { reading: true, .. } => {
                Err("identity not read yet (a read is under way)".to_owned())
            }
            State::Unknown { last, reading } => {
                let now = Instant::now();
                if last.is_some_and(|l| now.saturating_duration_since(l) < RETRY_GAP) {
                    return Err("identity not read yet (the voter did not answer)".to_owned());
                }
                *last = Some(now);
                *reading = true;
                Ok(Some(Reading(self)))
            }
        }
    }
}

/// A read under way; dropping it (the request was cancelled) lets the next request read.
struct Reading<'a>(&'a Admission);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.set_unknown_done();
    }
}

impl Node {
    /// Reads what identifies the store behind this voter, within `timeout`: a master's
    /// `run_id` (and [`CLUSTER_NODE`] when it is a Redis Cluster node), every node id a
    /// Redis Cluster voter's `CLUSTER NODES` lists (masters, replicas, failed nodes alike).
    pub(crate) async fn read_identity(&self, timeout: Duration) -> Read {
        let (cmd, field) = if self.is_cluster() {
            (redis::cmd("CLUSTER").arg("NODES").clone(), None)
        } else {
            let info = redis::cmd("INFO").arg("server").arg("cluster").clone();
            (info, Some("run_id:"))
        };
        let text: String = match self.query(&cmd, timeout).await {
            Reply::Value(v) => match redis::from_redis_value(v) {
                Ok(text) => text,
                Err(_) => return Read::Refused("an answer that is not text".to_owned()),
            },
            Reply::TimedOut => return Read::NoAnswer("timed out".to_owned()),
            Reply::Error(e) if is_no_answer(&e) => return Read::NoAnswer(Reply::error_text(&e)),
            Reply::Error(e)
                if field.is_none()
                    && e.detail()
                        .is_some_and(|d| d.contains("cluster support disabled")) =>
            {
                return Read::NotCluster;
            }
            Reply::Error(e) => return Read::Refused(Reply::error_text(&e)),
        };
        let lines = text.lines().map(str::trim);
        let ids: Vec<String> = match field {
            Some(f) => lines
                .filter_map(|l| match l.strip_prefix(f) {
                    Some(id) => Some(id.to_owned()),
                    None => (l == CLUSTER_NODE).then(|| CLUSTER_NODE.to_owned()),
                })
                .collect(),
            None => lines
                .filter_map(|l| l.split_whitespace().next())
                .map(|id| format!("cluster-node:{id}"))
                .collect(),
        };
        if ids.iter().all(|id| id == CLUSTER_NODE) {
            return Read::Refused("no run_id or node id in its answer".to_owned());
        }
        Read::Ids(ids)
    }

    /// Before a request that votes: `Ok` when this voter's votes count (admitted now, or
    /// before), else the reply to count in its place: a failure naming why.
    pub(crate) async fn admit(&self, timeout: Duration) -> Result<(), Reply> {
        let Some(admission) = &self.admission else {
            return Ok(());
        };
        let reading = match admission.begin() {
            Ok(None) => return Ok(()),
            Ok(Some(reading)) => reading,
            Err(why) => return Err(refusal(why)),
        };
        let read = self.read_identity(timeout).await;
        let settled = admission.settle(read);
        drop(reading);
        settled.map_err(refusal)
    }
}

/// A failed vote for a voter that is not admitted.
fn refusal(why: String) -> Reply {
    Reply::Error(RedisError::from((
        redis::ErrorKind::Client,
        "voter not admitted",
        why,
    )))
}

/// Whether an error says "no answer now" rather than "not this": an I/O or connection
/// failure, or a server that is loading, busy or without a quorum of its own.
fn is_no_answer(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || super::is_transient(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_voter_sharing_an_id_with_an_admitted_one_is_refused_for_good() {
        let reg = Registry::new(vec!["a".into(), "b".into(), "c".into()]);
        let (a, b, c) = (
            Admission::new(reg.clone(), 0),
            Admission::new(reg.clone(), 1),
            Admission::new(reg.clone(), 2),
        );
        assert_eq!(a.settle(Read::Ids(ids(&["r1"]))), Ok(()));
        assert!(matches!(a.begin(), Ok(None)));
        // c has not answered: not admitted, and asked again only after the gap.
        assert!(c.begin().is_ok_and(|g| g.is_some()));
        assert!(c.settle(Read::NoAnswer("timed out".into())).is_err());
        assert!(c.begin().is_err(), "read again within the gap");
        // b is a's store under another address.
        let why = b.settle(Read::Ids(ids(&["r1"]))).unwrap_err();
        assert!(why.contains("voters #1 (a) and #2 (b)"), "{why}");
        assert!(b.begin().is_err());
        // A refusal is for good, whatever a later read finds.
        assert!(b.settle(Read::Ids(ids(&["r2"]))).is_err());
        assert!(b.begin().is_err());
    }

    #[test]
    fn one_store_given_twice_is_found() {
        let known = vec![Some(ids(&["a", "x"])), None, Some(ids(&["b"]))];
        assert_eq!(same_store(&known, 1, &ids(&["c"])), None);
        assert_eq!(same_store(&known, 1, &ids(&["y", "x"])), Some(0));
        assert_eq!(same_store(&known, 2, &ids(&["b"])), None, "itself");
        assert_eq!(same_store(&known, 1, &[]), None);
    }

    #[test]
    fn a_refused_read_refuses_the_voter() {
        let reg = Registry::new(vec!["a".into()]);
        let a = Admission::new(reg, 0);
        let why = a
            .settle(Read::Refused(
                "NOPERM this user has no permissions to run the 'info' command".into(),
            ))
            .unwrap_err();
        assert!(why.contains("NOPERM") && why.contains("INFO"), "{why}");
        assert!(a.begin().is_err());
    }

    #[test]
    fn a_cancelled_read_lets_the_next_request_read() {
        let reg = Registry::new(vec!["a".into()]);
        let a = Admission::new(reg, 0);
        let guard = a.begin();
        assert!(matches!(guard, Ok(Some(_))));
        drop(guard);
        // Within the gap it is not read again; the gap is short.
        assert!(a.begin().is_err());
        if let Ok(mut s) = a.state.lock()
            && let State::Unknown { last, .. } = &mut *s
        {
            *last = Instant::now().checked_sub(RETRY_GAP);
        }
        assert!(matches!(a.begin(), Ok(Some(_))));
    }
}
