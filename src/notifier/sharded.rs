//! Release announcements from a voter that is a Redis Cluster: sharded pub/sub.
//!
//! On a Redis Cluster voter every key of a resource lives in one slot, and the release
//! scripts announce on *shard channels* of that slot (`SPUBLISH`; the channel names are
//! [`resource::channel_in`](crate::resource::channel_in) and the client's sharded inbox,
//! [`Resources::inbox`](crate::resource::Resources::inbox)). A shard channel's messages
//! stay on the shard that serves the slot, its master and replicas, instead of travelling
//! the whole cluster bus as a `PUBLISH` does: the cost of an announcement does not grow
//! with the cluster.
//!
//! One task per voter holds one RESP3 connection through redis-rs's cluster client, which
//! sends each `SSUBSCRIBE` to the master of the channel's slot, follows redirects, and
//! subscribes again, on the slot's new master, after a failover or a slot migration. The
//! task subscribes to every channel with interest, turns messages into wake-ups
//! ([`Shared::announce_from`], as a plain master's link does), wakes the waiters once more
//! after a connection was lost (a release may have been missed meanwhile), asks again
//! every [`ASK_REFUSED_AGAIN`] for channels a subscription failed for, and unsubscribes
//! channels idle for a while.
//!
//! ```text
//!   SubCmd::Subscribe(ch) ──SSUBSCRIBE (slot's master)──▶ pushes: smessage ──▶ Shared::announce_from
//!                                                                 disconnection ──▶ epoch + 1, notices
//! ```

use std::collections::HashSet;
use std::sync::Weak;
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::{ASK_REFUSED_AGAIN, SUBSCRIBE_TIMEOUT, Shared, SubCmd, announce_subscribed};
use crate::node::NodeAddr;

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
    let mut link = ShardLink {
        conn,
        shared,
        index,
        epoch: 1,
        subscribed: HashSet::new(),
        refused: HashSet::new(),
        refused_asked: Instant::now(),
        addr,
    };
    link.serve(&mut pushes, &mut cmds).await;
}

/// The subscriptions of one Redis Cluster voter.
struct ShardLink {
    conn: redis::cluster_async::ClusterConnection,
    shared: Weak<Shared>,
    /// The voter's index (whose transfers this link hears).
    index: usize,
    /// Counts the connections lost: a notice after a loss carries a new id (wakes again).
    epoch: u64,
    subscribed: HashSet<Vec<u8>>,
    /// Channels whose `SSUBSCRIBE` failed (an ACL, the slot's master down): asked again
    /// every [`ASK_REFUSED_AGAIN`].
    refused: HashSet<Vec<u8>>,
    refused_asked: Instant,
    addr: NodeAddr,
}

impl ShardLink {
    /// Subscribes to every wanted channel, then serves messages, new channels and the idle
    /// sweep until the notifier is gone.
    async fn serve(
        &mut self,
        pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
        cmds: &mut mpsc::UnboundedReceiver<SubCmd>,
    ) {
        let Some(wanted) = self.shared.upgrade().map(|s| s.wanted()) else {
            return;
        };
        for ch in wanted {
            self.subscribe(ch).await;
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
                    self.subscribe(ch).await;
                }
                _ = sweep.tick() => {
                    if !self.sweep().await {
                        return;
                    }
                }
            }
        }
    }

    /// Subscribes to the shard channel `ch` (once; plain channels, such as the client's
    /// plain inbox, are not for this link) and announces that the subscription is active.
    async fn subscribe(&mut self, ch: Vec<u8>) {
        if !crate::resource::is_sharded(&ch)
            || self.subscribed.contains(&ch)
            || self.refused.contains(&ch)
        {
            return;
        }
        let asked = tokio::time::timeout(SUBSCRIBE_TIMEOUT, self.conn.ssubscribe(ch.as_slice()));
        match asked.await {
            Ok(Ok(())) => {
                announce_subscribed(&self.shared, &ch, self.epoch);
                self.subscribed.insert(ch);
            }
            Ok(Err(e)) => {
                tracing::debug!(node = %self.addr, channel = %String::from_utf8_lossy(&ch), error = %e, "quorumlock: a sharded release subscription failed; asked again shortly (waiters fall back to their retry delay)");
                self.refused.insert(ch);
            }
            Err(_) => {
                tracing::debug!(node = %self.addr, channel = %String::from_utf8_lossy(&ch), "quorumlock: a sharded release subscription took too long; asked again shortly");
                self.refused.insert(ch);
            }
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
            // A connection of the voter was lost: what was published meanwhile was missed.
            // The client subscribes again by itself; the waiters look again once it has.
            PushKind::Disconnection => self.epoch = self.epoch.wrapping_add(1),
            PushKind::SSubscribe => {
                if let Some(Value::BulkString(ch)) = push.data.first()
                    && self.subscribed.contains(ch)
                {
                    announce_subscribed(&self.shared, ch, self.epoch);
                }
            }
            _ => {}
        }
        true
    }

    /// Unsubscribes the channels idle for long enough, forgets the refused ones no one
    /// wants any more, and asks again for the others; `false` once the notifier is gone.
    async fn sweep(&mut self) -> bool {
        let Some(s) = self.shared.upgrade() else {
            return false;
        };
        for ch in s.sweep(&self.subscribed) {
            let _ = tokio::time::timeout(SUBSCRIBE_TIMEOUT, self.conn.sunsubscribe(ch.as_slice()))
                .await;
            self.subscribed.remove(&ch);
        }
        for ch in s.sweep(&self.refused) {
            self.refused.remove(&ch);
        }
        drop(s);
        if self.refused.is_empty() || self.refused_asked.elapsed() < ASK_REFUSED_AGAIN {
            return true;
        }
        self.refused_asked = Instant::now();
        for ch in std::mem::take(&mut self.refused) {
            self.subscribe(ch).await;
        }
        true
    }
}
