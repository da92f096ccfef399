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
//!     ├─ refused our login (password, TLS certificate) ───▶ not admitted yet
//!     │                                    (a strict build is refused instead)
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
//! A server's `run_id` changes when it restarts, so a voter read late is compared with
//! what every other voter answers *now* as well as with every id it ever answered: the
//! other admitted voters are read again at the same time, and one that does not answer
//! then is no longer admitted (it is read again, and compared, before it votes again). So
//! a duplicate that comes back after a restart, or after its path recovers, is found
//! whichever of the two comes back first; of two voters found to be one store, the one
//! read last never counts.
//!
//! This module may touch the voters' connections (through [`Node::query`]) and nothing
//! else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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
    /// The voter refused our credentials: authentication failed (a wrong password or
    /// user), or the TLS handshake did (a certificate refused either way): why. Counted
    /// as no answer (a later read may succeed, after a password is rotated on the server);
    /// a strict build refuses it.
    Denied(String),
    /// A voter given as a Redis Cluster (`redis+cluster://`) answered as a single master
    /// (cluster support disabled).
    NotCluster,
}

/// Every voter of one group: whether each one's votes count, and every id each answered.
#[derive(Debug)]
pub(crate) struct Registry {
    voters: Mutex<Vec<Voter>>,
    /// Whether each voter is admitted, as in `voters`, read without the lock: every
    /// request to an admitted voter asks, so that costs one atomic load.
    admitted: Vec<AtomicBool>,
    /// Each voter's address, for the messages.
    addrs: Vec<String>,
    /// Each voter's connection (without admission: no cycle back to the registry), to read
    /// the others again when one is admitted late.
    readers: OnceLock<Vec<Node>>,
}

#[derive(Debug, Clone)]
struct Voter {
    state: State,
    /// Every id this voter ever answered (a restart adds a new `run_id`).
    ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not admitted: when the last read started, and whether one is under way.
    Unknown {
        last: Option<Instant>,
        reading: bool,
    },
    /// Distinct from every other voter: its votes count.
    Admitted,
    /// Never counts: why (another voter's store, or a read the voter refuses).
    Refused(String),
}

impl Registry {
    /// A registry for voters with these addresses, none admitted.
    pub(crate) fn new(addrs: Vec<String>) -> Arc<Registry> {
        let unknown = Voter {
            state: State::Unknown {
                last: None,
                reading: false,
            },
            ids: Vec::new(),
        };
        Arc::new(Registry {
            voters: Mutex::new(vec![unknown; addrs.len()]),
            admitted: addrs.iter().map(|_| AtomicBool::new(false)).collect(),
            addrs,
            readers: OnceLock::new(),
        })
    }

    /// The voters' connections, once (see the field).
    pub(crate) fn set_readers(&self, readers: Vec<Node>) {
        let _ = self.readers.set(readers);
    }

    fn addr(&self, j: usize) -> &str {
        self.addrs.get(j).map_or("?", String::as_str)
    }

    fn name(&self, i: usize) -> String {
        format!("voter #{} ({})", i + 1, self.addr(i))
    }

    /// Takes in what a read of voter `i` found (with the other voters' fresh reads, when
    /// it was read late): `Ok` when it is admitted now, `Err` with why not (for good when
    /// it is refused; for now when it did not answer).
    pub(crate) fn settle(
        &self,
        i: usize,
        read: Read,
        others: &[(usize, Read)],
    ) -> Result<(), String> {
        let Ok(mut voters) = self.voters.lock() else {
            return Err("voter states unavailable".to_owned());
        };
        note_fresh(&mut voters, others);
        let judged = self.judge(&mut voters, i, read);
        let outcome = match (judged, voters.get_mut(i)) {
            (_, None) => Err("no such voter".to_owned()),
            (_, Some(v)) if matches!(v.state, State::Refused(_)) => match &v.state {
                State::Refused(why) => Err(why.clone()),
                _ => Err("refused".to_owned()),
            },
            (Ok(outcome), Some(v)) => {
                v.state = outcome.clone();
                Ok(outcome)
            }
            (Err(why), Some(_)) => Err(why),
        };
        for (flag, v) in self.admitted.iter().zip(voters.iter()) {
            flag.store(v.state == State::Admitted, Ordering::Release);
        }
        match outcome? {
            State::Admitted => Ok(()),
            State::Refused(why) => {
                tracing::error!(%why, "quorumlock: voter refused; it never counts towards a quorum");
                Err(why)
            }
            State::Unknown { .. } => Err("identity not read yet".to_owned()),
        }
    }

