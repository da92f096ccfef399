//! The watchdog's I/O: the kept locks of one [`Redlock`](crate::Redlock) ([`Registry`]),
//! each one's shared state ([`Entry`]), and the one task that extends them all in
//! pipelined rounds, one pipeline per node and tick.
//!
//! Every decision is the protocol's ([`protocol::keep::Kept`](crate::protocol::keep::Kept)):
//! which locks are due, what a round's votes did to each, when a lock's lost signal fires
//! and why. This module holds that state behind a mutex, sends the rounds, reads the
//! clock, and tells the guards (`watchdog.rs`) when something changed.
//!
//! ```text
//!   Task::run ──sweep every entry (Kept::sweep)──▶ due ──ExtendBatch per node──▶ replies
//!       ▲                                                               │ one Tally per lock
//!       └── sleeps until the next due time or a new entry ◀── Kept::apply ◀┘ (decided at quorum)
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{Notify, watch};

use crate::base::error::{Error, LostReason};
use crate::base::time::log_ms;
use crate::io::fanout::KeptNodes;
use crate::io::groupmap::GroupMap;
use crate::io::node::{ExtendBatch, Node, Request};
use crate::protocol::keep::{self, Applied, Kept, Lost, Policy, Sweep};
use crate::protocol::semaphore::{self, NodeSet};
use crate::protocol::{Ballot, Decision, Tally};

/// The public reason for a kept lock's loss.
fn reason(lost: Lost) -> LostReason {
    match lost {
        Lost::ExtendFailed => LostReason::ExtendFailed,
        Lost::MaxHold => LostReason::MaxHold,
        Lost::MaxExtensions => LostReason::MaxExtensions,
        Lost::NotHeld => LostReason::NotHeld,
        Lost::Expired => LostReason::Expired,
    }
}

/// What the entries of one kept lock share: the channel they announce their changes on,
/// and whether any of them was lost. A spanning lock's parts share one, so that a part
/// lost stops the watchdogs of the others (the lock is lost as a whole: its surviving
/// parts then expire by their TTL, as a lost lock within one group does).
pub(crate) struct Linked {
    tx: watch::Sender<u64>,
    lost: AtomicBool,
}

/// The shared [`Linked`] of one kept lock's entries.
pub(crate) type Changed = Arc<Linked>;

/// What the watchdog task and the guard share about one kept lock.
pub(crate) struct Entry {
    state: Mutex<Kept<Instant>>,
    /// Bumped whenever the deadline moves or the lock is lost or stopped (shared by the
    /// entries of one spanning lock's parts, so that its signal wakes for any of them).
    changed: Changed,
    /// A lock spanning several lock groups: the entries of its other parts, each kept by
    /// its own group's watchdog. This entry (the first part's) reports for the whole
    /// lock: lost when any part is, valid until the earliest part's deadline.
    linked: Vec<Arc<Entry>>,
    /// The lock's extension by its TTL, prepared once (the kind of lock chose the script).
    extend: Request,
    /// The grants an extension needs.
    quorum: usize,
    /// A semaphore permit's kept nodes: its extensions go to and are counted from those
    /// only, and none before they are decided. `None` for every other kind (every node).
    kept: Option<KeptNodes>,
    ttl: Duration,
}

