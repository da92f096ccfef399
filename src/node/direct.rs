//! The direct path to a Redis Cluster voter's shard masters.
//!
//! redis-rs's async cluster client hands every command to a task of its own, which sends
//! it on that node's connection and hands the reply back: a hop there and back on every
//! request, which made an uncontended lock cycle on cluster voters a quarter slower than
//! on plain masters. Every key of a lock lives in one slot, so a request whose slot is
//! known goes straight to that slot's master instead, over a connection of its own (a
//! [`ConnectionManager`], as a plain master has), found in a slot map read with
//! `CLUSTER SLOTS` from the masters (or the seeds) themselves. The cluster client stays
//! for commands without a key, pipelines, and the few requests the direct path hands it:
//!
//! * `MOVED` from the master: Redis refused the command before running any of it (it
//!   checks every key's slot first). The map takes the master the `MOVED` names, and the
//!   request goes there, on the direct path (at most [`HOPS`] times; then, or when the
//!   new master cannot be reached, through the cluster client). The whole map is read
//!   again in the background.
//! * `ASK` (a slot half-way through a migration, the key already moved): through the
//!   cluster client, which sends `ASKING` and the request to the importing master. A
//!   clean-up after such a request meets the same `ASK` and goes the same way.
//! * a slot with no master in the map: through the cluster client (the map is read again).
//! * an I/O error or a dropped connection: the request may have run, so it is not sent
//!   again here; the caller's rules apply, as on a plain master (an idempotent script is
//!   sent again, an acquisition never). The map is read again (a crashed master's replica
//!   may have taken over), as it is when the caller stops waiting for an answer (a master
//!   paused or cut off).
//!
//! A stale map is never unsafe: a cluster node refuses (`MOVED`) a key of a slot it does
//! not serve, and the direct path never sends `ASKING`.
//!
//! Order. A request and its clean-up (sent once the request's future completed or timed
//! out) go the same way: the first requests wait for the first reading of the map rather
//! than go another way, a `MOVED` is followed on the direct path to the master it names
//! (where the map then sends the clean-up too), and one connection is kept per master
//! address across readings. So they are written to one socket in the order issued, as on
//! a plain master.
//!
//! Readings of the whole map are one at a time and at least [`REFRESH_GAP`] apart; each
//! asks the known masters, then the seeds, until one answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisResult, Value};

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// Marks a slot with no master known in [`Routes::slots`].
const NONE: u16 = u16::MAX;

/// The least time between two readings of the slot map (a master that is down makes
/// every request to it ask for one).
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// How many `MOVED` in a row one request follows on the direct path.
const HOPS: usize = 3;

/// A voter's shard masters, by slot.
struct Routes {
    /// For each slot, its master's index in `masters`, or [`NONE`].
    slots: Vec<u16>,
    /// Each master's address (`host:port`) and connection.
    masters: Vec<(String, Arc<ConnectionManager>)>,
}

impl Routes {
    fn empty() -> Routes {
        Routes {
            slots: Vec::new(),
            masters: Vec::new(),
        }
    }

    fn master(&self, slot: u16) -> Option<&Arc<ConnectionManager>> {
        let i = *self.slots.get(usize::from(slot))?;
        self.masters.get(usize::from(i)).map(|(_, c)| c)
    }

    /// The connection kept for `addr`, if any.
    fn kept(&self, addr: &str) -> Option<&Arc<ConnectionManager>> {
        self.masters.iter().find(|(a, _)| a == addr).map(|(_, c)| c)
    }
}

/// The direct path of one Redis Cluster voter (see the module docs).
pub(crate) struct Direct {
    /// How to reach a master: a seed's settings (credentials, TCP settings), its address
    /// replaced by the master's.
    template: ConnectionInfo,
    /// The seeds' hosts and ports, asked for the map when no known master answers.
    seeds: Vec<(String, u16)>,
    connect_timeout: Duration,
    routes: RwLock<Arc<Routes>>,
    /// The first reading of the map, which the first requests wait for.
    first: tokio::sync::OnceCell<()>,
    /// A reading of the slot map is under way.
    refreshing: AtomicBool,
    /// When the last reading began.
    last: Mutex<Option<Instant>>,
}

