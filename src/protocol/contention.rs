//! Contention and waiting: who tries next, when, and what a release announcement means
//! for a waiter. Pure rules; the waiting loop (`wait.rs`) and the subscription
//! connections (`notifier.rs`) execute them, with the clock and the random draws as
//! inputs.
//!
//! ```text
//!   attempt failed ──▶ is_split? ──yes──▶ Pause::Backoff   random within the contention window
//!        │                                                  (next_window: doubles on a split, ¾ on a win)
//!        └── otherwise ──▶ Pause::Listen: an announcement (then a stagger) or the fallback timer
//!
//!   Releases::hear(announcement) ──▶ New / Again / Old        once per release, whichever herald
//!   releaser_yields ──▶ the next lock() yields: the transfer waiter joins the queue's end
//!                       first; several resources wait POLITE_DELAY
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use super::time::{Moment, later};

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
pub(crate) const POLITE_WINDOW: Duration = Duration::from_secs(1);

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

/// How many recent release ids a client remembers per resource, to wake its waiters once
/// per release however many nodes announce it.
const REMEMBERED: usize = 16;

/// One contention-window step: doubled on a split vote, three quarters on an acquisition,
/// kept within [`STAGGER_MIN`]..=[`STAGGER_MAX`] (Ethernet-style back-off).
pub(crate) fn next_window(window: Duration, split: bool) -> Duration {
    let next = if split {
        window.saturating_mul(2)
    } else {
        window.saturating_mul(3) / 4
    };
    next.clamp(STAGGER_MIN, STAGGER_MAX)
}

/// Whether a failed attempt's votes show that no one holds a quorum: the refusing nodes
/// named their holders (`largest_holder` is the most nodes one of them holds; `None` when
/// some refusal named no one), and even if every node that did not answer belonged to the
/// most widespread holder, it would stay below the quorum. The votes were split between
/// contenders: the resource is about to be free and no release will be announced for it.
pub(crate) fn is_split(
    nodes: usize,
    granted: usize,
    held: usize,
    largest_holder: Option<usize>,
    quorum: usize,
) -> bool {
    let unknown = nodes.saturating_sub(granted.saturating_add(held));
    largest_holder.is_some_and(|largest| largest.saturating_add(unknown) < quorum)
}

/// The hand-off window: how long a named waiter's attempt is taken to be under way. It
/// tries at once and its attempt ends within the per-node timeout; as much again as the
/// longest fallback delay is allowed for a slow scheduler.
pub(crate) fn handoff_window(node_timeout: Duration, delay_max: Duration) -> Duration {
    node_timeout.max(delay_max)
}

/// What a waiter does between a failed attempt and the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// The votes were split: no announcement will come; back off randomly within the
    /// contention window.
    Backoff,
    /// Wait for an announcement or the fallback timer.
    Listen,
    /// No release notifications: the retry delay.
    Sleep,
}

/// The pause after a failed attempt: no notifier → [`Pause::Sleep`]; a split vote →
/// [`Pause::Backoff`]; otherwise [`Pause::Listen`].
pub(crate) fn pause(notify: bool, split: bool) -> Pause {
    match (notify, split) {
        (false, _) => Pause::Sleep,
        (true, true) => Pause::Backoff,
        (true, false) => Pause::Listen,
    }
}

/// The delay before a polling waiter's next attempt, given the one its retry policy drew:
/// a waiting writer (`intent`: its attempts renew its intent, a lease of [`QUEUE_LEASE`])
/// tries again within a third of the lease, whatever the policy, or its intent would lapse
/// between two attempts and let new readers in ahead of it. Every other waiter keeps the
/// policy's delay.
pub(crate) fn polling_delay(drawn: Duration, intent: bool) -> Duration {
    if intent {
        drawn.min(QUEUE_LEASE / 3)
    } else {
        drawn
    }
}

/// When a queue lease joined at `joined_at` is next renewed: a third of the lease later.
pub(crate) fn renew_at<T: Moment>(joined_at: T) -> T {
    later(joined_at, QUEUE_LEASE / 3)
}

