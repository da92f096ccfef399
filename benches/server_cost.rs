//! What a lock costs the Redis servers, per operation: quorumlock beside `rslock` 0.10 and
//! the raw floor (plain redis-rs: `SET NX PX` + compare-and-delete), in the same run, on
//! 5 local `redis-server` processes that this benchmark starts itself.
//!
//! ```text
//! cargo bench --features testkit --bench server_cost              # everything (~3 minutes)
//! cargo bench --features testkit --bench server_cost -- contended # one section
//! ```
//!
//! On a shared machine ops/s move with the load; CPU per operation does not. Each window
//! reads, before and after:
//!
//! * **server CPU**: user + system time of the 5 `redis-server` processes
//!   (`/proc/PID/stat`), summed;
//! * **server commands**: calls and `usec` of every command in `INFO commandstats` of the
//!   5 servers (the benchmark's own `INFO` calls excluded), summed; `usec` is the time
//!   inside the commands (for a script, the whole script with the commands it calls);
//! * **client CPU**: this process's user + system time (`getrusage`).
//!
//! Sections:
//!
//! * `uncontended`: acquire + release with 1 task on its own resource, 16 tasks sharing
//!   one client each on its own resource, and 16 tasks on a new resource every cycle.
//! * `contended`: 16 tasks on one resource, sharing one client, and with a client each:
//!   acquisitions per second, acquire p99, each task's share, and the cost per
//!   acquisition. The floor retries after a random 1–10 ms; rslock as configured by
//!   default; quorumlock with `lock` (waiting in its queue).
//!
//! Three rounds per case, the implementations interleaved round by round; the report
//! gives the median round. Results also go to `bench-out/server_cost.jsonl`
//! (`QL_SUMMARY` names another file).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;
use tokio::runtime::Runtime;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use support::{Floor, Impl, Summary, cpu_time, percentile, proc_cpu_time, us};

/// Acquisition sequence number, read by the shared support module's split-vote counter
/// (not used here).
pub static ACQ_SEQ: AtomicU64 = AtomicU64::new(0);

const NODES: usize = 5;
const TASKS: usize = 16;
const ROUNDS: usize = 3;
const TTL: Duration = Duration::from_secs(10);
const CONTENDED_TTL: Duration = Duration::from_secs(2);

