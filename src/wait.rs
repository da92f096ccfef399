//! Waiting strategies: retry after a random delay, and wake on release announcements.
//!
//! [`Redlock::lock`](crate::Redlock::lock) makes one attempt; if the resource is held (or
//! too few nodes answered) it waits and tries again, until the [`Retry`] policy's attempt
//! count or maximum wait is reached. Only attempts that were sent count. Two strategies
//! decide *when* to try again:
//!
//! * **Polling**: after a random delay drawn from the policy's range. Jitter keeps
//!   contenders out of lock-step; the expected hand-off latency is half the mean delay.
//! * **Notify** (the default): every release publishes on the resource's channel
//!   (`quorumlock:released:{name}`). Waiters of a [`Redlock`](crate::Redlock) share one
//!   subscription connection per node ([`Notifier`]) and try again when a release names
//!   them (or, without a queue, when any release is announced). The random delay stays as
//!   a fallback timer, so a lost message (a cut subscription link, a node down) only
//!   delays a waiter, never strands it.
//!
//! Waking every waiter at once would split the votes: each node grants a different
//! waiter and none reaches the quorum. So, for a single resource, waiters queue:
//!
//! 1. after its first failed attempt a waiter joins the resource's wait queue, a sorted
//!    set by arrival time (each herald's own clock when the join reached it, never the
//!    client's, so a client whose clock is off cannot jump the queue or fall behind it)
//!    on the resource's two *herald* nodes (chosen from the name; the
//!    only nodes whose releases announce, so the only nodes that keep a queue). Each entry
//!    is a lease of [`QUEUE_LEASE`] that the waiter renews while it waits; every queue
//!    script purges lapsed entries, and the queue's keys expire with the latest lease, so
//!    the entry of a waiter that crashed or was cut off is gone within the lease whatever
//!    other waiters do, and an idle queue leaves nothing behind;
//! 2. a release on a herald pops the first waiter and names it in its announcement: only
//!    that waiter tries. The others skip their fallback attempts while a hand-off is under
//!    way (a waiter was named within the larger of the per-node timeout and the longest
//!    retry delay), so a fallback timer does not race the waiter whose turn it is. The
//!    named waiter's attempt can overtake the release on the other nodes (the first
//!    herald to run it announces at once): while its attempts are refused by the very
//!    lock whose release named it, within that window, it keeps its turn and tries again
//!    when the release is announced again (by the second herald) or after a back-off that
//!    doubles up to the per-node timeout. No other announcement would come: the other
//!    nodes announce nothing;
//! 3. a caller that released the resource within the last second, while others were
//!    queued, joins the end of the queue before trying, and tries at once only if no one
//!    is queued ahead of it;
//! 4. within one `Redlock`, only one waiter per resource tries at a time (a turn skipped
//!    so sends nothing and is not counted as an attempt);
//! 5. without a queue (several resources, or an announcement naming no one) a woken
//!    waiter first sleeps a random stagger within the resource's contention window
//!    (initially [`NOTIFY_STAGGER`]; it doubles on every split vote and shrinks on every
//!    acquisition).
//!
//! The queue is only a hint for *who tries first*: an acquisition is always the ordinary
//! Redlock vote, whatever the queue says.
//!
//! The hand-over is in arrival order: with no faults and a scheduler that keeps up, a
//! waiter that arrived while `k` others were queued is served after exactly those `k`.
//! What can put a waiter back by one place, each time it happens: a newcomer's first
//! attempt (a caller not yet queued) that lands between a release and the named waiter's
//! attempt; a release heard late or not at all; the two heralds' queues differing after a
//! join and a release crossed on them; a pause longer than the hand-off window.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::Rng;
use tokio::sync::{mpsc, watch};

use crate::client::{Inner, acquire_once};
use crate::config::Retry;
use crate::error::{Error, Timeout, TimeoutBudget, Votes};
use crate::lock::Lock;
use crate::node::{DEQUEUE, ENQUEUE, NodeSpec, Reply, ScriptCall};
use crate::resource::Resources;

/// The initial contention window: a waiter woken by a release announcement (or backing
/// off after a split vote) pauses a random time in `0..window` before trying. The window
/// adapts per resource: it doubles on every split vote (up to [`STAGGER_MAX`]) and shrinks
/// by a quarter on every acquisition (down to [`STAGGER_MIN`]).
pub const NOTIFY_STAGGER: Duration = Duration::from_micros(1000);
/// The smallest contention window.
pub const STAGGER_MIN: Duration = Duration::from_micros(250);
/// The largest contention window.
pub const STAGGER_MAX: Duration = Duration::from_millis(16);
/// How long a caller that released several resources moments ago (while others listened
/// for the release) waits before trying to take them again, so that a waiter gets them
/// first. (A single resource has a queue: such a caller joins its end instead.)
pub const POLITE_DELAY: Duration = Duration::from_micros(1500);
/// How long after such a release the caller is considered "just released": its next
/// `lock()` of a single resource joins the wait queue first and tries at once only if no
/// one is queued ahead of it (a caller that comes back after a scheduling hiccup must not
/// jump the queue either).
const POLITE_WINDOW: Duration = Duration::from_secs(1);

