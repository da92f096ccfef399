//! Release announcements for one [`Redlock`](crate::Redlock): one subscription
//! connection per node, shared by every waiter of the client, started on first use.
//!
//! Every release on a resource's heralds that hands the lock to no one publishes
//! `<release id>[:<waiter>…]` on the resource's channel (`<namespace>:released:{name}`,
//! `quorumlock` being the default namespace). A
//! release that transferred the lock to a queued token (on any node) publishes
//! `<release id>:>:<token>[:<fence>]` on the channel the entry brought: the *inbox* of
//! the waiter's client (`<namespace>:released:\xFFinbox:<random>`, one per `Redlock`,
//! subscribed on every node for the client's lifetime; under the release channels' prefix,
//! so the one ACL channel pattern `&<namespace>:released:*` covers it), so a hand-off
//! costs one message per node, to
//! the one client that waits for it, however many other clients listen to the resource.
//! Each node's subscription task hands such a transfer, with the node's index, to the
//! transfer waiter that registered that token ([`Notifier::route`]; current and retired
//! tokens alike: the waiter counts the node, or passes a retired token's transfer on).
//! Every announcement on a resource's channel wakes the client's listening waiters once
//! per release, however many nodes announce it: whether a message is a new release, the
//! same one again from another node or an old one is decided by the protocol
//! ([`protocol::contention::Releases`](crate::protocol::contention::Releases)); this module
//! holds that state per channel, wakes the waiters, and keeps the subscriptions.
//!
//! ```text
//!   node i ──SUBSCRIBE──▶ subscriber task ──message──▶ Shared::announce_from ──route──▶ the transfer waiter of the token
//!                                                                            └─Releases::hear──▶ wake the listeners
//!   waiter (wait.rs) ──interest()──▶ Interest: released().await, window(), adapt()
//!   release (lock.rs) ──released()──▶ polite map ──should_yield()──▶ the next lock() yields
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use crate::base::resource::{Keyspace, Resources};
use crate::base::time::later;
use crate::io::node::{NodeAddr, NodeSpec};
use crate::protocol::contention::{self, Announced, POLITE_WINDOW, Releases, parse_announcement};
use crate::protocol::handoff;

mod sharded;

/// How long a channel stays subscribed after its last waiter left (saves a SUBSCRIBE
/// round trip for the next waiter, and closes the missed-release window).
const LINGER: Duration = Duration::from_secs(5);

/// The pseudo release id announced once a channel's subscription is active: a waiter that
/// failed before its subscription took effect may have missed a release in between, so it
/// is woken once to look again. Deduplicated like a release, so five nodes confirming
/// wake it once.
const SUBSCRIBED: &[u8] = b"\0subscribed";

/// Release announcements for one client. See the module docs.
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

struct Shared {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
    /// Channels this client released while others listened, until when it yields.
    polite: Mutex<HashMap<Vec<u8>, Instant>>,
    nodes: Vec<mpsc::UnboundedSender<SubCmd>>,
    /// Transfer waiters by token (current and retired tokens alike): each transfer
    /// announcement naming one is routed to its waiter with the node that published it.
    transfers: Mutex<HashMap<Vec<u8>, mpsc::UnboundedSender<Transfer>>>,
    /// This client's own channel, where transfers to its waiters are announced.
    inbox: Vec<u8>,
}

/// A transfer announcement heard from one node: node `node` handed the lock to `token`
/// (`fence`: the counter it raised, for a fenced entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transfer {
    pub(crate) node: usize,
    pub(crate) token: Vec<u8>,
    pub(crate) fence: Option<u64>,
}

