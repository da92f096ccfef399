//! The direct path to a Redis Cluster voter's shard masters.
//!
//! redis-rs's async cluster client hands every command to a task of its own, which sends
//! it on that node's connection and hands the reply back: a hop there and back on every
//! request, which made an uncontended lock cycle on cluster voters a quarter slower than
//! on plain masters. Every key of a lock lives in one slot, so a request whose slot is
//! known goes straight to that slot's master instead, over a connection of its own (a
//! [`ConnectionManager`], as a plain master has), found in a slot map read with
//! `CLUSTER SLOTS`. No lock request (every request with a slot: acquire, extend,
//! release, fence commit, queue joins) goes through the cluster client; it keeps the
//! commands without a slot (the group-map record, start-up checks) and the pipelines of
//! `peek`, and reads the map when no master or seed answers the direct path's own
//! reading.
//!
//! * `MOVED`: Redis refused the command before running any of it (it checks every key's
//!   slot first). The map takes the master the `MOVED` names (a `MOVED` without a host
//!   names the node that answered), the request goes there, and the whole map is read
//!   again in the background. At most [`HOPS`] redirects per request; then it fails.
//! * `ASK` (a slot half-way through a migration, the key already moved): `ASKING` and the
//!   request, in one pipeline, on the direct connection to the importing master. Its
//!   clean-up meets the same `ASK` (or, once the migration ended, the map's `MOVED` to the
//!   same master) and goes on the same connection.
//! * a slot with no master known: the request asks for a reading of the map and waits
//!   for one that names a master, asking again every [`REFRESH_GAP`] (its caller's timeout
//!   bounds the wait).
//! * an I/O error or a dropped connection: the request may have run, so it is not sent
//!   again here; the caller's rules apply, as on a plain master (an idempotent script is
//!   sent again, an acquisition never). The map is read again (a crashed master's replica
//!   may have taken over), as it is when the caller stops waiting for an answer (a master
//!   paused or cut off).
//!
//! A stale map is never unsafe: a cluster node refuses (`MOVED`) a key of a slot it does
//! not serve before running anything, and `ASKING` is sent only where an `ASK` pointed.
//!
//! Order. A request and its clean-up (sent once the request's future completed or timed
//! out) must reach a node in that order. One connection is kept per master address for
//! the voter's life, whatever the map says meanwhile, and every lock request to that
//! address goes on it: to one node, requests are written to one socket in the order
//! issued, as on a plain master. (An address is `host:port` as the cluster names it; a
//! node the cluster names under two addresses, which Redis does not do by itself, would
//! get two sockets. Connections are not closed when their node leaves the map: a voter
//! keeps one per address it ever met.)
//!
//! Readings of the whole map run in the background, one at a time, at least
//! [`REFRESH_GAP`] apart; each asks the known masters, then the seeds, then the cluster
//! client, until one answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisError, RedisResult, Value};

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// Marks a slot with no master known in [`Routes::slots`].
const NONE: u16 = u16::MAX;

/// The least time between two readings of the slot map (a master that is down makes
/// every request to it ask for one).
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// How many redirects (`MOVED`, `ASK`) one request follows.
const HOPS: usize = 3;

/// One master: its address (`host:port`, shared: a request clones it) and the connection
/// kept for it.
type Master = (Arc<str>, Arc<ConnectionManager>);

/// A voter's shard masters, by slot.
struct Routes {
    /// For each slot, its master's index in `masters`, or [`NONE`].
    slots: Vec<u16>,
    masters: Vec<Master>,
}

impl Routes {
    fn empty() -> Routes {
        Routes {
            slots: Vec::new(),
            masters: Vec::new(),
        }
    }

    fn master(&self, slot: u16) -> Option<&Master> {
        let i = *self.slots.get(usize::from(slot))?;
        self.masters.get(usize::from(i))
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
    /// The cluster client, asked for the map when no master or seed answers.
    client: ClusterConnection,
    routes: RwLock<Arc<Routes>>,
    /// Every connection made, by address, kept for the voter's life: one socket per node.
    conns: Mutex<HashMap<String, Arc<ConnectionManager>>>,
    /// Counts the maps installed (a request with no master known waits for the next).
    installed: tokio::sync::watch::Sender<u64>,
    /// A reading of the slot map is under way.
    refreshing: AtomicBool,
    /// When the last reading began.
    last: Mutex<Option<Instant>>,
}

/// What a master's answer means for the direct path.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// `MOVED`: the slot's master now, if the answer names one.
    Moved(Option<(String, u16)>),
    /// `ASK`: the importing master, for this request only.
    Ask(Option<(String, u16)>),
    /// An I/O error or a dropped connection: the map may be stale.
    Broken,
    /// Anything else, for the caller.
    Final,
}

