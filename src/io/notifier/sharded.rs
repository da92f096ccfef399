//! Release announcements from a voter that is a Redis Cluster: sharded pub/sub.
//!
//! On a Redis Cluster voter every key of a resource lives in one slot, and the release
//! scripts announce on *shard channels* of that slot (`SPUBLISH`; the channel names are
//! [`resource::channel_in`](crate::base::resource::channel_in) and the client's sharded inbox,
//! [`Resources::inbox`](crate::base::resource::Resources::inbox)). A shard channel's messages
//! stay on the shard that serves the slot, its master and replicas, instead of travelling
//! the whole cluster bus as a `PUBLISH` does: the cost of an announcement does not grow
//! with the cluster.
//!
//! One task per voter holds one RESP3 connection through redis-rs's cluster client, which
//! sends each `SSUBSCRIBE` to the master of the channel's slot and follows redirects. The
//! task subscribes to every channel with interest, each `SSUBSCRIBE` in a task of its own
//! (a shard that does not answer holds up no other channel), turns messages into wake-ups
//! ([`Shared::announce_from`], as a plain master's link does), and unsubscribes channels
//! idle for a while. Subscriptions are lost when a slot moves (Redis drops them with a
//! `sunsubscribe` push, and the cluster client forgets them), when a connection drops, and
//! silently when a master crashes; the task asks again at the push, and asks for every
//! subscribed channel again every [`VERIFY_EVERY`] to find the silent losses. A
//! subscription back after a loss wakes the waiters once more (a release may have been
//! missed meanwhile); a failed one is asked for again every [`ASK_REFUSED_AGAIN`].
//!
//! ```text
//!   SubCmd::Subscribe(ch) ──task: SSUBSCRIBE (slot's master)──▶ answered ──▶ notice (new epoch after a loss)
//!   pushes: smessage ──▶ Shared::announce_from      sunsubscribe, disconnection ──▶ ask again
//!   every 5 s: SSUBSCRIBE each subscribed channel again ──failed──▶ lost, asked again every 2 s
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::{ASK_REFUSED_AGAIN, SUBSCRIBE_TIMEOUT, Shared, SubCmd, announce_subscribed};
use crate::io::node::NodeAddr;

/// How often every subscribed channel is asked for again (idempotent on the server; one
/// `SSUBSCRIBE` per slot): a subscription lost without a word (its master crashed, and the
/// cluster client only looks for the new one when a command fails) is found within this
/// time.
const VERIFY_EVERY: Duration = Duration::from_secs(5);

/// What an `SSUBSCRIBE` in flight was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// A channel not subscribed (new, refused before, or lost).
    Subscribe,
    /// Channels subscribed already (one slot's), asked again to see that they still are.
    Verify,
}

/// The answer to one `SSUBSCRIBE`: its channels, what it was for, whether it succeeded.
type Answer = (Vec<Vec<u8>>, Asked, bool);

/// Serves voter `index`'s shard-channel subscriptions until the notifier is gone.
pub(super) async fn subscriber(
    builder: redis::cluster::ClusterClientBuilder,
    addr: NodeAddr,
    index: usize,
    shared: Weak<Shared>,
    mut cmds: mpsc::UnboundedReceiver<SubCmd>,
) {
    let (tx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
    let client = builder
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(tx)
        .build();
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(node = %addr, error = %e, "quorumlock: no release subscription on this Redis Cluster voter; waiters fall back to their retry delay");
            return;
        }
    };
    let conn =
        client.get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
    let (answers_tx, mut answers) = mpsc::unbounded_channel();
    let mut link = ShardLink {
        conn,
        shared,
        index,
        returns: 0,
        subscribed: HashSet::new(),
        asking: HashSet::new(),
        reask: HashSet::new(),
        lost: HashSet::new(),
        refused: HashSet::new(),
        refused_asked: Instant::now(),
        verified: Instant::now(),
        answers: answers_tx,
        addr,
    };
    link.serve(&mut pushes, &mut cmds, &mut answers).await;
}

