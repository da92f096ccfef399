//! Fault schedules against any [`Faults`] backend: a scripted [`Schedule`] for deterministic
//! scenarios, and a seeded, bounded [`RandomNemesis`] for soaks.
//!
//! # Replaying a random run
//!
//! [`RandomNemesis::from_env`] takes its seed from `QUORUMLOCK_SEED` when set, else draws
//! one, and prints it (stderr and `tracing`) before it starts:
//!
//! ```text
//! quorumlock testkit: nemesis seed 12345 (replay with QUORUMLOCK_SEED=12345)
//! ```
//!
//! The sequence of faults depends only on the seed and the options, never on timing, so the
//! same seed replays the same faults at the same offsets.

use std::fmt;
use std::io;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

use super::Faults;

/// Environment variable holding the seed of a [`RandomNemesis::from_env`] run.
pub const SEED_ENV: &str = "QUORUMLOCK_SEED";

/// One fault action on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// [`Faults::kill`].
    Kill(usize),
    /// [`Faults::start`].
    Start(usize),
    /// [`Faults::restart`]: kill, wait `delay`, start.
    Restart {
        /// The node.
        node: usize,
        /// How long it stays down.
        delay: Duration,
    },
    /// [`Faults::pause`].
    Pause(usize),
    /// [`Faults::resume`].
    Resume(usize),
    /// [`Faults::disconnect`].
    Disconnect(usize),
    /// [`Faults::reconnect`].
    Reconnect(usize),
    /// [`Faults::slow`]: the node's link delivers every byte `delay` late.
    Slow {
        /// The node.
        node: usize,
        /// The one-way delay.
        delay: Duration,
    },
}

impl Fault {
    /// The node it acts on.
    pub fn node(&self) -> usize {
        match *self {
            Fault::Kill(n)
            | Fault::Start(n)
            | Fault::Pause(n)
            | Fault::Resume(n)
            | Fault::Disconnect(n)
            | Fault::Reconnect(n)
            | Fault::Restart { node: n, .. }
            | Fault::Slow { node: n, .. } => n,
        }
    }

    /// Applies it to `faults`.
    ///
    /// # Errors
    ///
    /// The backend's error for that operation.
    pub async fn apply<F: Faults + ?Sized>(&self, faults: &F) -> io::Result<()> {
        match *self {
            Fault::Kill(n) => faults.kill(n).await,
            Fault::Start(n) => faults.start(n).await,
            Fault::Restart { node, delay } => faults.restart(node, delay).await,
            Fault::Pause(n) => faults.pause(n).await,
            Fault::Resume(n) => faults.resume(n).await,
            Fault::Disconnect(n) => faults.disconnect(n).await,
            Fault::Reconnect(n) => faults.reconnect(n).await,
            Fault::Slow { node, delay } => faults.slow(node, delay).await,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(n) => write!(f, "kill {n}"),
            Fault::Start(n) => write!(f, "start {n}"),
            Fault::Restart { node, delay } => write!(f, "restart {node} after {delay:?}"),
            Fault::Pause(n) => write!(f, "pause {n}"),
            Fault::Resume(n) => write!(f, "resume {n}"),
            Fault::Disconnect(n) => write!(f, "disconnect {n}"),
            Fault::Reconnect(n) => write!(f, "reconnect {n}"),
            Fault::Slow { node, delay } => write!(f, "slow {node} by {delay:?}"),
        }
    }
}

/// One applied fault in a [`NemesisLog`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogEntry {
    /// When it was applied, from the start of the run.
    pub at: Duration,
    /// What.
    pub fault: Fault,
    /// How long applying it took (a restart includes its delay).
    pub took: Duration,
}

/// What a schedule or nemesis did, in order. `Display` prints one fault per line, with the
/// seed first when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NemesisLog {
    /// The seed of a random run.
    pub seed: Option<u64>,
    /// The faults applied.
    pub entries: Vec<LogEntry>,
}

impl NemesisLog {
    /// The faults alone, in order (what a replay with the same seed must reproduce).
    pub fn faults(&self) -> Vec<Fault> {
        self.entries.iter().map(|e| e.fault).collect()
    }
}

impl fmt::Display for NemesisLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seed) = self.seed {
            writeln!(f, "seed {seed} (replay with {SEED_ENV}={seed})")?;
        }
        for e in &self.entries {
            writeln!(
                f,
                "+{:>8.1}ms {} ({:.1}ms)",
                e.at.as_secs_f64() * 1e3,
                e.fault,
                e.took.as_secs_f64() * 1e3
            )?;
        }
        Ok(())
    }
}