    /// What a read of voter `i` makes of it (`voters` locked); `Err` when it did not
    /// answer (not admitted, for now).
    fn judge(&self, voters: &mut [Voter], i: usize, read: Read) -> Result<State, String> {
        Ok(match read {
            Read::Ids(ids) if ids.iter().any(|x| x == CLUSTER_NODE) => State::Refused(format!(
                "{} is a node of a Redis Cluster, given as one master; give the cluster as \
                 one voter, redis+cluster://host:port[,host:port…] (its keys are spread over \
                 its shards)",
                self.name(i)
            )),
            Read::Ids(ids) => match same_store(voters, i, &ids) {
                None => {
                    if let Some(v) = voters.get_mut(i) {
                        add_ids(&mut v.ids, &ids);
                    }
                    State::Admitted
                }
                Some(j) => State::Refused(format!(
                    "voters #{} ({}) and #{} ({}) are one Redis server or one Redis Cluster under \
                     two addresses; every voter must be an independent store, or one failure \
                     counts twice",
                    j.min(i) + 1,
                    self.addr(j.min(i)),
                    j.max(i) + 1,
                    self.addr(j.max(i)),
                )),
            },
            Read::Refused(why) => State::Refused(format!(
                "{}: cannot tell which store it is ({why}); quorumlock reads INFO (server, \
                 cluster) on a master and CLUSTER NODES on a Redis Cluster voter to tell that \
                 voters are distinct stores: allow the ACL user those commands",
                self.name(i)
            )),
            Read::NotCluster => State::Refused(format!(
                "{} is not a Redis Cluster (cluster support is disabled on it), given as \
                 redis+cluster://; give a single master as redis://host:port",
                self.name(i)
            )),
            Read::NoAnswer(why) | Read::Denied(why) => {
                if let Some(State::Unknown { reading, .. }) =
                    voters.get_mut(i).map(|v| &mut v.state)
                {
                    *reading = false;
                }
                return Err(format!("identity not read yet ({why})"));
            }
        })
    }

    /// `Ok(None)` when voter `i` is admitted; `Err(why)` when it is refused for good, or a
    /// read is under way or was tried a moment ago; `Ok(Some((guard, others)))` when the
    /// caller should read it now, with the other admitted voters (`others`) read again.
    fn begin(&self, i: usize) -> Result<Option<(Reading<'_>, Vec<usize>)>, String> {
        if self
            .admitted
            .get(i)
            .is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Ok(None);
        }
        let Ok(mut voters) = self.voters.lock() else {
            return Err("voter states unavailable".to_owned());
        };
        let others: Vec<usize> = voters
            .iter()
            .enumerate()
            .filter(|(j, v)| *j != i && v.state == State::Admitted)
            .map(|(j, _)| j)
            .collect();
        let Some(v) = voters.get_mut(i) else {
            return Err("no such voter".to_owned());
        };
        match &mut v.state {
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
                Ok(Some((Reading(self, i), others)))
            }
        }
    }

    fn done_reading(&self, i: usize) {
        if let Ok(mut voters) = self.voters.lock()
            && let Some(State::Unknown { reading, .. }) = voters.get_mut(i).map(|v| &mut v.state)
        {
            *reading = false;
        }
    }
}

/// Takes in the other voters' fresh reads: their ids are added to what they ever
/// answered; one that is silent now may come back as another voter's store (a restart
/// changes its run_id), so it is no longer admitted: read and compared again before it
/// votes.
fn note_fresh(voters: &mut [Voter], others: &[(usize, Read)]) {
    for (j, fresh) in others {
        let Some(v) = voters.get_mut(*j) else {
            continue;
        };
        match fresh {
            Read::Ids(ids) => add_ids(&mut v.ids, ids),
            _ if v.state == State::Admitted => {
                v.state = State::Unknown {
                    last: None,
                    reading: false,
                };
            }
            _ => {}
        }
    }
    // Two voters admitted apart (each read while the other's server had another run_id:
    // a restart between two reads) answer one id now: the later of the two never counts.
    for (j, fresh) in others {
        let Read::Ids(ids) = fresh else { continue };
        let earlier = voters
            .iter()
            .take(*j)
            .any(|v| v.state == State::Admitted && v.ids.iter().any(|x| ids.contains(x)));
        if earlier && let Some(v) = voters.get_mut(*j) {
            v.state = State::Refused(format!(
                "voter #{} answers as another voter's store (its server restarted between \
                 two reads); every voter must be an independent store",
                j + 1
            ));
        }
    }
}

