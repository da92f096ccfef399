//! The fault matrix of read-write locks and semaphores (docs/testing.md), on local
//! `redis-server` processes. Every hold a client believes is recorded with its mode and judged
//! by the history checker: no reader with a writer, no two writers, never more than P holders
//! of a semaphore. The rows written against `Faults` (in `support/shared_scenarios.rs`) run on
//! the Docker Compose harness too (`tests/compose.rs`).
//!
//! Two kinds of negative control prove the checker can fail here: the test kit's naive
//! semaphore (per-node limit c = P, the same code path) under contention must be flagged for
//! more than P holders while ours is not, and restarts without persistence outside the
//! deployment contract must be flagged.
//!
//! Run: `cargo test --test shared_faults -- --nocapture`.

#[path = "support/shared_scenarios.rs"]
mod shared_scenarios;

use std::time::{Duration, Instant};

use quorumlock_testkit::{LocalCluster, Persistence, ViolationKind};
use shared_scenarios::*;

async fn launch(persistence: Persistence) -> (LocalCluster, Vec<String>) {
    let c = LocalCluster::builder(5)
        .proxies(true)
        .persistence(persistence)
        .launch()
        .await
        .expect(
            "start 5 redis-server nodes (is redis-server installed? run scripts/install-deps.sh)",
        );
    let direct = (0..5)
        .map(|i| c.direct_url(i).expect("node index"))
        .collect();
    (c, direct)
}