/// A scripted, deterministic fault schedule: faults at fixed offsets from the start of
/// [`run`](Schedule::run).
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock_testkit::{LocalCluster, nemesis::{Fault, Schedule}};
///
/// # async fn demo() -> std::io::Result<()> {
/// let cluster = LocalCluster::launch(5).await?;
/// let ms = Duration::from_millis;
/// let schedule = Schedule::new()
///     .at(ms(100), Fault::Kill(0))
///     .at(ms(100), Fault::Pause(1))
///     .at(ms(600), Fault::Resume(1))
///     .at(ms(800), Fault::Restart { node: 0, delay: ms(50) });
/// let log = schedule.run(&cluster).await?;
/// println!("{log}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    steps: Vec<(Duration, Fault)>,
}

impl Schedule {
    /// An empty schedule.
    pub fn new() -> Schedule {
        Schedule::default()
    }

    /// Adds `fault` at offset `at` (steps at the same offset run in insertion order).
    pub fn at(mut self, at: Duration, fault: Fault) -> Schedule {
        self.steps.push((at, fault));
        self
    }

    /// The steps, sorted by offset.
    pub fn steps(&self) -> Vec<(Duration, Fault)> {
        let mut steps = self.steps.clone();
        steps.sort_by_key(|(at, _)| *at); // stable: insertion order within an offset
        steps
    }

    /// Applies every step at its offset from now, in order; a step that is late (the previous
    /// one took long) runs at once. Cancel safety: dropping the future stops the schedule
    /// where it is, with no healing.
    ///
    /// # Errors
    ///
    /// The first step that fails stops the run; the error names the step.
    pub async fn run<F: Faults + ?Sized>(&self, faults: &F) -> io::Result<NemesisLog> {
        let start = Instant::now();
        let mut log = NemesisLog::default();
        for (at, fault) in self.steps() {
            tokio::time::sleep_until(start + at).await;
            apply_logged(faults, fault, start, &mut log).await?;
        }
        Ok(log)
    }
}

async fn apply_logged<F: Faults + ?Sized>(
    faults: &F,
    fault: Fault,
    start: Instant,
    log: &mut NemesisLog,
) -> io::Result<()> {
    let at = start.elapsed();
    tracing::info!(testkit.fault = %fault, testkit.at_ms = at.as_millis() as u64, "testkit.nemesis");
    fault
        .apply(faults)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("nemesis step `{fault}` failed: {e}")))?;
    log.entries.push(LogEntry {
        at,
        fault,
        took: start.elapsed() - at,
    });
    Ok(())
}

/// The kinds of fault a [`RandomNemesis`] may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Kill, later start.
    Kill,
    /// Restart after a random delay (within the step interval).
    Restart,
    /// Pause, later resume.
    Pause,
    /// Disconnect, later reconnect (needs a proxy per node).
    Disconnect,
    /// Slow the link by a random delay (see [`RandomNemesis::slow_delay`]), later reconnect
    /// (needs a proxy per node).
    Slow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeState {
    Healthy,
    Killed,
    Paused,
    Disconnected,
    Slow,
}

/// A seeded random nemesis: for a bounded time, at random intervals, it either breaks a
/// healthy node or heals a broken one, never breaking more than a minority at once
/// (at most `(N - 1) / 2` nodes) unless [`allow_majority`](RandomNemesis::allow_majority)
/// says so, and heals every node before it returns.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock_testkit::{LocalCluster, nemesis::{FaultKind, RandomNemesis}};
///
/// # async fn demo() -> std::io::Result<()> {
/// let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
/// let nemesis = RandomNemesis::from_env() // QUORUMLOCK_SEED, or a printed random seed
///     .duration(Duration::from_secs(5))
///     .interval(Duration::from_millis(50), Duration::from_millis(300))
///     .kinds(&[FaultKind::Kill, FaultKind::Pause, FaultKind::Disconnect]);
/// let log = nemesis.run(&cluster).await?; // every node healthy again here
/// println!("{log}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomNemesis {
    seed: u64,
    duration: Duration,
    min_interval: Duration,
    max_interval: Duration,
    max_faulty: Option<usize>,
    majority: bool,
    slow: (Duration, Duration),
    kinds: Vec<FaultKind>,
}