/// One resource channel of this client.
struct Channel {
    /// Bumped to wake every waiter: `.0` counts releases, `.1` subscription notices.
    tx: watch::Sender<(u64, u64)>,
    /// What was heard of the resource's releases (the protocol's state).
    releases: Releases,
    interest: usize,
    idle_since: Option<Instant>,
    /// Held by the one waiter of this client that is trying right now.
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            tx: watch::channel((0, 0)).0,
            releases: Releases::default(),
            interest: 0,
            idle_since: None,
            gate: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Wakes every waiter of this client listening on the channel: for a release, or
    /// (`notice`) for a subscription that just became active.
    fn wake(&self, notice: bool) {
        self.tx.send_modify(|(releases, notices)| {
            if notice {
                *notices = notices.wrapping_add(1);
            } else {
                *releases = releases.wrapping_add(1);
            }
        });
    }
}

enum SubCmd {
    Subscribe(Vec<u8>),
}

impl Notifier {
    /// Starts one subscription task per node (each connects on its own, in the background).
    pub(crate) fn new(specs: &[NodeSpec], keys: &Keyspace) -> Notifier {
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
            transfers: Mutex::new(HashMap::new()),
            inbox: inbox_channel(keys),
        });
        for (index, (spec, rx)) in specs.iter().zip(receivers).enumerate() {
            let weak = Arc::downgrade(&shared);
            let addr = spec.addr.clone();
            if let Some(seeds) = &spec.seeds {
                // A Redis Cluster voter: shard channels, on the slots' masters.
                let b = crate::io::node::cluster_builder(spec, seeds, Duration::from_secs(1));
                crate::io::background::spawn_daemon(sharded::subscriber(b, addr, index, weak, rx));
            } else if let Ok(client) = redis::Client::open(spec.info.clone()) {
                crate::io::background::spawn_daemon(subscriber(client, addr, index, weak, rx));
            }
        }
        Notifier { shared }
    }

    /// Notes a release of `res` that reached `listeners` (the most any node reported):
    /// when the protocol says this client should yield ([`contention::releaser_yields`];
    /// `queued` per [`contention::release_queued`]), its next `lock()` of the resource
    /// within [`POLITE_WINDOW`] joins the queue's end first.
    pub(crate) fn released(&self, res: &Resources, listeners: u64, queued: bool) {
        let single = res.len() == 1;
        if listeners == 0 && !(queued && single) {
            return;
        }
        let channels = res.channels();
        let own = self
            .shared
            .channels
            .lock()
            .map(|m| channels.iter().any(|c| m.contains_key(c)))
            .unwrap_or(false);
        if contention::releaser_yields(single, listeners, queued, own)
            && let Ok(mut p) = self.shared.polite.lock()
        {
            let now = Instant::now();
            let until = later(now, POLITE_WINDOW);
            if p.len() > 4096 {
                p.retain(|_, t| *t > now);
            }
            for c in channels {
                p.insert(c, until);
            }
        }
    }

    /// Whether this client released `res` moments ago while others waited for it (and
    /// forgets it: the next call says no).
    pub(crate) fn should_yield(&self, res: &Resources) -> bool {
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

    /// This client's inbox: the channel its waiters' queue entries ask transfers to be
    /// announced on (subscribed on every node for the client's lifetime).
    pub(crate) fn inbox(&self) -> &[u8] {
        &self.shared.inbox
    }

    /// Routes the transfer announcements naming `token` to `to` (until [`Notifier::unroute`]).
    pub(crate) fn route(&self, token: &[u8], to: mpsc::UnboundedSender<Transfer>) {
        if let Ok(mut m) = self.shared.transfers.lock() {
            m.insert(token.to_vec(), to);
        }
    }

    /// Stops routing the transfer announcements naming `token`.
    pub(crate) fn unroute(&self, token: &[u8]) {
        if let Ok(mut m) = self.shared.transfers.lock() {
            m.remove(token);
        }
    }

    /// Registers interest in a lock's resources (subscribing on every node if new). On
    /// Redis Cluster voters the client's sharded inbox of the resources' slot is
    /// subscribed too, for as long as the interest lasts (it wakes no one: transfers are
    /// routed by token).
    pub(crate) fn interest(&self, res: &Resources) -> Interest {
        let mut rxs = Vec::new();
        let mut seen = Vec::new();
        let mut gate = None;
        let mut channels = res.channels();
        let wake = channels.len();
        let inbox = res.inbox(&self.shared.inbox);
        if inbox != self.shared.inbox {
            channels.push(inbox);
        }
        if let Ok(mut map) = self.shared.channels.lock() {
            for (k, ch) in channels.iter().enumerate() {
                let entry = map.entry(ch.clone()).or_insert_with(|| {
                    for node in &self.shared.nodes {
                        let _ = node.send(SubCmd::Subscribe(ch.clone()));
                    }
                    Channel::new()
                });
                entry.interest += 1;
                entry.idle_since = None;
                if k >= wake {
                    continue;
                }
                let rx = entry.tx.subscribe();
                seen.push(rx.borrow().0);
                rxs.push(rx);
                gate.get_or_insert_with(|| entry.gate.clone());
            }
        }
        Interest {
            shared: Arc::downgrade(&self.shared),
            channels,
            rxs,
            seen,
            gate: gate.unwrap_or_default(),
        }
    }
}