fn add_ids(known: &mut Vec<String>, ids: &[String]) {
    for id in ids {
        if !known.contains(id) {
            known.push(id.clone());
        }
    }
}

/// The first voter other than `i`, and not refused, that ever answered an id in `ids`.
fn same_store(voters: &[Voter], i: usize, ids: &[String]) -> Option<usize> {
    voters
        .iter()
        .enumerate()
        .filter(|(j, v)| *j != i && !matches!(v.state, State::Refused(_)))
        .find_map(|(j, v)| v.ids.iter().any(|x| ids.contains(x)).then_some(j))
}

/// One voter of a [`Registry`], as its node holds it.
#[derive(Debug)]
pub(crate) struct Admission {
    registry: Arc<Registry>,
    index: usize,
}

impl Admission {
    /// Voter `index` of `registry`.
    pub(crate) fn new(registry: Arc<Registry>, index: usize) -> Arc<Admission> {
        Arc::new(Admission { registry, index })
    }

    /// Takes in what a read at build found (every voter read at once).
    pub(crate) fn settle(&self, read: Read) -> Result<(), String> {
        self.registry.settle(self.index, read, &[])
    }
}

/// A read under way; dropping it (the request was cancelled) lets the next request read.
struct Reading<'a>(&'a Registry, usize);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.done_reading(self.1);
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
            Reply::Error(e) if is_denial(&e) => return Read::Denied(Reply::error_text(&e)),
            Reply::Error(e) if !is_refusal(&e) => return Read::NoAnswer(Reply::error_text(&e)),
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
    /// before), else why not ([`refusal`] makes it the failure counted in its place). A
    /// voter not admitted yet is read now, within `timeout`, and the other admitted voters
    /// with it.
    pub(crate) async fn admit(&self, timeout: Duration) -> Result<(), String> {
        let Some(admission) = &self.admission else {
            return Ok(());
        };
        let registry = &admission.registry;
        let (reading, others) = match registry.begin(admission.index) {
            Ok(None) => return Ok(()),
            Ok(Some(begun)) => begun,
            Err(why) => return Err(why),
        };
        // Its own read first: a voter that does not answer (a dead one, asked again every
        // 100 ms) costs the others nothing. The others are read within what is left.
        let start = std::time::Instant::now();
        let read = self.read_identity(timeout).await;
        let fresh = match &read {
            Read::Ids(_) => {
                let left = timeout.saturating_sub(start.elapsed());
                let readers = registry.readers.get();
                let reads = others.iter().filter_map(|&j| {
                    let node = readers?.get(j)?.clone();
                    Some(async move { (j, node.read_identity(left).await) })
                });
                futures::future::join_all(reads).await
            }
            _ => Vec::new(),
        };
        let settled = registry.settle(admission.index, read, &fresh);
        drop(reading);
        settled
    }

    /// This node without its admission: a reader of the voter, for the registry.
    pub(crate) fn reader(&self) -> Node {
        Node {
            admission: None,
            ..self.clone()
        }
    }
}

/// A failed vote for a voter that is not admitted (`why`: [`Node::admit`]'s error).
pub(crate) fn refusal(why: String) -> Reply {
    Reply::Error(RedisError::from((
        redis::ErrorKind::Client,
        "voter not admitted",
        why,
    )))
}