/// One contention-window step: doubled on a split vote, three quarters on an acquisition,
/// kept within [`STAGGER_MIN`]..=[`STAGGER_MAX`].
pub(crate) fn next_window(window: Duration, split: bool) -> Duration {
    let next = if split {
        window.saturating_mul(2)
    } else {
        window.saturating_mul(3) / 4
    };
    next.clamp(STAGGER_MIN, STAGGER_MAX)
}

/// How long a channel stays subscribed after its last waiter left (saves a SUBSCRIBE
/// round trip for the next waiter, and closes the missed-release window).
const LINGER: Duration = Duration::from_secs(5);

/// A random delay in `min..=max`.
pub(crate) fn jitter(min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
    min.saturating_add(Duration::from_nanos(rand::rng().random_range(0..=span)))
}

/// Whether a failed attempt's votes show that no one holds a quorum: the nodes that
/// refused name their holders, and even if every node that did not answer belonged to the
/// most widespread of them, it would stay below the quorum. The votes were split between
/// contenders (or a failed attempt's keys are about to be cleaned up): the resource is
/// about to be free, and no release will be announced for it.
pub(crate) fn is_split(v: &Votes) -> bool {
    let unknown = v.len().saturating_sub(v.granted() + v.held());
    v.largest_holder()
        .is_some_and(|largest| largest + unknown < v.quorum())
}