/// A fresh inbox channel name ([`resource::inbox_channel`](crate::base::resource::inbox_channel)
/// with a random id; a collision between two clients would only route announcements to a
/// client that ignores tokens it did not register).
fn inbox_channel(keys: &Keyspace) -> Vec<u8> {
    keys.inbox_channel(rand::random::<u64>())
}

/// What woke an [`Interest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A release was announced.
    Released,
    /// Only a subscription became active (or active again after a reconnection): a release
    /// may have been missed while it was not.
    Subscribed,
}

/// One waiter's registration with the notifier.
pub(crate) struct Interest {
    shared: Weak<Shared>,
    channels: Vec<Vec<u8>>,
    rxs: Vec<watch::Receiver<(u64, u64)>>,
    /// The release count each receiver showed when last looked at.
    seen: Vec<u64>,
    /// Held while this client's waiter for the resource is trying.
    pub(crate) gate: Arc<tokio::sync::Mutex<()>>,
}

impl Interest {
    /// Runs `f` on the resource's (first) channel, if the notifier is still there.
    fn with_channel<R>(&self, f: impl FnOnce(&mut Channel) -> R) -> Option<R> {
        let s = self.shared.upgrade()?;
        let ch = self.channels.first()?;
        let mut m = s.channels.lock().ok()?;
        m.get_mut(ch).map(f)
    }

    /// The current contention window of the resource (its first channel).
    pub(crate) fn window(&self) -> Duration {
        self.with_channel(|c| c.releases.window())
            .unwrap_or(contention::NOTIFY_STAGGER)
    }

    /// Adapts the contention window of every resource after a split vote (`true`) or an
    /// acquisition.
    pub(crate) fn adapt(&self, split: bool) {
        let Some(s) = self.shared.upgrade() else {
            return;
        };
        if let Ok(mut m) = s.channels.lock() {
            for ch in &self.channels {
                if let Some(c) = m.get_mut(ch) {
                    c.releases.adapt(split);
                }
            }
        }
    }