// ---------------------------------------------------------------------------------------
// Kill, pause, cut links.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_kill_one_then_two_nodes_mid_lease_safe() {
    let (c, _) = launch(Persistence::None).await;
    rw_kill_mid_lease(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_kill_a_node_mid_lease_safe() {
    let (c, direct) = launch(Persistence::None).await;
    sem_kill_mid_lease(&c, &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_and_sem_pause_one_node_cut_another_safe() {
    let (c, direct) = launch(Persistence::None).await;
    pause_and_cut(&c, &direct).await;
}

// ---------------------------------------------------------------------------------------
// Restarts: with AOF `always` at once, without persistence after the TTL (the deployment
// contract), and without persistence at once (outside it: the negative controls).
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_aof_always_immediate_restart_k3_safe() {
    let (c, direct) = launch(Persistence::AofAlways).await;
    rw_restart_in_contract(
        &c,
        &direct,
        "rw-aof",
        Duration::ZERO,
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_delayed_restart_without_persistence_k3_safe() {
    let (c, direct) = launch(Persistence::None).await;
    // Down longer than the longest TTL in use.
    let ttl = Duration::from_secs(1);
    rw_restart_in_contract(&c, &direct, "rw-delayed", ttl + ms(300), ttl).await;
}

/// Outside the contract: the writer held only nodes 0–2 and node 0 comes back empty at once;
/// a reader takes {0, 3, 4} while the writer still believes it holds. The checker must say
/// so (as row 3b of the mutex).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_immediate_restart_without_persistence_k3_flagged() {
    let (c, direct) = launch(Persistence::None).await;
    let res = "shared:rw-negative";
    let (h, lock, probe) =
        rw_restart(&c, &direct, res, Duration::ZERO, Duration::from_secs(2)).await;
    let inside = probe.wins.iter().filter(|t| **t < lock.deadline()).count();
    assert!(
        inside >= 1,
        "no reader got in during the writer's validity: refused {} times",
        probe.refusals
    );
    let report = h.check();
    assert!(
        report.has(ViolationKind::SharedWithExclusive),
        "the checker must flag the reader inside the writer's hold: {report}\n{h}"
    );
    assert!(!report.has(ViolationKind::Overlap), "{report}");
    observed(
        "rw-negative",
        format!(
            "VIOLATION flagged: {inside} reader hold(s) inside the writer's validity after {} refusals; {} shared-with-exclusive",
            probe.refusals,
            report.count(ViolationKind::SharedWithExclusive)
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_aof_always_immediate_restart_of_two_nodes_safe() {
    let (c, direct) = launch(Persistence::AofAlways).await;
    sem_restart_in_contract(
        &c,
        &direct,
        "sem-aof",
        Duration::ZERO,
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_delayed_restart_of_two_nodes_without_persistence_safe() {
    let (c, direct) = launch(Persistence::None).await;
    // 2 s: the holders must still be valid when the nodes go down (settling the three
    // permits' surplus first takes a few hundred ms on a loaded machine).
    let ttl = Duration::from_secs(2);
    sem_restart_in_contract(&c, &direct, "sem-delayed", ttl + ms(300), ttl).await;
}

/// Outside the contract, but safe in this layout: 3 holders fill 9 of the 10 slots; one full
/// node back empty frees 2 slots on one node, and with the one free slot elsewhere that is
/// two nodes, fewer than a quorum. Not a guarantee: with two nodes (next test) it breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_immediate_restart_of_one_node_without_persistence_safe_in_this_layout() {
    let (c, direct) = launch(Persistence::None).await;
    let name = "shared:sem-one-restart";
    let (h, held, probe) =
        sem_restart(&c, &direct, name, 1, Duration::ZERO, Duration::from_secs(2)).await;
    let first = held.iter().map(|l| l.deadline()).min().expect("holders");
    assert!(
        probe.faulted_at < Some(first),
        "the holders had expired before the restart: the row proves nothing"
    );
    assert!(
        probe.wins.iter().all(|t| *t >= first),
        "a 4th holder while 3 held"
    );
    let report = h.check();
    assert_clean(&report, &h);
    observed(
        "sem-one-restart",
        format!(
            "safe in this layout: a 4th contender refused {} times while 3 held; {report}",
            probe.refusals
        ),
    );
}

/// Outside the contract: two full nodes come back empty at once; their 4 free slots and the
/// free slot elsewhere span 3 nodes, a quorum, and a 4th holder gets in while 3 hold. The
/// checker must flag more than 3 permit holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_immediate_restart_of_two_nodes_without_persistence_flagged() {
    let (c, direct) = launch(Persistence::None).await;
    let name = "shared:sem-negative";
    let (h, held, probe) =
        sem_restart(&c, &direct, name, 2, Duration::ZERO, Duration::from_secs(2)).await;
    let first = held.iter().map(|l| l.deadline()).min().expect("holders");
    let inside = probe.wins.iter().filter(|t| **t < first).count();
    assert!(
        inside >= 1,
        "no 4th holder during the holders' validity: refused {} times",
        probe.refusals
    );
    let report = h.check();
    assert!(
        report.has(ViolationKind::TooManyPermits),
        "the checker must flag 4 holders of 3 permits: {report}\n{h}"
    );
    assert_eq!(report.permit_peak(name), Some(4), "{report}");
    observed(
        "sem-negative",
        format!(
            "VIOLATION flagged: a 4th holder {inside} time(s) while 3 held; {}",
            report.permit_peaks()[0]
        ),
    );
}

// ---------------------------------------------------------------------------------------
// Contention under the random minority nemesis (AOF `always`: restarts are immediate).
// ---------------------------------------------------------------------------------------

/// Length of each nemesis run: `QUORUMLOCK_SOAK_SECS` / 3, 3–15 s, 5 s by default.
fn nemesis_secs() -> u64 {
    std::env::var("QUORUMLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(5, |s| s / 3)
        .clamp(3, 15)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_readers_and_writers_under_random_minority_nemesis() {
    let (c, _) = launch(Persistence::AofAlways).await;
    rw_under_nemesis(&c, nemesis_secs()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_contenders_under_random_minority_nemesis() {
    let (c, _) = launch(Persistence::AofAlways).await;
    sem_under_nemesis(&c, nemesis_secs()).await;
}

// ---------------------------------------------------------------------------------------
// The negative control of the semaphore itself.
// ---------------------------------------------------------------------------------------

/// Permits of both semaphores; contenders per semaphore; length of the run.
const P: u32 = 2;
const CONTENDERS: usize = 12;

/// 12 contenders loop try_acquire / hold 20–200 ms / release on the naive semaphore (c = P =
/// 2 per node, majority 3 of 5: room for 3 holders), and 12 others on ours (c = 1) in the
/// same run, on the same nodes. The checker must see more than 2 holders of the naive one,
/// and never more than 2 of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_semaphore_is_flagged_ours_is_not() {
    let (c, _) = launch(Persistence::None).await;
    let secs = 5;
    let mut roles = Vec::new();
    for i in 0..CONTENDERS {
        for (name, naive) in [("shared:naive", true), ("shared:ours", false)] {
            roles.push(Role::Permit {
                name: name.to_owned(),
                permits: P,
                naive,
                wait: i % 3 == 0,
            });
        }
    }
    let plan = LoopPlan {
        ttl: (1_000, 2_000),
        hold: (20, 200),
        think: (0, 5),
        writer_rest: (0, 0),
        extend_percent: 20,
    };
    let seed = quorumlock_testkit::nemesis::seed_from_env();
    println!("[sem-naive] seed {seed} (replay with QUORUMLOCK_SEED={seed})");
    let started = Instant::now();
    let (h, (), stats) = with_contenders(&c.urls(), roles, plan, seed, async {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    })
    .await;
    let report = h.check();
    let naive = report
        .permit_peaks()
        .iter()
        .find(|p| &*p.resource == "shared:naive")
        .cloned();
    let ours = report
        .permit_peaks()
        .iter()
        .find(|p| &*p.resource == "shared:ours")
        .cloned();
    let (Some(naive), Some(ours)) = (naive, ours) else {
        panic!("both semaphores should have holders: {report}");
    };
    let above: Duration = naive.over.iter().map(|(a, b)| *b - *a).sum();
    println!(
        "[sem-naive] {:?}: {}; naive {naive}; ours {ours}; naive above P for {above:?} in {} interval(s)",
        started.elapsed(),
        stats.line(),
        naive.over.len()
    );
    for v in report.violations() {
        assert_eq!(
            v.resource(),
            "shared:naive",
            "only the naive semaphore may be flagged: {v}"
        );
        assert_eq!(v.kind, ViolationKind::TooManyPermits, "{v}");
    }
    assert!(ours.peak <= P as usize, "ours exceeded P: {ours}\n{report}");
    assert!(
        ours.holds >= 10 && naive.holds >= 10,
        "too little progress: {stats:?}",
        stats = stats.line()
    );
    assert!(
        naive.peak > P as usize,
        "the naive semaphore went unflagged (seed {seed}): {naive}"
    );
    assert!(report.has(ViolationKind::TooManyPermits));
}

// ---------------------------------------------------------------------------------------
// A known limit of the semaphore's give-back (capacity, not safety), for the core to fix.
// ---------------------------------------------------------------------------------------

/// `capacity()` holders should fit with every node up when they come one after another. Here
/// each acquires as soon as the previous one returned (as `acquire` callers do), with node
/// 4's link 100 ms slow so that a holder's give-back (which waits for every answer) lands
/// after the next holder's grants: the next holder then sees the previous one's entries on
/// every fast node, both keep the same three nodes, and the third permit never fits
/// (observed: the third `acquire` times out in most rounds). Ignored until the give-back
/// takes the late answers' effect into account; run with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known limit of the give-back: back-to-back holders can keep the same nodes"]
async fn sem_back_to_back_acquisitions_reach_the_capacity() {
    let (c, direct) = launch(Persistence::None).await;
    c.proxy(4)
        .expect("proxy")
        .set_mode(quorumlock_testkit::ProxyMode::Delay(ms(100)));
    let h = quorumlock_testkit::History::new();
    let mut actors = Vec::new();
    for id in 0..3 {
        actors.push(Actor::new(&h, id, &c.urls()).await);
    }
    let name = "shared:back-to-back";
    let pools: Vec<Pool> = actors
        .iter()
        .map(|a| Pool::new(&a.locks, name, 3))
        .collect();
    let mut stuck = Vec::new();
    for round in 0..5 {
        let mut held = Vec::new();
        for (a, pool) in actors.iter().zip(&pools) {
            match a.permit(pool, Duration::from_secs(10)).await {
                Ok(l) => held.push((a, l)),
                Err(e) => {
                    let layout: Vec<usize> = live_per_node(&direct, &sem_key(name))
                        .await
                        .iter()
                        .map(Vec::len)
                        .collect();
                    stuck.push((round, held.len() + 1, layout, e.to_string()));
                    break;
                }
            }
        }
        for (a, l) in held {
            a.release(name, l).await.ok();
        }
        let key = sem_key(name);
        assert!(
            eventually(PATIENCE, || async {
                live_per_node(&direct, &key).await.iter().all(Vec::is_empty)
            })
            .await
        );
    }
    assert!(
        stuck.is_empty(),
        "capacity 3 not reached with every node up; (round, permit that timed out, live entries per node, error): {stuck:#?}"
    );
}