impl RandomNemesis {
    /// A nemesis with this seed. Defaults: runs 5 s, steps every 50–500 ms, kinds kill,
    /// restart and pause, up to a minority faulty.
    pub fn new(seed: u64) -> RandomNemesis {
        RandomNemesis {
            seed,
            duration: Duration::from_secs(5),
            min_interval: Duration::from_millis(50),
            max_interval: Duration::from_millis(500),
            max_faulty: None,
            majority: false,
            slow: (Duration::from_millis(10), Duration::from_millis(100)),
            kinds: vec![FaultKind::Kill, FaultKind::Restart, FaultKind::Pause],
        }
    }

    /// A nemesis seeded from `QUORUMLOCK_SEED` (decimal, or hex with `0x`) when set and
    /// valid, else from a fresh random seed; the seed is printed to stderr and logged, so a
    /// failing run can be replayed.
    pub fn from_env() -> RandomNemesis {
        let seed = seed_from_env();
        RandomNemesis::new(seed)
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Total running time before healing. The default for this is 5 seconds.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Pause between steps, drawn uniformly in `[min, max]` (`min` is raised to 1 ms, `max`
    /// to `min`). The default for this is 50–500 ms.
    pub fn interval(mut self, min: Duration, max: Duration) -> Self {
        self.min_interval = min.max(Duration::from_millis(1));
        self.max_interval = max.max(self.min_interval);
        self
    }

    /// At most this many nodes faulty at once; capped at `(N - 1) / 2` whatever the value,
    /// unless [`allow_majority`](Self::allow_majority). The default for this is `(N - 1) / 2`.
    pub fn max_faulty(mut self, max: usize) -> Self {
        self.max_faulty = Some(max);
        self
    }

    /// Lets [`max_faulty`](Self::max_faulty) go up to every node: a majority paused, slowed
    /// or cut off is within the deployment contract (no one can lock meanwhile, and nothing
    /// is lost), and so is a majority killed when the nodes persist with AOF `always`. The
    /// default for this is `false` (at most a minority).
    pub fn allow_majority(mut self, allow: bool) -> Self {
        self.majority = allow;
        self
    }

    /// The one-way delay of a [`FaultKind::Slow`] link, drawn uniformly in `[min, max]`
    /// (`max` is raised to `min`). The default for this is 10–100 ms.
    pub fn slow_delay(mut self, min: Duration, max: Duration) -> Self {
        self.slow = (min, max.max(min));
        self
    }

    /// Which faults to inject. The default for this is kill, restart and pause; add
    /// [`FaultKind::Disconnect`] only for a backend with proxies. An empty list only heals.
    pub fn kinds(mut self, kinds: &[FaultKind]) -> Self {
        self.kinds = kinds.to_vec();
        self
    }

    /// The faults this nemesis would inject against `nodes` nodes, with their offsets,
    /// without running them (same RNG sequence as [`run`](Self::run)).
    pub fn plan(&self, nodes: usize) -> Vec<(Duration, Fault)> {
        let mut plan = Vec::new();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut states = vec![NodeState::Healthy; nodes];
        let limit = self.limit(nodes);
        let mut t = Duration::ZERO;
        // Bounded by the step count as well as by time.
        let max_steps = self.duration.as_millis() / self.min_interval.as_millis().max(1) + 1;
        for _ in 0..max_steps {
            let gap = rng.random_range(self.min_interval..=self.max_interval);
            if t + gap >= self.duration {
                break; // the final heals own the instant `duration`
            }
            t += gap;
            let faulty: Vec<usize> = (0..nodes)
                .filter(|&n| states[n] != NodeState::Healthy)
                .collect();
            let healthy: Vec<usize> = (0..nodes)
                .filter(|&n| states[n] == NodeState::Healthy)
                .collect();
            let can_break = faulty.len() < limit && !healthy.is_empty() && !self.kinds.is_empty();
            let break_now = can_break && (faulty.is_empty() || rng.random_bool(0.5));
            let fault = if break_now {
                let node = healthy[rng.random_range(0..healthy.len())];
                match self.kinds[rng.random_range(0..self.kinds.len())] {
                    FaultKind::Kill => {
                        states[node] = NodeState::Killed;
                        Fault::Kill(node)
                    }
                    FaultKind::Pause => {
                        states[node] = NodeState::Paused;
                        Fault::Pause(node)
                    }
                    FaultKind::Disconnect => {
                        states[node] = NodeState::Disconnected;
                        Fault::Disconnect(node)
                    }
                    FaultKind::Restart => Fault::Restart {
                        node,
                        delay: rng.random_range(Duration::ZERO..=self.max_interval),
                    },
                    FaultKind::Slow => {
                        states[node] = NodeState::Slow;
                        Fault::Slow {
                            node,
                            delay: rng.random_range(self.slow.0..=self.slow.1),
                        }
                    }
                }
            } else if let Some(&node) = faulty.get(rng.random_range(0..faulty.len().max(1))) {
                heal(&mut states, node)
            } else {
                continue;
            };
            plan.push((t, fault));
        }
        // Heal everything at the end.
        for node in 0..nodes {
            if states[node] != NodeState::Healthy {
                plan.push((self.duration, heal(&mut states, node)));
            }
        }
        plan
    }

    fn limit(&self, nodes: usize) -> usize {
        let cap = if self.majority {
            nodes
        } else {
            nodes.saturating_sub(1) / 2
        };
        self.max_faulty.map_or(cap, |m| m.min(cap))
    }

    /// Runs the nemesis against `faults` for its duration, then heals every node it broke,
    /// and returns what it did. Restarts block the nemesis for their delay (the node counts
    /// as faulty meanwhile).
    ///
    /// Cancel safety: dropping the future stops the nemesis with faults possibly unhealed;
    /// drop the cluster too, or heal by hand.
    ///
    /// # Errors
    ///
    /// The first fault that fails stops the run (after trying to heal what it broke); the
    /// error names the step and the seed.
    pub async fn run<F: Faults + ?Sized>(&self, faults: &F) -> io::Result<NemesisLog> {
        let nodes = faults.len();
        announce(self.seed);
        let start = Instant::now();
        let mut log = NemesisLog {
            seed: Some(self.seed),
            entries: Vec::new(),
        };
        let plan = self.plan(nodes);
        let (steps, healing): (Vec<_>, Vec<_>) = {
            // The plan ends with the final heals, at exactly `duration`.
            let split = plan
                .iter()
                .rposition(|(at, _)| *at < self.duration)
                .map_or(0, |i| i + 1);
            let (a, b) = plan.split_at(split);
            (a.to_vec(), b.to_vec())
        };
        let mut broken: Vec<Fault> = Vec::new();
        let mut failure = None;
        for (at, fault) in steps {
            tokio::time::sleep_until(start + at).await;
            if let Err(e) = apply_logged(faults, fault, start, &mut log).await {
                failure = Some(e);
                break;
            }
            match fault {
                Fault::Kill(_) | Fault::Pause(_) | Fault::Disconnect(_) | Fault::Slow { .. } => {
                    broken.push(fault)
                }
                _ => broken.retain(|b| b.node() != fault.node()),
            }
        }
        if failure.is_none() {
            tokio::time::sleep_until(start + self.duration).await;
            for (_, fault) in healing {
                if let Err(e) = apply_logged(faults, fault, start, &mut log).await {
                    failure = Some(e);
                    break;
                }
                broken.retain(|b| b.node() != fault.node());
            }
        }
        if let Some(e) = failure {
            // Best effort: heal what is still broken, then report.
            for fault in broken {
                let _ = heal_fault(fault).apply(faults).await;
            }
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "{e} (nemesis seed {}; replay with {SEED_ENV}={})",
                    self.seed, self.seed
                ),
            ));
        }
        Ok(log)
    }
}