fn window() -> Duration {
    std::env::var("QL_WINDOW_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(3), Duration::from_millis)
}

/// What the servers and this process had spent at one instant.
#[derive(Clone, Copy, Default)]
struct Spent {
    server_cpu: f64,
    calls: u64,
    usec: u64,
    client_cpu: f64,
}

impl Spent {
    fn since(self, before: Spent) -> Spent {
        Spent {
            server_cpu: self.server_cpu - before.server_cpu,
            calls: self.calls.saturating_sub(before.calls),
            usec: self.usec.saturating_sub(before.usec),
            client_cpu: self.client_cpu - before.client_cpu,
        }
    }
}

/// The commands the benchmark itself sends to read the servers.
const OWN: &[&str] = &[
    "info",
    "config|get",
    "config",
    "client|setinfo",
    "hello",
    "ping",
];

async fn spent(cluster: &LocalCluster) -> Spent {
    let mut s = Spent {
        client_cpu: cpu_time(),
        ..Spent::default()
    };
    for i in 0..cluster.len() {
        let url = cluster.direct_url(i).expect("node");
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        for line in info.lines() {
            let Some((name, stats)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if OWN.contains(&name) {
                continue;
            }
            let field = |k: &str| -> u64 {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            s.calls += field("calls=");
            s.usec += field("usec=");
        }
        s.server_cpu += cluster.pid(i).ok().flatten().map_or(0.0, proc_cpu_time);
    }
    s
}

/// One measured window: operations done, its length, what it cost, and latencies.
struct Window {
    ops: u64,
    secs: f64,
    cost: Spent,
    latencies: Vec<Duration>,
    shares: Vec<u64>,
}

impl Window {
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    fn per_op(&self, x: f64) -> f64 {
        x / (self.ops.max(1) as f64)
    }
    fn server_cpu_us(&self) -> f64 {
        self.per_op(self.cost.server_cpu * 1e6)
    }
    fn client_cpu_us(&self) -> f64 {
        self.per_op(self.cost.client_cpu * 1e6)
    }
    fn calls(&self) -> f64 {
        self.per_op(self.cost.calls as f64)
    }
    fn command_us(&self) -> f64 {
        self.per_op(self.cost.usec as f64)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Keys {
    /// Each task on its own resource, the same every cycle.
    Own,
    /// A new resource every cycle.
    Fresh,
}

async fn uncontended(
    cluster: &LocalCluster,
    imp: &Impl,
    tasks: usize,
    keys: Keys,
    round: usize,
) -> Window {
    let stop_after = window();
    let before = spent(cluster).await;
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let imp = imp.clone();
        let tag = format!("{}:{round}:{t}", imp.name());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while start.elapsed() < stop_after {
                let key = match keys {
                    Keys::Own => format!("own:{tag}"),
                    Keys::Fresh => format!("fresh:{tag}:{i}"),
                };
                let t0 = Instant::now();
                imp.cycle(&key, TTL).await;
                lat.push(t0.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    let mut shares = Vec::new();
    for h in handles {
        let lat = h.await.expect("task");
        shares.push(lat.len() as u64);
        latencies.extend(lat);
    }
    let secs = start.elapsed().as_secs_f64();
    let cost = spent(cluster).await.since(before);
    Window {
        ops: latencies.len() as u64,
        secs,
        cost,
        latencies,
        shares,
    }
}

/// One contender's way of taking the hot resource until it has it, then releasing it.
#[derive(Clone)]
enum Contender {
    Quorumlock(Redlock),
    Rslock(rslock::LockManager),
    Floor(Floor),
}

impl Contender {
    fn name(&self) -> &'static str {
        match self {
            Contender::Quorumlock(_) => "quorumlock",
            Contender::Rslock(_) => "rslock",
            Contender::Floor(_) => "floor",
        }
    }

    /// Takes and releases `key` once; the time the acquisition took.
    async fn take(&self, key: &str) -> Option<Duration> {
        let t0 = Instant::now();
        match self {
            Contender::Quorumlock(q) => {
                let l = q.lock(key, CONTENDED_TTL).await.ok()?;
                let d = t0.elapsed();
                l.release().await.ok();
                Some(d)
            }
            Contender::Rslock(r) => {
                let l = r.acquire_no_guard(key, CONTENDED_TTL).await.ok()?;
                let d = t0.elapsed();
                r.unlock(&l).await;
                Some(d)
            }
            Contender::Floor(f) => {
                for _ in 0..100_000 {
                    let (token, granted) = f.acquire(key, CONTENDED_TTL).await;
                    if granted > f.nodes() / 2 {
                        let d = t0.elapsed();
                        f.release(key, &token).await;
                        return Some(d);
                    }
                    f.release(key, &token).await;
                    let pause = 1 + rand::random::<u64>() % 10;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                None
            }
        }
    }
}

async fn contended(cluster: &LocalCluster, who: Vec<Contender>, round: usize) -> Window {
    let key = format!("hot:{}:{round}", who[0].name());
    let stop_after = window();
    let before = spent(cluster).await;
    let start = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for c in who {
        let key = key.clone();
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while start.elapsed() < stop_after {
                if let Some(d) = c.take(&key).await
                    && start.elapsed() < stop_after
                {
                    lat.push(d);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    let mut shares = Vec::new();
    for h in handles {
        let lat = h.await.expect("contender");
        shares.push(lat.len() as u64);
        latencies.extend(lat);
    }
    let secs = start.elapsed().as_secs_f64();
    let cost = spent(cluster).await.since(before);
    Window {
        ops: done.load(Ordering::Relaxed),
        secs,
        cost,
        latencies,
        shares,
    }
}

/// The median round of `rounds` by ops/s.
fn median(mut rounds: Vec<Window>) -> Window {
    rounds.sort_by(|a, b| a.ops_per_s().total_cmp(&b.ops_per_s()));
    let mid = rounds.len() / 2;
    rounds.swap_remove(mid)
}

fn report(summary: &Summary, section: &str, case: &str, name: &str, w: &mut Window) {
    let p50 = us(percentile(&mut w.latencies, 0.5));
    let p99 = us(percentile(&mut w.latencies, 0.99));
    let (min, max) = (
        w.shares.iter().copied().min().unwrap_or(0),
        w.shares.iter().copied().max().unwrap_or(0),
    );
    println!(
        "[{section}] {case:<22} {name:<11} {:>8.0} ops/s  p50 {p50:>8.1} µs  p99 {p99:>9.1} µs  \
         server CPU {:>6.1} µs/op  commands {:>5.2}/op {:>6.1} µs/op  client CPU {:>6.1} µs/op  shares {min}..{max}",
        w.ops_per_s(),
        w.server_cpu_us(),
        w.calls(),
        w.command_us(),
        w.client_cpu_us(),
    );
    summary.line(&format!(
        r#"{{"section":"{section}","case":"{case}","impl":"{name}","ops_per_s":{:.0},"p50_us":{p50:.1},"p99_us":{p99:.1},"server_cpu_us_per_op":{:.2},"server_calls_per_op":{:.3},"server_command_us_per_op":{:.2},"client_cpu_us_per_op":{:.2},"min_share":{min},"max_share":{max}}}"#,
        w.ops_per_s(),
        w.server_cpu_us(),
        w.calls(),
        w.command_us(),
        w.client_cpu_us(),
    ));
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-') && a != "server_cost");
    let wants = |section: &str| {
        filter
            .as_deref()
            .is_none_or(|f| f.split(',').any(|f| section.starts_with(f)))
    };
    let rt = Runtime::new().expect("tokio runtime");
    let path = std::env::var("QL_SUMMARY").unwrap_or_else(|_| "bench-out/server_cost.jsonl".into());
    let summary = Summary::create(&path);
    summary.meta();
    let cluster = rt
        .block_on(LocalCluster::launch(NODES))
        .expect("start redis-server nodes (run scripts/install-deps.sh)");
    let urls = cluster.urls();

    if wants("uncontended") {
        let imps: Vec<Impl> = rt.block_on(async {
            let ql = Redlock::builder(urls.clone())
                .build()
                .await
                .expect("quorumlock");
            let rs = rslock::LockManager::new(urls.clone());
            let floor = Floor::connect(&urls).await.expect("floor");
            let all = vec![Impl::Floor(floor), Impl::Rslock(rs), Impl::Quorumlock(ql)];
            for imp in &all {
                for i in 0..200 {
                    imp.cycle(&format!("warm:{i}"), TTL).await;
                }
            }
            all
        });
        for (case, tasks, keys) in [
            ("1 task, own resource", 1, Keys::Own),
            ("16 tasks, own resource", TASKS, Keys::Own),
            ("16 tasks, new resource", TASKS, Keys::Fresh),
        ] {
            let mut rounds: Vec<Vec<Window>> = imps.iter().map(|_| Vec::new()).collect();
            for round in 0..ROUNDS {
                for (i, imp) in imps.iter().enumerate() {
                    let w = rt.block_on(uncontended(&cluster, imp, tasks, keys, round));
                    rounds[i].push(w);
                }
            }
            for (imp, r) in imps.iter().zip(rounds) {
                report(&summary, "uncontended", case, imp.name(), &mut median(r));
            }
        }
    }

    if wants("contended") {
        for (case, shared) in [
            ("16 tasks, one client", true),
            ("16 tasks, 16 clients", false),
        ] {
            let sets: Vec<Vec<Contender>> = rt.block_on(async {
                let mut sets = Vec::new();
                for kind in ["floor", "rslock", "quorumlock"] {
                    let mut set = Vec::new();
                    let mut one: Option<Contender> = None;
                    for _ in 0..TASKS {
                        if shared && let Some(c) = &one {
                            set.push(c.clone());
                            continue;
                        }
                        let c = match kind {
                            "floor" => {
                                Contender::Floor(Floor::connect(&urls).await.expect("floor"))
                            }
                            "rslock" => Contender::Rslock(rslock::LockManager::new(urls.clone())),
                            _ => Contender::Quorumlock(
                                Redlock::builder(urls.clone())
                                    .build()
                                    .await
                                    .expect("quorumlock"),
                            ),
                        };
                        // Connect and load the scripts before the clock starts.
                        c.take("warm").await;
                        one = Some(c.clone());
                        set.push(c);
                    }
                    sets.push(set);
                }
                sets
            });
            let mut rounds: Vec<Vec<Window>> = sets.iter().map(|_| Vec::new()).collect();
            for round in 0..ROUNDS {
                for (i, set) in sets.iter().enumerate() {
                    let w = rt.block_on(contended(&cluster, set.clone(), round));
                    rounds[i].push(w);
                }
            }
            for (set, r) in sets.iter().zip(rounds) {
                report(&summary, "contended", case, set[0].name(), &mut median(r));
            }
        }
    }
}
