//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): every
//! metric name, label and recording function of the crate is here, and the rest of the
//! crate calls these functions in one line each.
//!
//! Without the feature every function below has an empty `#[inline(always)]` body, and
//! [`Timer`] and [`NodeKeys`] hold nothing: the calls compile to nothing (no clock read, no
//! allocation, no atomic). With the feature, metrics go to whatever recorder the
//! application installed (none installed: the facade's no-op recorder).
//!
//! Prometheus naming: `quorumlock_` prefix, base units (seconds), `_total` for counters.
//! Labels are bounded: outcomes and reasons are fixed word lists, `node` is one of the
//! configured nodes (its address without the password, as in errors), and no label ever
//! holds a resource name, a token or a password.
//!
//! | metric | type | labels | one observation per |
//! | --- | --- | --- | --- |
//! | `quorumlock_acquire_seconds`, `quorumlock_acquire_total` | histogram, counter | `outcome`: `acquired`, `held`, `no_quorum`, `no_validity_left`, `abandoned`, `cancelled` | acquisition attempt (`try_lock`, each attempt of `lock`): first request to verdict (with fencing, both rounds) |
//! | `quorumlock_extend_seconds`, `quorumlock_extend_total` | histogram, counter | `outcome`: `extended`, `no_quorum`, `no_validity_left`, `lost`, `expired` | `Lock::extend` round |
//! | `quorumlock_release_seconds`, `quorumlock_release_total` | histogram, counter | `outcome`: `released`, `no_quorum`, `lost`, `expired` | `Lock::release` round (decided at the quorum) |
//! | `quorumlock_node_request_seconds` | histogram | `node`, `op`: `acquire`, `extend`, `release`, `fence_commit`, `watchdog`; `outcome`: `granted`, `refused`, `failed`, `timed_out` | request to one node, as its caller waited for it (a watchdog pipeline: one per lock in it) |
//! | `quorumlock_grant_validity_seconds` | histogram | `op`: `acquire`, `extend`, `watchdog` | grant: the validity left when the quorum granted |
//! | `quorumlock_locks_lost_total` | counter | `reason`: `not_held`, `extend_failed`, `max_hold`, `max_extensions`, `expired` | lost lock: a kept lock's lost signal, or a `Lock::extend` / `Lock::release` round that found it lost |
//! | `quorumlock_locks_dropped_total` | counter | — | `Lock` dropped without `release` (released in the background) |
//! | `quorumlock_split_votes_total` | counter | — | waiting attempt whose votes were split (no owner could have a quorum) |
//! | `quorumlock_handoffs_total` | counter | — | acquisition by a queued waiter on the turn a release's announcement gave it |
//! | `quorumlock_wait_seconds` | histogram | `outcome`: `acquired`, `timeout`, `error` | waiting call (`lock`, `lock_with`, `lock_many`, `with_lock`): start to result |
//! | `quorumlock_watchdog_rounds_total` | counter | — | watchdog round (one pipeline per node) |
//! | `quorumlock_watchdog_extensions_total` | counter | `outcome`: `extended`, `retry`, `lost` | kept lock decided in a watchdog round |
//! | `quorumlock_flush_pending` | gauge | — | `flush` call: background requests still running when it was called |
//! | `quorumlock_flush_total` | counter | `outcome`: `finished`, `timed_out` | `flush` call |
//!
//! The `outcome` words of acquire, extend and release are the tracing spans' `outcome`
//! field with `_` for spaces (`Verdict::label`), plus `abandoned` (the fencing commit
//! missed its quorum) and `cancelled` (the attempt's future was dropped mid-vote).

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use crate::base::addr::NodeAddr;
use crate::base::error::{Error, LostReason};
use crate::protocol::Reply;
use crate::protocol::Verdict;
use crate::protocol::keep::Applied;

/// A measurement's start: the clock read with the feature, nothing without it.
#[derive(Clone, Copy)]
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    start: Instant,
}

impl Timer {
    /// Starts a measurement (reads the clock only with the feature).
    #[inline(always)]
    pub(crate) fn start() -> Timer {
        Timer {
            #[cfg(feature = "metrics")]
            start: Instant::now(),
        }
    }
}