/// The least time between a waiter's join or renewal and a renewal prompted by a release
/// that handed the lock to no one ([`recheck_at`]): at most ten such renewals a second.
pub(crate) const RECHECK_GAP: Duration = Duration::from_millis(100);

/// When a waiter that is not the head renews after hearing, at `now`, a release that
/// handed the lock to no one (the waiter ahead may have left since its latest reply): at
/// once, but no sooner than [`RECHECK_GAP`] after the join that scheduled its next renewal
/// for `renew_at` ([`renew_at`]), and never later than that renewal. A resource with
/// frequent plain releases and many waiters must not turn each release into a round of
/// renewals.
pub(crate) fn recheck_at<T: Moment>(renew_at: T, now: T) -> T {
    renew_at
        .minus(QUEUE_LEASE / 3 - RECHECK_GAP)
        .unwrap_or(now)
        .max(now)
        .min(renew_at)
}

/// Whether a release should make this client yield its next `lock()` of the resource:
/// others listened for it. `listeners` is what the release reported: for one resource the
/// waiters queued for it on a herald (this client is not among them), for several the
/// most subscribers one of its announcements reached (this client's own subscription,
/// `own_subscribed`, included) or the most waiters queued for one of them, whichever is
/// more.
/// A release counts as heard by waiters also when the lock was waited for in the queue, or
/// when no herald answered before it was decided (`queued`): then nothing told how many wait.
pub(crate) fn releaser_yields(
    single: bool,
    listeners: u64,
    queued: bool,
    own_subscribed: bool,
) -> bool {
    if single {
        listeners > 0 || queued
    } else {
        listeners > u64::from(own_subscribed)
    }
}

/// Whether a decided release counts as "queued" for [`releaser_yields`]: the lock was
/// taken through the queue, or (one resource) no herald's answer was among those that
/// decided it. With five nodes a release is decided by three answers, which need not
/// include a herald, the only nodes that count the queue.
pub(crate) fn release_queued(single: bool, waited_in_queue: bool, herald_answered: bool) -> bool {
    waited_in_queue || (single && !herald_answered)
}

/// Splits an announcement payload, `<release id>[:<waiter>[:<waiter>…]]`, into the
/// release id and the waiters it names (empty names dropped). A transfer,
/// `<release id>:>:<token>[:<fence>]`, names the token it transferred to.
pub(crate) fn parse_announcement(payload: &[u8]) -> (&[u8], Vec<Vec<u8>>) {
    let mut parts = payload.split(|b| *b == b':');
    let id = parts.next().unwrap_or_default();
    let mut rest = parts.clone();
    if rest.next() == Some(&b">"[..]) {
        let heads = rest.next().filter(|t| !t.is_empty()).map(<[u8]>::to_vec);
        return (id, heads.into_iter().collect());
    }
    let heads = parts
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    (id, heads)
}

/// What one client has heard of one resource's releases: the recent release ids, the
/// waiters the latest one named, and the resource's contention window.
#[derive(Debug, Clone)]
pub(crate) struct Releases {
    recent: VecDeque<Vec<u8>>,
    heads: Vec<Vec<u8>>,
    window: Duration,
}

/// What an announcement was, for [`Releases::hear`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Announced {
    /// A release not heard before: wake the waiters it named (everyone, if none).
    New,
    /// The latest release again, from the other herald: `again` (named before: woken by
    /// the first announcement already, not again) and `added` (named only by this herald:
    /// the two queues can differ; the client's waiters are woken when there are any). A
    /// waiter whose claim overtook the release on its way to the other nodes is not woken
    /// again: its next join or renewal finds the key free or transferred to it.
    Again {
        /// Waiters named by both heralds.
        again: Vec<Vec<u8>>,
        /// Waiters only this herald named.
        added: Vec<Vec<u8>>,
    },
    /// An older release, heard before: nothing to do.
    Old,
}

impl Default for Releases {
    fn default() -> Releases {
        Releases {
            recent: VecDeque::new(),
            heads: Vec::new(),
            window: NOTIFY_STAGGER,
        }
    }
}

