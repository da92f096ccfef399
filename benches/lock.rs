//! quorumlock benchmarks against the performance targets: quorumlock side by side with `rslock` 0.10 and the raw
//! floor (plain redis-rs), on local clusters of real `redis-server` processes that this
//! benchmark starts itself.
//!
//! ```text
//! cargo bench --bench lock            # everything (< 10 minutes)
//! cargo bench --bench lock -- cycle   # one section
//! ```
//!
//! Sections (each a Criterion group plus our own timed loops, because the docs need
//! percentiles and medians of rounds, not only Criterion's means):
//!
//! * `cycle`: one task, uncontended acquire + release.
//! * `uncontended_16`: 16 tasks on distinct resources, total ops/s.
//! * `fencing`: `cycle` and `uncontended_16` with fencing tokens on and off.
//! * `scaling`: cycle latency and 16-task throughput for N = 1, 3, 5, 7, 9 nodes, and
//!   N = 5 with one node paused (SIGSTOP).
//! * `held_10k`: 10,000 held locks, memory and CPU.
//! * `contended_16`: 16 tasks, each with its own client, on one resource: throughput,
//!   acquire latency, fairness (same-task re-acquisitions; per acquisition, the overtakes
//!   by later waiters and the hand-offs waited), split votes.
//! * `metrics`: the one-task cycle with the `metrics` feature's cost: built with
//!   `--features metrics`, rounds alternate between recording into a Prometheus
//!   recorder and the same handles switched off; built without it, the plain cycle.
//!   `scripts/bench-metrics.py` runs the two builds alternately and compares them.
//! * `readers_16`: 16 tasks, each with its own client, taking (`try_read_lock`) and
//!   releasing read locks on ONE resource, beside 16 such tasks on the mutex of one
//!   resource (contended, `lock`), on the mutexes of 16 distinct resources (`try_lock`),
//!   and the raw floor on 16 distinct keys.
//! * `semaphore_16`: 16 tasks, each with its own client, taking and releasing a permit of
//!   one semaphore of 4 permits (capacity 3 on 5 nodes), beside the same with 16 permits
//!   (capacity 16: full only when every task holds one) and 64 permits (never full), and
//!   the raw floor: throughput, acquire latency, attempts per acquisition.
//!
//! * `groups`: 16 tasks on distinct resources (a new one every cycle) over G = 1, 2 and 4
//!   lock groups of 3 nodes each (12 `redis-server` processes), beside the raw floor and
//!   rslock on one group of 3: total ops/s, and per server the requests it ran and the
//!   CPU time it spent (the load split, and the per-request cost the capacity model in
//!   docs/benchmarks.md is built from).
//! * `spanning`: one task, uncontended `try_lock_many` + release of a pair of resources
//!   over two lock groups of 3 nodes: the pair in one group (a common hash tag: one round)
//!   against the pair across both groups (one round per group, one after the other):
//!   cycle latency percentiles.
//! * `cluster_voters`: one task, uncontended `try_lock` + release on 3 voters that are Redis
//!   Clusters of 3 masters each (9 `redis-server` processes) against 3 plain masters, in
//!   alternating rounds, beside each one's raw floor (`SET NX PX` + `DEL` on the 3 voters
//!   at once: multiplexed connections, or redis-rs's cluster client): cycle latency
//!   percentiles and the cluster / plain ratios.
//! * `contended_pairs`: 8 tasks, each with its own client, taking (`lock_many`) one of four
//!   overlapping pairs of a ring of four resources, two tasks per pair: notify waiting
//!   (woken by release announcements, staggered) against plain polling (notify off), in
//!   the same run: throughput, acquire latency, each task's share, timeouts.
//!
//! The last three are timed windows only (no Criterion group, as `contended_16`): waiting
//! makes a per-iteration mean meaningless.
//!
//! Machine-readable results go to `bench-out/summary.jsonl` (one JSON object per line;
//! `QL_SUMMARY` names another file); `scripts/plot-benchmarks.py` turns them into
//! `docs/img/*.svg`.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use futures::StreamExt;
use quorumlock::{Redlock, Semaphore, Watchdog};
use quorumlock_testkit::fairness::{self, Distribution, Grant, Wait};
use quorumlock_testkit::{ClusterVoters, Faults, LocalCluster};
use tokio::runtime::Runtime;

use support::{Impl, Summary, cpu_time, percentile, proc_cpu_time, rss_kb, split_votes, us};

/// TTL of the uncontended cycles: long enough that it never matters.
const TTL: Duration = Duration::from_secs(10);
/// Rounds of every timed loop; the docs report the median round.
const ROUNDS: usize = 3;
/// Cycles per round of the one-task timed loop.
const CYCLES: usize = 3000;
/// Cycles per task per round of the 16-task timed loop.
const CYCLES_16: usize = 300;
const TASKS: usize = 16;

fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(15)
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-') && a != "lock");
    // `-- cycle,scaling`: only the sections whose names start with one of these.
    let wants = |section: &str| {
        filter
            .as_deref()
            .is_none_or(|f| f.split(',').any(|f| section.starts_with(f)))
    };
    let rt = Runtime::new().expect("tokio runtime");
    let mut c = criterion();
    let summary_path =
        std::env::var("QL_SUMMARY").unwrap_or_else(|_| "bench-out/summary.jsonl".to_owned());
    let summary = Summary::create(&summary_path);
    summary.meta();

    // The shared 5-node cluster of sections 1, 2 and 5.
    let cluster = rt
        .block_on(LocalCluster::launch(5))
        .expect("launch 5 redis-server nodes (is redis-server installed?)");
    let urls = cluster.urls();

    if wants("cycle") {
        bench_cycle(&rt, &mut c, &summary, &urls);
    }
    if wants("uncontended_16") {
        bench_uncontended(&rt, &mut c, &summary, &urls);
    }
    if wants("fencing") {
        bench_fencing(&rt, &mut c, &summary, &urls);
    }
    if wants("scaling") {
        bench_scaling(&rt, &mut c, &summary);
    }
    if wants("groups") {
        bench_groups(&rt, &summary);
    }
    if wants("spanning") {
        bench_spanning(&rt, &summary);
    }
    if wants("cluster_voters") {
        bench_cluster_voters(&rt, &summary);
    }
    if wants("held_10k") {
        bench_held(&rt, &summary, &urls, &cluster);
    }
    if wants("metrics") {
        // After the sections above: it installs a global recorder (with the feature).
        bench_metrics(&rt, &mut c, &summary, &urls);
    }
    drop(rt);
    if wants("contended_16") {
        // Last: it runs on its own runtime with a tracing layer that counts split votes.
        bench_contended(&summary, &urls);
    }
    if wants("contended_pairs") {
        let rt = Runtime::new().expect("tokio runtime");
        bench_pairs(&rt, &summary, &urls);
    }
    if wants("readers_16") || wants("semaphore_16") {
        // Own runtime, with the attempt counter of `contended_16`.
        let (rt, stats) = split_votes::runtime();
        if wants("readers_16") {
            bench_readers(&rt, &stats, &summary, &urls);
        }
        if wants("semaphore_16") {
            bench_semaphore(&rt, &stats, &summary, &urls);
        }
    }
    c.final_summary();
    drop(cluster);
    eprintln!("summary written to {summary_path}");
}

/// The three implementations on `urls`, connected and warmed up.
fn impls(rt: &Runtime, urls: &[String], fencing: bool) -> Vec<Impl> {
    rt.block_on(async {
        let ql = Redlock::builder(urls.to_vec())
            .fencing(fencing)
            .build()
            .await
            .expect("quorumlock build");
        let rs = rslock::LockManager::new(urls.to_vec());
        let floor = support::Floor::connect(urls).await.expect("floor connect");
        let all = vec![Impl::Quorumlock(ql), Impl::Rslock(rs), Impl::Floor(floor)];
        for imp in &all {
            for i in 0..200 {
                imp.cycle(&format!("warm:{i}"), TTL).await;
            }
        }
        all
    })
}