impl Entry {
    /// The entries of a spanning lock's other parts (empty for every other lock).
    pub(crate) fn linked_entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.linked.iter()
    }

    /// A new [`Linked`] (change channel and loss flag) for the entries of one kept lock
    /// (one spanning lock's parts share it).
    pub(crate) fn channel() -> Changed {
        Arc::new(Linked {
            tx: watch::channel(0).0,
            lost: AtomicBool::new(false),
        })
    }

    /// Records that the lock is lost (this part, so the whole lock): no part of it is
    /// extended from now on.
    fn mark_lock_lost(&self) {
        self.changed.lost.store(true, Ordering::SeqCst);
    }

    /// Whether this entry, or another part of the same lock, was reported lost.
    fn lock_lost(&self) -> bool {
        self.changed.lost.load(Ordering::SeqCst)
    }

    /// A kept lock: its prepared extension, the quorum it needs and (a permit) its kept
    /// nodes, its policy, valid until `deadline`, kept from `now`, capped at `hold_end`;
    /// announcing its changes on `changed`, and reporting for the `linked` entries of a
    /// spanning lock's other parts too (which must share `changed`).
    pub(crate) fn linked(
        policy: Policy,
        (extend, quorum, kept): (Request, usize, Option<KeptNodes>),
        (deadline, now, hold_end): (Instant, Instant, Option<Instant>),
        changed: Changed,
        linked: Vec<Arc<Entry>>,
    ) -> Arc<Entry> {
        Arc::new(Entry {
            state: Mutex::new(Kept::new(policy, deadline, now, hold_end)),
            changed,
            linked,
            extend,
            quorum,
            kept,
            ttl: policy.ttl,
        })
    }

    /// Whether the lock is lost already when it is handed over at `now`
    /// ([`Kept::lost_at_start`]); then it is reported lost and must not be registered.
    pub(crate) fn lost_at_start(&self, now: Instant) -> bool {
        let lost = self
            .state
            .lock()
            .ok()
            .and_then(|mut st| st.lost_at_start(now));
        if let Some(l) = lost {
            self.report(l);
        }
        // Every part is asked (each reports its own loss).
        let parts_lost = self.linked.iter().filter(|e| e.lost_at_start(now)).count();
        lost.is_some() || parts_lost > 0
    }

    /// Reports a loss that just happened: a warning, and a wake-up for the signals.
    fn report(&self, lost: Lost) {
        // First: the other parts must stop even if what follows panics.
        self.mark_lock_lost();
        crate::base::metrics::lost(reason(lost));
        let e = Error::lost(reason(lost), None);
        tracing::warn!(ttl_ms = log_ms(self.ttl), error = %e, "quorumlock: watchdog: lock lost");
        self.notify();
    }

    fn notify(&self) {
        self.changed.tx.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Marks the lock lost if its time is up; returns the error if it is lost.
    ///
    /// Fails closed: if the state's mutex was poisoned by a panic, the lock is reported
    /// lost (never trusted on a state that may be half-updated).
    pub(crate) fn check(&self, now: Instant) -> Option<Error> {
        let Ok(mut st) = self.state.lock() else {
            self.mark_lock_lost();
            return Some(Error::lost(LostReason::WatchdogFailed, None));
        };
        if let Some(l) = st.fire(now) {
            self.report(l);
        }
        let own = st.lost().map(|l| Error::lost(reason(l), None));
        drop(st);
        own.or_else(|| self.linked.iter().find_map(|e| e.check(now)))
    }

    /// The deadline the guard and its contexts report. Once the lock was released (or its
    /// guard dropped) no validity is left to report: a context that outlived the guard
    /// must not call a lock valid that another client may hold by now.
    pub(crate) fn deadline(&self) -> Instant {
        let now = Instant::now();
        let own = self.state.lock().map_or(now, |s| s.deadline(now));
        self.linked
            .iter()
            .map(|e| e.deadline())
            .fold(own, Instant::min)
    }

    /// Whether the guard released the lock or was dropped (a poisoned state counts).
    pub(crate) fn is_stopped(&self) -> bool {
        self.state.lock().map(|s| s.stopped()).unwrap_or(true)
    }

    /// Stops the watchdog for this lock and returns the deadline it had, for the release
    /// that follows; from then on the entry (and every context) reports no validity.
    pub(crate) fn stop(&self) -> Instant {
        let deadline = match self.state.lock() {
            Ok(mut st) => st.stop(),
            Err(_) => Instant::now(),
        };
        self.notify();
        self.linked
            .iter()
            .map(|e| e.stop())
            .fold(deadline, Instant::min)
    }

    /// When the lost signal's time comes (the earliest part's, for a spanning lock), and
    /// whether the lock was stopped; `None` on a poisoned state.
    fn fire_at(&self) -> Option<(Instant, bool)> {
        let (own, stopped) = self
            .state
            .lock()
            .ok()
            .map(|st| (st.fire_at().0, st.stopped()))?;
        let mut at = own;
        for e in &self.linked {
            at = at.min(e.fire_at()?.0);
        }
        Some((at, stopped))
    }

    /// Completes with the lock's loss: when its lost signal's time comes (its own timer,
    /// re-armed whenever the deadline moves, so hanging requests cannot delay it), when a
    /// round or a cap finds it lost, or with [`LostReason::Released`] once it was released
    /// without being lost (whoever still waits must stop too).
    pub(crate) async fn wait_lost(self: Arc<Entry>) -> Error {
        let mut rx = self.changed.tx.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(e) = self.check(Instant::now()) {
                return e;
            }
            let Some((at, stopped)) = self.fire_at() else {
                // A part's state was poisoned (by a panic): failed closed, as `check` does.
                self.mark_lock_lost();
                return Error::lost(LostReason::WatchdogFailed, None);
            };
            if stopped {
                return Error::lost(LostReason::Released, None);
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return std::future::pending().await },
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
    }

    /// A kept lock (or part) of one resource with a TTL of 10 s, valid until `deadline`,
    /// sharing `changed`, reporting for `linked`.
    #[cfg(test)]
    pub(crate) fn for_test(
        deadline: Instant,
        changed: Changed,
        linked: Vec<Arc<Entry>>,
    ) -> Arc<Entry> {
        let ttl = Duration::from_secs(10);
        let policy = Policy {
            ttl,
            refresh: Duration::from_secs(5),
            margin: Duration::from_secs(1),
            max_extensions: None,
            drift_factor: 0.01,
        };
        let res = crate::base::resource::Resources::new(&["k"]).unwrap();
        let token = crate::base::token::Token::generate().unwrap();
        let extend = Request::extend(res.lock_keys().to_vec(), &token, ttl);
        Entry::linked(
            policy,
            (extend, 1, None),
            (deadline, Instant::now(), None),
            changed,
            linked,
        )
    }

    /// Poisons the state's mutex, as a panic while holding it would.
    #[cfg(test)]
    pub(crate) fn poison(self: &Arc<Entry>) {
        let e = self.clone();
        let joined = std::thread::spawn(move || {
            let _guard = e.state.lock();
            panic!("poison the watchdog state on purpose");
        })
        .join();
        assert!(joined.is_err() && self.state.is_poisoned());
    }
}