/// What the direct path did with a request.
pub(crate) enum Sent {
    /// Answered (or failed in a way the caller must see: it may have run).
    Done(RedisResult<Value>),
    /// Not sent, or refused before it ran: send it through the cluster client.
    Redirect,
}

/// What an answer of a master means for the direct path.
enum Answer {
    /// `MOVED`: the slot's master now, if the answer names one.
    Moved(Option<(String, u16)>),
    /// `ASK`: for the cluster client.
    Ask,
    /// An I/O error or a dropped connection: the map may be stale.
    Broken,
    /// Anything else, for the caller.
    Final,
}

impl Direct {
    /// The direct path of a voter whose seeds are `seeds`; `None` for TLS seeds (their
    /// requests all go through the cluster client).
    pub(crate) fn new(
        seeds: &[ConnectionInfo],
        tcp: redis::io::tcp::TcpSettings,
        connect_timeout: Duration,
    ) -> Option<Arc<Direct>> {
        let first = seeds.first()?;
        let mut hosts = Vec::new();
        for s in seeds {
            let ConnectionAddr::Tcp(host, port) = s.addr() else {
                return None;
            };
            hosts.push((host.clone(), *port));
        }
        Some(Arc::new(Direct {
            template: first.clone().set_tcp_settings(tcp),
            seeds: hosts,
            connect_timeout,
            routes: RwLock::new(Arc::new(Routes::empty())),
            first: tokio::sync::OnceCell::new(),
            refreshing: AtomicBool::new(false),
            last: Mutex::new(None),
        }))
    }

    /// The address (`host:port`) of the master the map routes `slot` to.
    #[cfg(all(test, feature = "testkit"))]
    pub(crate) fn master_of(&self, slot: u16) -> Option<String> {
        let r = self.routes();
        let i = *r.slots.get(usize::from(slot))?;
        r.masters.get(usize::from(i)).map(|(a, _)| a.clone())
    }

    fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .map(|r| r.clone())
            .unwrap_or_else(|_| Arc::new(Routes::empty()))
    }

    /// Sends `cmd`, whose keys are all in `slot`, to the slot's master, following `MOVED`
    /// there, or says to use the cluster client (see the module docs).
    pub(crate) async fn send(self: &Arc<Self>, cmd: &Cmd, slot: u16) -> Sent {
        if self.first.get().is_none() {
            let read = self
                .first
                .get_or_try_init(|| async { if self.read().await { Ok(()) } else { Err(()) } });
            let _ = read.await;
        }
        for _ in 0..HOPS {
            let Some(conn) = self.routes().master(slot).cloned() else {
                self.refresh();
                return Sent::Redirect;
            };
            let reply = self.exchange(&conn, cmd).await;
            match answer(&reply) {
                Answer::Moved(to) => {
                    self.refresh();
                    match to {
                        Some((host, port)) => self.set_master(slot, &host, port),
                        None => return Sent::Redirect,
                    }
                }
                Answer::Ask => return Sent::Redirect,
                Answer::Broken => {
                    self.refresh();
                    return Sent::Done(reply);
                }
                Answer::Final => return Sent::Done(reply),
            }
        }
        Sent::Redirect
    }

    /// One request on one master's connection; a request its caller stopped waiting for
    /// (a master paused, cut off, or crashed with its connection still open) has the map
    /// read again: its replica may have taken over meanwhile.
    async fn exchange(self: &Arc<Self>, conn: &ConnectionManager, cmd: &Cmd) -> RedisResult<Value> {
        let mut unanswered = Unanswered {
            direct: self,
            answered: false,
        };
        let reply = conn.clone().req_packed_command(cmd).await;
        unanswered.answered = true;
        reply
    }

    /// Reads the slot map again in the background, unless a reading is under way or the
    /// last one began less than [`REFRESH_GAP`] ago.
    fn refresh(self: &Arc<Self>) {
        let now = Instant::now();
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.is_some_and(|t| now.saturating_duration_since(t) < REFRESH_GAP)
            || self.refreshing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        *last = Some(now);
        drop(last);
        let reading = Reading(self.clone());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        drop(rt.spawn(async move {
            reading.0.read().await;
            drop(reading);
        }));
    }

    /// Reads `CLUSTER SLOTS` from the known masters, then the seeds, until one answers
    /// with a map, and installs it. Whether one did.
    async fn read(&self) -> bool {
        let routes = self.routes();
        let mut asked: Vec<(String, u16)> = Vec::new();
        for (addr, _) in &routes.masters {
            if let Some((h, p)) = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse().ok()?)))
            {
                asked.push((h.to_owned(), p));
            }
        }
        for s in &self.seeds {
            if !asked.contains(s) {
                asked.push(s.clone());
            }
        }
        let read = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        for (host, port) in asked {
            let addr = format!("{host}:{port}");
            let Some(conn) = routes
                .kept(&addr)
                .cloned()
                .or_else(|| self.connect(&host, port))
            else {
                continue;
            };
            let got = tokio::time::timeout(self.connect_timeout, self.exchange_quiet(&conn, &read));
            if let Ok(Ok(v)) = got.await {
                let ranges = slot_ranges(&v, &host);
                if !ranges.is_empty() {
                    self.install(&ranges);
                    return true;
                }
            }
        }
        false
    }

    /// One request, with no map reading when it goes unanswered (the reading's own).
    async fn exchange_quiet(&self, conn: &ConnectionManager, cmd: &Cmd) -> RedisResult<Value> {
        conn.clone().req_packed_command(cmd).await
    }

    /// Installs a slot map read from `CLUSTER SLOTS`, keeping the connection of every
    /// master that stays.
    fn install(&self, ranges: &[(u16, u16, String, u16)]) {
        let Ok(mut r) = self.routes.write() else {
            return;
        };
        let mut kept: HashMap<&str, &Arc<ConnectionManager>> =
            r.masters.iter().map(|(a, c)| (a.as_str(), c)).collect();
        let mut masters: Vec<(String, Arc<ConnectionManager>)> = Vec::new();
        let mut slots = vec![NONE; SLOTS];
        for (start, end, host, port) in ranges {
            let addr = format!("{host}:{port}");
            let i = match masters.iter().position(|(a, _)| *a == addr) {
                Some(i) => i,
                None => {
                    let conn = match kept.remove(addr.as_str()) {
                        Some(c) => c.clone(),
                        None => match self.connect(host, *port) {
                            Some(c) => c,
                            None => continue,
                        },
                    };
                    masters.push((addr, conn));
                    masters.len() - 1
                }
            };
            let Ok(i) = u16::try_from(i) else { continue };
            for s in usize::from(*start)..=usize::from(*end).min(SLOTS - 1) {
                if let Some(x) = slots.get_mut(s) {
                    *x = i;
                }
            }
        }
        *r = Arc::new(Routes { slots, masters });
    }

    /// Routes `slot` to the master at `host:port` (a `MOVED` named it).
    fn set_master(&self, slot: u16, host: &str, port: u16) {
        let Ok(mut r) = self.routes.write() else {
            return;
        };
        let addr = format!("{host}:{port}");
        let mut masters = r.masters.clone();
        let i = match masters.iter().position(|(a, _)| *a == addr) {
            Some(i) => i,
            None => {
                let Some(conn) = self.connect(host, port) else {
                    return;
                };
                masters.push((addr, conn));
                masters.len() - 1
            }
        };
        let Ok(i) = u16::try_from(i) else { return };
        let mut slots = if r.slots.len() == SLOTS {
            r.slots.clone()
        } else {
            vec![NONE; SLOTS]
        };
        if let Some(x) = slots.get_mut(usize::from(slot)) {
            *x = i;
        }
        *r = Arc::new(Routes { slots, masters });
    }

    /// A lazy connection to the master at `host:port` (the first command connects; a
    /// dropped connection is made again on the next one), configured as a plain master's.
    fn connect(&self, host: &str, port: u16) -> Option<Arc<ConnectionManager>> {
        let info = self
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
        let client = redis::Client::open(info).ok()?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(0)
            .set_min_delay(Duration::from_millis(1))
            .set_max_delay(Duration::from_millis(100));
        ConnectionManager::new_lazy_with_config(client, config)
            .ok()
            .map(Arc::new)
    }
}

