//! The world: N simulated nodes, M simulated clients, one event queue in true time, and
//! the faults, all drawn from one seed.
//!
//! [`run`] draws a schedule's parameters from the seed (node clocks, client clocks,
//! persistence, TTLs, the per-node timeout, network delays, whether fencing is on, the
//! faults and the client pauses), then processes events in order of simulated time
//! (microseconds, ties broken by the order in which they were scheduled) until every
//! client has finished its work and the network has drained. The invariants are checked
//! after every event (see `check.rs`); the first violation stops the run.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::node::{Persistence, Script, SimNode, crate_scripts, scripts};
use super::state::{Attempt, Call, Client, Clock, Fault, Kind, Link, Round, between, expiry_true};
use crate::base::resource::Resources;
use crate::protocol::tally;

/// A known-unsafe variant of the protocol or of the deployment, selectable in [`Config`]:
/// the simulator must catch each one (an invariant violation) within a few seeds.
///
/// # Example
///
/// ```
/// use quorumlock::sim::Mutation;
///
/// assert_eq!(Mutation::ALL.len(), 8);
/// assert_eq!(Mutation::HalfQuorum.name(), "quorum N/2");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mutation {
    /// The vote count needs `N / 2` grants instead of `N / 2 + 1`.
    HalfQuorum,
    /// No clock drift allowance (`drift = 0`); the clients' and nodes' clocks still drift.
    NoDrift,
    /// Extensions may shorten a lock: the nodes run `extend.lua` with plain `PEXPIRE`
    /// instead of `PEXPIRE … GT` (the script's text replaced, see [`Mutation::patches`]).
    ExtendShortens,
    /// A node without persistence restarts at once after a crash, instead of after the
    /// longest TTL.
    ImmediateRestart,
    /// The release scripts (`release.lua`, `release_one.lua`) delete or hand over the lock
    /// key whatever token it holds (their text replaced, see [`Mutation::patches`]).
    ReleaseWithoutTokenCheck,
    /// Fenced acquisitions skip the commit round: the token is the largest counter among
    /// the granting replies, never written back to the other nodes.
    FencingWithoutCommit,
    /// A failed attempt releases only the nodes that granted, not those that failed, timed
    /// out or had not answered (whose `SET` may still land).
    CleanupGrantedOnly,
    /// A queued waiter's claim (`claim.lua`) takes the lock key whatever token it holds,
    /// as if the lock had been handed to it (its text replaced, see
    /// [`Mutation::patches`]).
    ClaimTakesHeldKeys,
}

impl Mutation {
    /// Every mutation.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(quorumlock::sim::Mutation::ALL.contains(&quorumlock::sim::Mutation::NoDrift));
    /// ```
    pub const ALL: [Mutation; 8] = [
        Mutation::HalfQuorum,
        Mutation::NoDrift,
        Mutation::ExtendShortens,
        Mutation::ImmediateRestart,
        Mutation::ReleaseWithoutTokenCheck,
        Mutation::FencingWithoutCommit,
        Mutation::CleanupGrantedOnly,
        Mutation::ClaimTakesHeldKeys,
    ];

    /// A short name.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(quorumlock::sim::Mutation::NoDrift.name(), "no drift allowance");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Mutation::HalfQuorum => "quorum N/2",
            Mutation::NoDrift => "no drift allowance",
            Mutation::ExtendShortens => "extend without GT",
            Mutation::ImmediateRestart => "immediate restart without persistence",
            Mutation::ReleaseWithoutTokenCheck => "release without the token check",
            Mutation::FencingWithoutCommit => "fencing without the commit",
            Mutation::CleanupGrantedOnly => "clean-up of granting nodes only",
            Mutation::ClaimTakesHeldKeys => "claim takes held keys",
        }
    }

    /// The replacements this mutation makes in the crate's Lua scripts: `(script, text,
    /// replacement)`. Empty for a mutation of the client or of the deployment. A
    /// replacement whose text a script no longer contains stops the run with a
    /// [`Invariant::Simulator`] violation, so a mutation never passes by not applying.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::sim::Mutation;
    ///
    /// assert!(Mutation::HalfQuorum.patches().is_empty());
    /// assert_eq!(Mutation::ExtendShortens.patches()[0].0, "extend");
    /// ```
    pub fn patches(self) -> &'static [(&'static str, &'static str, &'static str)] {
        match self {
            Mutation::ExtendShortens => &[("extend", ", 'GT')", ")")],
            Mutation::ReleaseWithoutTokenCheck => &[
                (
                    "release",
                    "redis.call('GET', KEYS[i]) == ARGV[1]",
                    "redis.call('GET', KEYS[i])",
                ),
                // The uncontended path, the general one's plain release, and the hand-off.
                (
                    "release_one",
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then",
                    "if redis.call('GET', KEYS[1]) then",
                ),
                (
                    "release_one",
                    "elseif redis.call('GET', key) == token then",
                    "elseif redis.call('GET', key) then",
                ),
                (
                    "release_one",
                    "if redis.call('GET', key) ~= token then",
                    "if not redis.call('GET', key) then",
                ),
            ],
            Mutation::ClaimTakesHeldKeys => &[
                ("claim", "'NX', ", ""),
                ("claim", "return old", "return false"),
            ],
            _ => &[],
        }
    }
}