/// The per-node timeout for a TTL (the client's configuration).
pub(crate) type NodeTimeout = Arc<dyn Fn(Duration) -> Duration + Send + Sync>;

/// The kept locks of one [`Redlock`](crate::Redlock) and the one task that extends them.
pub(crate) struct Registry {
    entries: Arc<Mutex<Vec<Arc<Entry>>>>,
    wake: Arc<Notify>,
    nodes: Arc<[Node]>,
    quorum: usize,
    node_timeout: NodeTimeout,
    /// The client's group map: no kept lock is extended past the record's coverage.
    map: Arc<GroupMap>,
    /// The task; restarted by [`Registry::add`] if it is not running (never started
    /// outside a runtime, or its runtime shut down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Registry {
    /// A registry for these nodes; its task starts with the first kept lock.
    pub(crate) fn start(
        nodes: &Arc<[Node]>,
        quorum: usize,
        node_timeout: NodeTimeout,
        map: Arc<GroupMap>,
    ) -> Registry {
        Registry {
            entries: Arc::new(Mutex::new(Vec::new())),
            wake: Arc::new(Notify::new()),
            nodes: nodes.clone(),
            quorum,
            node_timeout,
            map,
            task: Mutex::new(None),
        }
    }

    /// Keeps a lock: the task extends it from now on.
    pub(crate) fn add(&self, entry: Arc<Entry>) {
        if let Ok(mut v) = self.entries.lock() {
            v.push(entry);
        }
        self.ensure_running();
        self.wake.notify_one();
    }

