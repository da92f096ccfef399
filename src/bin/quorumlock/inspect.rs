//! `quorumlock inspect RESOURCE`: reads the lock key `quorumlock:lock:{RESOURCE}` and the
//! fence counter `quorumlock:fence:{RESOURCE}` on every node, with a per-node timeout, and
//! prints one line per node and a verdict:
//!
//! ```text
//! orders:42 on 5 nodes (quorum 3)
//!   redis://127.0.0.1:7001  held by 3f2a9c1b…  ttl 8.2s  fence 1796077923605324
//!   redis://127.0.0.1:7002  free                          fence 1796077923605324
//!   redis://127.0.0.1:7003  unreachable: timed out after 500ms
//! verdict: held by 3f2a9c1b… on 4/5 nodes (quorum 3): HELD
//! ```
//!
//! Exits 0, or [`exit::UNAVAILABLE`](crate::exit::UNAVAILABLE) when fewer than a quorum of
//! nodes answered (the verdict is then "unknown").

use std::collections::BTreeMap;
use std::time::Duration;

use quorumlock::Redlock;

use crate::exit;

/// Arguments of `quorumlock inspect`.
#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct InspectArgs {
    /// The resource to inspect.
    resource: String,
    #[command(flatten)]
    nodes: crate::Nodes,
    /// Per-node timeout (connect and read).
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    timeout: Duration,
}

/// What one node holds for the resource.
#[derive(Debug)]
struct Probe {
    token: Option<String>,
    pttl: i64,
    fence: Option<String>,
}

/// Runs `quorumlock inspect`; returns the exit code.
pub async fn inspect(args: InspectArgs) -> u8 {
    // Validates the URLs and gives their password-free display form.
    let locks = match Redlock::builder(&args.nodes.nodes).build().await {
        Ok(locks) => locks,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::for_error(&e);
        }
    };
    if args.resource.is_empty() {
        eprintln!("quorumlock: the resource name is empty");
        return exit::USAGE;
    }
    let n = args.nodes.nodes.len();
    let quorum = locks.quorum();
    let probes = futures::future::join_all(
        args.nodes
            .nodes
            .iter()
            .map(|url| probe(url, &args.resource, args.timeout)),
    )
    .await;

    println!("{} on {n} nodes (quorum {quorum})", args.resource);
    let shown: Vec<String> = locks.nodes().iter().map(|a| a.to_string()).collect();
    let width = shown.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let mut holders: BTreeMap<String, usize> = BTreeMap::new();
    let mut answered = 0;
    for (addr, probe) in shown.iter().zip(&probes) {
        let line = match probe {
            Ok(p) => {
                answered += 1;
                let fence = match &p.fence {
                    Some(f) => format!("fence {f}"),
                    None => "fence -".to_owned(),
                };
                match &p.token {
                    Some(t) => {
                        let short = short_token(t);
                        *holders.entry(short.clone()).or_default() += 1;
                        let ttl = if p.pttl >= 0 {
                            format!("ttl {}", format_ms(p.pttl))
                        } else {
                            "no ttl".to_owned()
                        };
                        format!("held by {short:<10} {ttl:<12} {fence}")
                    }
                    None => format!("{:<32} {fence}", "free"),
                }
            }
            Err(e) => format!("unreachable: {e}"),
        };
        println!("  {addr:<width$}  {line}");
    }

    let best = holders.iter().max_by_key(|(_, c)| **c);
    let verdict = match best {
        Some((owner, &count)) if count >= quorum => {
            format!("held by {owner} on {count}/{n} nodes (quorum {quorum}): HELD")
        }
        _ if answered < quorum => {
            format!("unknown: only {answered}/{n} nodes answered (quorum {quorum})")
        }
        None => "free".to_owned(),
        Some((owner, &count)) => {
            format!("split: no owner has a quorum (best: {owner} on {count}/{n}, quorum {quorum})")
        }
    };
    println!("verdict: {verdict}");
    if answered < quorum && best.is_none_or(|(_, &c)| c < quorum) {
        exit::UNAVAILABLE
    } else {
        0
    }
}

/// Reads the lock key, its PTTL and the fence counter on one node.
async fn probe(url: &str, resource: &str, timeout: Duration) -> Result<Probe, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut lock_key = b"quorumlock:lock:".to_vec();
    lock_key.extend_from_slice(resource.as_bytes());
    let mut fence_key = b"quorumlock:fence:".to_vec();
    fence_key.extend_from_slice(resource.as_bytes());
    let read = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        let (token, pttl, fence): (Option<Vec<u8>>, i64, Option<String>) = redis::pipe()
            .cmd("GET")
            .arg(&lock_key)
            .cmd("PTTL")
            .arg(&lock_key)
            .cmd("GET")
            .arg(&fence_key)
            .query_async(&mut con)
            .await?;
        Ok::<_, redis::RedisError>(Probe {
            token: token.map(|t| String::from_utf8_lossy(&t).into_owned()),
            pttl,
            fence,
        })
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "timed out after {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// The first 8 characters of a token and `…`: enough to tell owners apart, never the
/// whole secret.
fn short_token(t: &str) -> String {
    let head: String = t.chars().take(8).collect();
    format!("{head}…")
}

fn format_ms(ms: i64) -> String {
    if ms >= 1000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}