/// Whether `e` says the voter refused our credentials: a failed authentication (redis-rs's
/// own kind, or the server's `WRONGPASS` / `NOAUTH`), or a TLS handshake that failed over
/// the certificates. redis-rs's cluster client hands a failed first connection on as an
/// I/O error whose detail is the cause's text: a Redis Cluster voter's refused login is
/// told by that text (redis-rs writes the kind's name, `AuthenticationFailed`, in it).
pub(crate) fn is_denial(e: &RedisError) -> bool {
    #[cfg(feature = "tls-rustls")]
    if super::tls::refused_certificates(e) {
        return true;
    }
    let cluster_login = e.kind() == redis::ErrorKind::Io
        && e.detail().is_some_and(|d| {
            d.contains("AuthenticationFailed") || d.contains("WRONGPASS") || d.contains("NOAUTH")
        });
    cluster_login
        || e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// Whether an error says "this voter will not tell": the ACL forbids the command
/// (`NOPERM`), the server does not know it, or a voter given as a cluster is a single
/// master. Every other error (I/O, a connection refused or dropped, a server loading,
/// busy or out of connections) is "no answer now": the voter is read again later, and does
/// not vote meanwhile.
fn is_refusal(e: &RedisError) -> bool {
    match e.code() {
        Some("NOPERM") => true,
        Some("ERR") => e.detail().is_some_and(|d| {
            d.contains("unknown command")
                || d.contains("unknown subcommand")
                || d.contains("cluster support disabled")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_login_is_a_denial_and_a_dead_node_is_not() {
        let server = |raw: &str| {
            redis::parse_redis_value(format!("-{raw}\r\n").as_bytes())
                .and_then(|v| v.extract_error())
                .expect_err("an error reply")
        };
        assert!(is_denial(&server("NOAUTH Authentication required.")));
        assert!(is_denial(&server(
            "WRONGPASS invalid username-password pair or user is disabled."
        )));
        assert!(!is_denial(&server("NOPERM this user has no permissions")));
        assert!(!is_denial(&server("LOADING Redis is loading")));
        // As redis-rs's cluster client hands a first connection on.
        let cluster = |detail: &str| {
            RedisError::from((
                redis::ErrorKind::Io,
                "Failed to create initial connections",
                detail.to_owned(),
            ))
        };
        assert!(is_denial(&cluster(
            "Password authentication failed- AuthenticationFailed"
        )));
        assert!(!is_denial(&cluster("Connection refused (os error 111)")));
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(!is_denial(&io));
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn registry(n: usize) -> Arc<Registry> {
        Registry::new((0..n).map(|i| format!("n{i}")).collect())
    }

    fn state(reg: &Registry, i: usize) -> State {
        reg.voters
            .lock()
            .map(|v| v[i].state.clone())
            .unwrap_or(State::Admitted)
    }

    fn is_admitted(reg: &Registry, i: usize) -> bool {
        matches!(reg.begin(i), Ok(None))
    }

    #[test]
    fn a_voter_sharing_an_id_with_an_admitted_one_is_refused_for_good() {
        let reg = registry(3);
        assert_eq!(reg.settle(0, Read::Ids(ids(&["r1"])), &[]), Ok(()));
        assert!(is_admitted(&reg, 0));
        // #3 has not answered: not admitted, and asked again only after the gap.
        assert!(matches!(reg.begin(2), Ok(Some(_))));
        assert!(
            reg.settle(2, Read::NoAnswer("timed out".into()), &[])
                .is_err()
        );
        assert!(reg.begin(2).is_err(), "read again within the gap");
        // #2 is #1's store under another address.
        let why = reg.settle(1, Read::Ids(ids(&["r1"])), &[]).unwrap_err();
        assert!(why.contains("voters #1 (n0) and #2 (n1)"), "{why}");
        assert!(reg.begin(1).is_err());
        // A refusal is for good, whatever a later read finds.
        assert!(reg.settle(1, Read::Ids(ids(&["r2"])), &[]).is_err());
        assert!(reg.begin(1).is_err());
        // The refused voter is not compared with: #1 stays admitted.
        assert!(is_admitted(&reg, 0));
    }

    #[test]
    fn a_restart_does_not_hide_a_duplicate_read_late() {
        // #1 admitted with run_id r1; #2 (its store) silent at build; the server restarts
        // (run_id r2); #2 is read late, and #1 is read again with it.
        let reg = registry(3);
        assert_eq!(reg.settle(0, Read::Ids(ids(&["r1"])), &[]), Ok(()));
        assert_eq!(reg.settle(2, Read::Ids(ids(&["x"])), &[]), Ok(()));
        let fresh = [(0, Read::Ids(ids(&["r2"]))), (2, Read::Ids(ids(&["x"])))];
        let why = reg.settle(1, Read::Ids(ids(&["r2"])), &fresh).unwrap_err();
        assert!(why.contains("voters #1 (n0) and #2 (n1)"), "{why}");
    }

    #[test]
    fn a_voter_silent_when_another_is_read_late_is_read_again_before_it_votes() {
        let reg = registry(3);
        assert_eq!(reg.settle(0, Read::Ids(ids(&["r1"])), &[]), Ok(()));
        assert_eq!(reg.settle(2, Read::Ids(ids(&["x"])), &[]), Ok(()));
        // #2 is read late while #1 is silent; #2's server restarted (r2): nothing is
        // known to match, #2 is admitted, and #1 is no longer.
        let fresh = [
            (0, Read::NoAnswer("timed out".into())),
            (2, Read::Ids(ids(&["x"]))),
        ];
        assert_eq!(reg.settle(1, Read::Ids(ids(&["r2"])), &fresh), Ok(()));
        assert!(matches!(state(&reg, 0), State::Unknown { .. }));
        // #1 comes back as the same server as #2: refused.
        assert!(matches!(reg.begin(0), Ok(Some(_))));
        let why = reg.settle(0, Read::Ids(ids(&["r2"])), &[]).unwrap_err();
        assert!(why.contains("are one Redis server"), "{why}");
        assert!(is_admitted(&reg, 1));
    }

    #[test]
    fn two_voters_admitted_apart_that_answer_one_id_now_keep_only_the_first() {
        // #1 read while its server had run_id r1, #2 (the same server) after a restart
        // (r2): both admitted. A later admission reads them again: both answer r2.
        let reg = registry(3);
        assert_eq!(reg.settle(0, Read::Ids(ids(&["r1"])), &[]), Ok(()));
        assert_eq!(reg.settle(1, Read::Ids(ids(&["r2"])), &[]), Ok(()));
        let fresh = [(0, Read::Ids(ids(&["r2"]))), (1, Read::Ids(ids(&["r2"])))];
        assert_eq!(reg.settle(2, Read::Ids(ids(&["x"])), &fresh), Ok(()));
        assert!(is_admitted(&reg, 0));
        assert!(matches!(state(&reg, 1), State::Refused(_)));
        assert!(is_admitted(&reg, 2));
    }

    #[test]
    fn one_store_given_twice_is_found() {
        let v = |state: State, i: &[&str]| Voter { state, ids: ids(i) };
        let voters = vec![
            v(State::Admitted, &["a", "x"]),
            v(
                State::Unknown {
                    last: None,
                    reading: false,
                },
                &[],
            ),
            v(State::Refused("dup".into()), &["y"]),
            v(
                State::Unknown {
                    last: None,
                    reading: false,
                },
                &["z"],
            ),
        ];
        assert_eq!(same_store(&voters, 1, &ids(&["c"])), None);
        assert_eq!(same_store(&voters, 1, &ids(&["q", "x"])), Some(0));
        assert_eq!(same_store(&voters, 0, &ids(&["a"])), None, "itself");
        assert_eq!(
            same_store(&voters, 1, &ids(&["y"])),
            None,
            "a refused voter"
        );
        assert_eq!(
            same_store(&voters, 1, &ids(&["z"])),
            Some(3),
            "a voter read before"
        );
        assert_eq!(same_store(&voters, 1, &[]), None);
    }

    #[test]
    fn a_refused_read_refuses_the_voter() {
        let reg = registry(1);
        let why = reg
            .settle(
                0,
                Read::Refused(
                    "NOPERM this user has no permissions to run the 'info' command".into(),
                ),
                &[],
            )
            .unwrap_err();
        assert!(why.contains("NOPERM") && why.contains("INFO"), "{why}");
        assert!(reg.begin(0).is_err());
    }

    #[test]
    fn a_cancelled_read_lets_the_next_request_read() {
        let reg = registry(1);
        let guard = reg.begin(0);
        assert!(matches!(guard, Ok(Some(_))));
        assert!(reg.begin(0).is_err(), "a read is under way");
        drop(guard);
        // Within the gap it is not read again; the gap is short.
        assert!(reg.begin(0).is_err());
        if let Ok(mut v) = reg.voters.lock()
            && let State::Unknown { last, .. } = &mut v[0].state
        {
            *last = Instant::now().checked_sub(RETRY_GAP);
        }
        assert!(matches!(reg.begin(0), Ok(Some(_))));
    }
}