/// Acquires with retries, per `retry`.
///
/// After a failed attempt:
/// * someone may hold a quorum → wait for a release announcement (then a short random
///   stagger) or the retry delay, whichever comes first;
/// * the votes were split (no one holds a quorum) → retry after a random back-off within
///   the resource's contention window, which doubles on every split and shrinks on every
///   acquisition (like Ethernet's exponential back-off);
/// * a caller that itself released this resource moments ago, while others were listening
///   for it, joins the end of the queue first and tries at once only if no one is queued
///   ahead (several resources: waits [`POLITE_DELAY`] before its first attempt).
///
/// A queued waiter (single resource, notify waiting) skips its fallback attempt while a
/// release named another waiter within the hand-off window (the larger of the per-node
/// timeout and the longest retry delay): that hand-off is under way, and an attempt now
/// could only race the waiter whose turn it is (the announcements show that the channel
/// works, so nothing was lost). It renews its queue lease every
/// third of [`QUEUE_LEASE`]; a renewal that finds its place gone (popped by a release
/// whose announcement it missed, or lapsed) makes it try at once.
///
/// Only attempts that were sent count against [`Retry::attempts`]: a turn skipped because
/// another waiter of this client is trying right now sends nothing.
pub(crate) async fn acquire_waiting(
    inner: &Arc<Inner>,
    res: &Resources,
    ttl: Duration,
    retry: &Retry,
) -> Result<Lock, Error> {
    let start = Instant::now();
    let give_up_at = retry.max_wait.map(|w| crate::time::later(start, w));
    // A named waiter tries at once and its attempt ends within the per-node timeout; the
    // hand-off window allows as much again as a fallback delay for a slow scheduler.
    let handoff = inner.config.node_timeout_for(ttl).max(retry.delay_max);
    let mut attempts: u32 = 0;
    let mut interest: Option<Interest> = None;
    let mut ticket: Option<Ticket> = None;
    let mut last: Option<Votes> = None;
    let mut try_now = true;
    let mut fallback_at: Option<tokio::time::Instant> = None;
    // The turn a release gave us by naming us, while its attempts go on.
    let mut turn: Option<Turn> = None;
    if let Some(n) = &inner.notifier
        && n.should_yield(res)
    {
        // We released it moments ago and others are queued for it: take our place at the
        // end of the queue instead of trying first (multi-resource locks, which have no
        // queue, just pause).
        let mut i = n.interest(res);
        let t = Ticket::new(inner, res, ttl);
        if let Some(t) = &t {
            i.register(&t.id);
        }
        match t {
            Some(mut t) => {
                // Try at once only if no one is (known to be) queued ahead of us, and our
                // release did not just hand over to someone (who is no longer queued).
                try_now = t.join().await.ahead == 0 && !i.handoff_under_way(&t.id, handoff);
                ticket = Some(t);
            }
            None => tokio::time::sleep(POLITE_DELAY).await,
        }
        interest = Some(i);
    }
    loop {
        let mut split = false;
        let sent = attempts;
        if try_now {
            let gate = interest.as_ref().map(|i| i.gate.clone());
            let guard = match &gate {
                Some(g) => g.try_lock().ok(),
                None => None,
            };
            // With the gate taken, another waiter of this Redlock is trying right now:
            // wait for the next release instead of splitting the vote with it. Such a
            // skipped turn sends nothing, so it does not count as an attempt.
            if gate.is_none() || guard.is_some() {
                attempts = attempts.saturating_add(1);
                match acquire_once(inner, res, ttl, attempts).await {
                    Ok(mut lock) => {
                        if let Some(i) = &interest {
                            i.adapt(false);
                        }
                        if let Some(t) = &ticket {
                            lock.set_waiter(t.id.clone());
                        }
                        return Ok(lock);
                    }
                    Err(e) if !e.is_retryable() => return Err(e),
                    Err(e) => {
                        last = e.votes().cloned();
                        split = last.as_ref().is_some_and(is_split);
                    }
                }
                // A refusal by the very lock whose release named us means that release
                // has not reached those nodes yet (our attempt overtook it): no other
                // announcement may come (the other nodes announce nothing, and the second
                // herald's is the same release), so keep the turn and try again shortly.
                // Refused by anyone else, the turn is lost: wait as usual.
                if turn
                    .as_ref()
                    .is_none_or(|t| !t.overtaken(last.as_ref(), handoff))
                {
                    turn = None;
                }
                drop(guard);
                if retry.attempts.is_some_and(|n| attempts >= n) {
                    return Err(gave_up(start, attempts, last));
                }
            }
        }
        if attempts == sent {
            // No attempt went out (another waiter of ours is trying): no turn to keep.
            turn = None;
        }
        if interest.is_none() {
            interest = inner.notifier.as_ref().map(|n| n.interest(res));
        }
        if split && let Some(i) = &interest {
            i.adapt(true);
        }
        // Join the wait queue (once; again after a turn that was lost to someone else,
        // since the release that named us popped us), so releases hand over in order; and
        // renew the lease while waiting.
        let renew = ticket.as_ref().is_some_and(Ticket::renewal_due);
        if interest.is_some() && ((!split && try_now) || renew) {
            match ticket.as_mut() {
                Some(t) => {
                    let lost = t.join().await.lost;
                    if lost && !try_now {
                        // Our place was gone (a release named us and we missed it, or the
                        // lease lapsed): it is back, at our arrival; try at once. (Also when
                        // no herald answered: then we cannot count on being named.)
                        try_now = true;
                        continue;
                    }
                }
                None => {
                    if let Some(mut t) = Ticket::new(inner, res, ttl) {
                        if let Some(i) = interest.as_mut() {
                            i.register(&t.id);
                        }
                        t.join().await;
                        ticket = Some(t);
                    }
                }
            }
        }
        // The fallback timer runs from the last attempt: announcements that name someone
        // else do not restart it (or a waiter that lost its place would never try again).
        if try_now || fallback_at.is_none() {
            let mut delay = jitter(retry.delay_min, retry.delay_max);
            if let Some(at) = give_up_at {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(gave_up(start, attempts, last));
                }
                delay = delay.min(left);
            }
            fallback_at = Some(crate::time::later_tokio(tokio::time::Instant::now(), delay));
        }
        let wake_at = fallback_at.unwrap_or_else(tokio::time::Instant::now);
        let delay = wake_at.saturating_duration_since(tokio::time::Instant::now());
        let renew_at = ticket.as_ref().map(Ticket::renew_at);
        try_now = true;
        match interest.as_mut() {
            Some(i) if split => {
                // No one holds it: back off randomly and try again, no announcement will come.
                tokio::time::sleep(jitter(Duration::ZERO, i.window()).min(delay)).await;
            }
            Some(i) if turn.is_some() => {
                // Our turn, overtaken by its own release: try again when the release is
                // announced again (it reached the other herald) or after a back-off that
                // doubles each time, up to the per-node timeout (within which a release
                // normally reaches every node).
                let cap = inner.config.node_timeout_for(ttl);
                let pause = turn.as_mut().map(|t| t.next_pause(cap)).unwrap_or_default();
                tokio::select! {
                    _ = i.released() => {}
                    () = tokio::time::sleep(pause.min(delay)) => {}
                }
            }
            Some(i) => {
                let me = ticket.as_ref().map(|t| t.id.as_slice());
                tokio::select! {
                    wake = i.released() => match wake {
                        // A release named us: our turn, try at once.
                        Wake::Named => turn = me.and_then(|me| i.turn(me)),
                        Wake::Announced => {
                            let heads = i.heads();
                            match me {
                                Some(me) if heads.iter().any(|h| h == me) => turn = i.turn(me),
                                // Someone else's turn: keep waiting (the fallback timer stays).
                                Some(_) if !heads.is_empty() => try_now = false,
                                // No queue (or no one named): stagger against the herd.
                                _ => tokio::time::sleep(jitter(Duration::ZERO, i.window())).await,
                            }
                        }
                    },
                    () = tokio::time::sleep_until(wake_at) => {
                        if let Some(me) = me
                            && i.handoff_under_way(me, handoff)
                        {
                            // Another waiter's turn is being handed over: do not race it;
                            // the timer starts again.
                            try_now = false;
                            fallback_at = None;
                        }
                    }
                    () = tokio::time::sleep_until(renew_at.unwrap_or(wake_at)), if renew_at.is_some() => {
                        try_now = false;
                    }
                }
            }
            None => tokio::time::sleep(delay).await,
        }
        if give_up_at.is_some_and(|at| Instant::now() >= at) {
            // One last look is not taken: the budget is spent.
            return Err(gave_up(start, attempts, last));
        }
    }
}