    fn ensure_running(&self) {
        let Ok(mut task) = self.task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "quorumlock: keep_alive outside a Tokio runtime: the lock is not extended and its lost signal fires before it expires"
            );
            return;
        };
        // A task that died mid-round left its entries marked: unmark them.
        if task.is_some()
            && let Ok(v) = self.entries.lock()
        {
            for e in v.iter() {
                if let Ok(mut st) = e.state.lock() {
                    st.abort_round();
                }
            }
        }
        let run = Task {
            entries: Arc::downgrade(&self.entries),
            wake: self.wake.clone(),
            nodes: self.nodes.clone(),
            quorum: self.quorum,
            node_timeout: self.node_timeout.clone(),
            map: self.map.clone(),
        }
        .run();
        *task = Some(rt.spawn(run));
    }
}

struct Task {
    entries: Weak<Mutex<Vec<Arc<Entry>>>>,
    wake: Arc<Notify>,
    nodes: Arc<[Node]>,
    quorum: usize,
    node_timeout: NodeTimeout,
    map: Arc<GroupMap>,
}

impl Entry {
    /// Whether the lock may be extended: always, except a permit whose kept nodes are
    /// still undecided.
    fn ready(&self) -> bool {
        self.kept.as_ref().is_none_or(|k| k.get().is_some())
    }

    /// The nodes whose answers count: `None` for every node, or a permit's kept nodes (an
    /// empty set if undecided, which no round reaches: fail closed).
    fn voters(&self) -> Option<NodeSet> {
        self.kept.as_ref().map(|k| k.get().unwrap_or_default())
    }
}

/// What one node is sent in a round: the batch, and which of the round's locks its
/// answers are for, in order.
type NodeBatch = (Arc<ExtendBatch>, Arc<[usize]>);

/// Each node's batch for the round's locks `due` with their voters (`None`: every node).
/// Without permits every node gets the same batch; a permit's extension goes to its kept
/// nodes only. A node with nothing to extend gets no batch.
fn batches(due: &[Arc<Entry>], voters: &[Option<NodeSet>], nodes: usize) -> Vec<Option<NodeBatch>> {
    let for_node = |i: usize| -> Vec<usize> {
        (0..due.len())
            .filter(|&k| semaphore::counts(voters.get(k).copied().flatten(), i))
            .collect()
    };
    let shared: Option<NodeBatch> = voters.iter().all(Option::is_none).then(|| {
        let batch = Arc::new(ExtendBatch::new(due.iter().map(|e| &e.extend)));
        (batch, (0..due.len()).collect())
    });
    (0..nodes)
        .map(|i| {
            if let Some(s) = &shared {
                return Some(s.clone());
            }
            let locks = for_node(i);
            let batch =
                ExtendBatch::new(locks.iter().filter_map(|&k| due.get(k)).map(|e| &e.extend));
            (!locks.is_empty()).then(|| (Arc::new(batch), locks.into()))
        })
        .collect()
}

/// The votes of one round, per lock.
struct Votes {
    tallies: Vec<Tally>,
    done: Vec<bool>,
}