/// One-task cycle timings: `ROUNDS` rounds of `CYCLES`, implementations interleaved
/// round by round. Returns per implementation the samples of each round.
fn timed_cycles(rt: &Runtime, imps: &[Impl], cycles: usize) -> Vec<Vec<Vec<Duration>>> {
    let mut out = vec![Vec::new(); imps.len()];
    for round in 0..ROUNDS {
        for (k, imp) in imps.iter().enumerate() {
            let samples = rt.block_on(async {
                let key = format!("cycle:{}:{round}", imp.name());
                let mut v = Vec::with_capacity(cycles);
                for _ in 0..cycles {
                    let t = Instant::now();
                    imp.cycle(&key, TTL).await;
                    v.push(t.elapsed());
                }
                v
            });
            out[k].push(samples);
        }
    }
    out
}

/// Median over rounds of a per-round statistic.
fn median_of(rounds: &[Vec<Duration>], f: impl Fn(&mut Vec<Duration>) -> f64) -> f64 {
    let mut vals: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let mut r = r.clone();
            f(&mut r)
        })
        .collect();
    vals.sort_by(|a, b| a.total_cmp(b));
    vals[vals.len() / 2]
}

fn report_cycles(summary: &Summary, section: &str, imps: &[Impl], rounds: &[Vec<Vec<Duration>>]) {
    for (imp, r) in imps.iter().zip(rounds) {
        let p50 = median_of(r, |v| us(percentile(v, 0.50)));
        let p99 = median_of(r, |v| us(percentile(v, 0.99)));
        let mean = median_of(r, |v| us(v.iter().sum::<Duration>()) / v.len() as f64);
        let p50s: Vec<f64> = r
            .iter()
            .map(|v| us(percentile(&mut v.clone(), 0.5)))
            .collect();
        println!(
            "[{section}] {:<22} p50 {p50:>8.1} µs  p99 {p99:>8.1} µs  mean {mean:>8.1} µs  (p50 per round {p50s:.1?})",
            imp.name()
        );
        summary.line(&format!(
            r#"{{"section":"{section}","impl":"{}","p50_us":{p50:.1},"p99_us":{p99:.1},"mean_us":{mean:.1},"rounds_p50_us":{}}}"#,
            imp.name(),
            support::json_f64s(&p50s)
        ));
    }
}

fn bench_cycle(rt: &Runtime, c: &mut Criterion, summary: &Summary, urls: &[String]) {
    let imps = impls(rt, urls, false);
    let mut g = c.benchmark_group("cycle");
    for imp in &imps {
        let key = format!("crit:cycle:{}", imp.name());
        g.bench_function(imp.name(), |b| {
            b.to_async(rt).iter(|| imp.cycle(&key, TTL));
        });
    }
    g.finish();
    let rounds = timed_cycles(rt, &imps, CYCLES);
    report_cycles(summary, "cycle", &imps, &rounds);
}

/// `TASKS` tasks, each `cycles` acquire+release cycles on its own resource; ops/s.
async fn throughput16(imp: &Impl, cycles: usize, tag: &str) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let imp = imp.clone();
        let key = format!("u16:{tag}:{}:{t}", imp.name());
        tasks.push(tokio::spawn(async move {
            for _ in 0..cycles {
                imp.cycle(&key, TTL).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    (TASKS * cycles) as f64 / start.elapsed().as_secs_f64()
}

fn timed_throughput(rt: &Runtime, imps: &[Impl], cycles: usize) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::new(); imps.len()];
    for round in 0..ROUNDS {
        for (k, imp) in imps.iter().enumerate() {
            out[k].push(rt.block_on(throughput16(imp, cycles, &round.to_string())));
        }
    }
    out
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn report_throughput(summary: &Summary, section: &str, imps: &[Impl], rounds: &[Vec<f64>]) {
    for (imp, r) in imps.iter().zip(rounds) {
        let m = median(r);
        println!(
            "[{section}] {:<22} {m:>9.0} ops/s  (rounds {r:.0?})",
            imp.name()
        );
        summary.line(&format!(
            r#"{{"section":"{section}","impl":"{}","ops_per_s":{m:.0},"rounds_ops_per_s":{}}}"#,
            imp.name(),
            support::json_f64s(r)
        ));
    }
}

fn criterion_throughput(rt: &Runtime, c: &mut Criterion, group: &str, imps: &[Impl]) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(TASKS as u64));
    for imp in imps {
        g.bench_function(imp.name(), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let imp = imp.clone();
                async move {
                    let start = Instant::now();
                    throughput16(&imp, iters as usize, "crit").await;
                    start.elapsed()
                }
            });
        });
    }
    g.finish();
}

fn bench_uncontended(rt: &Runtime, c: &mut Criterion, summary: &Summary, urls: &[String]) {
    let imps = impls(rt, urls, false);
    criterion_throughput(rt, c, "uncontended_16", &imps);
    let rounds = timed_throughput(rt, &imps, CYCLES_16);
    report_throughput(summary, "uncontended_16", &imps, &rounds);
}

fn bench_fencing(rt: &Runtime, c: &mut Criterion, summary: &Summary, urls: &[String]) {
    let plain = impls(rt, urls, false).swap_remove(0);
    let fenced = match impls(rt, urls, true).swap_remove(0) {
        Impl::Quorumlock(q) => Impl::Fenced(q),
        _ => unreachable!(),
    };
    let imps = vec![plain, fenced];
    let mut g = c.benchmark_group("fencing_cycle");
    for imp in &imps {
        let key = format!("crit:fence:{}", imp.name());
        g.bench_function(imp.name(), |b| {
            b.to_async(rt).iter(|| imp.cycle(&key, TTL));
        });
    }
    g.finish();
    criterion_throughput(rt, c, "fencing_uncontended_16", &imps);
    let rounds = timed_cycles(rt, &imps, CYCLES);
    report_cycles(summary, "fencing_cycle", &imps, &rounds);
    let rounds = timed_throughput(rt, &imps, CYCLES_16);
    report_throughput(summary, "fencing_uncontended_16", &imps, &rounds);
}

/// Groups of the `groups` section, and nodes per group.
const GROUPS: usize = 4;
const GROUP_NODES: usize = 3;

/// `(requests run, CPU seconds spent)` by each server so far: `SET`, `EVAL` and `EVALSHA`
/// calls from `INFO commandstats`, and the process's user + system time.
async fn server_load(cluster: &LocalCluster) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let url = cluster.direct_url(i).expect("node");
        let client = redis::Client::open(url).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        let calls = |cmd: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let cpu = cluster.pid(i).ok().flatten().map_or(0.0, proc_cpu_time);
        out.push((calls("set") + calls("eval") + calls("evalsha"), cpu));
    }
    out
}