/// A turn a release gave a waiter by naming it. The waiter's attempt may overtake that
/// release on the other nodes (the announcement comes from the first herald that ran
/// it); while its attempts are refused by the releasing lock itself, within the hand-off
/// window, the turn stands and the waiter tries again when the release is announced again
/// or after a doubling back-off.
struct Turn {
    /// The release's id: the first eight characters of the released lock's token.
    id: String,
    /// When the waiter heard it.
    at: Instant,
    /// The pause before the next try.
    pause: Duration,
}

impl Turn {
    /// Whether a failed attempt's votes show the release that named us still on its way:
    /// some node refused for the very lock it released, within `window` of the naming.
    fn overtaken(&self, votes: Option<&Votes>, window: Duration) -> bool {
        self.at.elapsed() < window && votes.is_some_and(|v| v.holder_ids.contains(&self.id))
    }

    /// A random pause within the current back-off, which then doubles up to `cap`.
    fn next_pause(&mut self, cap: Duration) -> Duration {
        let pause = jitter(Duration::ZERO, self.pause);
        self.pause = self.pause.saturating_mul(2).min(cap.max(self.pause));
        pause
    }
}

/// How long a waiter's place in a wait queue lasts unless it renews it: a waiter renews
/// every third of it while it waits, and the entry of a waiter that crashed or was cut
/// off lapses after at most this long (it is purged by the next queue operation, and an
/// otherwise idle queue expires with its last lease).
///
/// # Example
///
/// ```
/// // A crashed waiter's queue entry is gone a few seconds later, whatever the traffic.
/// assert!(quorumlock::QUEUE_LEASE <= std::time::Duration::from_secs(10));
/// ```
pub const QUEUE_LEASE: Duration = Duration::from_secs(3);

/// A waiter's place in a resource's wait queue (single-resource locks, notify waiting).
///
/// Joining adds the waiter, by arrival time, to a sorted set on the resource's two herald
/// nodes (the only nodes whose releases hand over, so the only ones that keep a queue),
/// with a lease of [`QUEUE_LEASE`] that the waiter renews while it waits. A release pops
/// the first waiter and names it in its announcement, so the lock is handed over in arrival
/// order instead of to whoever of the woken waiters is fastest. The queue is only a hint
/// for *who tries first*: the acquisition itself is the ordinary Redlock vote. Leaving (on
/// drop: acquired, gave up or cancelled) removes the waiter in the background; the entry of
/// a waiter that cannot leave (crashed, cut off) lapses with its lease.
struct Ticket {
    inner: Arc<Inner>,
    res: Resources,
    keys: Vec<Vec<u8>>,
    id: Vec<u8>,
    /// This waiter's arrival score on each herald (by node index), as that herald assigned
    /// it at the first join (its own clock: the clients' clocks play no part in the order);
    /// re-joins after a lost place send it back, so the place is kept.
    scores: HashMap<usize, Vec<u8>>,
    timeout: Duration,
    /// When the lease was last renewed (the start of the last join).
    joined_at: tokio::time::Instant,
}

impl Ticket {
    fn new(inner: &Arc<Inner>, res: &Resources, ttl: Duration) -> Option<Ticket> {
        if res.len() != 1 {
            return None;
        }
        let id = format!("{:016x}", rand::rng().random::<u64>()).into_bytes();
        Some(Ticket {
            inner: inner.clone(),
            res: res.clone(),
            keys: res.queue_keys().to_vec(),
            id,
            scores: HashMap::new(),
            timeout: inner.config.node_timeout_for(ttl),
            joined_at: tokio::time::Instant::now(),
        })
    }

    /// When the lease is next due for renewal.
    fn renew_at(&self) -> tokio::time::Instant {
        self.joined_at
            .checked_add(QUEUE_LEASE / 3)
            .unwrap_or(self.joined_at)
    }

    fn renewal_due(&self) -> bool {
        tokio::time::Instant::now() >= self.renew_at()
    }