/// What a request to one node does, for the `op` label of `quorumlock_node_request_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `SET … NX PX … GET`, or an acquire script (plain or fenced).
    Acquire,
    /// The extend script of `Lock::extend`.
    Extend,
    /// A release script (a release, or the clean-up of a failed attempt).
    Release,
    /// The fencing commit (round 2).
    FenceCommit,
    /// One lock's extension in a watchdog pipeline (named only where metrics are recorded).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    Watchdog,
}

/// How an acquisition attempt ended without a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The fencing commit missed its quorum.
    Abandoned,
    /// The attempt's future was dropped before it decided.
    Cancelled,
}

/// One node's metric keys (`node`, `op`, `outcome`), built once per node so that recording
/// a request neither allocates nor hashes. Empty without the feature.
#[derive(Clone)]
pub(crate) struct NodeKeys {
    #[cfg(feature = "metrics")]
    keys: std::sync::Arc<[::metrics::Key]>,
    #[cfg(feature = "metrics")]
    cache: std::sync::Arc<imp::Cache>,
}

impl NodeKeys {
    /// The keys of the node at `addr` (its address without the password).
    #[inline(always)]
    pub(crate) fn new(addr: &NodeAddr) -> NodeKeys {
        #[cfg(not(feature = "metrics"))]
        let _ = addr;
        NodeKeys {
            #[cfg(feature = "metrics")]
            keys: imp::node_keys(addr),
            #[cfg(feature = "metrics")]
            cache: std::sync::Arc::new(imp::Cache::new(imp::NODE_HISTOGRAMS, 0)),
        }
    }

    /// A request of kind `op`, started at `timer`, answered `reply`.
    #[inline(always)]
    pub(crate) fn request(&self, timer: Timer, op: Op, reply: &Reply) {
        #[cfg(feature = "metrics")]
        imp::node_request(&self.cache, &self.keys, timer.start.elapsed(), op, reply);
        #[cfg(not(feature = "metrics"))]
        let _ = (timer, op, reply);
    }

