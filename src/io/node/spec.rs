//! A node's URL, parsed and checked before anything connects: one master
//! (`redis://`, `rediss://`) or a Redis Cluster voter's seeds (`redis+cluster://`), and
//! the TLS settings it carries.

use super::*;

/// A parsed, validated node URL, not yet connected.
#[derive(Clone)]
pub(crate) struct NodeSpec {
    pub(crate) addr: NodeAddr,
    /// The node's connection, or a Redis Cluster voter's first seed.
    pub(crate) info: ConnectionInfo,
    /// A Redis Cluster voter's seed nodes (`redis+cluster://`), `None` for one master.
    pub(crate) seeds: Option<Arc<[ConnectionInfo]>>,
    /// The TLS settings of a `rediss+cluster://` voter's nodes: the certificate authorities
    /// they are checked against and the client certificate they are shown
    /// ([`NodeSpec::with_tls`]; a single master keeps them in `info`).
    #[cfg(feature = "tls-rustls")]
    pub(super) tls: Option<redis::TlsCertificates>,
}

impl NodeSpec {
    /// Parses one URL. The error never repeats the URL (it may hold a password).
    pub(crate) fn parse(index: usize, url: &str) -> Result<NodeSpec, Error> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Error::config(
                "nodes",
                format!("node #{} has an empty URL", index + 1),
            ));
        }
        if let Some(seeds) = cluster_seeds(index, url)? {
            return NodeSpec::cluster(index, &seeds);
        }
        Ok(NodeSpec::master(NodeSpec::parse_one(index, url)?))
    }

    /// One master, its connection info checked already.
    fn master(info: ConnectionInfo) -> NodeSpec {
        NodeSpec {
            addr: NodeAddr::from_info(&info),
            info,
            seeds: None,
            #[cfg(feature = "tls-rustls")]
            tls: None,
        }
    }

    /// A Redis Cluster voter from its seed URLs (each a `redis://` or `rediss://` URL).
    fn cluster(index: usize, seeds: &[String]) -> Result<NodeSpec, Error> {
        let infos = seeds
            .iter()
            .map(|u| NodeSpec::parse_one(index, u))
            .collect::<Result<Vec<_>, Error>>()?;
        let Some(first) = infos.first().cloned() else {
            return Err(Error::config(
                "nodes",
                format!(
                    "node #{} is a redis+cluster:// URL without a host",
                    index + 1
                ),
            ));
        };
        Ok(NodeSpec {
            addr: NodeAddr::cluster(&infos),
            info: first,
            seeds: Some(infos.into()),
            #[cfg(feature = "tls-rustls")]
            tls: None,
        })
    }

    /// Whether this voter is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.seeds.is_some()
    }

    /// Parses one node's `redis://`, `rediss://` or `redis+unix://` URL.
    fn parse_one(index: usize, url: &str) -> Result<ConnectionInfo, Error> {
        let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s));
        if !scheme_ok {
            return Err(Error::config(
                "nodes",
                format!(
                    "node #{} is not a redis://, rediss:// or redis+unix:// URL",
                    index + 1
                ),
            ));
        }
        let info = url.into_connection_info().map_err(|e| {
            Error::config(
                "nodes",
                format!(
                    "node #{} is not a valid Redis URL ({})",
                    index + 1,
                    e.kind_str()
                ),
            )
        })?;
        NodeSpec::checked(index, info)
    }

    /// One master from redis-rs's connection info, checked as a URL is.
    pub(crate) fn from_info(index: usize, info: ConnectionInfo) -> Result<NodeSpec, Error> {
        Ok(NodeSpec::master(NodeSpec::checked(index, info)?))
    }

    /// `info` when quorumlock can connect to it as configured: TLS only with a TLS
    /// feature, and never without checking certificates.
    fn checked(index: usize, info: ConnectionInfo) -> Result<ConnectionInfo, Error> {
        if let ConnectionAddr::TcpTls { insecure, .. } = info.addr() {
            if !cfg!(feature = "tls-rustls") {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} uses rediss:// but quorumlock was built without TLS \
                         (enable the `tls-rustls` feature)",
                        index + 1
                    ),
                ));
            }
            if *insecure {
                return Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} asks for #insecure (no certificate check), which quorumlock \
                         does not support: give the servers' certificate authority with \
                         tls_root_ca instead",
                        index + 1
                    ),
                ));
            }
        }
        Ok(info)
    }

    /// Whether the node is reached over TLS (`rediss://`).
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// For a `rediss://` node: these TLS settings (validated already, see
    /// [`tls::certificates`]) instead of redis-rs's defaults. Other nodes are returned
    /// unchanged.
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn with_tls(
        mut self,
        certs: &redis::TlsCertificates,
        field: &'static str,
    ) -> Result<NodeSpec, Error> {
        if !self.is_tls() {
            return Ok(self);
        }
        if self.is_cluster() {
            self.tls = Some(certs.clone());
            return Ok(self);
        }
        // The error's text is redis-rs's kind only: its detail could quote the PEM.
        let client = redis::Client::build_with_tls(self.info.clone(), certs.clone())
            .map_err(|e| Error::config(field, format!("{}: {}", self.addr, e.kind_str())))?;
        self.info = client.get_connection_info().clone();
        Ok(self)
    }

    /// Whether two specs name the same node (same address and database).
    pub(crate) fn same_node(&self, other: &NodeSpec) -> bool {
        let one = |s: &NodeSpec| {
            s.seeds
                .clone()
                .unwrap_or_else(|| Arc::new([s.info.clone()]))
        };
        let (a, b) = (one(self), one(other));
        a.iter().any(|x| {
            b.iter()
                .any(|y| x.addr() == y.addr() && x.redis_settings().db() == y.redis_settings().db())
        })
    }
}