/// The subscriptions of one Redis Cluster voter. Every `SSUBSCRIBE` runs in a task of its
/// own, bounded by [`SUBSCRIBE_TIMEOUT`], and reports back: a shard that does not answer
/// holds up no other channel and no message.
///
/// A channel is in at most one of `subscribed` and `refused`, and in `asking` while a
/// request for it is in flight. A loss, or a new subscription wanted, while a request is
/// in flight puts the channel in `reask`: that request's answer is then stale (it cannot
/// tell "still subscribed" from "subscribed again by a redirect") and is set aside for a
/// new `SSUBSCRIBE`.
struct ShardLink {
    conn: redis::cluster_async::ClusterConnection,
    shared: Weak<Shared>,
    /// The voter's index (whose transfers this link hears).
    index: usize,
    /// Subscriptions back after a loss so far (each announces a notice id of its own).
    returns: u64,
    subscribed: HashSet<Vec<u8>>,
    /// Channels with an `SSUBSCRIBE` in flight.
    asking: HashSet<Vec<u8>>,
    /// Channels to ask for anew once the request in flight answers.
    reask: HashSet<Vec<u8>>,
    /// Channels whose subscription was lost (their next one wakes the waiters again).
    lost: HashSet<Vec<u8>>,
    /// Channels whose `SSUBSCRIBE` failed (an ACL, the slot's master down): asked again
    /// every [`ASK_REFUSED_AGAIN`].
    refused: HashSet<Vec<u8>>,
    refused_asked: Instant,
    /// When the subscribed channels were last asked for again ([`VERIFY_EVERY`]).
    verified: Instant,
    answers: mpsc::UnboundedSender<Answer>,
    addr: NodeAddr,
}

