//! Shared helpers for the integration tests: raw access to a node, bounded polling.
#![allow(dead_code)]

#[cfg(feature = "tls-rustls")]
pub mod pki;

use std::future::Future;
use std::time::{Duration, Instant};

use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// The resource's two herald nodes out of `n`: the nodes that announce its plain releases
/// and keep its wait queue (mirrors `resource::is_herald`: FNV-1a of the name modulo `n`,
/// and the next node).
pub fn heralds(name: &str, n: usize) -> [usize; 2] {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let first = usize::try_from(h % n as u64).unwrap_or(0);
    [first, (first + 1) % n]
}

/// The lock key of a resource (mirrors `src/resource.rs`).
pub fn lock_key(resource: &str) -> String {
    format!("quorumlock:lock:{resource}")
}

/// A raw connection to node `i`, bypassing any proxy. A refused or reset connect (a full
/// listen backlog on a loaded machine) is tried again, at most 5 times within 5 s.
pub async fn raw(cluster: &LocalCluster, i: usize) -> MultiplexedConnection {
    let url = cluster.direct_url(i).expect("node index");
    let client = redis::Client::open(url).expect("url");
    let started = Instant::now();
    let mut last = None;
    for _ in 0..5 {
        let left = Duration::from_secs(5).saturating_sub(started.elapsed());
        match tokio::time::timeout(left, client.get_multiplexed_async_connection()).await {
            Ok(Ok(conn)) => return conn,
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("timed out".to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to node {i}: {}", last.unwrap_or_default())
}

/// The value of `key` on node `i` (None if absent).
pub async fn get(cluster: &LocalCluster, i: usize, key: &str) -> Option<String> {
    let mut c = raw(cluster, i).await;
    c.get(key).await.expect("GET")
}

/// On how many of `nodes` the key exists.
pub async fn count_key(
    cluster: &LocalCluster,
    nodes: impl IntoIterator<Item = usize>,
    key: &str,
) -> usize {
    let mut n = 0;
    for i in nodes {
        if get(cluster, i, key).await.is_some() {
            n += 1;
        }
    }
    n
}

/// Polls `check` until it returns true, at most `limit` long (every 10 ms). Returns
/// whether it became true.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A 5-node cluster with proxies (so links can be cut).
pub async fn cluster5() -> LocalCluster {
    proxied(5).await
}

/// `n` local nodes, each behind a fault proxy.
pub async fn proxied(n: usize) -> LocalCluster {
    LocalCluster::builder(n)
        .proxies(true)
        .launch()
        .await
        .expect("start redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
}

/// Node `i`'s clock in milliseconds (`TIME`), the clock its sorted-set scores are read on.
pub async fn node_ms(cluster: &LocalCluster, i: usize) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut raw(cluster, i).await)
        .await
        .expect("TIME");
    s * 1000 + us / 1000
}

/// A client of `urls` with a fixed per-node timeout (tests about order, not latency, do not
/// want the derived default, which is tight on a loaded 2-core machine) and fencing on or
/// off.
pub async fn client(
    urls: Vec<String>,
    node_timeout: Duration,
    fencing: bool,
) -> quorumlock::Redlock {
    quorumlock::Redlock::builder(urls)
        .node_timeout(node_timeout)
        .fencing(fencing)
        .build()
        .await
        .expect("build client")
}

/// Sets `key` to `value` with a TTL of `ttl_ms` on every node (raw): a holder planted
/// behind the library's back.
pub async fn plant_everywhere(cluster: &LocalCluster, key: &str, value: &str, ttl_ms: u64) {
    for i in 0..cluster.len() {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("SET");
    }
}

/// The number of members of the sorted set `key` on each node.
pub async fn zcards(cluster: &LocalCluster, key: &str) -> Vec<u64> {
    let mut out = Vec::with_capacity(cluster.len());
    for i in 0..cluster.len() {
        let n: u64 = redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("ZCARD");
        out.push(n);
    }
    out
}

/// The connections node `i` has accepted since it started (`INFO stats`).
pub async fn connections_received(cluster: &LocalCluster, i: usize) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut raw(cluster, i).await)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A cluster of three whose nodes know the ACL user `lockuser` (password `pw`) with keys
/// `~quorumlock:*`, every command, and the channel rules `channels` (such as
/// `["&quorumlock:released:*"]` or `["resetchannels"]`), behind proxies if `proxies`; and
/// its URLs with that user. The default user stays open for the tests' raw connections.
pub async fn acl_cluster(
    channels: &[&str],
    proxies: bool,
) -> std::io::Result<(LocalCluster, Vec<String>)> {
    let cluster = LocalCluster::builder(3)
        .proxies(proxies)
        .args(["--user", "lockuser", "on", ">pw", "~quorumlock:*"])
        .args(channels.iter().copied())
        .arg("+@all")
        .launch()
        .await?;
    let urls = cluster
        .urls()
        .iter()
        .map(|u| u.replacen("redis://", "redis://lockuser:pw@", 1))
        .collect();
    Ok((cluster, urls))
}

/// Logs every command each node runs from now on (slow log threshold 0, room for 10,000
/// entries), the log emptied first.
pub async fn log_every_command(cluster: &LocalCluster) -> redis::RedisResult<()> {
    for i in 0..cluster.len() {
        let mut c = raw(cluster, i).await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .arg("slowlog-max-len")
            .arg(10_000)
            .query_async(&mut c)
            .await?;
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut c)
            .await?;
    }
    Ok(())
}