    /// The herald nodes, with their indices.
    fn heralds(&self) -> impl Iterator<Item = (usize, &crate::node::Node)> {
        let n = self.inner.nodes.len();
        self.inner
            .nodes
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.res.is_herald(*i, n))
    }

    /// Joins, re-joins (keeping the arrival order) or renews the lease, on the herald
    /// nodes; bounded by the node timeout, failures ignored (the queue is only a hint).
    async fn join(&mut self) -> Joined {
        self.joined_at = tokio::time::Instant::now();
        let lease = crate::quorum::millis_ceil(QUEUE_LEASE)
            .to_string()
            .into_bytes();
        let timeout = self.timeout;
        let all: futures::stream::FuturesUnordered<_> = self
            .heralds()
            .map(|(i, n)| {
                // The score this herald gave us, or none yet: it assigns one (its time).
                let score = self.scores.get(&i).cloned().unwrap_or_default();
                let call = Arc::new(ScriptCall::new(
                    &ENQUEUE,
                    self.keys.clone(),
                    vec![self.id.clone(), score, lease.clone()],
                ));
                async move { (i, n.eval(&call, timeout).await) }
            })
            .collect();
        // Every reply is awaited (dropping a request midway could leave a herald unrenewed).
        let replies: Vec<(usize, Reply)> = all.collect().await;
        let mut joined = Joined::default();
        let mut answered = false;
        for (i, r) in &replies {
            if let Reply::Value(redis::Value::Array(a)) = r
                && let (Some(redis::Value::Int(added)), Some(redis::Value::Int(ahead))) =
                    (a.first(), a.get(1))
            {
                answered = true;
                joined.lost |= *added == 1;
                joined.ahead = joined.ahead.max(*ahead);
                if let Some(redis::Value::BulkString(score)) = a.get(2) {
                    self.scores.insert(*i, score.clone());
                }
            }
        }
        // No herald answered: our place cannot be vouched for either.
        joined.lost |= !answered;
        joined
    }
}

/// What a join told: over the heralds that answered.
#[derive(Default)]
struct Joined {
    /// Some herald did not have us queued (first join, or the place was popped or lapsed),
    /// or none answered.
    lost: bool,
    /// The most waiters queued ahead of us on one herald (0 when none answered).
    ahead: i64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let call = Arc::new(ScriptCall::new(
            &DEQUEUE,
            self.keys.clone(),
            vec![self.id.clone()],
        ));
        let heralds: Vec<crate::node::Node> = self.heralds().map(|(_, n)| n.clone()).collect();
        let timeout = self.timeout;
        crate::fanout::spawn(async move {
            let all: futures::stream::FuturesUnordered<_> = heralds
                .iter()
                .map(|node| node.eval(&call, timeout))
                .collect();
            all.collect::<Vec<_>>().await;
        });
    }
}

fn gave_up(start: Instant, attempts: u32, votes: Option<Votes>) -> Error {
    Error::Timeout(Timeout {
        budget: TimeoutBudget::MaxWait,
        waited: start.elapsed(),
        attempts,
        votes,
    })
}

/// Release announcements for one [`Redlock`](crate::Redlock): one subscription
/// connection per node, shared by every waiter, started on first use.
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

struct Shared {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
    /// Channels this client released while others listened, until when it yields.
    polite: Mutex<HashMap<Vec<u8>, Instant>>,
    nodes: Vec<mpsc::UnboundedSender<SubCmd>>,
}

struct Channel {
    tx: watch::Sender<u64>,
    recent: VecDeque<Vec<u8>>,
    interest: usize,
    idle_since: Option<Instant>,
    gate: Arc<tokio::sync::Mutex<()>>,
    window: Duration,
    /// The waiters the latest release named (queue heads), first one first.
    heads: Vec<Vec<u8>>,
    /// Queued waiters of this client, by queue id: woken only when a release names them.
    tickets: HashMap<Vec<u8>, Arc<tokio::sync::Notify>>,
    /// When the latest release that named a waiter was heard.
    named_at: Option<Instant>,
}