    /// Completes at the next release announced for any of the resources, or at a
    /// subscription that became active (a release may have been missed before it did):
    /// which one, [`Wake`] says.
    pub(crate) async fn released(&mut self) -> Wake {
        if self.rxs.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
        let (res, _, _) = futures::future::select_all(waits).await;
        if res.is_err() {
            // The notifier is gone; only the fallback timer is left.
            return std::future::pending().await;
        }
        let mut wake = Wake::Subscribed;
        for (rx, seen) in self.rxs.iter_mut().zip(self.seen.iter_mut()) {
            let releases = rx.borrow_and_update().0;
            if releases != *seen {
                *seen = releases;
                wake = Wake::Released;
            }
        }
        wake
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
                    c.interest = c.interest.saturating_sub(1);
                    if c.interest == 0 {
                        c.idle_since = Some(Instant::now());
                    }
                }
            }
        }
    }
}

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
    /// A release was announced on `channel` (by any node): wake its waiters, once per
    /// release however many nodes announce it ([`Releases::hear`]).
    fn announce(&self, channel: &[u8], payload: &[u8]) {
        self.announce_from(channel, payload, None);
    }

    /// As [`Shared::announce`], from node `node` (a subscription): a transfer naming a
    /// routed token is also handed to its waiter, with the node.
    fn announce_from(&self, channel: &[u8], payload: &[u8], node: Option<usize>) {
        if let (Some(node), Some((token, fence))) = (node, handoff::parse_transfer(payload))
            && let Ok(m) = self.transfers.lock()
            && let Some(to) = m.get(token)
        {
            let _ = to.send(Transfer {
                node,
                token: token.to_vec(),
                fence,
            });
        }
        let notice = payload.starts_with(SUBSCRIBED);
        let (id, heads) = parse_announcement(payload);
        let Ok(mut map) = self.channels.lock() else {
            return;
        };
        let Some(c) = map.get_mut(channel) else {
            return;
        };
        match c.releases.hear(id, heads) {
            Announced::New => c.wake(notice),
            // The latest release again, from another node: new only if it names someone
            // the first announcement did not (the queues can differ).
            Announced::Again { added, .. } if !added.is_empty() => c.wake(notice),
            Announced::Again { .. } | Announced::Old => {}
        }
    }

    /// The inbox, then the channels that currently have an entry (to subscribe on a new
    /// connection).
    fn wanted(&self) -> Vec<Vec<u8>> {
        let mut wanted = vec![self.inbox.clone()];
        if let Ok(m) = self.channels.lock() {
            wanted.extend(m.keys().cloned());
        }
        wanted
    }

    /// Drops the channels idle for [`LINGER`] from the map (whichever node's task sees it
    /// first) and returns those of `subscribed` the map no longer has.
    fn sweep(&self, subscribed: &HashSet<Vec<u8>>) -> Vec<Vec<u8>> {
        self.channels
            .lock()
            .map(|mut m| {
                m.retain(|_, c| {
                    !(c.interest == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= LINGER))
                });
                subscribed
                    .iter()
                    .filter(|ch| **ch != self.inbox && !m.contains_key(*ch))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// One node's subscription connection: (re)connects, subscribes to every channel with
/// interest, turns messages into wake-ups, and unsubscribes channels idle for a while.
async fn subscriber(
    client: redis::Client,
    addr: NodeAddr,
    index: usize,
    shared: Weak<Shared>,
    mut cmds: mpsc::UnboundedReceiver<SubCmd>,
) {
    let mut backoff = Duration::from_millis(20);
    // For links that break at once: starts at 100 ms, up to BROKEN_LINK_BACKOFF_MAX.
    let mut broken = BROKEN_LINK_BACKOFF_MIN;
    let mut broke_at_once: u32 = 0;
    let mut epoch: u64 = 0;
    loop {
        let conn = tokio::time::timeout(Duration::from_secs(1), client.get_async_pubsub()).await;
        let Ok(Ok(pubsub)) = conn else {
            tracing::debug!(node = %addr, "quorumlock: release subscription unavailable; waiters fall back to their retry delay");
            if pause(&mut backoff, Duration::from_secs(1), &mut cmds).await == Served::Done {
                return;
            }
            continue;
        };
        backoff = Duration::from_millis(20);
        let connected = Instant::now();
        epoch = epoch.wrapping_add(1);
        let (sink, mut stream) = pubsub.split();
        let mut link = Link {
            sink,
            shared: shared.clone(),
            index,
            epoch,
            subscribed: HashSet::new(),
            refused: HashSet::new(),
            refused_asked: Instant::now(),
            addr: addr.clone(),
        };
        if link.serve(&mut stream, &mut cmds).await == Served::Done {
            return;
        }
        tracing::debug!(node = %addr, "quorumlock: release subscription lost; reconnecting");
        // A link that broke at once (a server or proxy that drops a connection on
        // SUBSCRIBE, say) is not reconnected in a loop: the backoff grows, up to
        // BROKEN_LINK_BACKOFF_MAX, until a link lasts.
        if connected.elapsed() >= STABLE_LINK {
            broken = BROKEN_LINK_BACKOFF_MIN;
            broke_at_once = 0;
            continue;
        }
        broke_at_once = broke_at_once.saturating_add(1);
        if broke_at_once == 3 {
            tracing::warn!(node = %addr, "quorumlock: the node breaks every release subscription at once (no pub/sub?); waiters fall back to their retry delay, and the client tries again with a growing backoff");
        }
        if pause(&mut broken, BROKEN_LINK_BACKOFF_MAX, &mut cmds).await == Served::Done {
            return;
        }
    }
}

/// The first wait before reconnecting a link that broke at once.
const BROKEN_LINK_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest wait before reconnecting a link that broke at once.
const BROKEN_LINK_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How often a link asks again for the channels its node refused (an error reply).
const ASK_REFUSED_AGAIN: Duration = Duration::from_secs(2);

/// How long a `SUBSCRIBE` may take before the link is taken for broken and replaced.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a subscription link must last for its backoff to start again.
const STABLE_LINK: Duration = Duration::from_secs(1);

/// Waits out `backoff` (or until the notifier is gone) and doubles it, up to `max`.
async fn pause(
    backoff: &mut Duration,
    max: Duration,
    cmds: &mut mpsc::UnboundedReceiver<SubCmd>,
) -> Served {
    let until = tokio::time::Instant::now() + *backoff;
    *backoff = (*backoff * 2).min(max);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => return Served::Lost,
            // A new channel is subscribed on the next connection (`Shared::wanted`).
            cmd = cmds.recv() => if cmd.is_none() { return Served::Done },
        }
    }
}