/// The seed URLs of a `redis+cluster://` or `rediss+cluster://` voter URL, `None` for
/// any other URL. The form is `redis+cluster://[user[:password]@]host:port[,host:port…]`:
/// the credentials apply to every node, and a cluster has no database to choose.
fn cluster_seeds(index: usize, url: &str) -> Result<Option<Vec<String>>, Error> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Error::config(
            "nodes",
            format!(
                "node #{} is not a valid redis+cluster:// URL ({why})",
                index + 1
            ),
        )
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    if user.contains(',') {
        return Err(bad(
            "credentials for each seed: give them once, before the hosts",
        ));
    }
    if hosts.contains('/') || hosts.contains('?') {
        return Err(bad("a path, database or parameter after the hosts"));
    }
    let seeds: Vec<String> = hosts
        .split(',')
        .map(|h| format!("{scheme}://{user}{}", h.trim()))
        .collect();
    if hosts.split(',').any(|h| h.trim().is_empty()) {
        return Err(bad("an empty host in the list"));
    }
    Ok(Some(seeds))
}

/// One node as given to the builder: a URL (parsed at `build()`, where every scheme of
/// quorumlock's is known, `redis+cluster://` included), or redis-rs's connection info
/// (converted when given; a conversion error is reported at `build()`).
#[derive(Clone)]
pub(crate) enum NodeInput {
    Url(String),
    Info(Box<Result<ConnectionInfo, &'static str>>),
}

impl NodeInput {
    /// From anything redis-rs can connect with.
    pub(crate) fn info(node: impl IntoConnectionInfo) -> NodeInput {
        NodeInput::Info(Box::new(
            node.into_connection_info().map_err(|e| e.kind_str()),
        ))
    }

    /// Node `index`'s validated spec.
    pub(crate) fn spec(&self, index: usize) -> Result<NodeSpec, Error> {
        match self {
            NodeInput::Url(url) => NodeSpec::parse(index, url),
            NodeInput::Info(info) => match &**info {
                Ok(info) => NodeSpec::from_info(index, info.clone()),
                Err(kind) => Err(Error::config(
                    "nodes",
                    format!(
                        "node #{} is not a valid Redis connection ({kind})",
                        index + 1
                    ),
                )),
            },
        }
    }
}