impl Channel {
    /// Wakes the named waiters of this client; wakes everyone else only when someone may
    /// need it (a waiter without a queue place, or an announcement naming no one).
    fn wake(&self, named: &[Vec<u8>]) {
        for h in named {
            if let Some(n) = self.tickets.get(h) {
                n.notify_one();
            }
        }
        if named.is_empty() || self.interest > self.tickets.len() {
            self.tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }
}

enum SubCmd {
    Subscribe(Vec<u8>),
}

impl Notifier {
    pub(crate) fn new(specs: &[NodeSpec]) -> Notifier {
        let mut senders = Vec::with_capacity(specs.len());
        let mut receivers = Vec::with_capacity(specs.len());
        for _ in specs {
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let shared = Arc::new(Shared {
            channels: Mutex::new(HashMap::new()),
            polite: Mutex::new(HashMap::new()),
            nodes: senders,
        });
        for (spec, rx) in specs.iter().zip(receivers) {
            let client = redis::Client::open(spec.info.clone()).ok();
            let weak = Arc::downgrade(&shared);
            let addr = spec.addr.clone();
            if let Some(client) = client {
                crate::fanout::spawn_daemon(subscriber(client, addr, weak, rx));
            }
        }
        Notifier { shared }
    }

    /// Notes a release of `res` that reached `listeners` subscribers on some node: if that
    /// is more than this client's own subscription, others are waiting, and this client's
    /// next `lock()` of it within [`POLITE_WINDOW`] yields first. So it does after a lock
    /// it had to queue for (`queued`): the release may have been decided by nodes that keep
    /// no queue (with five nodes, three answers need not include a herald), and yielding
    /// costs one round trip to the heralds when no one turns out to be queued. The caller
    /// also passes `queued` for a release that no herald answered before it was decided:
    /// then nothing told how many wait.
    pub(crate) fn released(&self, res: &Resources, listeners: i64, queued: bool) {
        let listeners = if queued && res.len() == 1 {
            listeners.max(1)
        } else {
            listeners
        };
        if listeners <= 0 {
            return;
        }
        // A single-resource release reports the waiters queued for it (we are not one of
        // them); a multi-resource one the subscribers it reached (ours included).
        let channels = res.channels();
        let own = self
            .shared
            .channels
            .lock()
            .map(|m| channels.iter().any(|c| m.contains_key(c)))
            .unwrap_or(false);
        let others = if res.len() == 1 {
            listeners
        } else {
            listeners - i64::from(own)
        };
        if others > 0
            && let Ok(mut p) = self.shared.polite.lock()
        {
            let until = crate::time::later(Instant::now(), POLITE_WINDOW);
            if p.len() > 4096 {
                let now = Instant::now();
                p.retain(|_, t| *t > now);
            }
            for c in channels {
                p.insert(c, until);
            }
        }
    }

    /// Whether this client released `res` moments ago while others waited for it.
    fn should_yield(&self, res: &Resources) -> bool {
        let Ok(mut p) = self.shared.polite.lock() else {
            return false;
        };
        let now = Instant::now();
        let mut yield_ = false;
        for c in res.channels() {
            if let Some(until) = p.remove(&c) {
                yield_ |= until > now;
            }
        }
        yield_
    }

    /// Registers interest in a lock's resources (subscribing on every node if new).
    fn interest(&self, res: &Resources) -> Interest {
        let mut rxs = Vec::new();
        let mut gate = None;
        let channels = res.channels();
        if let Ok(mut map) = self.shared.channels.lock() {
            for ch in &channels {
                let entry = map.entry(ch.clone()).or_insert_with(|| {
                    for node in &self.shared.nodes {
                        let _ = node.send(SubCmd::Subscribe(ch.clone()));
                    }
                    Channel {
                        tx: watch::channel(0).0,
                        recent: VecDeque::new(),
                        interest: 0,
                        idle_since: None,
                        gate: Arc::new(tokio::sync::Mutex::new(())),
                        window: NOTIFY_STAGGER,
                        heads: Vec::new(),
                        tickets: HashMap::new(),
                        named_at: None,
                    }
                });
                entry.interest += 1;
                entry.idle_since = None;
                rxs.push(entry.tx.subscribe());
                gate.get_or_insert_with(|| entry.gate.clone());
            }
        }
        Interest {
            shared: Arc::downgrade(&self.shared),
            channels,
            rxs,
            gate: gate.unwrap_or_default(),
            ticket: None,
        }
    }
}

/// One waiter's registration.
struct Interest {
    shared: Weak<Shared>,
    channels: Vec<Vec<u8>>,
    rxs: Vec<watch::Receiver<u64>>,
    gate: Arc<tokio::sync::Mutex<()>>,
    /// This waiter's queue id and the wake-up a release naming it sends.
    ticket: Option<(Vec<u8>, Arc<tokio::sync::Notify>)>,
}

/// Why a waiter woke.
enum Wake {
    /// A release named this waiter: its turn.
    Named,
    /// Some announcement: look at who it named.
    Announced,
}

impl Interest {
    /// Registers this waiter's queue id, so that releases naming it wake it (and only it).
    fn register(&mut self, id: &[u8]) {
        let Some(s) = self.shared.upgrade() else {
            return;
        };
        let Some(ch) = self.channels.first() else {
            return;
        };
        let notify = Arc::new(tokio::sync::Notify::new());
        if let Ok(mut m) = s.channels.lock()
            && let Some(c) = m.get_mut(ch)
        {
            c.tickets.insert(id.to_vec(), notify.clone());
            self.ticket = Some((id.to_vec(), notify));
        }
    }

    /// The turn the latest release of the resource gave `me`, if it named `me`.
    fn turn(&self, me: &[u8]) -> Option<Turn> {
        let s = self.shared.upgrade()?;
        let ch = self.channels.first()?;
        let m = s.channels.lock().ok()?;
        let c = m.get(ch)?;
        if !c.heads.iter().any(|h| h == me) {
            return None;
        }
        let id = c.recent.back()?;
        Some(Turn {
            id: String::from_utf8_lossy(id).into_owned(),
            at: Instant::now(),
            pause: c.window,
        })
    }

    /// The waiters the latest release of the resource named (its first channel).
    fn heads(&self) -> Vec<Vec<u8>> {
        let Some(s) = self.shared.upgrade() else {
            return Vec::new();
        };
        let Some(ch) = self.channels.first() else {
            return Vec::new();
        };
        s.channels
            .lock()
            .ok()
            .and_then(|m| m.get(ch).map(|c| c.heads.clone()))
            .unwrap_or_default()
    }