/// How a subscription connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// The link broke: reconnect.
    Lost,
    /// The notifier is gone: stop.
    Done,
}

/// One live subscription connection of a node (its sending half).
struct Link {
    sink: redis::aio::PubSubSink,
    shared: Weak<Shared>,
    /// The node's index (whose transfers this link hears).
    index: usize,
    epoch: u64,
    subscribed: HashSet<Vec<u8>>,
    /// Channels the server refused to subscribe this connection to (an error reply: an
    /// ACL without the channel, a busy node): asked again every [`ASK_REFUSED_AGAIN`] (an
    /// operator may grant the channel without dropping connections).
    refused: HashSet<Vec<u8>>,
    /// When the refused channels were last asked for.
    refused_asked: Instant,
    addr: NodeAddr,
}

impl Link {
    /// Subscribes to `ch` (once) and announces that the subscription is active. `false`
    /// when the link broke or did not answer within [`SUBSCRIBE_TIMEOUT`] (it is then
    /// replaced, after the backoff). A channel the node answers with an error (an ACL's
    /// `NOPERM`, a `BUSY` node running a long script, a server without pub/sub) is logged
    /// at WARN and set aside, the link kept for the others, and asked for again every
    /// [`ASK_REFUSED_AGAIN`]: meanwhile its waiters fall back to their retry delay and
    /// renewal replies, as with a node whose subscription is down.
    async fn subscribe(&mut self, ch: Vec<u8>) -> bool {
        if self.subscribed.contains(&ch) || self.refused.contains(&ch) {
            return true;
        }
        let asked = tokio::time::timeout(SUBSCRIBE_TIMEOUT, self.sink.subscribe(ch.as_slice()));
        let answer = asked.await;
        self.apply(ch, answer, false)
    }