/// Every command each node ran since [`log_every_command`], as its arguments.
pub async fn commands_run(cluster: &LocalCluster) -> Vec<Vec<Vec<String>>> {
    let mut all = Vec::new();
    for i in 0..cluster.len() {
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("SLOWLOG GET");
        let mut node = Vec::new();
        for e in entries {
            let redis::Value::Array(fields) = e else {
                continue;
            };
            if let Some(redis::Value::Array(args)) = fields.get(3) {
                node.push(
                    args.iter()
                        .map(|a| match a {
                            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                );
            }
        }
        all.push(node);
    }
    all
}

/// The acquisitions each node ran since [`log_every_command`], as (node, arguments): a
/// `SET … NX`, or a script that acquires (`acquire.lua`, `acquire_fenced.lua`, `claim.lua`).
pub async fn acquires_run(cluster: &LocalCluster) -> Vec<(usize, Vec<String>)> {
    let shas: Vec<String> = [
        include_str!("../../src/scripts/acquire.lua"),
        include_str!("../../src/scripts/acquire_fenced.lua"),
        include_str!("../../src/scripts/claim.lua"),
    ]
    .into_iter()
    .map(|src| redis::Script::new(src).get_hash().to_owned())
    .collect();
    let mut found = Vec::new();
    for (i, node) in commands_run(cluster).await.into_iter().enumerate() {
        for args in node {
            let name = args
                .first()
                .map(|a| a.to_ascii_uppercase())
                .unwrap_or_default();
            let acquire = (name == "SET" && args.iter().any(|a| a.eq_ignore_ascii_case("NX")))
                || ((name == "EVALSHA" || name == "EVAL")
                    && args
                        .get(1)
                        .is_some_and(|s| shas.contains(s) || s.contains("NX")));
            if acquire {
                found.push((i, args));
            }
        }
    }
    found
}

/// Waits (at most 5 s) until `n` entries are queued for the resource `res` on every node.
pub async fn queued_on_every_node(cluster: &LocalCluster, res: &str, n: u64) -> Result<(), String> {
    let all: Vec<usize> = (0..cluster.len()).collect();
    queued_on(cluster, res, &all, n).await
}

/// Waits (at most 5 s) until `n` entries are queued for the resource `res` on each of
/// `nodes` (a node that does not answer counts as none).
pub async fn queued_on(
    cluster: &LocalCluster,
    res: &str,
    nodes: &[usize],
    n: u64,
) -> Result<(), String> {
    let key = format!("quorumlock:queue:{res}");
    let sizes = || async {
        let mut sizes = Vec::new();
        for &i in nodes {
            let c: u64 = redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut raw(cluster, i).await)
                .await
                .unwrap_or(0);
            sizes.push(c);
        }
        sizes
    };
    let ok = eventually(Duration::from_secs(5), || async {
        sizes().await.iter().all(|s| *s == n)
    })
    .await;
    if ok {
        Ok(())
    } else {
        Err(format!("not queued: {:?}", sizes().await))
    }
}

/// The wait-queue keys of a resource: its queue, leases and attributes (mirrors
/// `src/resource.rs`).
pub fn queue_keys(res: &str) -> [String; 3] {
    [
        format!("quorumlock:queue:{res}"),
        format!("quorumlock:qlease:{res}"),
        format!("quorumlock:qattrs:{res}"),
    ]
}

/// Deletes `keys` on each of `nodes`, behind the clients' backs.
pub async fn del_on(cluster: &LocalCluster, nodes: &[usize], keys: &[String]) {
    for &i in nodes {
        let _: i64 = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("DEL");
    }
}

/// Waits (at most 5 s) until `n` waiters wait for the resource `res` on every node (its
/// leases key: queued single-resource waiters and multi-resource waiters' marks), then
/// 150 ms more (a join's renewals and subscriptions settle), printing each node's count.
pub async fn settle(cluster: &LocalCluster, res: &str, n: u64) -> Result<(), String> {
    let key = format!("quorumlock:qlease:{res}");
    let enough = eventually(Duration::from_secs(5), || async {
        zcards(cluster, &key).await.iter().all(|c| *c >= n)
    })
    .await;
    if !enough {
        return Err(format!(
            "{n} waiters for {res}: {:?}",
            zcards(cluster, &key).await
        ));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    println!("{res}: {:?}", zcards(cluster, &key).await);
    Ok(())
}

/// The key of the group-map record on every node (mirrors `src/groupmap.rs`).
pub const GROUP_MAP: &str = "quorumlock:groupmap";

/// A lock group of three local nodes, no proxies.
pub async fn group3() -> LocalCluster {
    LocalCluster::launch(3)
        .await
        .expect("start redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
}

/// A client of `groups` (the first given to `builder`, each further one with `group`),
/// with `version` if any, and a fixed per-node timeout of 250 ms.
pub async fn grouped(
    groups: &[&LocalCluster],
    version: Option<u16>,
) -> Result<quorumlock::Redlock, quorumlock::Error> {
    let Some((first, rest)) = groups.split_first() else {
        return quorumlock::Redlock::builder(Vec::<String>::new())
            .build()
            .await;
    };
    let mut b = quorumlock::Redlock::builder(first.urls()).node_timeout(Duration::from_millis(250));
    for g in rest {
        b = b.group(g.urls());
    }
    if let Some(v) = version {
        b = b.groups_version(v);
    }
    b.build().await
}

/// Deletes the group-map record on every node of `cluster` (as if its lease ran out).
pub async fn forget_group_map(cluster: &LocalCluster) {
    for i in 0..cluster.len() {
        let _: () = raw(cluster, i).await.del(GROUP_MAP).await.expect("DEL");
    }
}

/// How many times the node ran `cmd` (lower case, as `set` or `evalsha`), from the text of
/// its `INFO commandstats`; 0 when it never did.
pub fn calls(commandstats: &str, cmd: &str) -> u64 {
    let prefix = format!("cmdstat_{cmd}:calls=");
    commandstats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The fence counter key of a resource (the fencing token's counter on each node).
pub fn fence_key(resource: &str) -> String {
    format!("quorumlock:fence:{resource}")
}

/// Makes `nodes` refuse any acquisition of `resource`: another owner's lock key, with no
/// TTL, until [`vacate`].
pub async fn occupy(
    cluster: &LocalCluster,
    nodes: impl IntoIterator<Item = usize>,
    resource: &str,
) {
    for i in nodes {
        let mut c = raw(cluster, i).await;
        let _: () = c
            .set(lock_key(resource), "another-owner")
            .await
            .expect("SET");
    }
}

/// The other owner of [`occupy`] lets go of `nodes`.
pub async fn vacate(
    cluster: &LocalCluster,
    nodes: impl IntoIterator<Item = usize>,
    resource: &str,
) {
    for i in nodes {
        let mut c = raw(cluster, i).await;
        let _: () = c.del(lock_key(resource)).await.expect("DEL");
    }
}

/// How many `PUBLISH` and `SPUBLISH` calls the nodes have run so far (`INFO commandstats`,
/// which counts the calls a script makes): the release announcements.
pub async fn announcements(cluster: &LocalCluster) -> u64 {
    let mut total = 0;
    for i in 0..cluster.len() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw(cluster, i).await)
            .await
            .unwrap_or_default();
        for line in info.lines() {
            let calls = ["cmdstat_publish:calls=", "cmdstat_spublish:calls="]
                .iter()
                .find_map(|p| line.strip_prefix(p))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok());
            total += calls.unwrap_or(0);
        }
    }
    total
}

/// Makes the server at `url` (a plain `redis://` URL) require `password` from now on, as
/// an operator would (`CONFIG SET requirepass`).
pub async fn require_password(url: &str, password: &str) {
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(password)
        .query_async(&mut con)
        .await
        .expect("CONFIG SET requirepass");
}

/// The text of the configuration error a build failed with, asserting that it is one
/// about the nodes.
pub fn nodes_config_error(r: Result<quorumlock::Redlock, quorumlock::Error>) -> String {
    match r {
        Err(quorumlock::Error::Config(c)) => {
            assert_eq!(c.field(), "nodes", "{c}");
            c.to_string()
        }
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(_) => panic!("expected the build to fail"),
    }
}