/// What to simulate. Everything else (clocks, TTLs, timeouts, delays, faults, the
/// clients' work) is drawn from the seed given to [`run`].
///
/// # Example
///
/// ```
/// use quorumlock::sim::{Config, Mutation};
///
/// let config = Config { nodes: 3, mutation: Some(Mutation::NoDrift), ..Config::default() };
/// assert_eq!(config.max_clients, 8);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many nodes (1 to 64). Default 5.
    pub nodes: usize,
    /// The fewest clients a schedule draws. Default 2.
    pub min_clients: usize,
    /// The most clients a schedule draws (at most 64). Default 8.
    pub max_clients: usize,
    /// A known-unsafe variant to run instead of the real protocol. Default none.
    pub mutation: Option<Mutation>,
    /// Record the trace (every event, as text) even when no invariant is violated. A
    /// violation always comes with its trace. Default off.
    pub trace: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            nodes: 5,
            min_clients: 2,
            max_clients: 8,
            mutation: None,
            trace: false,
        }
    }
}

/// Which invariant a schedule violated.
///
/// # Example
///
/// ```
/// use quorumlock::sim::Invariant;
///
/// assert_eq!(Invariant::TwoHolders.to_string(), "two clients believe they hold the lock");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// Two clients both believed they held the resource at the same true time.
    TwoHolders,
    /// A holder's remaining validity exceeded the time for which a quorum of nodes still
    /// held its token.
    ValidityBeyondQuorum,
    /// A fencing token was not larger than every token returned before it.
    FencingOrder,
    /// A key was left behind: a lock key its owner's release or clean-up reached, or any
    /// key but a fence counter once the longest TTL passed after the end.
    KeyLeftBehind,
    /// A hand-off gave the lock to two waiters: two clients that took it by a claim
    /// believed they held it at the same true time.
    HandOffToTwo,
    /// The simulator itself could not go on (a request it cannot model, or a run that did
    /// not end within its event budget). A simulator bug, never a protocol verdict.
    Simulator,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::TwoHolders => "two clients believe they hold the lock",
            Invariant::ValidityBeyondQuorum => {
                "a holder's validity exceeds the time a quorum holds its token"
            }
            Invariant::FencingOrder => "fencing tokens do not strictly rise",
            Invariant::KeyLeftBehind => "a key was left behind",
            Invariant::HandOffToTwo => "a hand-off gave the lock to two waiters",
            Invariant::Simulator => "simulator error",
        })
    }
}

/// An invariant violation: which one, when (true time, µs from the start), and what was
/// seen.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{run, Config};
///
/// let report = run(1, &Config::default());
/// if let Some(v) = &report.violation {
///     println!("{} at {} µs: {}", v.invariant, v.at_us, v.detail);
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant.
    pub invariant: Invariant,
    /// True time of the violation, in µs since the schedule started.
    pub at_us: u64,
    /// What was seen, in words.
    pub detail: String,
}

/// Counts of what a schedule (or several, [`Stats::add`]) did.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{run, Config, Stats};
///
/// let mut total = Stats::default();
/// total.add(&run(3, &Config::default()).stats);
/// assert_eq!(total.schedules, 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Schedules run.
    pub schedules: u64,
    /// Schedules with fencing on.
    pub fenced_schedules: u64,
    /// Events processed.
    pub events: u64,
    /// Requests that reached a node and ran.
    pub executed: u64,
    /// Acquisition attempts started.
    pub attempts: u64,
    /// Attempts that returned a lock.
    pub acquired: u64,
    /// Attempts that failed (held by another, no quorum, no validity left).
    pub failed: u64,
    /// Of those: held by another owner.
    pub failed_held: u64,
    /// Of those: no validity left when the quorum was reached.
    pub failed_no_validity: u64,
    /// Simulated time, µs, summed over schedules (from the start to the end of the drain).
    pub sim_time_us: u64,
    /// Attempts cancelled before they decided.
    pub cancelled: u64,
    /// Extensions that moved the deadline (or kept it: a shorter TTL).
    pub extended: u64,
    /// Extensions that did not (no quorum, cancelled, too late).
    pub extend_failed: u64,
    /// Extensions or releases that found the lock lost or expired.
    pub lost: u64,
    /// Releases that reached a quorum.
    pub released: u64,
    /// Locks given up without a release (their keys expire).
    pub abandoned: u64,
    /// Node crashes.
    pub crashes: u64,
    /// Node pauses.
    pub node_pauses: u64,
    /// Connections lost.
    pub cuts: u64,
    /// Client pauses.
    pub client_pauses: u64,
    /// Client pauses longer than the validity of the lock the client held.
    pub pauses_past_validity: u64,
    /// Schedules whose clients take several resources at once.
    pub multi_resource_schedules: u64,
    /// Refused clients that joined the wait queues.
    pub waits: u64,
    /// Waiters' claims that returned the lock (handed over by a release, or found free).
    pub claimed: u64,
}

