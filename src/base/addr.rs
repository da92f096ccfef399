//! A node's address as it may be shown: in errors, `Debug` output, tracing and the CLI.
//!
//! Kept apart from the connection code so that the error types can name a node without
//! depending on how nodes are talked to.

use std::fmt;
use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo};

/// A node's address, printed without its password.
///
/// This is how nodes appear in [`Votes`](crate::Votes), in `Debug` output and in tracing:
/// `redis://user:<redacted>@127.0.0.1:7001/0`. It never contains a password.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// let locks = quorumlock::Redlock::builder(["redis://app:s3cret@127.0.0.1:7001"]).build().await?;
/// let shown = locks.nodes()[0].to_string();
/// assert_eq!(shown, "redis://app:<redacted>@127.0.0.1:7001");
/// assert!(!format!("{locks:?}").contains("s3cret"));
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    shown: Arc<str>,
    /// Where the node is, without the user: scheme, host, port, db.
    place: Arc<str>,
    host: Arc<str>,
    port: Option<u16>,
}

impl NodeAddr {
    pub(crate) fn from_info(info: &ConnectionInfo) -> NodeAddr {
        let rs = info.redis_settings();
        let user = match (rs.username(), rs.password()) {
            (Some(u), Some(_)) => format!("{u}:<redacted>@"),
            (None, Some(_)) => ":<redacted>@".to_owned(),
            (Some(u), None) => format!("{u}@"),
            (None, None) => String::new(),
        };
        let db = if rs.db() != 0 {
            format!("/{}", rs.db())
        } else {
            String::new()
        };
        let (scheme, host, port) = match info.addr() {
            ConnectionAddr::Tcp(h, p) => ("redis", h.clone(), Some(*p)),
            ConnectionAddr::TcpTls { host, port, .. } => ("rediss", host.clone(), Some(*port)),
            ConnectionAddr::Unix(p) => ("redis+unix", p.display().to_string(), None),
            _ => ("redis", "?".to_owned(), None),
        };
        let shown = match port {
            Some(p) if host.contains(':') => format!("{scheme}://{user}[{host}]:{p}{db}"),
            Some(p) => format!("{scheme}://{user}{host}:{p}{db}"),
            None if user.is_empty() && db.is_empty() => format!("{scheme}://{host}"),
            None => format!("{scheme}://{user}{host}{db}"),
        };
        let place = match port {
            Some(p) if host.contains(':') => format!("{scheme}://[{host}]:{p}{db}"),
            Some(p) => format!("{scheme}://{host}:{p}{db}"),
            None => format!("{scheme}://{host}{db}"),
        };
        NodeAddr {
            shown: shown.into(),
            place: place.into(),
            host: host.into(),
            port,
        }
    }

    /// The node's place without its user: `scheme://host:port[/db]`. Two URLs of one node
    /// with different users have the same place.
    /// A Redis Cluster voter's address: `redis+cluster://` and its seeds, sorted (so the
    /// order they were given in does not change the group map's fingerprint); host and
    /// port are the first seed's.
    pub(crate) fn cluster(seeds: &[ConnectionInfo]) -> NodeAddr {
        let each: Vec<NodeAddr> = seeds.iter().map(NodeAddr::from_info).collect();
        let tls = each.iter().any(|a| a.place.starts_with("rediss://"));
        let scheme = if tls {
            "rediss+cluster://"
        } else {
            "redis+cluster://"
        };
        let strip = |s: &str| s.split_once("://").map_or(s, |(_, r)| r).to_owned();
        let mut places: Vec<String> = each.iter().map(|a| strip(&a.place)).collect();
        places.sort();
        let user = each
            .first()
            .map(|a| strip(&a.shown))
            .and_then(|s| s.rsplit_once('@').map(|(u, _)| format!("{u}@")))
            .unwrap_or_default();
        let hosts: Vec<String> = each
            .iter()
            .map(|a| strip(&a.shown))
            .map(|s| s.rsplit_once('@').map_or(s.clone(), |(_, h)| h.to_owned()))
            .collect();
        let first = each.first();
        NodeAddr {
            shown: format!("{scheme}{user}{}", hosts.join(",")).into(),
            place: format!("{scheme}{}", places.join(",")).into(),
            host: first.map_or_else(|| "?".into(), |a| a.host.clone()),
            port: first.and_then(|a| a.port),
        }
    }

    pub(crate) fn place(&self) -> &str {
        &self.place
    }

    /// The host name or IP address (or the socket path for `redis+unix://`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.nodes()[0].host(), "127.0.0.1");
    /// # Ok(()) }
    /// ```
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port, `None` for a Unix socket.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// assert_eq!(locks.nodes()[0].port(), Some(7001));
    /// # Ok(()) }
    /// ```
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}
