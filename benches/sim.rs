//! Throughput of the deterministic simulator (`quorumlock::sim::run`): schedules per
//! second on one core, each schedule a whole run of the real protocol layer against
//! simulated nodes with faults, checked against every invariant.
//!
//! ```text
//! cargo bench --features sim --bench sim
//! ```
//!
//! Criterion measures the time of one schedule (seeds advance on every iteration, so the
//! mean is over many different schedules); the summary line after it gives schedules per
//! minute from a timed batch of 2,000 seeds.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use quorumlock::sim::{Config, run};

fn schedules(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(1));
    for nodes in [5, 3] {
        let config = Config {
            nodes,
            ..Config::default()
        };
        let mut seed = 0u64;
        g.bench_function(format!("schedule_{nodes}_nodes"), |b| {
            b.iter(|| {
                seed += 1;
                let report = run(seed, &config);
                assert!(report.violation.is_none(), "{report}");
                report.stats.events
            })
        });
    }
    g.finish();
    // One timed batch for the schedules-per-minute figure.
    for nodes in [5, 3] {
        let config = Config {
            nodes,
            ..Config::default()
        };
        let start = Instant::now();
        let count = 2_000u64;
        let mut events = 0;
        for seed in 1_000_000..1_000_000 + count {
            events += run(seed, &config).stats.events;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "sim/{nodes} nodes: {count} schedules in {secs:.2} s: {:.0} schedules/min, {:.0} events/s",
            count as f64 / secs * 60.0,
            events as f64 / secs
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    schedules(&mut c);
    c.final_summary();
}