impl ShardLink {
    /// Subscribes to every wanted channel, then serves messages, new channels, answers and
    /// the sweep until the notifier is gone.
    async fn serve(
        &mut self,
        pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
        cmds: &mut mpsc::UnboundedReceiver<SubCmd>,
        answers: &mut mpsc::UnboundedReceiver<Answer>,
    ) {
        let Some(wanted) = self.shared.upgrade().map(|s| s.wanted()) else {
            return;
        };
        for ch in wanted {
            self.subscribe(ch);
        }
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                push = pushes.recv() => {
                    let Some(push) = push else { return };
                    if !self.push(push) {
                        return;
                    }
                }
                cmd = cmds.recv() => {
                    let Some(SubCmd::Subscribe(ch)) = cmd else { return };
                    self.subscribe(ch);
                }
                answer = answers.recv() => {
                    let Some((channels, asked, ok)) = answer else { return };
                    for ch in channels {
                        self.answered(ch, asked, ok);
                    }
                }
                _ = sweep.tick() => {
                    if !self.sweep() {
                        return;
                    }
                }
            }
        }
    }

    /// Subscribes to the shard channel `ch` (the client's plain inbox is not for this
    /// link), unless it is subscribed; with a request in flight, once that one answers.
    fn subscribe(&mut self, ch: Vec<u8>) {
        if !crate::base::resource::is_sharded(&ch) || self.subscribed.contains(&ch) {
            return;
        }
        if self.asking.contains(&ch) {
            self.reask.insert(ch);
            return;
        }
        self.send(vec![ch], Asked::Subscribe);
    }

    /// Sends one `SSUBSCRIBE` for `channels` (one slot's) from a task of its own.
    fn send(&mut self, channels: Vec<Vec<u8>>, asked: Asked) {
        self.asking.extend(channels.iter().cloned());
        let mut conn = self.conn.clone();
        let answers = self.answers.clone();
        crate::io::background::spawn_daemon(async move {
            let done = tokio::time::timeout(SUBSCRIBE_TIMEOUT, conn.ssubscribe(&channels));
            let ok = matches!(done.await, Ok(Ok(())));
            let _ = answers.send((channels, asked, ok));
        });
    }

    /// Applies the answer to an `SSUBSCRIBE` of `ch`: a stale one (see [`ShardLink`]) is
    /// replaced by a new request; a new subscription is announced (with a notice id of
    /// its own after a loss, so the waiters look again); a failed one is asked for again
    /// later, and a failed verification means the subscription was lost.
    fn answered(&mut self, ch: Vec<u8>, asked: Asked, ok: bool) {
        self.asking.remove(&ch);
        if self.reask.remove(&ch) {
            self.send(vec![ch], Asked::Subscribe);
            return;
        }
        match (asked, ok) {
            (Asked::Verify, true) => {}
            (Asked::Subscribe, true) => {
                let epoch = if self.lost.remove(&ch) {
                    self.returns = self.returns.wrapping_add(1);
                    return_epoch(self.index, self.returns)
                } else {
                    1
                };
                self.refused.remove(&ch);
                announce_subscribed(&self.shared, &ch, epoch);
                self.subscribed.insert(ch);
            }
            (_, false) => {
                tracing::debug!(node = %self.addr, channel = %String::from_utf8_lossy(&ch), "quorumlock: a sharded release subscription failed or took too long; asked again shortly (waiters fall back to their retry delay)");
                if self.subscribed.remove(&ch) {
                    self.lost.insert(ch.clone());
                }
                self.refused.insert(ch);
            }
        }
    }

    /// `ch`'s subscription was lost (or may have been): asked for again, now or once the
    /// request in flight answers, and its return will wake the waiters.
    fn lose(&mut self, ch: Vec<u8>) {
        let had = self.subscribed.remove(&ch);
        if !had && !self.asking.contains(&ch) {
            return;
        }
        self.lost.insert(ch.clone());
        if self.asking.contains(&ch) {
            self.reask.insert(ch);
        } else {
            self.send(vec![ch], Asked::Subscribe);
        }
    }

    /// Handles one push from the cluster client; `false` once the notifier is gone.
    fn push(&mut self, push: PushInfo) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                let mut data = push.data.into_iter();
                if let (Some(Value::BulkString(ch)), Some(Value::BulkString(payload))) =
                    (data.next(), data.next())
                {
                    shared.announce_from(&ch, &payload, Some(self.index));
                }
            }
            // The slot moved away from the master we listened on (a migration, a
            // failover): Redis dropped the subscription, and the cluster client forgets
            // it. Asked for again, it meets MOVED and lands on the slot's new master.
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(ch)) = push.data.first() {
                    self.lose(ch.clone());
                }
            }
            // A connection of the voter was lost: what was published meanwhile was
            // missed. Every channel is asked for again; its return wakes the waiters.
            PushKind::Disconnection => {
                let all: Vec<Vec<u8>> = self.subscribed.union(&self.asking).cloned().collect();
                for ch in all {
                    self.lose(ch);
                }
            }
            _ => {}
        }
        true
    }

    /// Unsubscribes the channels idle for long enough, forgets the refused ones no one
    /// wants any more, asks again for the others every [`ASK_REFUSED_AGAIN`], and verifies
    /// the subscribed ones every [`VERIFY_EVERY`]; `false` once the notifier is gone.
    fn sweep(&mut self) -> bool {
        let Some(s) = self.shared.upgrade() else {
            return false;
        };
        for ch in s.sweep(&self.subscribed) {
            // Removed first: the server's `sunsubscribe` push is then ours, not a loss.
            self.subscribed.remove(&ch);
            let mut conn = self.conn.clone();
            crate::io::background::spawn_daemon(async move {
                let _ =
                    tokio::time::timeout(SUBSCRIBE_TIMEOUT, conn.sunsubscribe(ch.as_slice())).await;
            });
        }
        for ch in s.sweep(&self.refused) {
            self.refused.remove(&ch);
            self.lost.remove(&ch);
        }
        drop(s);
        if !self.refused.is_empty() && self.refused_asked.elapsed() >= ASK_REFUSED_AGAIN {
            self.refused_asked = Instant::now();
            for ch in std::mem::take(&mut self.refused) {
                self.subscribe(ch);
            }
        }
        if self.verified.elapsed() >= VERIFY_EVERY {
            self.verified = Instant::now();
            self.verify();
        }
        true
    }

    /// Asks for every subscribed channel again, one `SSUBSCRIBE` per slot.
    fn verify(&mut self) {
        let mut by_slot: HashMap<u16, Vec<Vec<u8>>> = HashMap::new();
        for ch in &self.subscribed {
            if !self.asking.contains(ch) {
                by_slot
                    .entry(crate::base::slot::key_slot(ch))
                    .or_default()
                    .push(ch.clone());
            }
        }
        for channels in by_slot.into_values() {
            self.send(channels, Asked::Verify);
        }
    }
}

/// The notice id of a subscription back after a loss: this voter's `n`-th, distinct from
/// every other voter's and from a first subscription's (1), so that each voter's return
/// wakes the waiters (the same id from two voters would be heard once).
fn return_epoch(index: usize, n: u64) -> u64 {
    let voter = u64::try_from(index).unwrap_or(u64::MAX) & 0x7fff;
    (1 << 63) | (voter << 48) | (n & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::return_epoch;

    #[test]
    fn every_voters_returns_have_ids_of_their_own() {
        let ids: Vec<u64> = (0..4)
            .flat_map(|voter| (1..4).map(move |n| return_epoch(voter, n)))
            .collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "{ids:x?}");
        assert!(
            ids.iter().all(|&id| id != 1),
            "never a first subscription's id"
        );
    }
}