fn heal(states: &mut [NodeState], node: usize) -> Fault {
    let fault = match states[node] {
        NodeState::Killed => Fault::Start(node),
        NodeState::Paused => Fault::Resume(node),
        NodeState::Disconnected | NodeState::Slow | NodeState::Healthy => Fault::Reconnect(node),
    };
    states[node] = NodeState::Healthy;
    fault
}

fn heal_fault(fault: Fault) -> Fault {
    match fault {
        Fault::Kill(n) => Fault::Start(n),
        Fault::Pause(n) => Fault::Resume(n),
        Fault::Disconnect(n) | Fault::Slow { node: n, .. } => Fault::Reconnect(n),
        other => other,
    }
}

fn announce(seed: u64) {
    eprintln!("quorumlock testkit: nemesis seed {seed} (replay with {SEED_ENV}={seed})");
    tracing::info!(
        testkit.seed = seed,
        "testkit.nemesis seed (replay with {SEED_ENV}={seed})"
    );
}

/// Parses a seed: decimal, or hexadecimal with a `0x` prefix.
pub fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The seed from `QUORUMLOCK_SEED` when it is set and valid, else a random one (an invalid
/// value is reported on stderr). Use it for every random parameter of a soak, not just the
/// nemesis, so one seed replays the whole run; it is not printed here (the nemesis prints
/// it), so print it yourself when you use it alone.
pub fn seed_from_env() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => match parse_seed(&v) {
            Some(seed) => seed,
            None => {
                eprintln!("quorumlock testkit: ignoring invalid {SEED_ENV}={v:?}");
                rand::random()
            }
        },
        Err(_) => rand::random(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A fake backend that records calls and checks the minority bound.
    struct Fake {
        n: usize,
        calls: Mutex<Vec<Fault>>,
        down: Mutex<Vec<bool>>,
        max_down: Mutex<usize>,
    }

    impl Fake {
        fn new(n: usize) -> Fake {
            Fake {
                n,
                calls: Mutex::new(Vec::new()),
                down: Mutex::new(vec![false; n]),
                max_down: Mutex::new(0),
            }
        }
        fn set(&self, f: Fault, down: bool) -> io::Result<()> {
            self.calls.lock().unwrap().push(f);
            let mut d = self.down.lock().unwrap();
            d[f.node()] = down;
            let count = d.iter().filter(|x| **x).count();
            let mut m = self.max_down.lock().unwrap();
            *m = (*m).max(count);
            Ok(())
        }
    }

    impl Faults for Fake {
        fn urls(&self) -> Vec<String> {
            vec![String::new(); self.n]
        }
        fn len(&self) -> usize {
            self.n
        }
        async fn kill(&self, node: usize) -> io::Result<()> {
            self.set(Fault::Kill(node), true)
        }
        async fn start(&self, node: usize) -> io::Result<()> {
            self.set(Fault::Start(node), false)
        }
        async fn restart(&self, node: usize, delay: Duration) -> io::Result<()> {
            self.set(Fault::Restart { node, delay }, true)?;
            self.set(Fault::Start(node), false)
        }
        async fn pause(&self, node: usize) -> io::Result<()> {
            self.set(Fault::Pause(node), true)
        }
        async fn resume(&self, node: usize) -> io::Result<()> {
            self.set(Fault::Resume(node), false)
        }
        async fn disconnect(&self, node: usize) -> io::Result<()> {
            if node == 99 {
                return Err(io::Error::other("boom"));
            }
            self.set(Fault::Disconnect(node), true)
        }
        async fn reconnect(&self, node: usize) -> io::Result<()> {
            self.set(Fault::Reconnect(node), false)
        }
        async fn slow(&self, node: usize, delay: Duration) -> io::Result<()> {
            self.set(Fault::Slow { node, delay }, true)
        }
    }

    #[test]
    fn same_seed_same_plan_different_seed_differs() {
        let n = RandomNemesis::new(7).duration(Duration::from_secs(10));
        assert_eq!(n.plan(5), n.clone().plan(5));
        assert_ne!(
            n.plan(5),
            RandomNemesis::new(8)
                .duration(Duration::from_secs(10))
                .plan(5)
        );
    }

    #[test]
    fn plans_respect_minority_and_heal_everything() {
        for seed in 0..200u64 {
            for nodes in [1usize, 2, 3, 5, 7] {
                let nemesis = RandomNemesis::new(seed)
                    .duration(Duration::from_secs(3))
                    .interval(Duration::from_millis(10), Duration::from_millis(100))
                    .kinds(&[
                        FaultKind::Kill,
                        FaultKind::Pause,
                        FaultKind::Disconnect,
                        FaultKind::Restart,
                        FaultKind::Slow,
                    ])
                    .max_faulty(99);
                let plan = nemesis.plan(nodes);
                let mut down = vec![false; nodes];
                let mut last = Duration::ZERO;
                for (at, f) in &plan {
                    assert!(*at >= last && *at <= Duration::from_secs(3), "seed {seed}");
                    last = *at;
                    match f {
                        Fault::Kill(n) | Fault::Pause(n) | Fault::Disconnect(n) => {
                            assert!(!down[*n], "seed {seed}: node {n} broken twice");
                            down[*n] = true;
                        }
                        Fault::Start(n) | Fault::Resume(n) | Fault::Reconnect(n) => {
                            assert!(down[*n], "seed {seed}: healing a healthy node {n}");
                            down[*n] = false;
                        }
                        Fault::Slow { node, .. } => {
                            assert!(!down[*node], "seed {seed}: node {node} broken twice");
                            down[*node] = true;
                        }
                        Fault::Restart { node, delay } => {
                            assert!(!down[*node]);
                            assert!(*delay <= Duration::from_millis(100));
                        }
                    }
                    // A restarting node counts as faulty during the step.
                    let now_down = down.iter().filter(|d| **d).count()
                        + usize::from(matches!(f, Fault::Restart { .. }));
                    assert!(
                        now_down <= (nodes - 1) / 2,
                        "seed {seed}, {nodes} nodes: {now_down} down"
                    );
                }
                assert!(down.iter().all(|d| !d), "seed {seed}: not healed");
                if nodes < 3 {
                    assert!(plan.is_empty(), "no minority to break with {nodes} nodes");
                }
            }
        }
    }

    #[test]
    fn majority_plans_reach_the_cap_and_heal_everything() {
        let mut reached = 0;
        for seed in 0..100u64 {
            let nemesis = RandomNemesis::new(seed)
                .duration(Duration::from_secs(3))
                .interval(Duration::from_millis(10), Duration::from_millis(100))
                .kinds(&[FaultKind::Pause, FaultKind::Slow])
                .slow_delay(Duration::from_millis(5), Duration::from_millis(20))
                .allow_majority(true)
                .max_faulty(3);
            let plan = nemesis.plan(5);
            let mut down = [false; 5];
            let mut most = 0;
            for (_, f) in &plan {
                match f {
                    Fault::Pause(n) | Fault::Slow { node: n, .. } => {
                        assert!(!down[*n], "seed {seed}: node {n} broken twice");
                        down[*n] = true;
                    }
                    Fault::Resume(n) | Fault::Reconnect(n) => {
                        assert!(down[*n], "seed {seed}: healing a healthy node {n}");
                        down[*n] = false;
                    }
                    other => panic!("seed {seed}: unexpected {other}"),
                }
                if let Fault::Slow { delay, .. } = f {
                    assert!((Duration::from_millis(5)..=Duration::from_millis(20)).contains(delay));
                }
                let now_down = down.iter().filter(|d| **d).count();
                assert!(now_down <= 3, "seed {seed}: {now_down} down");
                most = most.max(now_down);
            }
            assert!(down.iter().all(|d| !d), "seed {seed}: not healed");
            reached += usize::from(most == 3);
        }
        assert!(
            reached > 50,
            "a majority was broken in {reached} of 100 plans"
        );
    }

    #[test]
    fn parse_seed_accepts_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2A "), Some(42));
        assert_eq!(parse_seed("nope"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn random_run_follows_the_plan_and_heals() {
        let fake = Fake::new(5);
        let nemesis = RandomNemesis::new(3)
            .duration(Duration::from_secs(2))
            .kinds(&[FaultKind::Kill, FaultKind::Pause, FaultKind::Disconnect]);
        let log = nemesis.run(&fake).await.unwrap();
        assert_eq!(log.seed, Some(3));
        let planned: Vec<Fault> = nemesis.plan(5).into_iter().map(|(_, f)| f).collect();
        assert_eq!(log.faults(), planned);
        assert!(!planned.is_empty());
        assert!(fake.down.lock().unwrap().iter().all(|d| !d));
        assert!(*fake.max_down.lock().unwrap() <= 2);
        assert!(
            log.to_string()
                .starts_with("seed 3 (replay with QUORUMLOCK_SEED=3)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn schedule_runs_in_time_order() {
        let fake = Fake::new(3);
        let ms = Duration::from_millis;
        let schedule = Schedule::new()
            .at(ms(200), Fault::Start(0))
            .at(ms(100), Fault::Kill(0))
            .at(ms(200), Fault::Pause(1))
            .at(ms(300), Fault::Resume(1));
        let t0 = Instant::now();
        let log = schedule.run(&fake).await.unwrap();
        assert_eq!(
            log.faults(),
            [
                Fault::Kill(0),
                Fault::Start(0),
                Fault::Pause(1),
                Fault::Resume(1)
            ]
        );
        assert_eq!(log.entries[0].at, ms(100));
        assert!(t0.elapsed() >= ms(300));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_step_reports_it() {
        let fake = Fake::new(3);
        let err = Schedule::new()
            .at(Duration::ZERO, Fault::Disconnect(99))
            .run(&fake)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("disconnect 99"), "{err}");
    }
}
