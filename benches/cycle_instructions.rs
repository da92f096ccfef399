//! Where an uncontended acquire + release cycle's cost goes, counted rather than timed:
//! the client's CPU instructions (`valgrind --tool=callgrind`) and system calls
//! (`strace -c -f`) per cycle, for quorumlock, the raw floor (plain redis-rs,
//! `benches/support`'s `Floor`) and rslock, so the figures do not depend on what else the
//! machine is doing.
//!
//! Starts 5 local `redis-server` nodes (child processes: neither callgrind nor the
//! counting below includes them once the bench subtracts two runs), connects the chosen
//! implementation, warms up, then runs `QL_CYCLES` cycles in all, split over `QL_TASKS`
//! tokio tasks (2 worker threads, as the `lock` bench), each task on its own resource.
//!
//! * `QL_IMPL`: `quorumlock` (default), `floor` or `rslock`;
//! * `QL_TASKS`: tasks sharing the one client (default 1);
//! * `QL_CYCLES`: cycles in all (default 1000);
//! * `QL_NOTIFY=0`: quorumlock built with `.notify(false)` (no release announcements, no
//!   subscriptions), to count what notify waiting costs an uncontended cycle;
//! * `QL_NODE_TIMEOUT_MS`: quorumlock's per-node timeout (default 2000: under valgrind the
//!   client runs tens of times slower; run natively, 0 keeps the library's default).
//!
//! It also prints, per timed cycle, the wall time and the CPU time of the client process
//! and of the nodes (user + system, `getrusage` and `/proc/PID/stat`): run natively with
//! many cycles, that is what a CPU-bound run on a shared machine pays per cycle.
//!
//! `scripts/bench-cycle-instructions.sh` runs it at two cycle counts per implementation and
//! subtracts, which cancels start-up and shut-down: what is left is the per-cycle cost.

#[allow(dead_code)]
mod support;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;

use support::{Floor, Impl, cpu_time, proc_cpu_time};

/// Used by `support`'s split-vote layer (not by this bench).
pub static ACQ_SEQ: AtomicU64 = AtomicU64::new(0);

const TTL: Duration = Duration::from_secs(30);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let which = std::env::var("QL_IMPL").unwrap_or_else(|_| "quorumlock".to_owned());
    let tasks = env_usize("QL_TASKS", 1).max(1);
    let cycles = env_usize("QL_CYCLES", 1000);
    let per_task = cycles / tasks;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let cluster = LocalCluster::launch(5)
            .await
            .expect("launch 5 redis-server nodes (is redis-server installed?)");
        let urls = cluster.urls();
        let imp = match which.as_str() {
            // Generous timeouts: under valgrind the client runs tens of times slower.
            "quorumlock" => Impl::Quorumlock(
                match env_usize("QL_NODE_TIMEOUT_MS", 2000) {
                    0 => Redlock::builder(urls.clone()),
                    ms => Redlock::builder(urls.clone())
                        .node_timeout(Duration::from_millis(ms as u64)),
                }
                .notify(std::env::var("QL_NOTIFY").map_or(true, |v| v != "0"))
                .build()
                .await
                .expect("build the client"),
            ),
            "floor" => Impl::Floor(Floor::connect(&urls).await.expect("floor connect")),
            "rslock" => Impl::Rslock(rslock::LockManager::new(urls.clone())),
            other => panic!("QL_IMPL={other}: expected quorumlock, floor or rslock"),
        };
        // Warm-up: connections open, scripts loaded, the runtime's pools grown.
        let mut warm = Vec::new();
        for t in 0..tasks {
            let imp = imp.clone();
            warm.push(tokio::spawn(async move {
                for _ in 0..20 {
                    imp.cycle(&format!("warm:{t}"), TTL).await;
                }
            }));
        }
        for w in warm {
            w.await.expect("warm-up task");
        }
        let pids: Vec<u32> = (0..cluster.len())
            .filter_map(|i| cluster.pid(i).ok().flatten())
            .collect();
        let servers_cpu = || -> f64 { pids.iter().map(|&p| proc_cpu_time(p)).sum() };
        let (t0, client0, servers0) = (Instant::now(), cpu_time(), servers_cpu());
        let mut running = Vec::new();
        for t in 0..tasks {
            let imp = imp.clone();
            running.push(tokio::spawn(async move {
                let key = format!("cycle:{t}");
                for _ in 0..per_task {
                    imp.cycle(&key, TTL).await;
                }
            }));
        }
        for r in running {
            r.await
                .expect("cycle task (a panic means a cycle was not granted)");
        }
        // Wall time and CPU time of the timed cycles (the client process, all its threads,
        // user + system; the nodes' processes), per cycle: what a CPU-bound run pays.
        let n = per_task.saturating_mul(tasks).max(1) as f64;
        let (wall, client, servers) = (
            t0.elapsed().as_secs_f64(),
            cpu_time() - client0,
            servers_cpu() - servers0,
        );
        println!(
            "per cycle: wall {:.1} µs, client CPU {:.1} µs, nodes' CPU {:.1} µs ({:.0} cycles/s)",
            wall / n * 1e6,
            client / n * 1e6,
            servers / n * 1e6,
            n / wall
        );
        if let Impl::Quorumlock(q) = &imp {
            q.flush(Duration::from_secs(5)).await;
        }
        drop(cluster);
    });
    println!(
        "impl {which} tasks {tasks} cycles {}",
        per_task.saturating_mul(tasks)
    );
}