impl Direct {
    /// The direct path of a voter whose seeds are `seeds`, beside its cluster client;
    /// `None` for TLS seeds (their requests all go through the cluster client).
    pub(crate) fn new(
        seeds: &[ConnectionInfo],
        tcp: redis::io::tcp::TcpSettings,
        connect_timeout: Duration,
        client: ClusterConnection,
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
            client,
            routes: RwLock::new(Arc::new(Routes::empty())),
            conns: Mutex::new(HashMap::new()),
            installed: tokio::sync::watch::Sender::new(0),
            refreshing: AtomicBool::new(false),
            last: Mutex::new(None),
        }))
    }

    /// The address (`host:port`) of the master the map routes `slot` to.
    #[cfg(test)]
    pub(crate) fn master_of(&self, slot: u16) -> Option<String> {
        self.routes().master(slot).map(|(a, _)| a.to_string())
    }

    fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .map(|r| r.clone())
            .unwrap_or_else(|_| Arc::new(Routes::empty()))
    }

    /// Sends `cmd`, whose keys are all in `slot`, to the slot's master, following `MOVED`
    /// and `ASK` on the direct connections (see the module docs).
    pub(crate) async fn send(self: &Arc<Self>, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        let mut ask: Option<Master> = None;
        for _ in 0..=HOPS {
            let asking = ask.is_some();
            let (addr, conn) = match ask.take() {
                Some(m) => m,
                None => self.master(slot).await,
            };
            let reply = self.exchange(&conn, cmd, asking).await;
            let asked = addr.rsplit_once(':').map_or("", |(h, _)| h);
            match answer(&reply, asked) {
                Answer::Moved(Some((host, port))) => {
                    self.refresh();
                    self.set_master(slot, &host, port);
                }
                Answer::Ask(Some((host, port))) => {
                    let to = format!("{host}:{port}");
                    let Some(c) = self.conn_for(&host, port) else {
                        return reply;
                    };
                    ask = Some((to.into(), c));
                }
                Answer::Broken | Answer::Moved(None) => {
                    self.refresh();
                    return reply;
                }
                Answer::Ask(None) | Answer::Final => return reply,
            }
        }
        Err(RedisError::from((
            redis::ErrorKind::Client,
            "too many cluster redirects",
        )))
    }

    /// The master the map routes `slot` to; with none known, the one a later reading of
    /// the map says (asked for now, and again every [`REFRESH_GAP`] while none does; the
    /// caller's timeout bounds the wait).
    async fn master(self: &Arc<Self>, slot: u16) -> Master {
        if let Some(m) = self.routes().master(slot) {
            return m.clone();
        }
        let mut next = self.installed.subscribe();
        loop {
            if let Some(m) = self.routes().master(slot) {
                return m.clone();
            }
            self.refresh();
            // A reading that installs nothing, or a map still without the slot, wakes no
            // one: look again after the gap.
            let _ = tokio::time::timeout(REFRESH_GAP, next.changed()).await;
        }
    }

    /// One request on one master's connection (after `ASKING`, in one pipeline, when an
    /// `ASK` sent it there); a request its caller stopped waiting for (a master paused,
    /// cut off, or crashed with its connection still open) has the map read again: its
    /// replica may have taken over meanwhile.
    async fn exchange(
        self: &Arc<Self>,
        conn: &ConnectionManager,
        cmd: &Cmd,
        asking: bool,
    ) -> RedisResult<Value> {
        let mut unanswered = Unanswered {
            direct: self,
            answered: false,
        };
        let mut conn = conn.clone();
        let reply = if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            conn.req_packed_commands(&pipe, 1, 1)
                .await
                .and_then(|mut v| {
                    v.pop().ok_or_else(|| {
                        RedisError::from((redis::ErrorKind::Parse, "no answer after ASKING"))
                    })
                })
        } else {
            conn.req_packed_command(cmd).await
        };
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

    /// Reads `CLUSTER SLOTS` from the known masters, then the seeds, then through the
    /// cluster client, until one answers with a map, and installs it.
    async fn read(&self) {
        let mut asked: Vec<(String, u16)> = Vec::new();
        for (addr, _) in &self.routes().masters {
            if let Some((h, p)) = addr.rsplit_once(':')
                && let Ok(p) = p.parse()
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
            let Some(conn) = self.conn_for(&host, port) else {
                continue;
            };
            let mut conn = conn.as_ref().clone();
            let got = tokio::time::timeout(self.connect_timeout, conn.req_packed_command(&read));
            if let Ok(Ok(v)) = got.await
                && self.install(&slot_ranges(&v, &host))
            {
                return;
            }
        }
        let mut client = self.client.clone();
        let got = tokio::time::timeout(self.connect_timeout, client.req_packed_command(&read));
        if let Ok(Ok(v)) = got.await {
            self.install(&slot_ranges(&v, ""));
        }
    }

    /// The connection kept for the master at `host:port`, made now if there is none (a
    /// lazy one: the first command connects, and a dropped connection is made again on
    /// the next one), configured as a plain master's.
    fn conn_for(&self, host: &str, port: u16) -> Option<Arc<ConnectionManager>> {
        let addr = format!("{host}:{port}");
        let mut conns = self.conns.lock().ok()?;
        if let Some(c) = conns.get(&addr) {
            return Some(c.clone());
        }
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
        let conn = Arc::new(ConnectionManager::new_lazy_with_config(client, config).ok()?);
        conns.insert(addr, conn.clone());
        Some(conn)
    }

    /// Installs a slot map read from `CLUSTER SLOTS` (nothing for an empty one); whether
    /// it did.
    fn install(&self, ranges: &[(u16, u16, String, u16)]) -> bool {
        if ranges.is_empty() {
            return false;
        }
        let mut masters: Vec<Master> = Vec::new();
        let mut slots = vec![NONE; SLOTS];
        for (start, end, host, port) in ranges {
            let addr = format!("{host}:{port}");
            let i = match masters.iter().position(|(a, _)| **a == *addr) {
                Some(i) => i,
                None => {
                    let Some(conn) = self.conn_for(host, *port) else {
                        continue;
                    };
                    masters.push((addr.into(), conn));
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
        if let Ok(mut r) = self.routes.write() {
            *r = Arc::new(Routes { slots, masters });
        }
        self.installed.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    /// Routes `slot` to the master at `host:port` (a `MOVED` named it).
    fn set_master(&self, slot: u16, host: &str, port: u16) {
        let addr = format!("{host}:{port}");
        let Some(conn) = self.conn_for(host, port) else {
            return;
        };
        let Ok(mut r) = self.routes.write() else {
            return;
        };
        if r.master(slot).is_some_and(|(a, _)| **a == *addr) {
            return;
        }
        let mut masters = r.masters.clone();
        let i = match masters.iter().position(|(a, _)| **a == *addr) {
            Some(i) => i,
            None => {
                masters.push((addr.into(), conn));
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
/// value or as an error); `asked`: the host of the node that answered, which a redirect
/// without a host names.
fn answer(reply: &RedisResult<Value>, asked: &str) -> Answer {
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
    let to = || {
        detail
            .and_then(|d| moved_to(d, asked))
            .map(|(_, h, p)| (h, p))
    };
    match kind {
        Some(redis::ServerErrorKind::Moved) => Answer::Moved(to()),
        Some(redis::ServerErrorKind::Ask) => Answer::Ask(to()),
        _ => Answer::Final,
    }
}

/// The slot and master a `MOVED` or `ASK` names: `<slot> <host>:<port>` (the host may be
/// an IPv6 address: the port follows the last colon). An empty host is the node that
/// answered (`asked`), as the Redis Cluster specification says; `None` for anything else,
/// or a host unknown (`?`).
fn moved_to(detail: &str, asked: &str) -> Option<(u16, String, u16)> {
    let (slot, endpoint) = detail.trim().split_once(' ')?;
    let (host, port) = endpoint.rsplit_once(':')?;
    let slot: u16 = slot.parse().ok()?;
    let host = if host.is_empty() { asked } else { host };
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
        let at = |s: u16, h: &str, p: u16| Some((s, h.to_owned(), p));
        assert_eq!(
            moved_to("3999 127.0.0.1:6381", "x"),
            at(3999, "127.0.0.1", 6381)
        );
        assert_eq!(moved_to("7 ::1:7000", "x"), at(7, "::1", 7000));
        // No host: the node that answered.
        assert_eq!(moved_to("1 :6381", "10.0.0.9"), at(1, "10.0.0.9", 6381));
        assert_eq!(moved_to("1 :6381", ""), None);
        assert_eq!(moved_to("1 ?:6381", "x"), None);
        assert_eq!(moved_to("16384 127.0.0.1:1", "x"), None);
        assert_eq!(moved_to("1 127.0.0.1", "x"), None);
        assert_eq!(moved_to("x 127.0.0.1:1", "x"), None);
        assert_eq!(moved_to("", "x"), None);
    }

    #[test]
    fn only_moved_ask_and_broken_connections_are_the_direct_paths_own() {
        let server = |kind, detail: &str| -> RedisResult<Value> {
            Err(RedisError::from((
                redis::ErrorKind::Server(kind),
                "server",
                detail.to_owned(),
            )))
        };
        use redis::ServerErrorKind as K;
        let to = Some(("127.0.0.1".to_owned(), 6381));
        assert_eq!(
            answer(&server(K::Moved, "3999 127.0.0.1:6381"), "h"),
            Answer::Moved(to.clone())
        );
        assert_eq!(
            answer(&server(K::Ask, "3999 127.0.0.1:6381"), "h"),
            Answer::Ask(to)
        );
        assert_eq!(
            answer(&server(K::Moved, "3999 :6381"), "10.0.0.9"),
            Answer::Moved(Some(("10.0.0.9".to_owned(), 6381)))
        );
        assert_eq!(
            answer(&server(K::Moved, "garbled"), "h"),
            Answer::Moved(None)
        );
        assert_eq!(answer(&server(K::TryAgain, ""), "h"), Answer::Final);
        let io: RedisResult<Value> =
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into());
        assert_eq!(answer(&io, "h"), Answer::Broken);
        assert_eq!(answer(&Ok(Value::Okay), "h"), Answer::Final);
    }

    /// A direct path whose seed is 127.0.0.1:1 (nothing is ever sent here).
    fn direct() -> Result<Arc<Direct>, String> {
        let seed = redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1")
            .map_err(|e| e.to_string())?;
        let client = redis::cluster::ClusterClient::new(vec![seed.clone()])
            .map_err(|e| e.to_string())?
            .get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
        let tcp = redis::io::tcp::TcpSettings::default();
        Direct::new(&[seed], tcp, Duration::from_millis(50), client)
            .ok_or_else(|| "no direct path".to_owned())
    }

    #[tokio::test]
    async fn a_map_covers_its_ranges_and_one_connection_is_kept_per_master() -> Result<(), String> {
        let d = direct()?;
        assert!(
            d.routes().master(0).is_none(),
            "no map before the first reading"
        );
        assert!(d.install(&[
            (0, 99, "127.0.0.1".into(), 7000),
            (100, 16383, "127.0.0.1".into(), 7001),
        ]));
        let r = d.routes();
        assert_eq!(r.masters.len(), 2);
        assert_eq!(r.slots.get(99), Some(&0));
        assert_eq!(r.slots.get(100), Some(&1));
        assert_eq!(r.slots.get(16383), Some(&1));
        let before = r.master(100).map(|(_, c)| c.clone()).ok_or("no master")?;
        // A reading without 7001, a MOVED to it, another reading: still one connection
        // (one socket per node keeps a request and its clean-up in order).
        assert!(d.install(&[(0, 16383, "127.0.0.1".into(), 7000)]));
        d.set_master(5, "127.0.0.1", 7001);
        let moved = d
            .routes()
            .master(5)
            .map(|(_, c)| c.clone())
            .ok_or("no master")?;
        assert!(
            Arc::ptr_eq(&before, &moved),
            "MOVED made a second connection"
        );
        assert!(d.install(&[
            (0, 99, "127.0.0.1".into(), 7002),
            (100, 16383, "127.0.0.1".into(), 7001),
        ]));
        let r = d.routes();
        let names: Vec<&str> = r.masters.iter().map(|(a, _)| &**a).collect();
        assert_eq!(names, ["127.0.0.1:7002", "127.0.0.1:7001"]);
        let after = r.master(100).map(|(_, c)| c.clone()).ok_or("no master")?;
        assert!(Arc::ptr_eq(&before, &after), "the connection was not kept");
        assert!(!d.install(&[]), "an empty map is not installed");
        assert_eq!(d.master_of(100).as_deref(), Some("127.0.0.1:7001"));
        Ok(())
    }

    #[cfg(feature = "tls-rustls")]
    #[tokio::test]
    async fn tls_seeds_have_no_direct_path() -> Result<(), String> {
        let tls = redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:1")
            .map_err(|e| e.to_string())?;
        let client = redis::cluster::ClusterClient::new(vec![tls.clone()])
            .map_err(|e| e.to_string())?
            .get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
        let tcp = redis::io::tcp::TcpSettings::default;
        assert!(Direct::new(&[tls], tcp(), Duration::from_millis(50), client.clone()).is_none());
        assert!(Direct::new(&[], tcp(), Duration::from_millis(50), client).is_none());
        Ok(())
    }
}