impl Stats {
    /// Adds another schedule's counts.
    ///
    /// # Example
    ///
    /// ```
    /// let mut s = quorumlock::sim::Stats::default();
    /// s.add(&quorumlock::sim::Stats { schedules: 2, ..Default::default() });
    /// assert_eq!(s.schedules, 2);
    /// ```
    pub fn add(&mut self, o: &Stats) {
        self.schedules += o.schedules;
        self.fenced_schedules += o.fenced_schedules;
        self.events += o.events;
        self.executed += o.executed;
        self.attempts += o.attempts;
        self.acquired += o.acquired;
        self.failed += o.failed;
        self.failed_held += o.failed_held;
        self.failed_no_validity += o.failed_no_validity;
        self.sim_time_us += o.sim_time_us;
        self.cancelled += o.cancelled;
        self.extended += o.extended;
        self.extend_failed += o.extend_failed;
        self.lost += o.lost;
        self.released += o.released;
        self.abandoned += o.abandoned;
        self.crashes += o.crashes;
        self.node_pauses += o.node_pauses;
        self.cuts += o.cuts;
        self.client_pauses += o.client_pauses;
        self.pauses_past_validity += o.pauses_past_validity;
        self.multi_resource_schedules += o.multi_resource_schedules;
        self.waits += o.waits;
        self.claimed += o.claimed;
    }
}

/// The outcome of one schedule: its seed, the first violation if any, the trace (when
/// asked for, or when there is a violation) and counts.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{run, Config};
///
/// let report = run(7, &Config { trace: true, ..Config::default() });
/// assert!(report.violation.is_none(), "{report}");
/// assert!(!report.trace.is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed: [`run`] with it and the same [`Config`] replays the schedule exactly.
    pub seed: u64,
    /// The first invariant violation, if any.
    pub violation: Option<Violation>,
    /// Every event as one line of text, in order (empty unless [`Config::trace`] was set
    /// or an invariant was violated).
    pub trace: Vec<String>,
    /// Counts.
    pub stats: Stats,
    /// The config it ran with (what a replay needs besides the seed).
    pub config: Config,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.violation {
            Some(v) => writeln!(
                f,
                "seed {}: {} at {}: {}",
                self.seed,
                v.invariant,
                time(v.at_us),
                v.detail
            )?,
            None => writeln!(f, "seed {}: no violation", self.seed)?,
        }
        let c = &self.config;
        let nodes = if c.nodes == Config::default().nodes {
            String::new()
        } else {
            format!(" QUORUMLOCK_SIM_NODES={}", c.nodes)
        };
        let mutation = c.mutation.map_or(String::new(), |m| {
            format!(" QUORUMLOCK_SIM_MUTATION=\"{}\"", m.name())
        });
        write!(
            f,
            "replay: QUORUMLOCK_SIM_SEED={}{nodes}{mutation} cargo test --features sim --test sim_schedules replay -- --nocapture",
            self.seed
        )?;
        if (c.min_clients, c.max_clients) != (2, 8) {
            write!(f, " (with {}..={} clients)", c.min_clients, c.max_clients)?;
        }
        writeln!(f)?;
        for line in &self.trace {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Runs one schedule from `seed`. Deterministic: the same seed and config give the same
/// report, trace included.
///
/// # Example
///
/// ```
/// use quorumlock::sim::{run, Config};
///
/// for seed in 0..20 {
///     let report = run(seed, &Config::default());
///     assert!(report.violation.is_none(), "{report}");
/// }
/// ```
pub fn run(seed: u64, config: &Config) -> Report {
    let report = run_once(seed, config, config.trace);
    if report.violation.is_some() && !config.trace {
        // Replay with the trace on: the schedule does not depend on it.
        return run_once(seed, config, true);
    }
    report
}

fn run_once(seed: u64, config: &Config, trace: bool) -> Report {
    match World::new(seed, config, trace) {
        Ok(w) => w.run(),
        Err(what) => Report {
            seed,
            violation: Some(Violation {
                invariant: Invariant::Simulator,
                at_us: 0,
                detail: format!("cannot set up the world: {what}"),
            }),
            trace: Vec::new(),
            stats: Stats::default(),
            config: config.clone(),
        },
    }
}

/// µs as "12.345678 s"-style text: milliseconds with three decimals.
pub(super) fn time(us: u64) -> String {
    format!("{:>6}.{:03} ms", us / 1000, us % 1000)
}

/// The longest any schedule may run (events), a guard against a simulator bug.
const EVENT_BUDGET: u64 = 400_000;

/// Node clocks start here (µs since the Unix epoch, about December 2025).
const EPOCH_US: u64 = 1_764_543_600_000_000;

/// Bounds of the clock errors, parts per million: the nodes' rate drift and the clients'
/// monotonic clock rate error. Together below the 1 % drift allowance the client assumes.
pub(super) const NODE_PPM: i64 = 3_000;
pub(super) const CLIENT_PPM: i64 = 3_000;
/// Bounds of the nodes' initial clock offsets, µs: one is drawn per schedule. Offsets only
/// matter to fencing tokens (which take the clock as a floor); the delayed restart waits
/// longer than the clocks disagree.
const NODE_OFFSETS_US: [i64; 3] = [100, 5_000, 100_000];

/// The parameters of one schedule, drawn from the seed.
pub(super) struct Params {
    pub(super) nodes: usize,
    /// The quorum the clients count with (the real one unless mutated).
    pub(super) quorum: usize,
    /// The real quorum, which the invariants use.
    pub(super) majority: usize,
    pub(super) drift_factor: f64,
    pub(super) no_drift: bool,
    pub(super) fencing: bool,
    /// Acquisition TTLs are drawn in `min_ttl_ms..=max_ttl_ms`; extensions in
    /// `EXTEND_MIN_TTL_MS..=max_ttl_ms`.
    pub(super) min_ttl_ms: u64,
    pub(super) max_ttl_ms: u64,
    pub(super) node_timeout_us: u64,
    /// One-way network delay: usually in `delay_lo..=delay_hi` µs; with probability
    /// `slow_p` up to `slow_hi` µs.
    pub(super) delay_lo: u64,
    pub(super) delay_hi: u64,
    pub(super) slow_p: f64,
    pub(super) slow_hi: u64,
    pub(super) immediate_restart: bool,
    /// Fenced acquisitions run the commit round (unless mutated).
    pub(super) fencing_commit: bool,
    /// A failed attempt cleans up every node that may hold its key (unless mutated).
    pub(super) cleanup_all: bool,
    pub(super) res: Resources,
    /// Every lock key of the resources (a client takes them all, `lock_many`-style).
    pub(super) lock_keys: Vec<Vec<u8>>,
    pub(super) fence_keys: Vec<Vec<u8>>,
    /// Refused clients may join the wait queues and be handed the lock.
    pub(super) waiting: bool,
}

pub(super) const EXTEND_MIN_TTL_MS: u64 = 5;

/// One simulated node.
pub(super) struct NodeState {
    pub(super) sim: SimNode,
    pub(super) clock: Clock,
    pub(super) aof: bool,
    pub(super) paused: bool,
    pub(super) pause_gen: u32,
    /// Requests that reached the node while it was paused: (call, connection, EVAL).
    pub(super) inbox: VecDeque<(usize, u32, bool)>,
    /// While down: when it restarts (true µs).
    pub(super) restart_at: Option<u64>,
    /// Lock tokens the node held when it crashed without persistence, and until when
    /// their keys would have lived (true µs): see `check.rs`.
    pub(super) ghosts: Vec<(Vec<u8>, u64)>,
}

pub(super) struct Event {
    pub(super) at: u64,
    pub(super) seq: u64,
    pub(super) kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Event) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Event) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Event) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The whole simulated world.