    /// Whether a release named a waiter other than `me` within the last `window`: that
    /// waiter's attempt is (most likely) under way.
    fn handoff_under_way(&self, me: &[u8], window: Duration) -> bool {
        let Some(s) = self.shared.upgrade() else {
            return false;
        };
        let Some(ch) = self.channels.first() else {
            return false;
        };
        s.channels
            .lock()
            .ok()
            .and_then(|m| {
                m.get(ch).map(|c| {
                    c.named_at.is_some_and(|t| t.elapsed() < window)
                        && !c.heads.iter().any(|h| h == me)
                })
            })
            .unwrap_or(false)
    }

    /// The current contention window of the resource (its first channel).
    fn window(&self) -> Duration {
        let Some(s) = self.shared.upgrade() else {
            return NOTIFY_STAGGER;
        };
        let Some(ch) = self.channels.first() else {
            return NOTIFY_STAGGER;
        };
        s.channels
            .lock()
            .ok()
            .and_then(|m| m.get(ch).map(|c| c.window))
            .unwrap_or(NOTIFY_STAGGER)
    }

    /// Adapts the contention window after a split vote (`true`) or an acquisition.
    fn adapt(&self, split: bool) {
        let Some(s) = self.shared.upgrade() else {
            return;
        };
        if let Ok(mut m) = s.channels.lock() {
            for ch in &self.channels {
                if let Some(c) = m.get_mut(ch) {
                    c.window = next_window(c.window, split);
                }
            }
        }
    }