impl Releases {
    /// Records release `id` naming `heads`. Each release counts once,
    /// however many nodes announce it; the latest one's second announcement adds the
    /// waiters it names to those already named.
    pub(crate) fn hear(&mut self, id: &[u8], heads: Vec<Vec<u8>>) -> Announced {
        if self.recent.back().is_some_and(|r| r == id) {
            let (again, added): (Vec<_>, Vec<_>) =
                heads.into_iter().partition(|h| self.heads.contains(h));
            self.heads.extend(added.iter().cloned());
            return Announced::Again { again, added };
        }
        if self.recent.iter().any(|r| r == id) {
            return Announced::Old;
        }
        if self.recent.len() >= REMEMBERED {
            self.recent.pop_front();
        }
        self.recent.push_back(id.to_vec());
        self.heads = heads;
        Announced::New
    }

    /// The waiters the latest release named, first one first.
    #[cfg(test)]
    pub(crate) fn heads(&self) -> &[Vec<u8>] {
        &self.heads
    }

    /// The contention window.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// Adapts the contention window after a split vote (`true`) or an acquisition.
    pub(crate) fn adapt(&mut self, split: bool) {
        self.window = next_window(self.window, split);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn window_bounds_are_ordered() {
        assert!(Duration::ZERO < STAGGER_MIN);
        assert!(STAGGER_MIN <= NOTIFY_STAGGER && NOTIFY_STAGGER <= STAGGER_MAX);
        assert!(POLITE_DELAY < Duration::from_millis(10));
    }

    const MS: Duration = Duration::from_millis(1);

    fn id(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn split_detection() {
        // (nodes, granted, held, largest holder, split?)
        let seeds: &[(usize, usize, usize, Option<usize>, bool)] = &[
            (5, 2, 3, Some(2), true),  // 2 ours, 2 + 1 held by two others
            (5, 2, 3, Some(3), false), // one owner holds 3: wait for its release
            (5, 2, 2, Some(2), false), // one node unknown: that owner may hold 3
            (5, 1, 2, Some(2), false), // two not awaited
            (5, 2, 3, None, false),    // holders unknown (multi-resource script)
            (5, 2, 3, Some(1), true),  // 1 + 1 + 1 + 2 ours
            (3, 1, 2, Some(1), true),
            (1, 0, 1, Some(1), false),
        ];
        for &(n, g, h, l, want) in seeds {
            assert_eq!(is_split(n, g, h, l, n / 2 + 1), want, "{n} {g} {h} {l:?}");
        }
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
    fn waiting_decisions() {
        assert_eq!(pause(false, true), Pause::Sleep);
        assert_eq!(pause(false, false), Pause::Sleep);
        assert_eq!(pause(true, true), Pause::Backoff);
        assert_eq!(pause(true, false), Pause::Listen);
        assert_eq!(handoff_window(MS, 2 * MS), 2 * MS);
        assert_eq!(renew_at(Duration::ZERO), QUEUE_LEASE / 3);
        // Joined at 9 s (next renewal at 9 s + a third of the lease): a plain release heard
        // at 9.05 s renews at 9.1 s, one at 9.5 s at once; never after the renewal due.
        let joined = Duration::from_secs(9);
        let due = renew_at(joined);
        assert_eq!(recheck_at(due, joined + 50 * MS), joined + RECHECK_GAP);
        assert_eq!(recheck_at(due, joined + 500 * MS), joined + 500 * MS);
        assert_eq!(recheck_at(due, due + MS), due);
        let long = QUEUE_LEASE * 2;
        assert_eq!(polling_delay(long, true), QUEUE_LEASE / 3);
        assert_eq!(polling_delay(long, false), long);
        assert_eq!(
            polling_delay(Duration::from_millis(10), true),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn yielding() {
        assert!(releaser_yields(true, 1, false, true));
        assert!(releaser_yields(true, 0, true, false));
        assert!(!releaser_yields(true, 0, false, true));
        // Several resources: our own subscription does not count as someone waiting.
        assert!(!releaser_yields(false, 1, true, true));
        assert!(releaser_yields(false, 1, false, false));
        assert!(releaser_yields(false, 2, false, true));
        assert!(release_queued(true, false, false));
        assert!(!release_queued(true, false, true));
        assert!(!release_queued(false, false, false));
        assert!(release_queued(false, true, true));
    }

    #[test]
    fn announcements() {
        assert_eq!(parse_announcement(b"abcd1234"), (&b"abcd1234"[..], vec![]));
        assert_eq!(
            parse_announcement(b"abcd1234:w1::w2"),
            (&b"abcd1234"[..], vec![id("w1"), id("w2")])
        );
        assert_eq!(parse_announcement(b""), (&b""[..], vec![]));
        // A transfer names its token only (the fence value is not a waiter).
        assert_eq!(
            parse_announcement(b"abcd1234:>:tok:1764543600000001"),
            (&b"abcd1234"[..], vec![id("tok")])
        );
        assert_eq!(
            parse_announcement(b"abcd1234:>"),
            (&b"abcd1234"[..], vec![])
        );
        let mut r = Releases::default();
        assert_eq!(r.hear(b"r1", vec![id("w1")]), Announced::New);
        assert_eq!(r.heads(), [id("w1")]);
        assert_eq!(
            r.hear(b"r1", vec![id("w1"), id("w2")]),
            Announced::Again {
                again: vec![id("w1")],
                added: vec![id("w2")]
            }
        );
        assert_eq!(r.heads(), [id("w1"), id("w2")]);
        assert_eq!(r.hear(b"r2", vec![]), Announced::New);
        assert_eq!(r.hear(b"r1", vec![id("w3")]), Announced::Old);
    }

    proptest! {
        /// The oracle for splits: with every unknown node given to the largest holder, can
        /// anyone reach the quorum?
        #[test]
        fn split_matches_oracle(n in 1usize..10, g in 0usize..10, h in 0usize..10,
                                l in prop::option::of(0usize..10)) {
            let (g, h) = (g.min(n), h.min(n - g.min(n)));
            let l = l.map(|l| l.min(h));
            let q = n / 2 + 1;
            let someone_may_reach = l.is_none_or(|l| l + (n - g - h) >= q);
            prop_assert_eq!(is_split(n, g, h, l, q), !someone_may_reach);
        }

        /// The window stays in bounds, grows on splits and shrinks on wins.
        #[test]
        fn window_bounded(w_us in 0u64..100_000, split in any::<bool>()) {
            let w = Duration::from_micros(w_us);
            let next = next_window(w, split);
            prop_assert!((STAGGER_MIN..=STAGGER_MAX).contains(&next));
            if (STAGGER_MIN..=STAGGER_MAX).contains(&w) {
                let grew = next >= w;
                let shrank = next <= w;
                prop_assert!(grew || !split);
                prop_assert!(shrank || split);
            }
        }

        /// Whatever order the heralds' announcements arrive in (each release announced by
        /// up to two heralds, possibly naming different waiters), each release is `New`
        /// exactly once, and a repeat of an older one is never `New`.
        #[test]
        fn each_release_is_new_once(seq in prop::collection::vec((0u8..6, prop::collection::vec(0u8..4, 0..3)), 0..40)) {
            let mut r = Releases::default();
            let mut news = std::collections::HashMap::<u8, u32>::new();
            let mut seen = Vec::new();
            for (rel, named) in &seq {
                let heads: Vec<Vec<u8>> = named.iter().map(|w| vec![*w]).collect();
                let was_latest = seen.last() == Some(rel);
                let got = r.hear(&[*rel], heads.clone());
                match got {
                    Announced::New => {
                        *news.entry(*rel).or_default() += 1;
                        prop_assert!(!seen.contains(rel) || seen.len() > REMEMBERED);
                        seen.push(*rel);
                        prop_assert_eq!(r.heads(), heads.as_slice());
                    }
                    Announced::Again { again, added } => {
                        prop_assert!(was_latest);
                        prop_assert_eq!(again.len() + added.len(), heads.len());
                        for h in &heads {
                            prop_assert!(r.heads().contains(h));
                        }
                    }
                    Announced::Old => prop_assert!(seen.contains(rel) && !was_latest),
                }
            }
            prop_assert!(news.values().all(|n| *n == 1) || seen.len() > REMEMBERED);
        }
    }
}