impl Task {
    async fn run(self) {
        loop {
            let Some(entries) = self.entries.upgrade() else {
                return;
            };
            let (due, next) = collect(&entries, Instant::now());
            drop(entries);
            // A part of a lock lost since it was found due (by another group's watchdog)
            // is not extended any more (the next sweep drops it).
            let due: Vec<Arc<Entry>> = due.into_iter().filter(|e| !e.lock_lost()).collect();
            if !due.is_empty() {
                self.round(due).await;
                continue;
            }
            let notified = self.wake.notified();
            match next {
                Some(at) => tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                },
                None => notified.await,
            }
        }
    }

    /// No kept lock outlives the group-map record's coverage: `false` (and the round of
    /// `due` failed, as if no node answered: the locks are retried, and reported lost
    /// before their validity ends) when the record cannot be made to cover the longest TTL
    /// of the round within `patience`.
    async fn covered(&self, due: &[Arc<Entry>], patience: Duration, start: Instant) -> bool {
        let longest_ttl = due.iter().map(|e| e.ttl).max().unwrap_or_default();
        match self.map.cover_held(longest_ttl, patience).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "quorumlock: watchdog: group map record does not cover the extensions");
                self.fail_round(due, start);
                false
            }
        }
    }

    /// Ends a round of `due` that was not sent, as if no node had answered.
    fn fail_round(&self, due: &[Arc<Entry>], start: Instant) {
        for entry in due {
            let mut tally = Tally::new(self.nodes.len(), entry.quorum);
            for _ in 0..self.nodes.len() {
                tally.record(Ballot::Failed);
            }
            apply(entry, tally.final_decision(), &tally, start, Instant::now());
        }
    }

    /// One pipelined round: per node, `SCRIPT LOAD` then one `EVALSHA` per due lock. Each
    /// lock is decided as soon as its own votes are certain; the round ends when every lock
    /// is, and the slower nodes' answers finish in the background.
    async fn round(&self, due: Vec<Arc<Entry>>) {
        let longest = due.iter().map(|e| (self.node_timeout)(e.ttl)).max();
        let timeout = keep::round_timeout(longest.unwrap_or(Duration::from_millis(50)), due.len());
        let start = Instant::now();
        if !self.covered(&due, longest.unwrap_or(timeout), start).await {
            return;
        }
        let voters: Vec<Option<NodeSet>> = due.iter().map(|e| e.voters()).collect();
        let plan = batches(&due, &voters, self.nodes.len());
        crate::base::metrics::watchdog_round(due.len());
        let span = tracing::debug_span!(
            "quorumlock.watchdog",
            locks = due.len(),
            nodes = self.nodes.len(),
            quorum = self.quorum
        );
        drop(span.enter());
        let mut replies: FuturesUnordered<_> = self
            .nodes
            .iter()
            .zip(plan)
            .filter_map(|(n, p)| p.map(|(batch, locks)| (n.clone(), batch, locks)))
            .map(|(n, batch, locks)| async move {
                let reply = n.extend_batch(&batch, timeout).await;
                (locks, reply)
            })
            .collect();
        let mut votes = Votes {
            tallies: due
                .iter()
                .zip(&voters)
                .map(|(e, v)| match v {
                    Some(kept) => semaphore::extension_tally(*kept, e.quorum),
                    None => Tally::new(self.nodes.len(), e.quorum),
                })
                .collect(),
            done: vec![false; due.len()],
        };
        while let Some((locks, reply)) = replies.next().await {
            count(&due, &mut votes, &locks, &reply, start);
            if votes.done.iter().all(|d| *d) {
                break;
            }
        }
        if !replies.is_empty() {
            // Every lock of the round is decided: the slower nodes' answers can no longer
            // change anything. They finish in the background instead of holding up the next
            // round: a node that does not answer must not make every other kept lock wait
            // out its timeout (a short lock falling due meanwhile would be reported lost
            // while a healthy quorum holds it).
            crate::io::background::spawn(async move { while replies.next().await.is_some() {} });
        }
        for (k, e) in due.iter().enumerate() {
            if !votes.done[k] {
                let t = votes.tallies[k];
                apply(e, t.final_decision(), &t, start, Instant::now());
            }
        }
    }
}

/// Counts one node's replies (one per lock of `locks`, in order) and applies every lock
/// they decide.
fn count(
    due: &[Arc<Entry>],
    votes: &mut Votes,
    locks: &[usize],
    reply: &[crate::protocol::Reply],
    start: Instant,
) {
    let at = Instant::now();
    for (j, &k) in locks.iter().enumerate() {
        let (Some(e), Some(tally), Some(done)) =
            (due.get(k), votes.tallies.get_mut(k), votes.done.get_mut(k))
        else {
            continue;
        };
        if let Some(r) = reply.get(j) {
            tally.record(r.ballot());
        }
        if *done {
            continue;
        }
        if let Some(d) = tally.decision() {
            *done = true;
            apply(e, d, tally, start, at);
        }
    }
}

