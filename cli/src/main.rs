//! `quorumlock`: a distributed `flock(1)` on a majority of N independent Redis masters.
//!
//! ```text
//! quorumlock run --nodes URL,URL,... --resource NAME [--ttl 10s] [--wait 10s | --no-wait]
//!                [--shared | --write | --permits P] [--fencing] [--grace 10s]
//!                -- COMMAND [ARGS...]
//! quorumlock inspect RESOURCE... --nodes URL,URL,... [--timeout 1s] [--json]
//! quorumlock demo [--nodes URL,URL,...]
//! ```
//!
//! Nodes come from `--nodes` or the `QUORUMLOCK_NODES` environment variable (comma
//! separated; lock groups separated by `;`, as in `URL,URL,URL;URL,URL,URL`, with
//! `--groups-version` / `QUORUMLOCK_GROUPS_VERSION`). Every key and channel starts with
//! the namespace of `--namespace` or `QUORUMLOCK_NAMESPACE` (default `quorumlock`), which
//! must match the one the locks' other clients use. With the `tls-rustls` feature
//! (`cargo install --path cli --features tls-rustls`),
//! `--tls-ca FILE` (`QUORUMLOCK_TLS_CA`) trusts a private certificate authority for
//! `rediss://` nodes, and `--tls-cert FILE --tls-key FILE` (`QUORUMLOCK_TLS_CERT`,
//! `QUORUMLOCK_TLS_KEY`) show a client certificate to servers with `tls-auth-clients yes`.
//! Node URLs are printed with their passwords redacted. Library diagnostics go
//! to stderr, filtered by `QUORUMLOCK_LOG` (`tracing` env-filter syntax; default `error`).
//!
//! Exit codes: see [`exit`]. `run` exits with COMMAND's status (128+N when COMMAND was
//! killed by signal N); 64 for usage errors, 69 when too few nodes answer for a quorum,
//! 70 when the lock was lost while COMMAND ran, 75 when the lock is held by another owner
//! or the wait timed out, 78 when `--permits P` does not match the semaphore in use,
//! 126/127 when COMMAND cannot be executed / is not found.

mod demo;
mod exit;
mod inspect;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quorumlock::{Redlock, RedlockBuilder};

/// Redlock from the command line: a distributed lock held on a majority of N independent
/// Redis masters.
#[derive(Debug, Parser)]
#[command(name = "quorumlock", version, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Take the lock, run COMMAND while keeping the lock alive, release it; exits with
    /// COMMAND's status.
    ///
    /// Takes the lock on a majority of the nodes (waiting up to --wait, 10s by default, or
    /// not at all with --no-wait). When it cannot be taken, COMMAND is not run and one line
    /// says why. While COMMAND runs the lock is extended every TTL/3; if it is lost, COMMAND
    /// gets SIGTERM, then SIGKILL after --grace. SIGINT, SIGTERM and SIGHUP are forwarded
    /// to COMMAND. COMMAND sees QUORUMLOCK_RESOURCE, and with --fencing
    /// QUORUMLOCK_FENCING_TOKEN (a number that grows with every holder).
    ///
    /// By default the lock is a mutex: one run at a time. --shared and --write take the
    /// read and write sides of a read-write lock (many --shared runs, or one --write run);
    /// --permits P takes one of P permits of a semaphore. The mutex, the read-write lock
    /// and the semaphore of one name are separate locks: runs that must exclude each
    /// other use the same kind.
    ///
    /// Example: quorumlock run --nodes redis://h1:6379,redis://h2:6379,redis://h3:6379
    /// --resource cron:report --ttl 30s --no-wait -- ./report.sh
    Run(run::RunArgs),
    /// Show, node by node, who holds each RESOURCE (a token prefix), its remaining TTL,
    /// its fence counter and its wait queue, and whether it is held or free on a quorum.
    /// Read-only: nothing is taken or changed.
    Inspect(inspect::InspectArgs),
    /// The coupon scenario: 100 buyers, K coupons, without and with the lock (starts its
    /// own 5 local redis-server nodes unless --nodes is given).
    Demo(demo::DemoArgs),
}