/// A reading of the map under way: clears the flag when it ends, however it ends (a
/// task dropped before it ran, at a runtime's shutdown, included).
struct Reading(Arc<Direct>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.refreshing.store(false, Ordering::Release);
    }
}

/// Reads the slot map again when dropped before its request was answered.
struct Unanswered<'a> {
    direct: &'a Arc<Direct>,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.direct.refresh();
        }
    }
}

/// What a master's answer means for the direct path (a server's error reply comes as a
/// value or as an error).
fn answer(reply: &RedisResult<Value>) -> Answer {
    let (kind, detail) = match reply {
        Ok(Value::ServerError(e)) => (e.kind(), e.details()),
        Err(e) => match e.kind() {
            redis::ErrorKind::Server(k) => (Some(k), e.detail()),
            _ if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() => {
                return Answer::Broken;
            }
            _ => return Answer::Final,
        },
        Ok(_) => return Answer::Final,
    };
    match kind {
        Some(redis::ServerErrorKind::Moved) => {
            Answer::Moved(detail.and_then(moved_to).map(|(_, h, p)| (h, p)))
        }
        Some(redis::ServerErrorKind::Ask) => Answer::Ask,
        _ => Answer::Final,
    }
}

/// The slot and new master a `MOVED` names: `<slot> <host>:<port>` (the host may be an
/// IPv6 address: the port follows the last colon). `None` for anything else, or an empty
/// host (the node knows no endpoint for it).
fn moved_to(detail: &str) -> Option<(u16, String, u16)> {
    let (slot, endpoint) = detail.trim().split_once(' ')?;
    let (host, port) = endpoint.rsplit_once(':')?;
    let slot: u16 = slot.parse().ok()?;
    if usize::from(slot) >= SLOTS || host.is_empty() || host == "?" {
        return None;
    }
    Some((slot, host.to_owned(), port.parse().ok()?))
}

/// The slot ranges of a `CLUSTER SLOTS` answer read from the node at `asked`, each with
/// its master's host and port: `[[start, end, [host, port, id, …], replicas…], …]`. A
/// master whose host the node does not know (empty, nil, `?`) or gives as any address
/// (`0.0.0.0`, `::`) is taken to be at `asked`'s host, as redis-rs's cluster client does
/// (a one-master cluster whose node was never introduced answers so for itself).
/// Anything unreadable is left out.
pub(crate) fn slot_ranges(v: &Value, asked: &str) -> Vec<(u16, u16, String, u16)> {
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges.iter().filter_map(|r| slot_range(r, asked)).collect()
}