/// The entries due now (marked in a round) and the next due time of the others; drops
/// released and lost entries and reports those lost just now ([`Kept::sweep`]).
fn collect(entries: &Mutex<Vec<Arc<Entry>>>, now: Instant) -> (Vec<Arc<Entry>>, Option<Instant>) {
    let mut due = Vec::new();
    let mut next: Option<Instant> = None;
    let Ok(mut v) = entries.lock() else {
        return (due, None);
    };
    v.retain(|e| {
        if e.lock_lost() {
            // Another part of the lock was lost: this one is no longer extended.
            return false;
        }
        let Ok(mut st) = e.state.lock() else {
            e.mark_lock_lost();
            return false;
        };
        match st.sweep(now, e.ready()) {
            Sweep::Drop => false,
            Sweep::Busy => true,
            Sweep::Lost(l) => {
                e.report(l);
                false
            }
            Sweep::Due => {
                due.push(e.clone());
                true
            }
            Sweep::Later(t) => {
                next = Some(next.map_or(t, |n| n.min(t)));
                true
            }
        }
    });
    (due, next)
}

/// Applies a decided round to one lock ([`Kept::apply`]) and reports what changed.
fn apply(e: &Entry, decision: Decision, tally: &Tally, start: Instant, decided: Instant) {
    let Ok(mut st) = e.state.lock() else { return };
    let applied = st.apply(decision, tally, start, decided, Instant::now());
    match crate::base::metrics::watchdog_applied(applied) {
        Applied::Ignored => {}
        Applied::Extended(validity) => {
            e.notify();
            tracing::trace!(
                validity_ms = log_ms(validity),
                "quorumlock: watchdog extended a lock"
            );
        }
        Applied::Retry => {
            tracing::debug!("quorumlock: watchdog extension missed the quorum; retrying");
        }
        Applied::Lost { reason, newly } => {
            if newly {
                e.report(reason);
            } else {
                // A quorum no longer holds it: the validity left is gone (the deadline moved).
                e.notify();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(registry: &Mutex<Vec<Arc<Entry>>>) -> usize {
        registry.lock().map_or(0, |v| v.len())
    }

    /// Two parts of one lock in two registries, and another lock beside the first: once
    /// one part is lost (its time ran out, or its state was poisoned by a panic), the
    /// other part's registry drops it too, and never the other lock.
    #[test]
    fn a_part_lost_stops_every_part_of_its_lock() {
        for poisoned in [false, true] {
            let later = Instant::now() + Duration::from_secs(60);
            let changed = Entry::channel();
            let deadline = if poisoned { later } else { Instant::now() };
            let b = Entry::for_test(deadline, changed.clone(), Vec::new());
            let a = Entry::for_test(later, changed, vec![b.clone()]);
            let other = Entry::for_test(later, Entry::channel(), Vec::new());
            let group_a = Mutex::new(vec![a.clone(), other.clone()]);
            let group_b = Mutex::new(vec![b.clone()]);
            let _ = collect(&group_a, Instant::now());
            assert_eq!(kept(&group_a), 2, "nothing lost yet");
            if poisoned {
                b.poison();
            }
            let _ = collect(&group_b, Instant::now() + Duration::from_millis(1));
            assert_eq!(
                kept(&group_b),
                0,
                "the lost part is dropped (poisoned: {poisoned})"
            );
            assert!(a.check(Instant::now()).is_some(), "the lock reads as lost");
            let _ = collect(&group_a, Instant::now());
            let left = group_a.lock().map(|v| v.clone()).unwrap_or_default();
            assert_eq!(
                left.len(),
                1,
                "the surviving part is dropped (poisoned: {poisoned})"
            );
            assert!(Arc::ptr_eq(&left[0], &other), "the other lock is kept");
        }
    }
}