    /// Applies the answer to a `SUBSCRIBE` of `ch` (`again`: a refused channel asked for
    /// again, logged at DEBUG if still refused). `false` when the link is to be replaced.
    fn apply(
        &mut self,
        ch: Vec<u8>,
        answer: Result<redis::RedisResult<()>, tokio::time::error::Elapsed>,
        again: bool,
    ) -> bool {
        match answer {
            Ok(Ok(())) => {
                self.refused.remove(&ch);
                announce_subscribed(&self.shared, &ch, self.epoch);
                self.subscribed.insert(ch);
                true
            }
            Ok(Err(e)) if e.code().is_some() => {
                if again {
                    tracing::debug!(node = %self.addr, channel = %String::from_utf8_lossy(&ch), error = %e, "quorumlock: the node still refuses a release subscription");
                } else {
                    tracing::warn!(
                        node = %self.addr,
                        channel = %String::from_utf8_lossy(&ch),
                        error = %e,
                        "quorumlock: the node refused a release subscription; waiters fall back to their retry delay until it is accepted (an ACL user needs the channels `<namespace>:released:*`, `quorumlock:released:*` by default)"
                    );
                }
                self.refused.insert(ch);
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(node = %self.addr, error = %e, kind = ?e.kind(), "quorumlock: a release subscription failed; replacing the link");
                false
            }
            Err(_) => {
                tracing::debug!(node = %self.addr, "quorumlock: a release subscription took too long; replacing the link");
                false
            }
        }
    }

    /// Asks again for the refused channels, if [`ASK_REFUSED_AGAIN`] has passed since
    /// the last time: all at once (one round trip, bounded by [`SUBSCRIBE_TIMEOUT`]), so
    /// the link's messages and new channels are held up for one round trip at most.
    async fn ask_refused_again(&mut self) -> bool {
        if self.refused.is_empty() || self.refused_asked.elapsed() < ASK_REFUSED_AGAIN {
            return true;
        }
        let channels: Vec<Vec<u8>> = self.refused.iter().cloned().collect();
        let asks = channels.iter().map(|ch| {
            let mut sink = self.sink.clone();
            async move { sink.subscribe(ch.as_slice()).await }
        });
        let answers =
            tokio::time::timeout(SUBSCRIBE_TIMEOUT, futures::future::join_all(asks)).await;
        self.refused_asked = Instant::now();
        let Ok(answers) = answers else {
            return false;
        };
        let mut kept = true;
        for (ch, answer) in channels.into_iter().zip(answers) {
            kept &= self.apply(ch, Ok(answer), true);
        }
        kept
    }

    /// Subscribes to every channel with an entry, then serves messages, new channels and
    /// the idle sweep until the link breaks or the notifier is gone.
    async fn serve(
        &mut self,
        stream: &mut redis::aio::PubSubStream,
        cmds: &mut mpsc::UnboundedReceiver<SubCmd>,
    ) -> Served {
        let Some(wanted) = self.shared.upgrade().map(|s| s.wanted()) else {
            return Served::Done;
        };
        for ch in wanted {
            if !self.subscribe(ch).await {
                return Served::Lost;
            }
        }
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { return Served::Lost };
                    let Some(s) = self.shared.upgrade() else { return Served::Done };
                    // Bytes: an inbox's name is not UTF-8.
                    let Ok(channel) = msg.get_channel::<Vec<u8>>() else { continue };
                    s.announce_from(&channel, msg.get_payload_bytes(), Some(self.index));
                }
                cmd = cmds.recv() => {
                    let Some(SubCmd::Subscribe(ch)) = cmd else { return Served::Done };
                    if !self.subscribe(ch).await {
                        return Served::Lost;
                    }
                }
                _ = sweep.tick() => {
                    let Some(s) = self.shared.upgrade() else { return Served::Done };
                    for ch in s.sweep(&self.subscribed) {
                        let _ = self.sink.unsubscribe(ch.as_slice()).await;
                        self.subscribed.remove(&ch);
                    }
                    for ch in s.sweep(&self.refused) {
                        self.refused.remove(&ch);
                    }
                    if !self.ask_refused_again().await {
                        return Served::Lost;
                    }
                }
            }
        }
    }
}