pub(super) struct World {
    pub(super) seed: u64,
    config: Config,
    pub(super) p: Params,
    pub(super) now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Event>>,
    pub(super) nodes: Vec<NodeState>,
    pub(super) clients: Vec<Client>,
    pub(super) links: Vec<Link>,
    pub(super) calls: Vec<Call>,
    pub(super) rounds: Vec<Round>,
    pub(super) attempts: Vec<Attempt>,
    pub(super) net_rng: StdRng,
    fault_rng: StdRng,
    pub(super) trace: Option<Vec<String>>,
    pub(super) violation: Option<Violation>,
    pub(super) stats: Stats,
    /// The largest fencing token returned so far.
    pub(super) max_fence: Option<u64>,
    /// Every client finished: faults stop, the network heals and drains.
    pub(super) ending: bool,
    /// Mean gap between faults, and between one client's pauses (µs; 0: none).
    fault_gap: u64,
    pause_gap: u64,
}
/// A rate error in ppm within `±bound`: half the time one of the bounds, else uniform.
fn ppm(rng: &mut StdRng, bound: i64) -> i64 {
    match rng.random_range(0..4u8) {
        0 => bound,
        1 => -bound,
        _ => rng.random_range(-bound..=bound),
    }
}

impl World {
    pub(super) fn new(seed: u64, config: &Config, trace: bool) -> Result<World, String> {
        // Independent streams, so that a change in one part of a schedule (say, one more
        // network delay drawn) does not reshuffle every other part.
        let mut root = StdRng::seed_from_u64(seed);
        let mut prm = StdRng::seed_from_u64(root.random());
        let net_rng = StdRng::seed_from_u64(root.random());
        let mut fault_rng = StdRng::seed_from_u64(root.random());
        let client_seed: u64 = root.random();

        let n = config.nodes.clamp(1, 64);
        let lo = config.min_clients.clamp(1, 64);
        let m = between(&mut prm, lo as u64, config.max_clients.clamp(lo, 64) as u64) as usize;
        let mutation = config.mutation;
        let majority = tally::quorum(n);
        let quorum = if mutation == Some(Mutation::HalfQuorum) {
            (n / 2).max(1)
        } else {
            majority
        };
        // Log-uniform longest TTL, 40 ms to 2 s; acquisitions use 1/4 of it and up.
        let max_ttl_ms = (40.0 * 50f64.powf(prm.random::<f64>())) as u64;
        let min_ttl_ms = (max_ttl_ms / 4).max(EXTEND_MIN_TTL_MS + 5);
        let node_timeout_us = between(&mut prm, 1_000, (min_ttl_ms * 1000 / 5).min(40_000));
        let (delay_lo, delay_hi) = match prm.random_range(0..3u8) {
            0 => (20, 300),
            1 => (50, 2_000),
            _ => (200, node_timeout_us / 2),
        };
        let slow_p = [0.0, 0.01, 0.05][prm.random_range(0..3usize)];
        let slow_hi = node_timeout_us * 3;
        let fencing = prm.random_bool(0.5);
        // Drawn apart from the stream above, so that the older parameters of a seed stay.
        let mut extra = StdRng::seed_from_u64(seed ^ 0x005E_ED0F_5A17_u64);
        let names: &[&str] = if extra.random_bool(0.35) {
            &["r", "s"]
        } else {
            &["r"]
        };
        // Waiters queue (and are handed the lock) in half the unfenced schedules.
        let waiting = !fencing && extra.random_bool(0.5);
        let res = Resources::new(names).map_err(|e| format!("the resources' keys: {e}"))?;
        let lock_keys = res.lock_keys().to_vec();
        let fence_keys = res.fence_keys();
        let scripts = mutated_scripts(mutation)?;
        // Persistence: every node AOF `always`, none, or each its own.
        let aof_p = [1.0, 0.0, 0.5][prm.random_range(0..3usize)];
        let offset_bound = NODE_OFFSETS_US[prm.random_range(0..NODE_OFFSETS_US.len())];
        let nodes: Vec<NodeState> = (0..n)
            .map(|_| {
                let aof = prm.random_bool(aof_p);
                let persistence = if aof {
                    Persistence::AofAlways
                } else {
                    Persistence::None
                };
                let offset = prm.random_range(-offset_bound..=offset_bound);
                NodeState {
                    sim: SimNode::with_scripts(persistence, scripts.clone()),
                    clock: Clock::new(
                        EPOCH_US.saturating_add_signed(offset),
                        ppm(&mut prm, NODE_PPM),
                    ),
                    aof,
                    paused: false,
                    pause_gen: 0,
                    inbox: VecDeque::new(),
                    restart_at: None,
                    ghosts: Vec::new(),
                }
            })
            .collect();
        let p = Params {
            nodes: n,
            quorum,
            majority,
            drift_factor: 0.01,
            no_drift: mutation == Some(Mutation::NoDrift),
            fencing,
            min_ttl_ms,
            max_ttl_ms,
            node_timeout_us,
            delay_lo,
            delay_hi,
            slow_p,
            slow_hi,
            immediate_restart: mutation == Some(Mutation::ImmediateRestart),
            fencing_commit: mutation != Some(Mutation::FencingWithoutCommit),
            cleanup_all: mutation != Some(Mutation::CleanupGrantedOnly),
            res,
            lock_keys,
            fence_keys,
            waiting,
        };
        let mut client_root = StdRng::seed_from_u64(client_seed);
        let clients: Vec<Client> = (0..m)
            .map(|_| {
                let mut rng = StdRng::seed_from_u64(client_root.random());
                let clock = Clock::new(rng.random_range(0..1u64 << 40), ppm(&mut rng, CLIENT_PPM));
                Client::new(rng, clock)
            })
            .collect();
        let links = (0..m * n).map(|_| Link::default()).collect();
        let mut w = World {
            seed,
            config: config.clone(),
            p,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            clients,
            links,
            calls: Vec::new(),
            rounds: Vec::new(),
            attempts: Vec::new(),
            net_rng,
            fault_rng: StdRng::seed_from_u64(0),
            trace: trace.then(Vec::new),
            violation: None,
            stats: Stats {
                schedules: 1,
                fenced_schedules: u64::from(fencing),
                multi_resource_schedules: u64::from(names.len() > 1),
                ..Stats::default()
            },
            max_fence: None,
            ending: false,
            fault_gap: 0,
            pause_gap: 0,
        };
        w.describe_params(mutation);
        w.plan_faults(&mut fault_rng);
        w.fault_rng = fault_rng;
        for c in 0..m {
            w.client_begin(c);
        }
        Ok(w)
    }

