//! The direct path to a Redis Cluster voter's shard masters.
//!
//! redis-rs's async cluster client hands every command to a task of its own, which sends
//! it on that node's connection and hands the reply back: a hop there and back on every
//! request, which made an uncontended lock cycle on cluster voters a quarter slower than
//! on plain masters. Every key of a lock lives in one slot, so a request whose slot is
//! known goes straight to that slot's master instead, over a connection of its own (a
//! [`ConnectionManager`], as a plain master has), found in a slot map read with
//! `CLUSTER SLOTS`. The cluster client stays for everything else: reading the slot map,
//! commands without a key, pipelines, and whatever the direct path cannot finish:
//!
//! * no slot map yet, or no master known for the slot: the cluster client (and the map
//!   is read in the background);
//! * `MOVED` or `ASK` from the master: Redis refused the command before running any of
//!   it (it checks every key's slot first), so the cluster client, which follows the
//!   redirect, sends it once more, and only once; the map is read again;
//! * an I/O error or a dropped connection: the request may have run, so the direct path
//!   does not send it again; the caller's rules apply, as on a plain master (an
//!   idempotent script is sent again, an acquisition never). The map is read again (a
//!   crashed master's replica may have taken over), as it is when the caller stops
//!   waiting for an answer (a master paused or cut off).
//!
//! A `MOVED` also names the slot's new master, which the map takes at once. Readings of
//! the whole map are one at a time and at least [`REFRESH_GAP`] apart.
//!
//! A stale map is never unsafe: a cluster node refuses (`MOVED`) a key of a slot it does
//! not serve, and the direct path never sends `ASKING`.
//!
//! Order. A request and its clean-up go the same way while the map stays the same (the
//! same connection, in the order issued), as on a plain master. A map read in between
//! can send the clean-up of an acquisition that timed out on one connection over
//! another; if the acquisition then still lands, its key lives until its TTL, as when a
//! node is restarted: liveness, never safety.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisResult, Value};

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// Marks a slot with no master known in [`Routes::slots`].
const NONE: u16 = u16::MAX;

/// The least time between two readings of the slot map (a master that is down makes
/// every request to it ask for one).
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// A voter's shard masters, by slot.
struct Routes {
    /// For each slot, its master's index in `masters`, or [`NONE`].
    slots: Vec<u16>,
    /// Each master's address (`host:port`) and connection.
    masters: Vec<(String, ConnectionManager)>,
}

impl Routes {
    fn empty() -> Routes {
        Routes {
            slots: Vec::new(),
            masters: Vec::new(),
        }
    }

    fn master(&self, slot: u16) -> Option<&ConnectionManager> {
        let i = *self.slots.get(usize::from(slot))?;
        self.masters.get(usize::from(i)).map(|(_, c)| c)
    }
}