/// Deletes the group-map record on every node, so that a client of another map can be
/// built next (the previous client was dropped first).
async fn forget_group_map(cluster: &LocalCluster) {
    for i in 0..cluster.len() {
        let client = redis::Client::open(cluster.direct_url(i).expect("node")).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let _: () = redis::cmd("DEL")
            .arg("quorumlock:groupmap")
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
}

/// 16 tasks, each `cycles` acquire + release cycles on a new resource every cycle.
async fn throughput_spread(imp: &Impl, cycles: usize, tag: &str) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let imp = imp.clone();
        let tag = format!("spread:{tag}:{t}");
        tasks.push(tokio::spawn(async move {
            for i in 0..cycles {
                imp.cycle(&format!("{tag}:{i}"), TTL).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    (TASKS * cycles) as f64 / start.elapsed().as_secs_f64()
}

/// Cycle latency of a pair within one lock group and of a pair across two groups.
/// The raw floor of one cycle on three voters: `SET NX PX` then `DEL` on all three at
/// once, through a multiplexed connection per master or redis-rs's cluster client per
/// cluster voter.
enum Floor {
    Plain(Vec<redis::aio::MultiplexedConnection>),
    Cluster(Vec<redis::cluster_async::ClusterConnection>),
}

impl Floor {
    async fn connect(urls: &[String], cluster: bool) -> Floor {
        if !cluster {
            let mut conns = Vec::new();
            for u in urls {
                let c = redis::Client::open(u.as_str()).expect("URL");
                conns.push(c.get_multiplexed_async_connection().await.expect("connect"));
            }
            return Floor::Plain(conns);
        }
        let mut conns = Vec::new();
        for u in urls {
            let seeds: Vec<String> = u
                .trim_start_matches("redis+cluster://")
                .split(',')
                .map(|h| format!("redis://{h}"))
                .collect();
            let c = redis::cluster::ClusterClient::new(seeds).expect("cluster client");
            conns.push(c.get_async_connection().await.expect("connect"));
        }
        Floor::Cluster(conns)
    }

    async fn cycle(&mut self, key: &str) {
        let mut set = redis::cmd("SET");
        set.arg(key)
            .arg("floor-token")
            .arg("NX")
            .arg("PX")
            .arg(10_000);
        let mut del = redis::cmd("DEL");
        del.arg(key);
        match self {
            Floor::Plain(cs) => {
                futures::future::join_all(cs.iter_mut().map(|c| set.query_async::<()>(c))).await;
                futures::future::join_all(cs.iter_mut().map(|c| del.query_async::<()>(c))).await;
            }
            Floor::Cluster(cs) => {
                futures::future::join_all(cs.iter_mut().map(|c| set.query_async::<()>(c))).await;
                futures::future::join_all(cs.iter_mut().map(|c| del.query_async::<()>(c))).await;
            }
        }
    }
}

fn bench_cluster_voters(rt: &Runtime, summary: &Summary) {
    let plain = rt
        .block_on(LocalCluster::launch(3))
        .expect("launch 3 redis-server nodes");
    let clusters = rt
        .block_on(ClusterVoters::launch(3, 3, 0))
        .expect("launch 3 Redis Clusters of 3 masters");
    let kinds = [
        ("plain", plain.urls(), false),
        ("cluster", clusters.urls(), true),
    ];
    let (locks, mut floors): (Vec<Redlock>, Vec<Floor>) = rt.block_on(async {
        let mut locks = Vec::new();
        let mut floors = Vec::new();
        for (_, urls, cluster) in &kinds {
            locks.push(Redlock::builder(urls.clone()).build().await.expect("build"));
            floors.push(Floor::connect(urls, *cluster).await);
        }
        (locks, floors)
    });
    let names = [
        "quorumlock/plain",
        "quorumlock/cluster",
        "floor/plain",
        "floor/cluster",
    ];
    let mut rounds: Vec<Vec<Vec<Duration>>> = vec![Vec::new(); names.len()];
    for round in 0..ROUNDS {
        for (k, rs) in rounds.iter_mut().enumerate() {
            let lat = rt.block_on(async {
                let mut lat = Vec::with_capacity(CYCLES);
                for i in 0..CYCLES {
                    // A new resource every cycle: spread over every slot (and shard).
                    let key = format!("cv-{round}-{i}");
                    let t = Instant::now();
                    if k < 2 {
                        let lock = locks[k].try_lock(&key, TTL).await.expect("lock");
                        lock.release().await.expect("release");
                    } else {
                        floors[k - 2].cycle(&key).await;
                    }
                    lat.push(t.elapsed());
                }
                lat
            });
            rs.push(lat);
        }
    }
    let mut p50 = vec![0.0; names.len()];
    for (k, name) in names.iter().enumerate() {
        p50[k] = median_of(&rounds[k], |v| us(percentile(v, 0.50)));
        let p99 = median_of(&rounds[k], |v| us(percentile(v, 0.99)));
        println!(
            "[cluster_voters] {name:<20} p50 {:>8.1} µs  p99 {p99:>8.1} µs",
            p50[k]
        );
        summary.line(&format!(
            r#"{{"section":"cluster_voters","impl":"{name}","p50_us":{:.1},"p99_us":{p99:.1}}}"#,
            p50[k]
        ));
    }
    // The load split over the shards: requests each cluster master ran in the timed rounds
    // (the floor's SETs included: every cycle of every implementation uses a new key).
    let mut shards = Vec::new();
    for i in 0..clusters.len() {
        let voter = clusters.voter(i).expect("voter");
        let load = rt.block_on(server_load(voter.processes()));
        shards.extend(load.iter().map(|(requests, _)| *requests));
    }
    let mean = shards.iter().sum::<u64>() as f64 / shards.len().max(1) as f64;
    let worst = shards
        .iter()
        .map(|r| (*r as f64 - mean).abs() / mean)
        .fold(0.0, f64::max);
    println!(
        "[cluster_voters] requests per shard master: {shards:?} (largest deviation from the mean {:.1} %)",
        worst * 100.0
    );
    summary.line(&format!(
        r#"{{"section":"cluster_voters","shard_requests":{shards:?},"largest_deviation":{worst:.4}}}"#
    ));
    println!(
        "[cluster_voters] cluster / plain (p50): quorumlock {:.2}x, floor {:.2}x; quorumlock / floor: plain {:.2}x, cluster {:.2}x",
        p50[1] / p50[0],
        p50[3] / p50[2],
        p50[0] / p50[2],
        p50[1] / p50[3]
    );
    drop(locks);
    drop(clusters);
    drop(plain);
}

fn bench_spanning(rt: &Runtime, summary: &Summary) {
    let cluster = rt
        .block_on(LocalCluster::launch(2 * GROUP_NODES))
        .expect("launch 6 redis-server nodes");
    let urls = cluster.urls();
    let locks = rt.block_on(async {
        forget_group_map(&cluster).await;
        Redlock::builder(urls[..GROUP_NODES].to_vec())
            .group(urls[GROUP_NODES..].to_vec())
            .groups_version(2)
            .build()
            .await
            .expect("quorumlock build")
    });
    let within = vec!["pair:{0}:a".to_owned(), "pair:{0}:b".to_owned()];
    let other = (0..1000)
        .map(|i| format!("across-{i}"))
        .find(|n| locks.group_of(n) != locks.group_of("across-0"))
        .expect("a name in the other group");
    let across = vec!["across-0".to_owned(), other];
    let mut rounds: Vec<Vec<Vec<Duration>>> = vec![Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (k, names) in [&within, &across].into_iter().enumerate() {
            let lat = rt.block_on(async {
                let mut lat = Vec::with_capacity(CYCLES);
                for _ in 0..CYCLES {
                    let t = Instant::now();
                    let lock = locks.try_lock_many(names, TTL).await.expect("lock pair");
                    lock.release().await.expect("release pair");
                    lat.push(t.elapsed());
                }
                lat
            });
            rounds[k].push(lat);
        }
    }
    let mut p50 = [0.0; 2];
    for (k, name) in ["pair-within-group", "pair-across-groups"]
        .iter()
        .enumerate()
    {
        let r = &rounds[k];
        p50[k] = median_of(r, |v| us(percentile(v, 0.50)));
        let p99 = median_of(r, |v| us(percentile(v, 0.99)));
        println!(
            "[spanning] {name:<22} p50 {:>8.1} µs  p99 {p99:>8.1} µs",
            p50[k]
        );
        summary.line(&format!(
            r#"{{"section":"spanning","impl":"{name}","p50_us":{:.1},"p99_us":{p99:.1}}}"#,
            p50[k]
        ));
    }
    println!("[spanning] across / within (p50): {:.2}x", p50[1] / p50[0]);
    drop(locks);
    drop(cluster);
}

fn bench_groups(rt: &Runtime, summary: &Summary) {
    // One process set: group g is nodes g*3 .. g*3+3.
    let cluster = rt
        .block_on(LocalCluster::launch(GROUPS * GROUP_NODES))
        .expect("launch 12 redis-server nodes");
    let urls = cluster.urls();
    let group = |g: usize| urls[g * GROUP_NODES..(g + 1) * GROUP_NODES].to_vec();
    let refs = rt.block_on(async {
        let rs = rslock::LockManager::new(group(0));
        let floor = support::Floor::connect(&group(0))
            .await
            .expect("floor connect");
        vec![Impl::Floor(floor), Impl::Rslock(rs)]
    });
    let sizes = [1usize, 2, 4];
    let names: Vec<String> = sizes.iter().map(|g| format!("quorumlock-g{g}")).collect();
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); refs.len() + sizes.len()];
    let mut load: Vec<Vec<(u64, f64)>> = vec![vec![(0, 0.0); cluster.len()]; sizes.len()];
    for round in 0..ROUNDS {
        for (k, imp) in refs.iter().enumerate() {
            rounds[k].push(rt.block_on(throughput_spread(imp, CYCLES_16, &format!("{round}"))));
        }
        for (k, &g) in sizes.iter().enumerate() {
            let tp = rt.block_on(async {
                forget_group_map(&cluster).await;
                let mut b = Redlock::builder(group(0));
                for h in 1..g {
                    b = b.group(group(h));
                }
                if g > 1 {
                    b = b.groups_version(g as u16);
                }
                let imp = Impl::Quorumlock(b.build().await.expect("quorumlock build"));
                throughput_spread(&imp, 20, &format!("warm{round}:{g}")).await;
                let before = server_load(&cluster).await;
                let tp = throughput_spread(&imp, CYCLES_16, &format!("{round}:{g}")).await;
                let after = server_load(&cluster).await;
                for (i, (b, a)) in before.iter().zip(&after).enumerate() {
                    load[k][i].0 += a.0.saturating_sub(b.0);
                    load[k][i].1 += a.1 - b.1;
                }
                drop(imp);
                tp
            });
            rounds[refs.len() + k].push(tp);
        }
    }
    for (k, r) in rounds.iter().enumerate() {
        let name = if k < refs.len() {
            refs[k].name().to_owned()
        } else {
            names[k - refs.len()].clone()
        };
        let m = median(r);
        println!("[groups] {name:<22} {m:>9.0} ops/s  (rounds {r:.0?})");
        summary.line(&format!(
            r#"{{"section":"groups","impl":"{name}","ops_per_s":{m:.0},"rounds_ops_per_s":{}}}"#,
            support::json_f64s(r)
        ));
    }
    let cycles = (ROUNDS * TASKS * CYCLES_16) as f64;
    for (k, &g) in sizes.iter().enumerate() {
        let used = &load[k][..g * GROUP_NODES];
        let requests: Vec<u64> = used.iter().map(|l| l.0).collect();
        let mean = requests.iter().sum::<u64>() as f64 / used.len() as f64;
        let spread = requests
            .iter()
            .map(|&r| (r as f64 / mean - 1.0).abs())
            .fold(0.0, f64::max);
        let cpu_us: Vec<f64> = used
            .iter()
            .map(|l| {
                if l.0 == 0 {
                    0.0
                } else {
                    l.1 * 1e6 / l.0 as f64
                }
            })
            .collect();
        println!(
            "[groups] G={g}: requests per server {requests:?} (max deviation from the mean {:.1} %), \
             {:.2} requests per cycle per server, server CPU per request {:.1?} µs",
            spread * 100.0,
            mean / cycles,
            cpu_us
        );
        summary.line(&format!(
            r#"{{"section":"groups_load","groups":{g},"requests_per_server":[{}],"max_deviation":{spread:.4},"cpu_us_per_request":{}}}"#,
            requests.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            support::json_f64s(&cpu_us)
        ));
    }
    drop(refs);
    drop(cluster);
}

fn bench_scaling(rt: &Runtime, c: &mut Criterion, summary: &Summary) {
    let mut g = c.benchmark_group("scaling");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for n in [1usize, 3, 5, 7, 9] {
        let cluster = rt
            .block_on(LocalCluster::launch(n))
            .expect("launch cluster");
        let urls = cluster.urls();
        let imps = impls(rt, &urls, false);
        let key = format!("crit:scale:{n}");
        g.bench_function(format!("quorumlock/{n}"), |b| {
            b.to_async(rt).iter(|| imps[0].cycle(&key, TTL));
        });
        let rounds = timed_cycles(rt, &imps, 1500);
        report_cycles(summary, &format!("scaling_n{n}"), &imps, &rounds);
        let tp = timed_throughput(rt, &imps, 150);
        report_throughput(summary, &format!("scaling_u16_n{n}"), &imps, &tp);

        if n == 5 {
            rt.block_on(cluster.pause(0)).expect("pause node 0");
            g.bench_function("quorumlock/5-paused", |b| {
                b.to_async(rt).iter(|| imps[0].cycle(&key, TTL));
            });
            // rslock and the floor wait for every node (here: redis-rs's 500 ms response
            // timeout), so only a few cycles each.
            let ql = timed_cycles(rt, &imps[..1], 1500);
            report_cycles(summary, "paused_n5", &imps[..1], &ql);
            let slow = rt.block_on(async {
                let mut out = Vec::new();
                for imp in &imps[1..] {
                    let mut v = Vec::new();
                    for i in 0..4 {
                        let t = Instant::now();
                        imp.cycle(&format!("paused:{i}"), TTL).await;
                        v.push(t.elapsed());
                    }
                    out.push(vec![v]);
                }
                out
            });
            report_cycles(summary, "paused_n5", &imps[1..], &slow);
            rt.block_on(cluster.resume(0)).expect("resume node 0");
        }
        drop(imps);
        drop(cluster);
    }
    g.finish();
}

fn bench_held(rt: &Runtime, summary: &Summary, urls: &[String], cluster: &LocalCluster) {
    let held_default: usize = std::env::var("QL_HELD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    const HOLD: Duration = Duration::from_secs(10);
    let pids: Vec<u32> = (0..cluster.len())
        .filter_map(|i| cluster.pid(i).ok().flatten())
        .collect();
    let server_cpu = || -> f64 { pids.iter().map(|&p| proc_cpu_time(p)).sum() };
    rt.block_on(async {
        let ql = Redlock::builder(urls.to_vec())
            .build()
            .await
            .expect("quorumlock build");
        for variant in ["idle", "watchdog_1k", "watchdog", "extend_every_1s"] {
            let ttl = match variant {
                "idle" => Duration::from_secs(60),
                "watchdog" | "watchdog_1k" => Duration::from_secs(2),
                _ => Duration::from_secs(3),
            };
            let held = if variant == "watchdog_1k" {
                held_default / 10
            } else {
                held_default
            };
            let is_watchdog = variant.starts_with("watchdog");
            let rss0 = rss_kb();
            let cpu0 = cpu_time();
            let t0 = Instant::now();
            let acquired: Vec<_> = futures::stream::iter(0..held)
                .map(|i| {
                    let ql = ql.clone();
                    async move { ql.try_lock(&format!("held:{variant}:{i}"), ttl).await }
                })
                .buffer_unordered(64)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .map(|r| r.expect("acquire held lock"))
                .collect();
            let acquire_s = t0.elapsed().as_secs_f64();
            let cpu_acq = cpu_time() - cpu0;
            let mut locks = Vec::new();
            let mut kept = Vec::new();
            if is_watchdog {
                kept = acquired
                    .into_iter()
                    .map(|l| l.keep_alive(Watchdog::new()).expect("a watchdog policy that fits the TTL"))
                    .collect();
            } else {
                locks = acquired;
            }
            let rss1 = rss_kb();
            let cpu1 = cpu_time();
            let srv1 = server_cpu();
            let hold_start = Instant::now();
            let mut extensions = 0u64;
            while hold_start.elapsed() < HOLD {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if is_watchdog {
                    let lost = kept.iter().filter(|k| k.is_lost()).count();
                    eprintln!(
                        "[held_10k:{variant}] t={:.1}s lost {lost}/{held}",
                        hold_start.elapsed().as_secs_f64()
                    );
                }
                if variant == "extend_every_1s" {
                    let results: Vec<_> = futures::stream::iter(locks.iter_mut())
                        .map(|l| l.extend(ttl))
                        .buffer_unordered(64)
                        .collect()
                        .await;
                    for r in results {
                        r.expect("extend held lock");
                        extensions += 1;
                    }
                }
            }
            let held_for = hold_start.elapsed().as_secs_f64();
            let cpu_hold = cpu_time() - cpu1;
            let srv_hold = server_cpu() - srv1;
            let rss2 = rss_kb();
            let still_valid = if is_watchdog {
                kept.iter().filter(|k| !k.is_lost() && !k.remaining().is_zero()).count()
            } else {
                locks.iter().filter(|l| l.is_valid()).count()
            };
            let t1 = Instant::now();
            let mut release_errors = 0usize;
            let errs: Vec<bool> = futures::stream::iter(locks.drain(..))
                .map(|l| async move { l.release().await.is_err() })
                .buffer_unordered(64)
                .collect()
                .await;
            release_errors += errs.iter().filter(|e| **e).count();
            let errs: Vec<bool> = futures::stream::iter(kept.drain(..))
                .map(|k| async move {
                    let r = k.release().await;
                    if let Err(e) = &r {
                        static ONCE: std::sync::Once = std::sync::Once::new();
                        ONCE.call_once(|| eprintln!("[held_10k:watchdog] first release error: {e}"));
                    }
                    r.is_err()
                })
                .buffer_unordered(64)
                .collect()
                .await;
            release_errors += errs.iter().filter(|e| **e).count();
            let release_s = t1.elapsed().as_secs_f64();
            println!(
                "[held_10k:{variant}] ttl {ttl:?}: acquire {acquire_s:.2} s (cpu {cpu_acq:.2} s), RSS {rss0} → {rss1} kB (+{} kB, {:.0} B/lock), hold {held_for:.1} s: client cpu {cpu_hold:.3} s ({:.2}% of a core), servers cpu {srv_hold:.2} s, {extensions} manual extensions, {still_valid} still valid, RSS {rss2} kB; release {release_s:.2} s, {release_errors} release errors",
                rss1.saturating_sub(rss0),
                (rss1.saturating_sub(rss0) * 1024) as f64 / held as f64,
                100.0 * cpu_hold / held_for
            );
            summary.line(&format!(
                r#"{{"section":"held_10k","variant":"{variant}","locks":{held},"ttl_ms":{},"acquire_s":{acquire_s:.3},"acquire_cpu_s":{cpu_acq:.3},"rss_before_kb":{rss0},"rss_held_kb":{rss1},"rss_end_kb":{rss2},"hold_s":{held_for:.2},"client_cpu_s":{cpu_hold:.4},"client_cpu_pct":{:.3},"servers_cpu_s":{srv_hold:.3},"extensions":{extensions},"still_valid":{still_valid},"release_s":{release_s:.3},"release_errors":{release_errors}}}"#,
                ttl.as_millis(),
                100.0 * cpu_hold / held_for
            ));
        }
    });
}

/// What a contended run measured.
struct Contended {
    acquisitions: usize,
    window: Duration,
    latencies: Vec<Duration>,
    order: Vec<u8>,
    /// Every acquisition granted within the window: when its `lock()` call started, when it
    /// got the lock, and its place in the order of acquisitions ([`ACQ_SEQ`]).
    waits: Vec<Wait>,
    timeouts: u64,
}

/// Acquisition sequence number: bumped on every acquisition of the contended resource
/// (read by the split-vote counter).
pub static ACQ_SEQ: AtomicU64 = AtomicU64::new(0);

#[derive(Clone)]
enum Contender {
    Quorumlock(Redlock),
    Rslock(rslock::LockManager),
}

async fn run_contended(
    contenders: Vec<Contender>,
    resource: &'static str,
    window: Duration,
) -> Contended {
    let ttl = Duration::from_secs(2);
    let order = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let waits = Arc::new(std::sync::Mutex::new(Vec::<Wait>::new()));
    let timeouts = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop = start + window;
    let mut tasks = Vec::new();
    for (id, who) in contenders.into_iter().enumerate() {
        let order = order.clone();
        let waits = waits.clone();
        let timeouts = timeouts.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < stop {
                let t = Instant::now();
                match &who {
                    Contender::Quorumlock(ql) => match ql.lock(resource, ttl).await {
                        Ok(l) => {
                            let d = t.elapsed();
                            let grant = Grant {
                                seq: ACQ_SEQ.fetch_add(1, Ordering::SeqCst),
                                at: Instant::now(),
                            };
                            if grant.at < stop {
                                lat.push(d);
                                order.lock().unwrap().push(id as u8);
                                waits.lock().unwrap().push(Wait {
                                    contender: id,
                                    started: t,
                                    grant: Some(grant),
                                });
                            }
                            l.release().await.expect("release");
                        }
                        Err(e) => {
                            assert!(e.is_retryable(), "contended lock: {e}");
                            timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    Contender::Rslock(rs) => match rs.acquire_no_guard(resource, ttl).await {
                        Ok(l) => {
                            let d = t.elapsed();
                            let grant = Grant {
                                seq: ACQ_SEQ.fetch_add(1, Ordering::SeqCst),
                                at: Instant::now(),
                            };
                            if grant.at < stop {
                                lat.push(d);
                                order.lock().unwrap().push(id as u8);
                                waits.lock().unwrap().push(Wait {
                                    contender: id,
                                    started: t,
                                    grant: Some(grant),
                                });
                            }
                            rs.unlock(&l).await;
                        }
                        Err(e) => panic!("rslock acquire: {e:?}"),
                    },
                }
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("contender"));
    }
    let order = std::mem::take(&mut *order.lock().unwrap());
    let waits = std::mem::take(&mut *waits.lock().unwrap());
    Contended {
        acquisitions: order.len(),
        window,
        latencies,
        order,
        waits,
        timeouts: timeouts.load(Ordering::Relaxed),
    }
}

fn bench_contended(summary: &Summary, urls: &[String]) {
    let window = Duration::from_secs(3);
    let (rt, stats) = split_votes::runtime();
    let variants: [(&str, &'static str); 4] = [
        ("quorumlock-notify", "contended:notify"),
        ("quorumlock-poll", "contended:poll"),
        ("rslock", "contended:rslock"),
        ("rslock-20ms", "contended:rslock20"),
    ];
    let mut samples: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for (name, resource) in variants {
        let result = rt.block_on(async {
            let mut contenders = Vec::new();
            for _ in 0..TASKS {
                contenders.push(match name {
                    "quorumlock-notify" | "quorumlock-poll" => Contender::Quorumlock(
                        Redlock::builder(urls.to_vec())
                            .notify(name == "quorumlock-notify")
                            .build()
                            .await
                            .expect("quorumlock build"),
                    ),
                    _ => {
                        let mut rs = rslock::LockManager::new(urls.to_vec());
                        if name == "rslock-20ms" {
                            rs.set_retry(3, Duration::from_millis(20));
                        }
                        // Connect before the clock starts.
                        let l = rs.lock("warm", TTL).await.expect("rslock warm");
                        rs.unlock(&l).await;
                        Contender::Rslock(rs)
                    }
                });
            }
            // Warm-up: connections, scripts, subscriptions.
            if let Contender::Quorumlock(ql) = &contenders[0] {
                let l = ql.lock(resource, TTL).await.expect("warm");
                l.release().await.expect("warm release");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            stats.reset();
            run_contended(contenders, resource, window).await
        });
        let split = stats.snapshot();
        let mut lat = result.latencies.clone();
        let ops = result.acquisitions as f64 / result.window.as_secs_f64();
        let p50 = us(percentile(&mut lat, 0.50));
        let p99 = us(percentile(&mut lat, 0.99));
        let max = us(percentile(&mut lat, 1.0));
        let same = result.order.windows(2).filter(|w| w[0] == w[1]).count();
        let fair_same_pct = 100.0 * same as f64 / (result.order.len().max(2) - 1) as f64;
        let mut per_task = [0usize; TASKS];
        for &id in &result.order {
            per_task[id as usize] += 1;
        }
        let is_ql = name.starts_with("quorumlock");
        // Per acquisition: acquisitions granted during its wait to tasks that started waiting
        // after it (overtakes), and to any other task (hand-offs waited). Each task's first
        // wait is left out: the 16 start together, before anyone is queued.
        let scores = fairness::scores(&result.waits);
        let mut seen = [false; TASKS];
        let later: Vec<(usize, &fairness::Score)> = result
            .waits
            .iter()
            .zip(&scores)
            .enumerate()
            .filter(|(_, (w, _))| std::mem::replace(&mut seen[w.contender], true))
            .map(|(i, (_, s))| (i, s))
            .collect();
        let overtakes = Distribution::of(later.iter().map(|(_, s)| s.overtakes));
        let hand_offs = Distribution::of(later.iter().map(|(_, s)| s.hand_offs));
        let first_round = Distribution::of(scores.iter().map(|s| s.overtakes)); // all waits
        let over_2: Vec<(usize, usize, usize)> = later
            .iter()
            .filter(|(_, s)| s.overtakes > 2)
            .map(|(i, s)| (result.waits[*i].contender, *i, s.overtakes))
            .collect();
        println!(
            "[contended_16] {name:<18} after the first round: overtakes p50 {} p99 {} max {} mean {:.3}  hand-offs waited p50 {} p99 {} max {} mean {:.2}  (with the first round: overtakes max {}); overtaken > 2: {} waits {:?}",
            overtakes.p50,
            overtakes.p99,
            overtakes.max,
            overtakes.mean(),
            hand_offs.p50,
            hand_offs.p99,
            hand_offs.max,
            hand_offs.mean(),
            first_round.max,
            over_2.len(),
            &over_2[..over_2.len().min(8)]
        );
        println!(
            "[contended_16] {name:<18} {ops:>7.0} ops/s  acquire p50 {p50:>9.1} µs  p99 {p99:>9.1} µs  max {max:>9.1} µs  same-task re-acquire {fair_same_pct:.1}%  per task {per_task:?}  timeouts {}{}",
            result.timeouts,
            if is_ql {
                format!(
                    "  attempts {} failed {} failed-with-grants {} split votes {} ({:.2}% of attempts)",
                    split.attempts,
                    split.failed,
                    split.failed_with_grants,
                    split.split,
                    100.0 * split.split as f64 / split.attempts.max(1) as f64
                )
            } else {
                String::new()
            }
        );
        let split_json = if is_ql {
            format!(
                r#","attempts":{},"failed_attempts":{},"failed_with_grants":{},"split_votes":{},"split_vote_pct":{:.3}"#,
                split.attempts,
                split.failed,
                split.failed_with_grants,
                split.split,
                100.0 * split.split as f64 / split.attempts.max(1) as f64
            )
        } else {
            String::new()
        };
        summary.line(&format!(
            r#"{{"section":"contended_16","impl":"{name}","ops_per_s":{ops:.0},"acquisitions":{},"p50_us":{p50:.1},"p99_us":{p99:.1},"max_us":{max:.1},"same_task_pct":{fair_same_pct:.2},"min_task_share":{},"max_task_share":{},"timeouts":{},"overtakes_p50":{},"overtakes_p99":{},"overtakes_max":{},"overtakes_mean":{:.3},"hand_offs_p50":{},"hand_offs_p99":{},"hand_offs_max":{},"hand_offs_mean":{:.3},"overtakes_max_first_round":{}{split_json}}}"#,
            result.acquisitions,
            per_task.iter().min().unwrap(),
            per_task.iter().max().unwrap(),
            result.timeouts,
            overtakes.p50,
            overtakes.p99,
            overtakes.max,
            overtakes.mean(),
            hand_offs.p50,
            hand_offs.p99,
            hand_offs.max,
            hand_offs.mean(),
            first_round.max
        ));
        samples.insert(name, result.latencies);
    }
    for (name, v) in samples {
        let lat: Vec<f64> = v.iter().map(|d| us(*d)).collect();
        summary.line(&format!(
            r#"{{"section":"contended_samples","impl":"{name}","lat_us":{}}}"#,
            support::json_f64s(&lat)
        ));
    }
}

/// One contender of `readers_16` and `semaphore_16`, with its own client.
#[derive(Clone)]
enum Cycler {
    /// A read lock, one attempt (readers are never refused without a writer).
    Read(Redlock),
    /// The mutex, waiting with `lock` (notify waiting, the default).
    Mutex(Redlock),
    /// The mutex, one attempt (`try_lock`; for distinct, uncontended resources).
    TryMutex(Redlock),
    /// A permit of a semaphore, waiting with `acquire` (the client's retry policy).
    Permit(Semaphore),
    /// The raw floor: `SET NX PX` on every node, then compare-and-delete on every node.
    Floor(support::Floor),
}

impl Cycler {
    /// One acquire + release on `key` (holding for no time): the acquire latency, or why
    /// it failed.
    async fn cycle(&self, key: &str, ttl: Duration) -> Result<Duration, String> {
        let t = Instant::now();
        let lock = match self {
            Cycler::Read(q) => q.try_read_lock(key, ttl).await,
            Cycler::Mutex(q) => q.lock(key, ttl).await,
            Cycler::TryMutex(q) => q.try_lock(key, ttl).await,
            Cycler::Permit(s) => s.acquire(ttl).await,
            Cycler::Floor(f) => {
                let (token, granted) = f.acquire(key, ttl).await;
                let d = t.elapsed();
                f.release(key, &token).await;
                return if granted > f.nodes() / 2 {
                    Ok(d)
                } else {
                    Err(format!("floor: only {granted} grants"))
                };
            }
        };
        let lock = lock.map_err(|e| e.to_string())?;
        let d = t.elapsed();
        ACQ_SEQ.fetch_add(1, Ordering::SeqCst);
        lock.release().await.map_err(|e| format!("release: {e}"))?;
        Ok(d)
    }
}

/// What one window of `TASKS` cyclers measured.
struct Window {
    latencies: Vec<Duration>,
    per_task: Vec<usize>,
    errors: usize,
    first_error: Option<String>,
    attempts: u64,
}

/// `TASKS` tasks cycle for `window`; task `t` uses `keys(t)`. Acquisitions that end after
/// the window are not counted.
async fn run_window(
    cyclers: &[Cycler],
    keys: impl Fn(usize) -> String,
    window: Duration,
    stats: &split_votes::Stats,
) -> Window {
    let ttl = Duration::from_secs(2);
    stats.reset();
    let stop = Instant::now() + window;
    let mut tasks = Vec::new();
    for (t, cycler) in cyclers.iter().enumerate() {
        let cycler = cycler.clone();
        let key = keys(t);
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut first) = (Vec::new(), 0usize, None);
            while Instant::now() < stop {
                match cycler.cycle(&key, ttl).await {
                    Ok(d) if Instant::now() < stop => lat.push(d),
                    Ok(_) => {}
                    Err(e) => {
                        errors += 1;
                        first.get_or_insert(e);
                    }
                }
            }
            (lat, errors, first)
        }));
    }
    let mut w = Window {
        latencies: Vec::new(),
        per_task: Vec::new(),
        errors: 0,
        first_error: None,
        attempts: 0,
    };
    for t in tasks {
        let (lat, errors, first) = t.await.expect("cycler");
        w.per_task.push(lat.len());
        w.latencies.extend(lat);
        w.errors += errors;
        if w.first_error.is_none() {
            w.first_error = first;
        }
    }
    w.attempts = stats.snapshot().attempts;
    w
}

/// A variant of a windowed section: its name, its `TASKS` cyclers, whether they share
/// one resource (else each task has its own), and more JSON fields for its summary line.
struct Variant {
    name: &'static str,
    cyclers: Vec<Cycler>,
    shared: bool,
    extra: String,
}

/// `ROUNDS` windows of every variant, interleaved round by round; prints and records
/// the median round's ops/s, the median of the rounds' acquire p50/p99, the errors, and
/// quorumlock's attempts per acquisition. Returns each variant's median ops/s.
fn run_windows(
    rt: &Runtime,
    stats: &split_votes::Stats,
    summary: &Summary,
    section: &str,
    variants: &[Variant],
) -> Vec<f64> {
    let window = Duration::from_secs(2);
    let mut rounds: Vec<Vec<Window>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (k, v) in variants.iter().enumerate() {
            let keys = |t: usize| {
                if v.shared {
                    format!("{section}:{}:{round}", v.name)
                } else {
                    format!("{section}:{}:{round}:{t}", v.name)
                }
            };
            rounds[k].push(rt.block_on(run_window(&v.cyclers, keys, window, stats)));
        }
    }
    let mut medians = Vec::new();
    for (v, r) in variants.iter().zip(&rounds) {
        let ops: Vec<f64> = r
            .iter()
            .map(|w| w.latencies.len() as f64 / window.as_secs_f64())
            .collect();
        let lats: Vec<Vec<Duration>> = r.iter().map(|w| w.latencies.clone()).collect();
        let p50 = median_of(&lats, |v| us(percentile(v, 0.50)));
        let p99 = median_of(&lats, |v| us(percentile(v, 0.99)));
        let max = median_of(&lats, |v| us(percentile(v, 1.0)));
        let errors: usize = r.iter().map(|w| w.errors).sum();
        let acquired: usize = r.iter().map(|w| w.latencies.len()).sum();
        let attempts: u64 = r.iter().map(|w| w.attempts).sum();
        let per_attempt = if matches!(v.cyclers[0], Cycler::Floor(_)) {
            1.0
        } else {
            attempts as f64 / acquired.max(1) as f64
        };
        let shares: Vec<usize> = (0..TASKS)
            .map(|t| {
                r.iter()
                    .map(|w| w.per_task.get(t).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        let (min_share, max_share) = (
            shares.iter().copied().min().unwrap_or(0),
            shares.iter().copied().max().unwrap_or(0),
        );
        let m = median(&ops);
        medians.push(m);
        let first = r.iter().find_map(|w| w.first_error.clone());
        println!(
            "[{section}] {:<26} {m:>8.0} ops/s (rounds {ops:.0?})  acquire p50 {p50:>8.1} µs  p99 {p99:>9.1} µs  max {max:>9.1} µs  attempts/acquisition {per_attempt:.2}  per task {min_share}..{max_share}  errors {errors}{}",
            v.name,
            first.map(|e| format!(" (first: {e})")).unwrap_or_default()
        );
        summary.line(&format!(
            r#"{{"section":"{section}","impl":"{}","ops_per_s":{m:.0},"rounds_ops_per_s":{},"p50_us":{p50:.1},"p99_us":{p99:.1},"max_us":{max:.1},"attempts_per_acquisition":{per_attempt:.3},"min_task_share":{min_share},"max_task_share":{max_share},"errors":{errors}{}}}"#,
            v.name,
            support::json_f64s(&ops),
            v.extra
        ));
    }
    medians
}

/// `contended_pairs` (see the module docs): per waiting strategy, one 3 s window of 8
/// tasks on the ring of pairs, twice, alternating the strategies.
fn bench_pairs(rt: &Runtime, summary: &Summary, urls: &[String]) {
    const N: usize = 8;
    let window = Duration::from_secs(3);
    for round in 0..2 {
        for (name, notify) in [("quorumlock-notify", true), ("quorumlock-poll", false)] {
            let (mut lat, shares, timeouts) = rt.block_on(async {
                let mut tasks = Vec::new();
                let mut clients = Vec::new();
                for _ in 0..N {
                    let ql = Redlock::builder(urls.to_vec())
                        .notify(notify)
                        .retry(quorumlock::Retry::new().max_wait(Duration::from_secs(5)))
                        .build()
                        .await
                        .expect("quorumlock build");
                    clients.push(ql);
                }
                let stop = Instant::now() + window;
                for (id, ql) in clients.into_iter().enumerate() {
                    let pair = [
                        format!("pairs:{round}:{name}:{}", id % 4),
                        format!("pairs:{round}:{name}:{}", (id + 1) % 4),
                    ];
                    tasks.push(tokio::spawn(async move {
                        let mut lat = Vec::new();
                        let mut timeouts = 0u64;
                        while Instant::now() < stop {
                            let t = Instant::now();
                            match ql.lock_many(&pair, Duration::from_secs(2)).await {
                                Ok(l) => {
                                    if Instant::now() < stop {
                                        lat.push(t.elapsed());
                                    }
                                    l.release().await.expect("release");
                                }
                                Err(e) => {
                                    assert!(e.is_retryable(), "contended pair: {e}");
                                    timeouts += 1;
                                }
                            }
                        }
                        (lat, timeouts)
                    }));
                }
                let mut lat = Vec::new();
                let mut shares = Vec::new();
                let mut timeouts = 0;
                for t in tasks {
                    let (l, to) = t.await.expect("pair task");
                    shares.push(l.len());
                    lat.extend(l);
                    timeouts += to;
                }
                (lat, shares, timeouts)
            });
            let n = lat.len();
            let ops = n as f64 / window.as_secs_f64();
            let p50 = us(percentile(&mut lat, 0.5));
            let p99 = us(percentile(&mut lat, 0.99));
            let max = us(percentile(&mut lat, 1.0));
            let min_share = shares.iter().min().copied().unwrap_or(0);
            let max_share = shares.iter().max().copied().unwrap_or(0);
            eprintln!(
                "[contended_pairs] round {round} {name:<18} {ops:>7.0} ops/s  acquire p50 {p50:>9.1} µs  p99 {p99:>9.1} µs  max {max:>9.1} µs  per task {shares:?}  timeouts {timeouts}"
            );
            summary.line(&format!(
                r#"{{"section":"contended_pairs","round":{round},"impl":"{name}","ops_per_s":{ops:.0},"acquisitions":{n},"p50_us":{p50:.1},"p99_us":{p99:.1},"max_us":{max:.1},"min_task_share":{min_share},"max_task_share":{max_share},"timeouts":{timeouts}}}"#
            ));
        }
    }
}

/// `TASKS` quorumlock clients, connected (their scripts loaded) by `warm`.
fn clients(rt: &Runtime, urls: &[String]) -> Vec<Redlock> {
    rt.block_on(async {
        let mut out = Vec::new();
        for i in 0..TASKS {
            let ql = Redlock::builder(urls.to_vec())
                .build()
                .await
                .expect("quorumlock build");
            let l = ql
                .try_lock(&format!("warm:w:{i}"), TTL)
                .await
                .expect("warm");
            l.release().await.expect("warm release");
            let r = ql
                .try_read_lock(&format!("warm:r:{i}"), TTL)
                .await
                .expect("warm read");
            r.release().await.expect("warm read release");
            out.push(ql);
        }
        out
    })
}

/// `TASKS` raw floors, each with its own connections.
fn floors(rt: &Runtime, urls: &[String]) -> Vec<Cycler> {
    rt.block_on(async {
        let mut out = Vec::new();
        for i in 0..TASKS {
            let f = support::Floor::connect(urls).await.expect("floor connect");
            f.cycle(&format!("warm:f:{i}"), TTL).await;
            out.push(Cycler::Floor(f));
        }
        out
    })
}

fn bench_readers(rt: &Runtime, stats: &split_votes::Stats, summary: &Summary, urls: &[String]) {
    let ql = clients(rt, urls);
    let variants = [
        Variant {
            name: "quorumlock-read-1",
            cyclers: ql.iter().cloned().map(Cycler::Read).collect(),
            shared: true,
            extra: String::new(),
        },
        Variant {
            name: "quorumlock-mutex-1",
            cyclers: ql.iter().cloned().map(Cycler::Mutex).collect(),
            shared: true,
            extra: String::new(),
        },
        Variant {
            name: "quorumlock-mutex-16",
            cyclers: ql.iter().cloned().map(Cycler::TryMutex).collect(),
            shared: false,
            extra: String::new(),
        },
        Variant {
            name: "floor-16",
            cyclers: floors(rt, urls),
            shared: false,
            extra: String::new(),
        },
    ];
    let m = run_windows(rt, stats, summary, "readers_16", &variants);
    println!(
        "[readers_16] read on 1 resource: {:.2} × the contended mutex, {:.2} × the mutex on 16 resources, {:.2} × the floor",
        m[0] / m[1],
        m[0] / m[2],
        m[0] / m[3]
    );
}

fn bench_semaphore(rt: &Runtime, stats: &split_votes::Stats, summary: &Summary, urls: &[String]) {
    let ql = clients(rt, urls);
    // Each variant on its own name: the semaphores of 4 and of 16 permits must not meet.
    let variant = |name: &'static str, permits: u32| -> Variant {
        let sems: Vec<Semaphore> = ql
            .iter()
            .map(|q| q.semaphore(name, permits).expect("semaphore"))
            .collect();
        let s = &sems[0];
        println!(
            "[semaphore_16] P = {permits} on {} nodes: per-node limit {}, quorum {}, capacity {}",
            urls.len(),
            s.per_node_limit(),
            s.quorum(),
            s.capacity()
        );
        Variant {
            name,
            extra: format!(
                r#","permits":{permits},"capacity":{},"per_node_limit":{},"quorum":{}"#,
                s.capacity(),
                s.per_node_limit(),
                s.quorum()
            ),
            cyclers: sems.into_iter().map(Cycler::Permit).collect(),
            shared: true,
        }
    };
    let variants = [
        variant("quorumlock-sem-p4", 4),
        variant("quorumlock-sem-p16", 16),
        variant("quorumlock-sem-p64", 64),
        Variant {
            name: "floor-16",
            cyclers: floors(rt, urls),
            shared: false,
            extra: String::new(),
        },
    ];
    let m = run_windows(rt, stats, summary, "semaphore_16", &variants);
    println!(
        "[semaphore_16] P = 4: {:.2} × P = 16, {:.2} × P = 64, {:.2} × the floor",
        m[0] / m[1],
        m[0] / m[2],
        m[0] / m[3]
    );
}

/// The `metrics` section's variants in this build: with the feature, recording into a
/// Prometheus recorder and not recording (the same handles, switched off); without it, the plain cycle.
fn metrics_variants() -> Vec<(&'static str, bool)> {
    if cfg!(feature = "metrics") {
        vec![("metrics-recording", true), ("metrics-noop", false)]
    } else {
        vec![("metrics-off", false)]
    }
}

/// The uncontended one-task cycle (quorumlock only), in each variant of this build: a
/// Criterion group `metrics`, then `ROUNDS` timed rounds of `CYCLES` cycles per variant,
/// the variants interleaved round by round.
fn bench_metrics(rt: &Runtime, c: &mut Criterion, summary: &Summary, urls: &[String]) {
    #[cfg(feature = "metrics")]
    let handle = switch::install(std::env::var_os("QL_NO_RECORDER").is_none());
    let ql = rt.block_on(async {
        let ql = Redlock::builder(urls.to_vec())
            .build()
            .await
            .expect("quorumlock build");
        let imp = support::Impl::Quorumlock(ql);
        for i in 0..200 {
            imp.cycle(&format!("warm:metrics:{i}"), TTL).await;
        }
        imp
    });
    let variants = metrics_variants();
    let set = |on: bool| {
        #[cfg(feature = "metrics")]
        switch::set(on);
        #[cfg(not(feature = "metrics"))]
        let _ = on;
    };
    let mut g = c.benchmark_group("metrics");
    for &(name, on) in &variants {
        set(on);
        g.bench_function(name, |b| {
            b.to_async(rt).iter(|| ql.cycle("crit:metrics", TTL));
        });
    }
    g.finish();
    let mut rounds: Vec<Vec<Vec<Duration>>> = vec![Vec::new(); variants.len()];
    // This process's CPU time per cycle, per round (the client's work, whatever the
    // machine's other load does to the wall clock).
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS {
        for (k, &(name, on)) in variants.iter().enumerate() {
            set(on);
            let cpu0 = cpu_time();
            let samples = rt.block_on(async {
                let key = format!("metrics:{name}:{round}");
                let mut v = Vec::with_capacity(CYCLES);
                for _ in 0..CYCLES {
                    let t = Instant::now();
                    ql.cycle(&key, TTL).await;
                    v.push(t.elapsed());
                }
                v
            });
            cpu[k].push((cpu_time() - cpu0) * 1e6 / CYCLES as f64);
            rounds[k].push(samples);
        }
    }
    set(false);
    for ((&(name, _), r), cpu) in variants.iter().zip(&rounds).zip(&cpu) {
        let p50 = median_of(r, |v| us(percentile(v, 0.50)));
        let p99 = median_of(r, |v| us(percentile(v, 0.99)));
        let mean = median_of(r, |v| us(v.iter().sum::<Duration>()) / v.len() as f64);
        let p50s: Vec<f64> = r
            .iter()
            .map(|v| us(percentile(&mut v.clone(), 0.5)))
            .collect();
        let means: Vec<f64> = r
            .iter()
            .map(|v| us(v.iter().sum::<Duration>()) / v.len() as f64)
            .collect();
        println!(
            "[metrics] {name:<22} p50 {p50:>8.1} µs  p99 {p99:>8.1} µs  mean {mean:>8.1} µs  (p50 per round {p50s:.1?}, mean per round {means:.1?}, CPU µs per cycle {cpu:.1?})"
        );
        summary.line(&format!(
            r#"{{"section":"metrics","impl":"{name}","p50_us":{p50:.1},"p99_us":{p99:.1},"mean_us":{mean:.1},"rounds_p50_us":{},"rounds_mean_us":{},"rounds_cpu_us":{}}}"#,
            support::json_f64s(&p50s),
            support::json_f64s(&means),
            support::json_f64s(cpu)
        ));
    }
    #[cfg(feature = "metrics")]
    {
        // Proof that the recording rounds recorded: every acquisition of those rounds (and
        // of Criterion's recording iterations) is counted.
        let text = handle.render();
        let acquired = text
            .lines()
            .find(|l| l.starts_with("quorumlock_acquire_total{outcome=\"acquired\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        let timed = (ROUNDS * CYCLES) as f64;
        println!("[metrics] recorded acquisitions: {acquired} (timed recording cycles: {timed})");
        let installed = std::env::var_os("QL_NO_RECORDER").is_none();
        assert!(
            acquired >= timed || !installed,
            "the recording rounds did not record"
        );
    }
}

/// A global recorder that records into a Prometheus recorder (with the buckets the
/// operations guide recommends) only while switched on, so that rounds with and without
/// recording can alternate in one process. Off, its handles drop every value (one atomic load).
#[cfg(feature = "metrics")]
mod switch {
    use std::sync::atomic::{AtomicBool, Ordering};

    use std::sync::Arc;

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };
    use metrics_exporter_prometheus::{
        Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
    };

    static ON: AtomicBool = AtomicBool::new(false);

    struct Switch(PrometheusRecorder);

    impl Recorder for Switch {
        fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_counter(k, u, d);
        }
        fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_gauge(k, u, d);
        }
        fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_histogram(k, u, d);
        }
        // The switch acts where a value is recorded, not where a handle is registered:
        // the library registers each handle once per client and recorder, and keeps it.
        fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Gated(self.0.register_counter(key, m))))
        }
        fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Gated(self.0.register_gauge(key, m))))
        }
        fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Gated(self.0.register_histogram(key, m))))
        }
    }

    /// A handle that records only while the switch is on.
    struct Gated<H>(H);

    fn on() -> bool {
        ON.load(Ordering::Relaxed)
    }

    impl CounterFn for Gated<Counter> {
        fn increment(&self, value: u64) {
            if on() {
                self.0.increment(value);
            }
        }
        fn absolute(&self, value: u64) {
            if on() {
                self.0.absolute(value);
            }
        }
    }

    impl GaugeFn for Gated<Gauge> {
        fn increment(&self, value: f64) {
            if on() {
                self.0.increment(value);
            }
        }
        fn decrement(&self, value: f64) {
            if on() {
                self.0.decrement(value);
            }
        }
        fn set(&self, value: f64) {
            if on() {
                self.0.set(value);
            }
        }
    }

    impl HistogramFn for Gated<Histogram> {
        fn record(&self, value: f64) {
            if on() {
                self.0.record(value);
            }
        }
    }

    const BUCKETS: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ];

    /// Installs the switchable recorder (`QL_NO_RECORDER` set: none at all, every call goes
    /// to the facade's no-op recorder).
    pub fn install(install: bool) -> PrometheusHandle {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
            .expect("buckets")
            .build_recorder();
        let handle = recorder.handle();
        if install {
            metrics::set_global_recorder(Switch(recorder)).expect("install the recorder");
        }
        handle
    }

    pub fn set(on: bool) {
        ON.store(on, Ordering::Relaxed);
    }
}