    /// A watchdog pipeline started at `timer`: one observation per lock in it.
    #[inline(always)]
    pub(crate) fn batch(&self, timer: Timer, replies: &[Reply]) {
        #[cfg(feature = "metrics")]
        {
            let elapsed = timer.start.elapsed();
            for reply in replies {
                imp::node_request(&self.cache, &self.keys, elapsed, Op::Watchdog, reply);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (timer, replies);
    }
}

/// One client's handles for the metrics of every acquire, extend and release round,
/// registered with the recorder on first use and kept (a lookup in the recorder's registry
/// on every call cost more than the rest of the recording together). Shared by the
/// client's clones; empty without the feature.
pub(crate) struct ClientMetrics {
    #[cfg(feature = "metrics")]
    cache: imp::Cache,
}

impl ClientMetrics {
    /// No handle registered yet.
    #[inline(always)]
    pub(crate) fn new() -> ClientMetrics {
        ClientMetrics {
            #[cfg(feature = "metrics")]
            cache: imp::Cache::new(imp::CLIENT_HISTOGRAMS, imp::CLIENT_COUNTERS),
        }
    }

    /// An acquisition attempt decided by `verdict` after `elapsed`.
    #[inline(always)]
    pub(crate) fn acquire(&self, verdict: Verdict, elapsed: Duration) {
        #[cfg(feature = "metrics")]
        imp::acquire(&self.cache, verdict, elapsed);
        #[cfg(not(feature = "metrics"))]
        let _ = (verdict, elapsed);
    }

    /// An acquisition attempt started at `started` that ended without a verdict.
    #[inline(always)]
    pub(crate) fn acquire_ended(&self, how: Ended, started: Instant) {
        #[cfg(feature = "metrics")]
        imp::acquire_ended(&self.cache, how, started.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = (how, started);
    }

    /// A `Lock::extend` round decided by `verdict` after `elapsed`.
    #[inline(always)]
    pub(crate) fn extend(&self, verdict: Verdict, elapsed: Duration) {
        #[cfg(feature = "metrics")]
        imp::extend(&self.cache, verdict, elapsed);
        #[cfg(not(feature = "metrics"))]
        let _ = (verdict, elapsed);
    }

    /// A `Lock::release` round decided by `verdict` after `elapsed`.
    #[inline(always)]
    pub(crate) fn release(&self, verdict: Verdict, elapsed: Duration) {
        #[cfg(feature = "metrics")]
        imp::release(&self.cache, verdict, elapsed);
        #[cfg(not(feature = "metrics"))]
        let _ = (verdict, elapsed);
    }
}

/// A `Lock` dropped without `release`.
#[inline(always)]
pub(crate) fn dropped() {
    #[cfg(feature = "metrics")]
    imp::dropped();
}

/// A held lock found lost, for `reason`.
#[inline(always)]
pub(crate) fn lost(reason: LostReason) {
    #[cfg(feature = "metrics")]
    imp::lost(reason);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// A waiting attempt was refused; `split`: its votes were split.
#[inline(always)]
pub(crate) fn split_vote(split: bool) {
    #[cfg(feature = "metrics")]
    imp::split_vote(split);
    #[cfg(not(feature = "metrics"))]
    let _ = split;
}

/// A waiter acquired; `on_turn`: on the turn a release's announcement gave it.
#[inline(always)]
pub(crate) fn handoff(on_turn: bool) {
    #[cfg(feature = "metrics")]
    imp::handoff(on_turn);
    #[cfg(not(feature = "metrics"))]
    let _ = on_turn;
}

/// A waiting call started at `started` ends with `result`, which is handed back.
#[inline(always)]
pub(crate) fn waited<T>(started: Instant, result: Result<T, Error>) -> Result<T, Error> {
    #[cfg(feature = "metrics")]
    imp::waited(started.elapsed(), result.as_ref().err());
    #[cfg(not(feature = "metrics"))]
    let _ = started;
    result
}

/// A watchdog round starts, for `locks` kept locks.
#[inline(always)]
pub(crate) fn watchdog_round(locks: usize) {
    #[cfg(feature = "metrics")]
    imp::watchdog_round(locks);
    #[cfg(not(feature = "metrics"))]
    let _ = locks;
}

/// What a watchdog round did to one kept lock; handed back.
#[inline(always)]
pub(crate) fn watchdog_applied(applied: Applied) -> Applied {
    #[cfg(feature = "metrics")]
    imp::watchdog_applied(&applied);
    applied
}

/// A `flush` starts, with `pending` background requests counted.
#[inline(always)]
pub(crate) fn flush_pending(pending: &AtomicUsize) {
    #[cfg(feature = "metrics")]
    imp::flush_pending(pending.load(std::sync::atomic::Ordering::Acquire));
    #[cfg(not(feature = "metrics"))]
    let _ = pending;
}

/// A `flush` ends; `finished`: every background request finished. Handed back.
#[inline(always)]
pub(crate) fn flushed(finished: bool) -> bool {
    #[cfg(feature = "metrics")]
    imp::flushed(finished);
    finished
}

/// A client is being built: describe the metrics to the recorder installed by now.
#[inline(always)]
pub(crate) fn built() {
    #[cfg(feature = "metrics")]
    describe();
}

/// Registers the description and unit of every quorumlock metric with the installed
/// recorder (Prometheus: the `# HELP` lines).
///
/// [`RedlockBuilder::build`](crate::RedlockBuilder::build) calls it; call it yourself
/// when you install your recorder after building the client. Cheap, and harmless to call
/// again. Feature `metrics`.
///
/// # Example
///
/// ```
/// // After installing a recorder, e.g. metrics_exporter_prometheus::PrometheusBuilder:
/// quorumlock::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    imp::describe();
}

/// The implementation, with the feature.
#[cfg(feature = "metrics")]
mod imp {
    use std::sync::{Arc, OnceLock, RwLock};
    use std::time::Duration;

    use ::metrics::{
        Counter, Histogram, Key, Label, Level, Metadata, Recorder, SharedString, Unit,
        with_recorder,
    };

    use super::{Ended, Op};
    use crate::base::addr::NodeAddr;
    use crate::base::error::{Error, LostReason};
    use crate::protocol::keep::Applied;
    use crate::protocol::{Ballot, Loss, Reply, Verdict};

    static META: Metadata<'static> = Metadata::new("quorumlock", Level::INFO, Some(module_path!()));

    /// Static label arrays: `labels!(key, VALUES, 0 1 …)`.
    macro_rules! labels {
        ($key:literal, $values:ident, $($i:literal)+) => {
            [$(Label::from_static_parts($key, $values[$i])),+]
        };
    }

    /// Static keys, one per label of a static label array (the key's hash is computed at
    /// compile time).
    macro_rules! keys {
        ($name:expr, $labels:ident, $($i:literal)+) => {
            [$(Key::from_static_parts($name, std::slice::from_ref(&$labels[$i]))),+]
        };
    }

    pub(super) const ACQUIRE_SECONDS: &str = "quorumlock_acquire_seconds";
    pub(super) const ACQUIRE_TOTAL: &str = "quorumlock_acquire_total";
    pub(super) const EXTEND_SECONDS: &str = "quorumlock_extend_seconds";
    pub(super) const EXTEND_TOTAL: &str = "quorumlock_extend_total";
    pub(super) const RELEASE_SECONDS: &str = "quorumlock_release_seconds";
    pub(super) const RELEASE_TOTAL: &str = "quorumlock_release_total";
    pub(super) const NODE_REQUEST_SECONDS: &str = "quorumlock_node_request_seconds";
    pub(super) const GRANT_VALIDITY_SECONDS: &str = "quorumlock_grant_validity_seconds";
    pub(super) const LOCKS_LOST_TOTAL: &str = "quorumlock_locks_lost_total";
    pub(super) const LOCKS_DROPPED_TOTAL: &str = "quorumlock_locks_dropped_total";
    pub(super) const SPLIT_VOTES_TOTAL: &str = "quorumlock_split_votes_total";
    pub(super) const HANDOFFS_TOTAL: &str = "quorumlock_handoffs_total";
    pub(super) const WAIT_SECONDS: &str = "quorumlock_wait_seconds";
    pub(super) const WATCHDOG_ROUNDS_TOTAL: &str = "quorumlock_watchdog_rounds_total";
    pub(super) const WATCHDOG_EXTENSIONS_TOTAL: &str = "quorumlock_watchdog_extensions_total";
    pub(super) const FLUSH_PENDING: &str = "quorumlock_flush_pending";
    pub(super) const FLUSH_TOTAL: &str = "quorumlock_flush_total";

    /// The `outcome` of acquire, extend and release rounds.
    pub(super) const OUTCOMES: [&str; 10] = [
        "acquired",
        "extended",
        "released",
        "held",
        "no_validity_left",
        "no_quorum",
        "lost",
        "expired",
        "abandoned",
        "cancelled",
    ];
    const ACQUIRED: usize = 0;
    const EXTENDED: usize = 1;
    const ABANDONED: usize = 8;
    const CANCELLED: usize = 9;

    static OUTCOME: [Label; 10] = labels!("outcome", OUTCOMES, 0 1 2 3 4 5 6 7 8 9);
    static ACQUIRE_S: [Key; 10] = keys!(ACQUIRE_SECONDS, OUTCOME, 0 1 2 3 4 5 6 7 8 9);
    static ACQUIRE_N: [Key; 10] = keys!(ACQUIRE_TOTAL, OUTCOME, 0 1 2 3 4 5 6 7 8 9);
    static EXTEND_S: [Key; 10] = keys!(EXTEND_SECONDS, OUTCOME, 0 1 2 3 4 5 6 7 8 9);
    static EXTEND_N: [Key; 10] = keys!(EXTEND_TOTAL, OUTCOME, 0 1 2 3 4 5 6 7 8 9);
    static RELEASE_S: [Key; 10] = keys!(RELEASE_SECONDS, OUTCOME, 0 1 2 3 4 5 6 7 8 9);
    static RELEASE_N: [Key; 10] = keys!(RELEASE_TOTAL, OUTCOME, 0 1 2 3 4 5 6 7 8 9);

    /// The `op` of `quorumlock_grant_validity_seconds`.
    pub(super) const GRANT_OPS: [&str; 3] = ["acquire", "extend", "watchdog"];
    static GRANT_OP: [Label; 3] = labels!("op", GRANT_OPS, 0 1 2);
    static GRANT_S: [Key; 3] = keys!(GRANT_VALIDITY_SECONDS, GRANT_OP, 0 1 2);

    /// The `reason` of `quorumlock_locks_lost_total`, by `LostReason`.
    pub(super) const REASONS: [&str; 7] = [
        "expired",
        "not_held",
        "extend_failed",
        "max_hold",
        "max_extensions",
        "released",
        "watchdog_failed",
    ];
    static REASON: [Label; 7] = labels!("reason", REASONS, 0 1 2 3 4 5 6);
    static LOST_N: [Key; 7] = keys!(LOCKS_LOST_TOTAL, REASON, 0 1 2 3 4 5 6);

    /// The `outcome` of `quorumlock_wait_seconds`.
    pub(super) const WAITED: [&str; 3] = ["acquired", "timeout", "error"];
    static WAITED_L: [Label; 3] = labels!("outcome", WAITED, 0 1 2);
    static WAIT_S: [Key; 3] = keys!(WAIT_SECONDS, WAITED_L, 0 1 2);

    /// The `outcome` of `quorumlock_watchdog_extensions_total`.
    pub(super) const KEPT: [&str; 3] = ["extended", "retry", "lost"];
    static KEPT_L: [Label; 3] = labels!("outcome", KEPT, 0 1 2);
    static KEPT_N: [Key; 3] = keys!(WATCHDOG_EXTENSIONS_TOTAL, KEPT_L, 0 1 2);

    /// The `outcome` of `quorumlock_flush_total`.
    pub(super) const FLUSHED: [&str; 2] = ["finished", "timed_out"];
    static FLUSHED_L: [Label; 2] = labels!("outcome", FLUSHED, 0 1);
    static FLUSH_N: [Key; 2] = keys!(FLUSH_TOTAL, FLUSHED_L, 0 1);

    static DROPPED_N: Key = Key::from_static_name(LOCKS_DROPPED_TOTAL);
    static SPLIT_N: Key = Key::from_static_name(SPLIT_VOTES_TOTAL);
    static HANDOFF_N: Key = Key::from_static_name(HANDOFFS_TOTAL);
    static ROUNDS_N: Key = Key::from_static_name(WATCHDOG_ROUNDS_TOTAL);
    static PENDING_G: Key = Key::from_static_name(FLUSH_PENDING);

    /// The `op` and `outcome` of `quorumlock_node_request_seconds`.
    pub(super) const NODE_OPS: [&str; 5] =
        ["acquire", "extend", "release", "fence_commit", "watchdog"];
    pub(super) const NODE_OUTCOMES: [&str; 4] = ["granted", "refused", "failed", "timed_out"];

    /// Every metric: name, kind, unit, description (for [`describe`]).
    pub(super) const METRICS: &[(&str, Kind, Unit, &str)] = &[
        (
            ACQUIRE_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Acquisition attempts: time from the first request to the verdict, by outcome.",
        ),
        (
            ACQUIRE_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Acquisition attempts, by outcome.",
        ),
        (
            EXTEND_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Lock::extend rounds: time to the verdict, by outcome.",
        ),
        (
            EXTEND_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Lock::extend rounds, by outcome.",
        ),
        (
            RELEASE_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Lock::release rounds: time to the quorum's verdict, by outcome.",
        ),
        (
            RELEASE_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Lock::release rounds, by outcome.",
        ),
        (
            NODE_REQUEST_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Requests to one node as their caller waited for them, by node (no password), operation and outcome.",
        ),
        (
            GRANT_VALIDITY_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Validity left when a quorum granted (acquire, extend, watchdog).",
        ),
        (
            LOCKS_LOST_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Held locks found lost, by reason.",
        ),
        (
            LOCKS_DROPPED_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Locks dropped without release (released in the background).",
        ),
        (
            SPLIT_VOTES_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Waiting attempts whose votes were split (no owner could have a quorum).",
        ),
        (
            HANDOFFS_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Acquisitions by a queued waiter on the turn a release announcement gave it.",
        ),
        (
            WAIT_SECONDS,
            Kind::Histogram,
            Unit::Seconds,
            "Waiting calls (lock, lock_many, with_lock): time from the call to its result, by outcome.",
        ),
        (
            WATCHDOG_ROUNDS_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Watchdog rounds (one pipeline per node).",
        ),
        (
            WATCHDOG_EXTENSIONS_TOTAL,
            Kind::Counter,
            Unit::Count,
            "Kept locks decided in a watchdog round, by outcome.",
        ),
        (
            FLUSH_PENDING,
            Kind::Gauge,
            Unit::Count,
            "Background requests still running when flush was last called.",
        ),
        (
            FLUSH_TOTAL,
            Kind::Counter,
            Unit::Count,
            "flush calls, by outcome.",
        ),
    ];

    /// A metric's kind.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Kind {
        Counter,
        Gauge,
        Histogram,
    }

    pub(super) fn describe() {
        with_recorder(|r| {
            for &(name, kind, unit, text) in METRICS {
                let text = SharedString::const_str(text);
                match kind {
                    Kind::Counter => r.describe_counter(name.into(), Some(unit), text),
                    Kind::Gauge => r.describe_gauge(name.into(), Some(unit), text),
                    Kind::Histogram => r.describe_histogram(name.into(), Some(unit), text),
                }
            }
        });
    }

    /// The histograms of a client's [`Cache`]: acquire, extend and release rounds by
    /// outcome (10 each), then the grant validity by op (3).
    pub(super) const CLIENT_HISTOGRAMS: usize = 33;
    /// The counters of a client's [`Cache`]: acquire, extend and release rounds by outcome.
    pub(super) const CLIENT_COUNTERS: usize = 30;
    /// The histograms of a node's [`Cache`]: one per (`op`, `outcome`), `op`-major.
    pub(super) const NODE_HISTOGRAMS: usize = NODE_OPS.len() * NODE_OUTCOMES.len();
    const EXTEND_BASE: usize = 10;
    const RELEASE_BASE: usize = 20;
    const GRANT_BASE: usize = 30;

    /// Handles registered with one recorder, each on its first use.
    struct Slots {
        recorder: usize,
        histograms: Box<[OnceLock<Histogram>]>,
        counters: Box<[OnceLock<Counter>]>,
    }

    impl Slots {
        fn new(recorder: usize, histograms: usize, counters: usize) -> Slots {
            Slots {
                recorder,
                histograms: (0..histograms).map(|_| OnceLock::new()).collect(),
                counters: (0..counters).map(|_| OnceLock::new()).collect(),
            }
        }
    }

    /// A set of metric handles kept per recorder: the first call with a recorder registers
    /// the key and keeps the handle, later calls record on the handle directly, without
    /// the recorder's registry lookup (which compares every label of the key).
    ///
    /// The recorder is told apart by its address: the global recorder's is fixed once it
    /// is installed, and the no-op recorder (before one is installed) is a static, so an
    /// application that installs its recorder after `build()` gets fresh handles on the
    /// next call. A thread-local recorder (`metrics::with_local_recorder`) works too, as
    /// long as it outlives the client's use under it (a later recorder at the same address
    /// would receive nothing); every cache belongs to one client or one of its nodes.
    pub(super) struct Cache {
        slots: RwLock<Arc<Slots>>,
        histograms: usize,
        counters: usize,
    }

    impl Cache {
        pub(super) fn new(histograms: usize, counters: usize) -> Cache {
            Cache {
                slots: RwLock::new(Arc::new(Slots::new(0, 0, 0))),
                histograms,
                counters,
            }
        }

        /// The slots for recorder `r`, replaced when the recorder changed.
        fn slots(&self, r: &dyn Recorder) -> Arc<Slots> {
            let id = std::ptr::from_ref(r).cast::<()>() as usize;
            if let Ok(s) = self.slots.read()
                && s.recorder == id
            {
                return Arc::clone(&s);
            }
            let fresh = Arc::new(Slots::new(id, self.histograms, self.counters));
            if let Ok(mut s) = self.slots.write() {
                *s = Arc::clone(&fresh);
            }
            fresh
        }

        /// Records `value` on histogram `i` (`key`).
        pub(super) fn histogram(&self, i: usize, key: &Key, value: Duration) {
            with_recorder(|r| {
                let v = value.as_secs_f64();
                match self.slots(r).histograms.get(i) {
                    Some(h) => h.get_or_init(|| r.register_histogram(key, &META)).record(v),
                    None => r.register_histogram(key, &META).record(v),
                }
            });
        }

        /// Adds one to counter `i` (`key`).
        pub(super) fn count(&self, i: usize, key: &Key) {
            with_recorder(|r| match self.slots(r).counters.get(i) {
                Some(c) => c
                    .get_or_init(|| r.register_counter(key, &META))
                    .increment(1),
                None => r.register_counter(key, &META).increment(1),
            });
        }
    }

    fn histogram(key: &Key, value: Duration) {
        with_recorder(|r| r.register_histogram(key, &META).record(value.as_secs_f64()));
    }

    fn count(key: &Key) {
        with_recorder(|r| r.register_counter(key, &META).increment(1));
    }

    /// The `outcome` index of a verdict; `held`: the index of the held word.
    pub(super) fn outcome(verdict: Verdict, held: usize) -> usize {
        match verdict {
            Verdict::Held { .. } => held,
            Verdict::Released => 2,
            Verdict::HeldByOther => 3,
            Verdict::Timeout => 4,
            Verdict::NoQuorum => 5,
            Verdict::Lost(Loss::NotHeld) => 6,
            Verdict::Lost(Loss::Expired | Loss::ExtendFailed) => 7,
        }
    }

    /// A round of a client: `base` is its kind's first slot in the client's cache.
    fn cached_round(
        c: &Cache,
        base: usize,
        (seconds, total): (&[Key; 10], &[Key; 10]),
        i: usize,
        elapsed: Duration,
    ) {
        if let (Some(s), Some(n)) = (seconds.get(i), total.get(i)) {
            c.histogram(base + i, s, elapsed);
            c.count(base + i, n);
        }
    }

    fn cached_granted(c: &Cache, op: usize, validity: Duration) {
        if let Some(k) = GRANT_S.get(op) {
            c.histogram(GRANT_BASE + op, k, validity);
        }
    }

    fn granted(op: usize, validity: Duration) {
        if let Some(k) = GRANT_S.get(op) {
            histogram(k, validity);
        }
    }

    pub(super) fn acquire(c: &Cache, verdict: Verdict, elapsed: Duration) {
        let i = outcome(verdict, ACQUIRED);
        cached_round(c, 0, (&ACQUIRE_S, &ACQUIRE_N), i, elapsed);
        if let Verdict::Held { validity } = verdict {
            cached_granted(c, 0, validity);
        }
    }

    pub(super) fn acquire_ended(c: &Cache, how: Ended, elapsed: Duration) {
        let i = match how {
            Ended::Abandoned => ABANDONED,
            Ended::Cancelled => CANCELLED,
        };
        cached_round(c, 0, (&ACQUIRE_S, &ACQUIRE_N), i, elapsed);
    }

    pub(super) fn extend(c: &Cache, verdict: Verdict, elapsed: Duration) {
        let i = outcome(verdict, EXTENDED);
        cached_round(c, EXTEND_BASE, (&EXTEND_S, &EXTEND_N), i, elapsed);
        match verdict {
            Verdict::Held { validity } => cached_granted(c, 1, validity),
            Verdict::Lost(Loss::NotHeld) => lost(LostReason::NotHeld),
            Verdict::Lost(Loss::ExtendFailed) => lost(LostReason::ExtendFailed),
            _ => {}
        }
    }

    pub(super) fn release(c: &Cache, verdict: Verdict, elapsed: Duration) {
        let i = outcome(verdict, 2);
        cached_round(c, RELEASE_BASE, (&RELEASE_S, &RELEASE_N), i, elapsed);
        if verdict == Verdict::Lost(Loss::NotHeld) {
            lost(LostReason::NotHeld);
        }
    }

    pub(super) fn dropped() {
        count(&DROPPED_N);
    }

    /// The `reason` index of a lost reason.
    pub(super) fn reason(reason: LostReason) -> usize {
        match reason {
            LostReason::Expired => 0,
            LostReason::NotHeld => 1,
            LostReason::ExtendFailed => 2,
            LostReason::MaxHold => 3,
            LostReason::MaxExtensions => 4,
            LostReason::Released => 5,
            LostReason::WatchdogFailed => 6,
        }
    }

    pub(super) fn lost(r: LostReason) {
        if let Some(k) = LOST_N.get(reason(r)) {
            count(k);
        }
    }

    pub(super) fn split_vote(split: bool) {
        if split {
            count(&SPLIT_N);
        }
    }

    pub(super) fn handoff(on_turn: bool) {
        if on_turn {
            count(&HANDOFF_N);
        }
    }

    pub(super) fn waited(elapsed: Duration, err: Option<&Error>) {
        let i = match err {
            None => 0,
            Some(Error::Timeout(_)) => 1,
            Some(_) => 2,
        };
        if let Some(k) = WAIT_S.get(i) {
            histogram(k, elapsed);
        }
    }

    pub(super) fn watchdog_round(_locks: usize) {
        count(&ROUNDS_N);
    }

    pub(super) fn watchdog_applied(applied: &Applied) {
        let i = match applied {
            Applied::Ignored => return,
            Applied::Extended(validity) => {
                granted(2, *validity);
                0
            }
            Applied::Retry => 1,
            Applied::Lost { .. } => 2,
        };
        if let Some(k) = KEPT_N.get(i) {
            count(k);
        }
    }

    pub(super) fn flush_pending(pending: usize) {
        // Exact below 2^53, which a count of running tasks never reaches.
        let pending = pending as f64;
        with_recorder(|r| r.register_gauge(&PENDING_G, &META).set(pending));
    }

    pub(super) fn flushed(finished: bool) {
        if let Some(k) = FLUSH_N.get(usize::from(!finished)) {
            count(k);
        }
    }

    /// Every (`op`, `outcome`) key of one node, `op`-major.
    pub(super) fn node_keys(addr: &NodeAddr) -> Arc<[Key]> {
        let node: SharedString = Arc::<str>::from(addr.to_string()).into();
        let mut keys = Vec::with_capacity(NODE_OPS.len() * NODE_OUTCOMES.len());
        for op in NODE_OPS {
            for outcome in NODE_OUTCOMES {
                let labels = vec![
                    Label::new("node", node.clone()),
                    Label::from_static_parts("op", op),
                    Label::from_static_parts("outcome", outcome),
                ];
                // Retained (shared) once here: a recorder that retains the key it is handed
                // (the Prometheus one does, on every call) then clones it without allocating.
                keys.push(Key::from_parts(NODE_REQUEST_SECONDS, labels).to_retained());
            }
        }
        keys.into()
    }

    /// The `op` index of a request kind.
    pub(super) fn op(op: Op) -> usize {
        match op {
            Op::Acquire => 0,
            Op::Extend => 1,
            Op::Release => 2,
            Op::FenceCommit => 3,
            Op::Watchdog => 4,
        }
    }

    /// The `outcome` index of a node's reply.
    pub(super) fn node_outcome(reply: &Reply) -> usize {
        match reply {
            Reply::TimedOut => 3,
            r => match r.ballot() {
                Ballot::Granted => 0,
                Ballot::Refused => 1,
                Ballot::Failed => 2,
            },
        }
    }

    pub(super) fn node_request(c: &Cache, keys: &[Key], elapsed: Duration, o: Op, reply: &Reply) {
        let i = op(o) * NODE_OUTCOMES.len() + node_outcome(reply);
        if let Some(k) = keys.get(i) {
            c.histogram(i, k, elapsed);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::imp::*;
    use crate::protocol::{Loss, Reply, Verdict};
    use std::time::Duration;

    /// The outcome words are the tracing spans' `outcome` words, `_` for spaces.
    #[test]
    fn outcomes_follow_the_tracing_labels() {
        let d = Duration::from_millis(1);
        let verdicts = [
            Verdict::Held { validity: d },
            Verdict::Released,
            Verdict::Timeout,
            Verdict::HeldByOther,
            Verdict::Lost(Loss::NotHeld),
            Verdict::Lost(Loss::Expired),
            Verdict::Lost(Loss::ExtendFailed),
            Verdict::NoQuorum,
        ];
        for (word, held) in [("acquired", 0), ("extended", 1)] {
            for v in verdicts {
                let traced = v.label(word).replace(' ', "_");
                assert_eq!(OUTCOMES[outcome(v, held)], traced, "{v:?}");
            }
        }
    }

    /// Every label list is made of Prometheus-safe words, and every name is described.
    #[test]
    fn names_and_labels_are_prometheus_words() {
        let word = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        };
        for list in [
            &OUTCOMES[..],
            &GRANT_OPS,
            &REASONS,
            &WAITED,
            &KEPT,
            &FLUSHED,
            &NODE_OPS,
            &NODE_OUTCOMES,
        ] {
            for w in list {
                assert!(word(w), "{w}");
            }
        }
        for (name, kind, _, text) in METRICS {
            assert!(name.starts_with("quorumlock_") && word(name), "{name}");
            assert_eq!(name.ends_with("_total"), *kind == Kind::Counter, "{name}");
            assert!(!text.is_empty());
        }
        assert_eq!(METRICS.len(), 17);
    }

    /// A node's reply maps to the outcome that counts it.
    #[test]
    fn node_outcomes() {
        assert_eq!(NODE_OUTCOMES[node_outcome(&Reply::Granted)], "granted");
        assert_eq!(NODE_OUTCOMES[node_outcome(&Reply::HeldBy(None))], "refused");
        assert_eq!(
            NODE_OUTCOMES[node_outcome(&Reply::Failed("x".into()))],
            "failed"
        );
        assert_eq!(NODE_OUTCOMES[node_outcome(&Reply::TimedOut)], "timed_out");
        let released = Reply::Released {
            deleted: 0,
            listeners: 0,
        };
        assert_eq!(NODE_OUTCOMES[node_outcome(&released)], "refused");
    }
}