    fn describe_params(&mut self, mutation: Option<Mutation>) {
        if self.trace.is_none() {
            return;
        }
        let p = &self.p;
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                format!(
                    "n{i} {} clock {:+} µs {:+} ppm",
                    if s.aof { "aof" } else { "no-persistence" },
                    s.clock.base() as i128 - EPOCH_US as i128,
                    s.clock.ppm()
                )
            })
            .collect();
        let clients: Vec<String> = self
            .clients
            .iter()
            .enumerate()
            .map(|(i, c)| format!("c{i} {:+} ppm", c.clock.ppm()))
            .collect();
        let line = format!(
            "seed {}: {} nodes, quorum {} (majority {}), {} clients, fencing {}, ttl {}..{} ms, node timeout {} µs, delay {}..{} µs (slow {} up to {} µs), mutation {}\n  nodes: {}\n  clients: {}",
            self.seed,
            p.nodes,
            p.quorum,
            p.majority,
            self.clients.len(),
            if p.fencing { "on" } else { "off" },
            p.min_ttl_ms,
            p.max_ttl_ms,
            p.node_timeout_us,
            p.delay_lo,
            p.delay_hi,
            p.slow_p,
            p.slow_hi,
            mutation.map_or("none", Mutation::name),
            nodes.join(", "),
            clients.join(", ")
        );
        self.log_raw(line);
    }

    /// Sets the fault rates: faults come one after another, each drawn when the previous
    /// one fires, at random gaps (mean `fault_gap`), until every client finished; so do
    /// each client's pauses (mean `pause_gap`). Some schedules have no faults or no
    /// pauses at all.
    fn plan_faults(&mut self, rng: &mut StdRng) {
        let max_ttl = self.p.max_ttl_ms * 1000;
        self.fault_gap = [0, max_ttl / 2, max_ttl, 2 * max_ttl][rng.random_range(0..4usize)];
        self.pause_gap = [0, max_ttl, 3 * max_ttl][rng.random_range(0..3usize)];
        if self.fault_gap > 0 {
            let at = between(rng, 0, 2 * self.fault_gap);
            self.push(at, Kind::Fault(Fault::Next));
        }
        if self.pause_gap > 0 {
            for c in 0..self.clients.len() {
                let at = between(rng, 0, 2 * self.pause_gap);
                self.push(at, Kind::Fault(Fault::NextPause(c)));
            }
        }
    }

    /// Draws the next fault and when the one after it comes.
    fn next_fault(&mut self) -> Fault {
        let rng = &mut self.fault_rng;
        let (n, m) = (self.p.nodes, self.clients.len());
        let max_ttl = self.p.max_ttl_ms * 1000;
        let gap = between(rng, 0, 2 * self.fault_gap);
        let fault = match rng.random_range(0..20u8) {
            0..=1 => Fault::Crash(rng.random_range(0..n)),
            2..=4 => Fault::CrashHolders(1),
            5..=6 => Fault::CrashHolders(rng.random_range(2..=n.max(2))),
            7..=11 => {
                let dur = if rng.random_bool(0.5) {
                    between(rng, 500, self.p.node_timeout_us * 3)
                } else {
                    between(rng, 1_000, max_ttl * 2)
                };
                Fault::Pause(rng.random_range(0..n), dur)
            }
            _ => Fault::Cut(rng.random_range(0..m * n), between(rng, 0, max_ttl / 2)),
        };
        self.push(self.now + gap, Kind::Fault(Fault::Next));
        fault
    }

    /// Draws client `c`'s next pause and when the one after it comes.
    fn next_pause(&mut self, c: usize) -> Fault {
        let rng = &mut self.fault_rng;
        let max_ttl = self.p.max_ttl_ms * 1000;
        let gap = between(rng, 0, 2 * self.pause_gap);
        let dur = match rng.random_range(0..10u8) {
            0..=5 => between(rng, 100, 5_000),
            6..=7 => between(rng, 1_000, max_ttl / 2),
            _ => between(rng, max_ttl / 2, max_ttl * 2),
        };
        self.push(self.now + gap, Kind::Fault(Fault::NextPause(c)));
        Fault::ClientPause(c, dur)
    }

    pub(super) fn push(&mut self, at: u64, kind: Kind) {
        self.seq += 1;
        self.queue.push(Reverse(Event {
            at: at.max(self.now),
            seq: self.seq,
            kind,
        }));
    }

    /// Whether the trace is on.
    pub(super) fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Appends one line to the trace, stamped with the true time.
    pub(super) fn log(&mut self, line: impl FnOnce() -> String) {
        if self.trace.is_some() {
            let line = format!("{}  {}", time(self.now), line());
            self.log_raw(line);
        }
    }

    fn log_raw(&mut self, line: String) {
        if let Some(t) = &mut self.trace {
            t.push(line);
        }
    }

    /// Records the first violation.
    pub(super) fn violate(&mut self, invariant: Invariant, detail: String) {
        if self.violation.is_none() {
            self.log(|| format!("VIOLATION: {invariant}: {detail}"));
            self.violation = Some(Violation {
                invariant,
                at_us: self.now,
                detail,
            });
        }
    }

    fn run(mut self) -> Report {
        while self.violation.is_none() {
            let Some(Reverse(ev)) = self.queue.pop() else {
                break;
            };
            self.stats.events += 1;
            if self.stats.events > EVENT_BUDGET {
                self.violate(
                    Invariant::Simulator,
                    format!("no end after {EVENT_BUDGET} events"),
                );
                break;
            }
            self.now = ev.at;
            // A paused client handles nothing until its pause ends.
            if let Some(c) = self.client_of(&ev.kind) {
                let until = self.clients.get(c).map_or(0, |cl| cl.paused_until);
                if until > self.now {
                    self.seq += 1;
                    self.queue.push(Reverse(Event {
                        at: until,
                        seq: self.seq,
                        kind: ev.kind,
                    }));
                    continue;
                }
            }
            match ev.kind {
                Kind::ToNode { call, epoch, eval } => self.at_node(call, epoch, eval),
                Kind::ToClient { call, epoch, reply } => self.at_client(call, epoch, reply),
                Kind::Timeout { call } => self.call_timeout(call),
                Kind::Timer { client, generation } => self.client_timer(client, generation),
                Kind::Fault(f) => self.fault(f),
            }
            self.check_validity();
            if !self.ending && self.clients.iter().all(Client::is_done) {
                self.begin_end();
            }
        }
        self.stats.sim_time_us = self.now;
        if self.violation.is_none() {
            self.check_left_behind();
        }
        if self.violation.is_none() {
            self.check_all_expired();
        }
        Report {
            seed: self.seed,
            violation: self.violation,
            trace: self.trace.unwrap_or_default(),
            stats: self.stats,
            config: self.config,
        }
    }

    fn client_of(&self, kind: &Kind) -> Option<usize> {
        match kind {
            Kind::ToClient { call, .. } | Kind::Timeout { call } => {
                self.calls.get(*call).map(|c| c.client)
            }
            Kind::Timer { client, .. } => Some(*client),
            _ => None,
        }
    }

    /// Every client finished its work: no more faults; paused nodes resume, cut links
    /// come back, crashed nodes restart when due; the network drains.
    fn begin_end(&mut self) {
        self.ending = true;
        self.log(|| "every client finished: faults stop, the network heals and drains".into());
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                let generation = self.nodes[i].pause_gen;
                self.fault(Fault::Resume(i, generation));
            }
        }
        for l in 0..self.links.len() {
            if !self.links[l].up {
                self.fault(Fault::LinkUp(l));
            }
        }
    }

    /// The true time by which every key written with the longest TTL has expired on
    /// every node, from now.
    pub(super) fn longest_ttl_true(&self) -> u64 {
        let ttl = self.p.max_ttl_ms * 1000;
        // A node clock running slow by NODE_PPM stretches a TTL; keys live up to 1 ms
        // past their TTL (expiry is by whole millisecond).
        ttl.saturating_mul(1_000_000) / (1_000_000 - NODE_PPM as u64) + 2_000
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::Next if !self.ending => {
                let f = self.next_fault();
                self.fault(f);
            }
            Fault::NextPause(c) if !self.ending => {
                let f = self.next_pause(c);
                self.fault(f);
            }
            Fault::Crash(i) if !self.ending => self.crash(i),
            Fault::CrashHolders(k) if !self.ending => {
                let (mut holders, mut others): (Vec<usize>, Vec<usize>) = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].sim.is_up())
                    .partition(|&i| {
                        let node = &self.nodes[i];
                        let now_n = node.clock.at(self.now);
                        node.sim
                            .entries(now_n)
                            .any(|(k, _, _)| self.p.lock_keys.iter().any(|l| l.as_slice() == k))
                    });
                for _ in 0..k {
                    let pool = if holders.is_empty() {
                        &mut others
                    } else {
                        &mut holders
                    };
                    if pool.is_empty() {
                        break;
                    }
                    let i = pool.remove(self.fault_rng.random_range(0..pool.len()));
                    self.crash(i);
                }
            }
            Fault::Restart(i) => self.restart(i),
            Fault::Pause(i, dur) if !self.ending => {
                let node = &mut self.nodes[i];
                if node.paused || !node.sim.is_up() {
                    return;
                }
                node.paused = true;
                node.pause_gen += 1;
                let generation = node.pause_gen;
                self.stats.node_pauses += 1;
                self.log(|| format!("n{i} paused for {} µs", dur));
                self.push(self.now + dur, Kind::Fault(Fault::Resume(i, generation)));
            }
            Fault::Resume(i, generation) => {
                let node = &mut self.nodes[i];
                if !node.paused || node.pause_gen != generation {
                    return;
                }
                node.paused = false;
                self.log(|| format!("n{i} resumes"));
                while let Some((call, epoch, eval)) = self.nodes[i].inbox.pop_front() {
                    self.execute(i, call, epoch, eval);
                }
            }
            Fault::Cut(l, down) if !self.ending => {
                let link = &mut self.links[l];
                link.epoch += 1;
                link.up = false;
                link.down_until = link.down_until.max(self.now + down);
                let until = link.down_until;
                self.stats.cuts += 1;
                let (c, i) = (l / self.p.nodes, l % self.p.nodes);
                let down = until - self.now;
                self.log(|| {
                    format!("c{c}-n{i} connection lost (in-flight messages lost), down {down} µs")
                });
                self.push(until, Kind::Fault(Fault::LinkUp(l)));
            }
            Fault::LinkUp(l) => {
                let link = &mut self.links[l];
                if link.up || (link.down_until > self.now && !self.ending) {
                    return;
                }
                link.up = true;
                let (c, i) = (l / self.p.nodes, l % self.p.nodes);
                self.log(|| format!("c{c}-n{i} reconnected"));
            }
            Fault::ClientPause(c, dur) if !self.ending => {
                let until = self.now + dur;
                let cl = &mut self.clients[c];
                cl.paused_until = cl.paused_until.max(until);
                self.stats.client_pauses += 1;
                let past = self.client_deadline_true(c).is_some_and(|d| d < until);
                if past {
                    self.stats.pauses_past_validity += 1;
                }
                self.log(|| {
                    format!(
                        "c{c} pauses for {dur} µs{}",
                        if past {
                            " (past its lock's validity)"
                        } else {
                            ""
                        }
                    )
                });
            }
            _ => {}
        }
    }

    fn crash(&mut self, i: usize) {
        if !self.nodes[i].sim.is_up() {
            return;
        }
        self.stats.crashes += 1;
        let now_n = self.nodes[i].clock.at(self.now);
        let aof = self.nodes[i].aof;
        if !aof {
            // What the node held, for the validity invariant: see `check.rs`.
            let clock = self.nodes[i].clock;
            let ghosts: Vec<(Vec<u8>, u64)> = self
                .node_holder(i, now_n)
                .map(|(t, at)| (t, expiry_true(clock, at)))
                .into_iter()
                .collect();
            self.nodes[i].ghosts = ghosts;
        }
        let node = &mut self.nodes[i];
        node.sim.crash();
        node.paused = false;
        node.inbox.clear();
        // Every connection to the node dies with it.
        for c in 0..self.clients.len() {
            self.links[c * self.p.nodes + i].epoch += 1;
        }
        let ttl_true = self.longest_ttl_true();
        let delay = if aof {
            // Nothing is lost: any delay, at once included.
            between(&mut self.fault_rng, 0, ttl_true)
        } else if self.p.immediate_restart {
            between(&mut self.fault_rng, 0, 1_000)
        } else {
            // The deployment contract's delayed restart: longer than the longest TTL,
            // and longer than the nodes' clocks disagree (the fencing floor's clock
            // assumption), with margin.
            let spread = self.clock_spread(self.now + 4 * ttl_true);
            ttl_true + 2 * spread + 1_000 + between(&mut self.fault_rng, 0, ttl_true / 2)
        };
        let at = self.now + delay;
        self.nodes[i].restart_at = Some(at);
        self.log(|| {
            format!(
                "n{i} crashes ({}), restarts in {delay} µs",
                if aof {
                    "AOF keeps every key"
                } else {
                    "every key lost"
                }
            )
        });
        self.push(at, Kind::Fault(Fault::Restart(i)));
    }

    fn restart(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if node.sim.is_up() {
            return;
        }
        node.sim.restart();
        node.restart_at = None;
        node.ghosts.clear();
        self.log(|| format!("n{i} restarts"));
    }

    /// The largest difference between two node clocks at true time `t`.
    fn clock_spread(&self, t: u64) -> u64 {
        let readings = self.nodes.iter().map(|n| n.clock.at(t));
        let hi = readings.clone().max().unwrap_or(0);
        let lo = readings.min().unwrap_or(0);
        hi - lo
    }

    /// A network delay for one message.
    pub(super) fn delay(&mut self) -> u64 {
        let p = &self.p;
        if p.slow_p > 0.0 && self.net_rng.random_bool(p.slow_p) {
            between(&mut self.net_rng, p.delay_hi, p.slow_hi)
        } else {
            let (lo, hi) = (p.delay_lo, p.delay_hi);
            between(&mut self.net_rng, lo, hi)
        }
    }
}

/// The crate's scripts with `mutation`'s replacements made.
fn mutated_scripts(mutation: Option<Mutation>) -> Result<std::rc::Rc<[Script]>, String> {
    let patches = mutation.map_or(&[][..], Mutation::patches);
    if patches.is_empty() {
        return Ok(crate_scripts());
    }
    let mut all = scripts();
    for (name, from, to) in patches {
        let Some(s) = all.iter_mut().find(|s| s.name() == *name) else {
            return Err(format!("mutation: no script named {name}"));
        };
        *s = s.replaced(from, to).ok_or_else(|| {
            format!("mutation: {name}.lua no longer contains {from:?} (update the mutation)")
        })?;
    }
    Ok(all.into())
}