/// The Redis nodes, shared by the subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct Nodes {
    /// Redis node URLs, comma separated (redis://, rediss://, redis+unix://; ACL user and
    /// password in the URL). Use an odd number of independent masters. To shard resources
    /// over several lock groups, separate the groups with `;` (each group as many nodes):
    /// redis://a1,redis://a2,redis://a3;redis://b1,redis://b2,redis://b3 (quote it in a
    /// shell). Every client of a resource must give the same groups in the same order.
    #[arg(
        long,
        env = "QUORUMLOCK_NODES",
        hide_env_values = true,
        value_delimiter = ',',
        required = true,
        value_name = "URL,..."
    )]
    pub nodes: Vec<String>,
    /// The version of the group map (raise it whenever the groups change); see the
    /// guide's "Sharded lock groups". Default: none (0 when there are several groups).
    #[arg(long, env = "QUORUMLOCK_GROUPS_VERSION", value_name = "N")]
    pub groups_version: Option<u16>,
    /// PEM file of the certificate authorities trusted for rediss:// nodes (the servers'
    /// tls-ca-cert-file). Default: the system's trust store.
    #[cfg(feature = "tls-rustls")]
    #[arg(long, env = "QUORUMLOCK_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM file of the client certificate shown to rediss:// nodes, for servers with
    /// tls-auth-clients yes (needs --tls-key). Default: none.
    #[cfg(feature = "tls-rustls")]
    #[arg(
        long,
        env = "QUORUMLOCK_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM file of the client certificate's private key (needs --tls-cert). Default: none.
    #[cfg(feature = "tls-rustls")]
    #[arg(
        long,
        env = "QUORUMLOCK_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<std::path::PathBuf>,
    /// The namespace every key and channel starts with (`<NS>:lock:<resource>`, …), as
    /// the resource's other clients use it; an ACL user confined to `~<NS>:* &<NS>:*`
    /// can use it. Default: quorumlock.
    #[arg(long, env = "QUORUMLOCK_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,
    /// Start even when some node refuses the credentials (a wrong password, a certificate
    /// refused) and lock on the others while they are a quorum. Without it, such a node
    /// is an error at start (exit 64) that names it.
    #[arg(
        long,
        env = "QUORUMLOCK_LENIENT",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub lenient: bool,
}

impl Nodes {
    /// A client builder over these nodes: the first group given to `Redlock::builder`,
    /// each further `;`-separated group added with `group`, with the TLS files read. The
    /// error says which file could not be read (never its contents).
    pub fn builder(&self) -> Result<RedlockBuilder, String> {
        let mut groups = split_groups(&self.nodes).into_iter();
        let mut builder = Redlock::builder(groups.next().unwrap_or_default()).strict(!self.lenient);
        for group in groups {
            builder = builder.group(group);
        }
        if let Some(v) = self.groups_version {
            builder = builder.groups_version(v);
        }
        if let Some(ns) = &self.namespace {
            builder = builder.namespace(ns.as_str());
        }
        #[cfg(feature = "tls-rustls")]
        {
            let read = |flag: &str, path: &std::path::Path| {
                std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
            };
            if let Some(ca) = &self.tls_ca {
                builder = builder.tls_root_ca(read("--tls-ca", ca)?);
            }
            match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => {
                    builder =
                        builder.tls_client_auth(read("--tls-cert", cert)?, read("--tls-key", key)?);
                }
                (None, None) => {}
                _ => return Err("--tls-cert and --tls-key go together".to_owned()),
            }
        }
        Ok(builder)
    }
}

/// Splits node URLs (already split at commas by clap) into groups at `;`:
/// `["a", "b;c", "d"]` is `[["a", "b"], ["c", "d"]]`. Blank entries are dropped; an empty
/// group stays (and is refused by the builder with a message naming it). A Redis Cluster
/// voter's URL lists its seeds with commas too: an entry without a scheme
/// (`host:port`) right after a `redis+cluster://` or `rediss+cluster://` one is one more
/// seed of it, so `redis+cluster://a:1,b:2,redis://c:3` is two voters.
pub fn split_groups(urls: &[String]) -> Vec<Vec<String>> {
    urls.join(",")
        .split(';')
        .map(|group| {
            let mut voters: Vec<String> = Vec::new();
            for u in group.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                match voters.last_mut() {
                    Some(last) if !u.contains("://") && last.contains("+cluster://") => {
                        last.push(',');
                        last.push_str(u);
                    }
                    _ => voters.push(u.to_owned()),
                }
            }
            voters
        })
        .collect()
}

/// Parses a human duration (`500ms`, `10s`, `2m`, `1h 30m`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (try 500ms, 10s, 2m)"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("QUORUMLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quorumlock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Cmd::Run(args) => run::run(args).await,
            Cmd::Inspect(args) => inspect::inspect(args).await,
            Cmd::Demo(args) => demo::demo(args).await,
        }
    });
    // Do not wait for background clean-up tasks of the library beyond this point.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::split_groups;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn groups_and_cluster_voters_split_apart() {
        assert_eq!(
            split_groups(&v(&[
                "redis://a:1",
                "redis://b:2;redis://c:3",
                "redis://d:4"
            ])),
            vec![
                v(&["redis://a:1", "redis://b:2"]),
                v(&["redis://c:3", "redis://d:4"])
            ]
        );
        // A cluster voter's seeds stay one voter; the next scheme starts the next voter.
        assert_eq!(
            split_groups(&v(&[
                "redis+cluster://a:1",
                "b:2",
                "redis+cluster://c:3",
                " d:4 ",
                "rediss+cluster://u:p@e:5",
                "f:6;redis+cluster://g:7",
                "h:8"
            ])),
            vec![
                v(&[
                    "redis+cluster://a:1,b:2",
                    "redis+cluster://c:3,d:4",
                    "rediss+cluster://u:p@e:5,f:6"
                ]),
                v(&["redis+cluster://g:7,h:8"])
            ]
        );
        // A bare host after a plain URL is left alone (the builder refuses it).
        assert_eq!(
            split_groups(&v(&["redis://a:1", "b:2"])),
            vec![v(&["redis://a:1", "b:2"])]
        );
    }
}