/// The direct path of one Redis Cluster voter (see the module docs).
pub(crate) struct Direct {
    /// How to reach a master: a seed's settings (credentials, TCP settings), its address
    /// replaced by the master's.
    template: ConnectionInfo,
    connect_timeout: Duration,
    routes: RwLock<Arc<Routes>>,
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

impl Direct {
    /// The direct path of a voter whose seeds are `seeds`; `None` for TLS seeds (their
    /// requests all go through the cluster client).
    pub(crate) fn new(
        seeds: &[ConnectionInfo],
        tcp: redis::io::tcp::TcpSettings,
        connect_timeout: Duration,
    ) -> Option<Direct> {
        let first = seeds.first()?;
        if !seeds
            .iter()
            .all(|s| matches!(s.addr(), ConnectionAddr::Tcp(..)))
        {
            return None;
        }
        Some(Direct {
            template: first.clone().set_tcp_settings(tcp),
            connect_timeout,
            routes: RwLock::new(Arc::new(Routes::empty())),
            refreshing: AtomicBool::new(false),
            last: Mutex::new(None),
        })
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

    /// Sends `cmd`, whose keys are all in `slot`, to the slot's master, or says to use the
    /// cluster client (reading the slot map again in the background, through `client`,
    /// when the map was missing or wrong).
    pub(crate) async fn send(
        self: &Arc<Self>,
        cmd: &Cmd,
        slot: u16,
        client: &ClusterConnection,
    ) -> Sent {
        let Some(mut conn) = self.routes().master(slot).cloned() else {
            self.refresh(client);
            return Sent::Redirect;
        };
        // A request its caller stopped waiting for (a master paused, cut off, or crashed
        // with its connection still open) has the map read again: its replica may have
        // taken over meanwhile.
        let mut unanswered = Unanswered {
            direct: self,
            client,
            answered: false,
        };
        let reply = conn.req_packed_command(cmd).await;
        unanswered.answered = true;
        match reply {
            // (A server's error reply comes as a value, or as an error.)
            Ok(Value::ServerError(e)) if e.kind().is_some_and(redirected) => {
                self.redirected(e.kind(), e.details(), client);
                Sent::Redirect
            }
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(k) if redirected(k)) => {
                let kind = match e.kind() {
                    redis::ErrorKind::Server(k) => Some(k),
                    _ => None,
                };
                self.redirected(kind, e.detail(), client);
                Sent::Redirect
            }
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.refresh(client);
                }
                Sent::Done(Err(e))
            }
            ok => Sent::Done(ok),
        }
    }

    /// After a redirect: a `MOVED` names the slot's master now (`<slot> <host>:<port>`),
    /// which the map takes at once (another node's answer to `CLUSTER SLOTS` may not know
    /// it yet); an `ASK` is for one request only. Either way the whole map is read again.
    fn redirected(
        self: &Arc<Self>,
        kind: Option<redis::ServerErrorKind>,
        detail: Option<&str>,
        client: &ClusterConnection,
    ) {
        if kind == Some(redis::ServerErrorKind::Moved)
            && let Some((slot, host, port)) = detail.and_then(moved_to)
        {
            self.set_master(slot, &host, port);
        }
        self.refresh(client);
    }

    /// Routes `slot` to the master at `host:port`.
    fn set_master(&self, slot: u16, host: &str, port: u16) {
        let old = self.routes();
        let addr = format!("{host}:{port}");
        let mut masters = old.masters.clone();
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
        let mut slots = if old.slots.len() == SLOTS {
            old.slots.clone()
        } else {
            vec![NONE; SLOTS]
        };
        if let Some(x) = slots.get_mut(usize::from(slot)) {
            *x = i;
        }
        if let Ok(mut r) = self.routes.write() {
            *r = Arc::new(Routes { slots, masters });
        }
    }

    /// Reads the slot map again in the background, unless a reading is under way or the
    /// last one began less than [`REFRESH_GAP`] ago.
    fn refresh(self: &Arc<Self>, client: &ClusterConnection) {
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
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let (me, mut client) = (self.clone(), client.clone());
        drop(rt.spawn(async move {
            let read = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
            let answer = tokio::time::timeout(me.connect_timeout, client.req_packed_command(&read));
            if let Ok(Ok(v)) = answer.await {
                me.install(&slot_ranges(&v));
            }
            me.refreshing.store(false, Ordering::Release);
        }));
    }

    /// Installs a slot map read from `CLUSTER SLOTS`, keeping the connection of every
    /// master that stays.
    fn install(&self, ranges: &[(u16, u16, String, u16)]) {
        let old = self.routes();
        let mut kept: HashMap<&str, &ConnectionManager> =
            old.masters.iter().map(|(a, c)| (a.as_str(), c)).collect();
        let mut masters: Vec<(String, ConnectionManager)> = Vec::new();
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
        if let Ok(mut r) = self.routes.write() {
            *r = Arc::new(Routes { slots, masters });
        }
    }

    /// A lazy connection to the master at `host:port` (the first command connects; a
    /// dropped connection is made again on the next one), configured as a plain master's.
    fn connect(&self, host: &str, port: u16) -> Option<ConnectionManager> {
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
        ConnectionManager::new_lazy_with_config(client, config).ok()
    }
}

/// Reads the slot map again when dropped before its request was answered.
struct Unanswered<'a> {
    direct: &'a Arc<Direct>,
    client: &'a ClusterConnection,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.direct.refresh(self.client);
        }
    }
}

/// Whether a server error says the command went to the wrong node and did not run.
fn redirected(kind: redis::ServerErrorKind) -> bool {
    matches!(
        kind,
        redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask
    )
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

/// The slot ranges of a `CLUSTER SLOTS` answer, each with its master's host and port:
/// `[[start, end, [host, port, id, …], replicas…], …]`. A range whose master has no
/// usable host (`""` or `"?"`: unknown to the node asked) is left out (its slots go
/// through the cluster client), as is anything unreadable.
pub(crate) fn slot_ranges(v: &Value) -> Vec<(u16, u16, String, u16)> {
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges.iter().filter_map(slot_range).collect()
}

fn slot_range(v: &Value) -> Option<(u16, u16, String, u16)> {
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
        _ => return None,
    };
    if host.is_empty() || host == "?" || start > end {
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
            range(10923, 16383, bulk(""), 7002),
            range(9, 3, bulk("127.0.0.1"), 7003),
            range(0, 70000, bulk("127.0.0.1"), 7004),
            Value::Int(3),
        ]);
        assert_eq!(
            slot_ranges(&v),
            vec![
                (0, 5460, "127.0.0.1".to_owned(), 7000),
                (5461, 10922, "::1".to_owned(), 7001),
            ]
        );
        assert!(slot_ranges(&Value::Nil).is_empty());
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
    fn only_moved_and_ask_go_to_the_cluster_client() {
        use redis::ServerErrorKind as K;
        assert!(redirected(K::Moved) && redirected(K::Ask));
        assert!(!redirected(K::TryAgain) && !redirected(K::NoScript));
        assert!(!redirected(K::ClusterDown));
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
        // A slot moved to a new master; 7001 keeps its connection object.
        d.install(&[
            (0, 99, "127.0.0.1".into(), 7002),
            (100, 16383, "127.0.0.1".into(), 7001),
        ]);
        let r = d.routes();
        let names: Vec<&str> = r.masters.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(names, ["127.0.0.1:7002", "127.0.0.1:7001"]);
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