    /// Completes at the next release announced for any of the resources.
    async fn released(&mut self) -> Wake {
        let named = async {
            match &self.ticket {
                Some((_, n)) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        let announced = async {
            if self.rxs.is_empty() {
                return std::future::pending().await;
            }
            let waits = self.rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
            let (res, _, _) = futures::future::select_all(waits).await;
            if res.is_err() {
                // The notifier is gone; only the fallback timer is left.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = named => Wake::Named,
            () = announced => Wake::Announced,
        }
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if let Ok(mut map) = shared.channels.lock() {
            for ch in &self.channels {
                if let Some(c) = map.get_mut(ch) {
                    if let Some((id, _)) = &self.ticket {
                        c.tickets.remove(id);
                    }
                    c.interest = c.interest.saturating_sub(1);
                    if c.interest == 0 {
                        c.idle_since = Some(Instant::now());
                    }
                }
            }
        }
    }
}

/// The pseudo release id announced once a channel's subscription is active: a waiter that
/// failed before its subscription took effect may have missed a release in between, so it
/// is woken once to look again. Deduplicated like a release, so five nodes confirming
/// wake it once.
const SUBSCRIBED: &[u8] = b"\0subscribed";

/// `epoch` counts this node's subscription connections: the first connection of every
/// node announces the same id (one wake-up), a *re*connection a new one (a release may have
/// been missed while the link was down).
fn announce_subscribed(shared: &Weak<Shared>, channel: &[u8], epoch: u64) {
    if let Some(s) = shared.upgrade() {
        let id = format!("{}{epoch:x}", String::from_utf8_lossy(SUBSCRIBED));
        s.announce(channel, id.as_bytes());
    }
}

impl Shared {
    /// A release was announced on `channel` (by any node) with `payload`
    /// `<release id>[:<first waiter>[:<second waiter>]]`: wake its waiters, once per
    /// release however many nodes announce it.
    fn announce(&self, channel: &[u8], payload: &[u8]) {
        let mut parts = payload.split(|b| *b == b':');
        let id = parts.next().unwrap_or_default();
        let heads: Vec<Vec<u8>> = parts
            .filter(|p| !p.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        let Ok(mut map) = self.channels.lock() else {
            return;
        };
        let Some(c) = map.get_mut(channel) else {
            return;
        };
        if c.recent.back().is_some_and(|r| r == id) {
            // The same release from the other herald: if its queue named someone else
            // (the two queues can differ), name them too and wake the waiters again.
            // Waiters it names again are woken again: the release has now reached a second
            // node, and a named waiter whose attempt overtook it and failed tries again
            // (one still trying keeps the wake-up for after its attempt).
            for h in heads.iter().filter(|h| c.heads.contains(h)) {
                if let Some(n) = c.tickets.get(h) {
                    n.notify_one();
                }
            }
            let new: Vec<Vec<u8>> = heads.into_iter().filter(|h| !c.heads.contains(h)).collect();
            if !new.is_empty() {
                c.heads.extend(new.iter().cloned());
                c.wake(&new);
            }
            return;
        }
        if c.recent.iter().any(|r| r == id) {
            return;
        }
        if c.recent.len() >= 16 {
            c.recent.pop_front();
        }
        c.recent.push_back(id.to_vec());
        c.heads = heads;
        if !c.heads.is_empty() {
            c.named_at = Some(Instant::now());
        }
        c.wake(&c.heads);
    }
}

/// One node's subscription connection: (re)connects, subscribes to every channel with
/// interest, turns messages into wake-ups, and unsubscribes channels idle for a while.
async fn subscriber(
    client: redis::Client,
    addr: crate::node::NodeAddr,
    shared: Weak<Shared>,
    mut cmds: mpsc::UnboundedReceiver<SubCmd>,
) {
    let mut backoff = Duration::from_millis(20);
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    let mut epoch: u64 = 0;
    loop {
        let conn = tokio::time::timeout(Duration::from_secs(1), client.get_async_pubsub()).await;
        let pubsub = match conn {
            Ok(Ok(p)) => p,
            _ => {
                tracing::debug!(node = %addr, "quorumlock: release subscription unavailable; waiters fall back to their retry delay");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    cmd = cmds.recv() => if cmd.is_none() { return },
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        let (mut sink, mut stream) = pubsub.split();
        epoch = epoch.wrapping_add(1);
        let mut subscribed: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        // Subscribe to everything that currently has a channel entry.
        let wanted: Vec<Vec<u8>> = match shared.upgrade() {
            Some(s) => s
                .channels
                .lock()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
            None => return,
        };
        let mut ok = true;
        for ch in wanted {
            if sink.subscribe(ch.as_slice()).await.is_err() {
                ok = false;
                break;
            }
            announce_subscribed(&shared, &ch, epoch);
            subscribed.insert(ch);
        }
        while ok {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        let Some(s) = shared.upgrade() else { return };
                        s.announce(msg.get_channel_name().as_bytes(), msg.get_payload_bytes());
                    }
                    None => ok = false,
                },
                cmd = cmds.recv() => match cmd {
                    Some(SubCmd::Subscribe(ch)) => {
                        if subscribed.contains(&ch) {
                            continue;
                        }
                        if sink.subscribe(ch.as_slice()).await.is_err() {
                            ok = false;
                        } else {
                            announce_subscribed(&shared, &ch, epoch);
                        }
                        subscribed.insert(ch);
                    }
                    None => return,
                },
                _ = sweep.tick() => {
                    let Some(s) = shared.upgrade() else { return };
                    // Drop channels idle for LINGER from the shared map (whichever node's
                    // task sees it first), then unsubscribe here whatever the map lost.
                    let gone: Vec<Vec<u8>> = s.channels.lock().map(|mut m| {
                        m.retain(|_, c| !(c.interest == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= LINGER)));
                        subscribed.iter().filter(|ch| !m.contains_key(*ch)).cloned().collect()
                    }).unwrap_or_default();
                    for ch in gone {
                        let _ = sink.unsubscribe(ch.as_slice()).await;
                        subscribed.remove(&ch);
                    }
                }
            }
        }
        tracing::debug!(node = %addr, "quorumlock: release subscription lost; reconnecting");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn votes(outcomes: &[crate::NodeOutcome], largest: Option<usize>) -> Votes {
        let addr = NodeSpec::parse(0, "redis://127.0.0.1:1").unwrap().addr;
        Votes {
            quorum: outcomes.len() / 2 + 1,
            votes: outcomes
                .iter()
                .map(|o| crate::NodeVote {
                    node: addr.clone(),
                    outcome: o.clone(),
                })
                .collect(),
            elapsed: Duration::ZERO,
            largest_holder: largest,
            holder_ids: Vec::new(),
        }
    }

    #[test]
    fn split_detection() {
        use crate::NodeOutcome::{Granted as G, HeldByOther as H, NotAwaited as N, TimedOut as T};
        // 2 ours, 2 + 1 held by two others: split.
        assert!(is_split(&votes(&[G, G, H, H, H], Some(2))));
        // One owner holds 3: not a split, wait for its release.
        assert!(!is_split(&votes(&[G, G, H, H, H], Some(3))));
        // Held 2 by one owner, one node unknown: that owner may hold 3.
        assert!(!is_split(&votes(&[G, G, H, H, T], Some(2))));
        assert!(!is_split(&votes(&[H, H, N, N, G], Some(2))));
        // Holders unknown (multi-resource script): never a split.
        assert!(!is_split(&votes(&[G, G, H, H, H], None)));
        // 1 + 1 + 1 + 2 ours: split.
        assert!(is_split(&votes(&[H, H, H, G, G], Some(1))));
    }

    #[test]
    fn window_adapts_within_bounds() {
        let mut w = NOTIFY_STAGGER;
        for _ in 0..20 {
            w = next_window(w, true);
        }
        assert_eq!(w, STAGGER_MAX);
        for _ in 0..40 {
            w = next_window(w, false);
        }
        assert_eq!(w, STAGGER_MIN);
        assert_eq!(next_window(Duration::MAX, true), STAGGER_MAX);
        assert_eq!(next_window(Duration::ZERO, false), STAGGER_MIN);
    }

    #[test]
    fn jitter_in_range() {
        for _ in 0..1000 {
            let d = jitter(Duration::from_millis(10), Duration::from_millis(20));
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
        }
        assert_eq!(
            jitter(Duration::from_millis(5), Duration::from_millis(5)),
            Duration::from_millis(5)
        );
        assert_eq!(jitter(Duration::ZERO, Duration::ZERO), Duration::ZERO);
        let _ = jitter(Duration::ZERO, Duration::MAX);
    }
}