fn slot_range(v: &Value, asked: &str) -> Option<(u16, u16, String, u16)> {
    let Value::Array(r) = v else { return None };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    let (start, end) = (int(r.first())?, int(r.get(1))?);
    let Some(Value::Array(master)) = r.get(2) else {
        return None;
    };
    let host = match master.first()? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
        Value::SimpleString(s) => s.clone(),
        Value::Nil => String::new(),
        _ => return None,
    };
    let host = match host.as_str() {
        "" | "?" | "0.0.0.0" | "::" => asked.to_owned(),
        _ => host,
    };
    if host.is_empty() || start > end {
        return None;
    }
    Some((start, end, host, int(master.get(1))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: Value, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![host, Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7999), bulk("replica")]),
        ])
    }

    #[test]
    fn reads_the_masters_of_cluster_slots() {
        let v = Value::Array(vec![
            range(0, 5460, bulk("127.0.0.1"), 7000),
            range(5461, 10922, Value::SimpleString("::1".into()), 7001),
            range(10923, 16000, bulk(""), 7002),
            range(16001, 16100, Value::Nil, 7003),
            range(16101, 16383, bulk("0.0.0.0"), 7004),
            range(9, 3, bulk("127.0.0.1"), 7005),
            range(0, 70000, bulk("127.0.0.1"), 7006),
            Value::Int(3),
        ]);
        let at = |h: &str| h.to_owned();
        assert_eq!(
            slot_ranges(&v, "10.0.0.9"),
            vec![
                (0, 5460, at("127.0.0.1"), 7000),
                (5461, 10922, at("::1"), 7001),
                (10923, 16000, at("10.0.0.9"), 7002),
                (16001, 16100, at("10.0.0.9"), 7003),
                (16101, 16383, at("10.0.0.9"), 7004),
            ]
        );
        assert!(slot_ranges(&Value::Nil, "h").is_empty());
    }

    #[test]
    fn reads_where_moved_points() {
        assert_eq!(
            moved_to("3999 127.0.0.1:6381"),
            Some((3999, "127.0.0.1".to_owned(), 6381))
        );
        assert_eq!(moved_to("7 ::1:7000"), Some((7, "::1".to_owned(), 7000)));
        assert_eq!(moved_to("16384 127.0.0.1:1"), None);
        assert_eq!(moved_to("1 :6381"), None);
        assert_eq!(moved_to("1 127.0.0.1"), None);
        assert_eq!(moved_to("x 127.0.0.1:1"), None);
        assert_eq!(moved_to(""), None);
    }

    #[test]
    fn only_moved_ask_and_broken_connections_are_the_direct_paths_own() {
        let moved: RedisResult<Value> = Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
            "moved",
            "3999 127.0.0.1:6381".to_owned(),
        )));
        assert!(matches!(answer(&moved), Answer::Moved(Some((h, 6381))) if h == "127.0.0.1"));
        let ask: RedisResult<Value> = Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::Ask),
            "ask",
            "3999 127.0.0.1:6381".to_owned(),
        )));
        assert!(matches!(answer(&ask), Answer::Ask));
        let again: RedisResult<Value> = Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
            "tryagain",
        )));
        assert!(matches!(answer(&again), Answer::Final));
        let io: RedisResult<Value> =
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into());
        assert!(matches!(answer(&io), Answer::Broken));
        assert!(matches!(answer(&Ok(Value::Okay)), Answer::Final));
    }

    #[tokio::test]
    async fn a_map_covers_its_ranges_and_keeps_its_connections() -> Result<(), String> {
        let seed = redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1")
            .map_err(|e| e.to_string())?;
        let tcp = redis::io::tcp::TcpSettings::default();
        let d = Direct::new(&[seed], tcp, Duration::from_millis(50)).ok_or("no direct path")?;
        assert!(
            d.routes().master(0).is_none(),
            "no map before the first reading"
        );
        d.install(&[
            (0, 99, "127.0.0.1".into(), 7000),
            (100, 16383, "127.0.0.1".into(), 7001),
        ]);
        let r = d.routes();
        assert_eq!(r.masters.len(), 2);
        assert_eq!(r.slots.get(99), Some(&0));
        assert_eq!(r.slots.get(100), Some(&1));
        assert_eq!(r.slots.get(16383), Some(&1));
        let before = r.master(100).cloned().ok_or("no master")?;
        // A slot moved to a new master; 7001 keeps its connection (one socket per master
        // across readings keeps a request and its clean-up in order).
        d.install(&[
            (0, 99, "127.0.0.1".into(), 7002),
            (100, 16383, "127.0.0.1".into(), 7001),
        ]);
        let r = d.routes();
        let names: Vec<&str> = r.masters.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(names, ["127.0.0.1:7002", "127.0.0.1:7001"]);
        let after = r.master(100).ok_or("no master")?;
        assert!(Arc::ptr_eq(&before, after), "the connection was not kept");
        // A MOVED keeps it too.
        d.set_master(5, "127.0.0.1", 7001);
        let moved = d.routes().master(5).cloned().ok_or("no master")?;
        assert!(
            Arc::ptr_eq(&before, &moved),
            "MOVED made a second connection"
        );
        d.install(&[]);
        assert!(
            d.routes().master(5).is_none(),
            "an empty map routes nothing"
        );
        Ok(())
    }

    #[cfg(feature = "tls-rustls")]
    #[test]
    fn tls_seeds_have_no_direct_path() -> Result<(), String> {
        let tls = redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:1")
            .map_err(|e| e.to_string())?;
        let tcp = redis::io::tcp::TcpSettings::default;
        assert!(Direct::new(&[tls], tcp(), Duration::from_millis(50)).is_none());
        assert!(Direct::new(&[], tcp(), Duration::from_millis(50)).is_none());
        Ok(())
    }
}
