//! Inspection: who holds a resource, read from every node without taking or touching it.
//!
//! [`Redlock::inspect`] and [`Redlock::inspect_many`] ask every node, in parallel and each
//! bounded by the per-node timeout, what it holds for a resource:
//!
//! * the lock key's holder, shown as a [`TokenPrefix`] (at most the first 8 characters of
//!   the token, never the whole token), and its remaining TTL (`PTTL`);
//! * the fence counter (`<namespace>:fence:{name}`, present once a fenced lock reached the
//!   node): the largest fencing token issued or committed there, so at least the token of
//!   the latest holder that committed on it;
//! * the wait queue's length, on the resource's two *herald* nodes (the only nodes that
//!   keep its queue; see [`NodeInspection::is_herald`]).
//!
//! and put the answers together in an [`Inspection`] with a [`Verdict`]:
//!
//! | verdict | when |
//! | --- | --- |
//! | [`Verdict::Held`] | one holder's key is on at least a quorum of nodes |
//! | [`Verdict::Free`] | no lock key on at least a quorum of nodes |
//! | [`Verdict::Unknown`] | neither: fewer than a quorum answered, or the answers are split (say 2 nodes held by one owner, 2 by another, 1 free) |
//!
//! A resource cannot be both held and free on a quorum, and at most one holder can be on a
//! quorum. A key on a minority of nodes (the leftovers of a failed attempt about to be
//! cleaned up, or a lock whose other keys expired) does not make the resource held.
//!
//! # What it sends
//!
//! One transaction per node, of read-only commands only: `MULTI`, then per resource
//! `GET` and `PTTL` of the lock key, `GET` of the fence counter and, on the resource's
//! herald nodes, `ZCARD` of its wait queue, then `EXEC`. The transaction makes each node's
//! answer one snapshot (a holder is never paired with the next holder's TTL). Nothing is
//! written: no key, no TTL, no queue entry changes. (Reading a key updates its last access
//! time, which only eviction policies look at; quorumlock's nodes run `noeviction`.) An
//! ACL user for inspection needs `GET`, `PTTL`, `ZCARD`, `MULTI` and `EXEC`.
//!
//! The queue length counts the waiters queued on that herald, including an entry whose
//! lease lapsed moments ago and that the next queue operation will purge (a waiter that
//! vanished is gone from the count within about [`QUEUE_LEASE`](crate::QUEUE_LEASE)).
//!
//! An inspection is a picture of a moment: a lock can be taken or released right after.
//! Use it to look (an operator's question, a health page, a test), never to decide whether
//! to take a lock: [`Redlock::try_lock`] does that atomically.
//!
//! # Example
//!
//! ```no_run
//! use quorumlock::Redlock;
//! use quorumlock::inspect::Verdict;
//!
//! # async fn demo() -> Result<(), quorumlock::Error> {
//! let locks = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .build()
//!     .await?;
//! let seen = locks.inspect("orders:42").await?;
//! match seen.verdict() {
//!     Verdict::Held { holder, nodes, ttl } => {
//!         println!("held by {holder} on {nodes} nodes, for {ttl:?} more")
//!     }
//!     Verdict::Free { .. } => println!("free"),
//!     _ => println!("unknown: {} of {} nodes answered", seen.answered(), seen.nodes().len()),
//! }
//! for node in seen.nodes() {
//!     println!("  {node}");
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use tracing::Instrument;

use crate::base::error::Error;
use crate::base::resource::{Resources, check_count};
use crate::client::config::DEFAULTS;
use crate::client::redlock::Redlock;
use crate::client::shared::Inner;
use crate::io::node::NodeAddr;
use crate::io::peek::{self, NodeAnswer, PeekError};
use crate::protocol::inspect::{Reading, Seen, read};

/// The most characters of a token an inspection shows.
const PREFIX_LEN: usize = 8;

/// The start of a lock token, enough to tell holders apart and to match a release
/// announcement or a log line, never the whole token.
///
/// It is at most the first 8 characters of the value stored in the lock key (and at most
/// half of it, so that a short value written by something else is never shown whole).
/// `Display` adds `…`: `3f2a9c1b…`, as [`Lock`](crate::Lock)'s `Debug` and the logs show
/// tokens.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let lock = locks.try_lock("report", Duration::from_secs(10)).await?;
/// let seen = locks.inspect("report").await?;
/// let holder = seen.holder().expect("held");
/// assert!(holder.is_prefix_of(lock.token()));
/// assert_eq!(holder.to_string(), format!("{}…", holder.as_str()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenPrefix(String);

impl TokenPrefix {
    /// The prefix of a stored value: at most [`PREFIX_LEN`] characters and at most half
    /// of the value (lossy UTF-8).
    fn of(value: &[u8]) -> TokenPrefix {
        let text = String::from_utf8_lossy(value);
        let keep = PREFIX_LEN.min(text.chars().count() / 2);
        TokenPrefix(text.chars().take(keep).collect())
    }

    /// The prefix, without the `…`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let Some(holder) = locks.inspect("report").await?.holder() {
    ///     assert!(holder.as_str().len() <= 8);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `token` (a whole token, such as [`Lock::token`](crate::Lock::token)) starts
    /// with this prefix: the lock key holds that token, as far as the prefix can tell.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// let lock = locks.try_lock("report", Duration::from_secs(10)).await?;
    /// let seen = locks.inspect("report").await?;
    /// let mine = seen.holder().is_some_and(|h| h.is_prefix_of(lock.token()));
    /// # let _ = mine;
    /// # Ok(()) }
    /// ```
    pub fn is_prefix_of(&self, token: &str) -> bool {
        !self.0.is_empty() && token.starts_with(&self.0)
    }
}

impl fmt::Display for TokenPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.0)
    }
}

/// What the nodes together say about one resource (see the [module docs](self)).
///
/// `Display` prints one line: `orders:42: held by 3f2a9c1b… on 5/5 nodes (quorum 3)`.
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::Verdict;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// let seen = locks.inspect("orders:42").await?;
/// println!("{seen}");
/// if let Verdict::Free { nodes } = seen.verdict() {
///     println!("no key on {nodes} of {} nodes", seen.nodes().len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    resource: String,
    quorum: usize,
    nodes: Vec<NodeInspection>,
    verdict: Verdict,
}

/// The verdict of an [`Inspection`].
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::Verdict;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// match locks.inspect("orders:42").await?.verdict() {
///     Verdict::Held { holder, nodes, ttl: Some(ttl) } => {
///         println!("{holder} holds it on {nodes} nodes for at least {ttl:?} more")
///     }
///     Verdict::Held { holder, .. } => println!("{holder} holds it with keys that never expire"),
///     Verdict::Free { .. } => println!("free"),
///     Verdict::Unknown | _ => println!("cannot tell"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// One holder's key is on at least a quorum of nodes: the resource is locked.
    Held {
        /// Who holds it.
        holder: TokenPrefix,
        /// On how many nodes its key is.
        nodes: usize,
        /// How long its key stays on a quorum of nodes if it is neither extended nor
        /// released: the quorum-th longest of the remaining TTLs its nodes reported.
        /// `None` when at least a quorum of its keys never expire (not set by quorumlock).
        ttl: Option<Duration>,
    },
    /// There is no lock key on at least a quorum of nodes: the resource is free (a key on
    /// a minority of nodes cannot make it held).
    Free {
        /// On how many nodes there is no key.
        nodes: usize,
    },
    /// Neither: fewer than a quorum of nodes answered, or the answers are split so that no
    /// holder and no "free" has a quorum.
    Unknown,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Held { holder, nodes, .. } => write!(f, "held by {holder} on {nodes} nodes"),
            Verdict::Free { nodes } => write!(f, "free on {nodes} nodes"),
            Verdict::Unknown => f.write_str("unknown"),
        }
    }
}

/// One node's part of an [`Inspection`]: its address (password redacted), whether it is
/// one of the resource's heralds, and what it answered.
///
/// `Display` prints one line: `redis://127.0.0.1:7001: held by 3f2a9c1b…, ttl 8.2s, fence
/// 17, queued 2`.
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::NodeState;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// for node in locks.inspect("orders:42").await?.nodes() {
///     match node.state() {
///         NodeState::Answered(r) => println!("{}: holder {:?}, ttl {:?}", node.addr(), r.holder(), r.ttl()),
///         NodeState::Failed(e) => println!("{}: failed: {e}", node.addr()),
///         NodeState::TimedOut | _ => println!("{}: no answer", node.addr()),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInspection {
    addr: NodeAddr,
    herald: bool,
    state: NodeState,
}

/// What one node answered.
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::NodeState;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// let seen = locks.inspect("orders:42").await?;
/// let timed_out = seen.nodes().iter().filter(|n| matches!(n.state(), NodeState::TimedOut)).count();
/// # let _ = timed_out;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeState {
    /// The node answered.
    Answered(NodeReading),
    /// The node answered with an error (a refused command, a key of the wrong type), an
    /// answer of an unexpected shape, or the connection failed. The text never holds a
    /// password or a whole token.
    Failed(String),
    /// No answer within the per-node timeout.
    TimedOut,
}

/// What one node holds for a resource.
///
/// # Example
///
/// ```no_run
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// let seen = locks.inspect("orders:42").await?;
/// for r in seen.nodes().iter().filter_map(|n| n.reading()) {
///     println!("holder {:?}, ttl {:?}, fence {:?}, queued {:?}", r.holder(), r.ttl(), r.fence(), r.queued());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReading {
    holder: Option<TokenPrefix>,
    ttl: Option<Duration>,
    fence: Option<u64>,
    queued: Option<u64>,
}

impl NodeReading {
    /// Who holds the lock key on this node; `None` when there is no key.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// let holding = seen.nodes().iter().filter(|n| n.reading().is_some_and(|r| r.holder().is_some())).count();
    /// # let _ = holding;
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Option<&TokenPrefix> {
        self.holder.as_ref()
    }

    /// The lock key's remaining TTL on this node (`PTTL`, whole milliseconds); `None` when
    /// there is no key, or when the key has no expiry (then [`holder`](Self::holder) is
    /// `Some`: a key quorumlock did not set).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// let longest = seen.nodes().iter().filter_map(|n| n.reading()?.ttl()).max();
    /// # let _ = longest;
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The resource's fence counter on this node; `None` when it has none (no fenced lock
    /// of this resource reached this node).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("ledger").await?;
    /// let counters: Vec<Option<u64>> = seen.nodes().iter().filter_map(|n| n.reading()).map(|r| r.fence()).collect();
    /// # let _ = counters;
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// How many waiters are queued for the resource on this node; `None` on a node that
    /// keeps no queue for it (not one of its heralds).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// let queued: Vec<u64> = seen.nodes().iter().filter_map(|n| n.reading()?.queued()).collect();
    /// # let _ = queued;
    /// # Ok(()) }
    /// ```
    pub fn queued(&self) -> Option<u64> {
        self.queued
    }
}

impl NodeInspection {
    /// The node, as configured (password redacted).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// assert_eq!(seen.nodes()[0].addr(), &locks.nodes()[0]);
    /// # Ok(()) }
    /// ```
    pub fn addr(&self) -> &NodeAddr {
        &self.addr
    }

    /// Whether this node is one of the resource's two heralds: the nodes (chosen from the
    /// resource's name) that announce its releases and keep its wait queue. Every node is
    /// a herald when there are at most two.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// assert_eq!(seen.nodes().iter().filter(|n| n.is_herald()).count(), 2.min(seen.nodes().len()));
    /// # Ok(()) }
    /// ```
    pub fn is_herald(&self) -> bool {
        self.herald
    }

    /// What the node answered.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::inspect::NodeState;
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// let failed = seen.nodes().iter().any(|n| matches!(n.state(), NodeState::Failed(_)));
    /// # let _ = failed;
    /// # Ok(()) }
    /// ```
    pub fn state(&self) -> &NodeState {
        &self.state
    }

    /// The node's reading, when it answered.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// let answered = seen.nodes().iter().filter(|n| n.reading().is_some()).count();
    /// assert_eq!(answered, seen.answered());
    /// # Ok(()) }
    /// ```
    pub fn reading(&self) -> Option<&NodeReading> {
        match &self.state {
            NodeState::Answered(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Display for NodeInspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.addr)?;
        let r = match &self.state {
            NodeState::Answered(r) => r,
            NodeState::Failed(e) => return write!(f, "failed: {e}"),
            NodeState::TimedOut => return f.write_str("timed out"),
        };
        match (&r.holder, r.ttl) {
            (Some(h), Some(t)) => write!(f, "held by {h}, ttl {}", Millis(t))?,
            (Some(h), None) => write!(f, "held by {h}, no expiry")?,
            (None, _) => f.write_str("free")?,
        }
        if let Some(fence) = r.fence {
            write!(f, ", fence {fence}")?;
        }
        if let Some(q) = r.queued {
            write!(f, ", queued {q}")?;
        }
        Ok(())
    }
}

/// A duration shown as `850ms` or `8.2s`.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs_f64();
        if secs >= 1.0 {
            write!(f, "{secs:.1}s")
        } else {
            write!(f, "{}ms", self.0.subsec_millis())
        }
    }
}

impl Inspection {
    /// The resource inspected.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// assert_eq!(locks.inspect("orders:42").await?.resource(), "orders:42");
    /// # Ok(()) }
    /// ```
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The verdict (see [`Verdict`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::inspect::Verdict;
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let free = matches!(locks.inspect("orders:42").await?.verdict(), Verdict::Free { .. });
    /// # let _ = free;
    /// # Ok(()) }
    /// ```
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The number of nodes a verdict needs: `N / 2 + 1`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// assert_eq!(locks.inspect("orders:42").await?.quorum(), locks.quorum());
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Every node's part, in the order the nodes were configured.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// for node in locks.inspect("orders:42").await?.nodes() {
    ///     println!("{node}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nodes(&self) -> &[NodeInspection] {
        &self.nodes
    }

    /// How many nodes answered (neither failed nor timed out).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("orders:42").await?;
    /// if seen.answered() < seen.quorum() {
    ///     eprintln!("too few nodes answered to tell");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|n| n.reading().is_some()).count()
    }

    /// Whether the verdict is [`Verdict::Held`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if locks.inspect("cron:nightly").await?.is_held() {
    ///     println!("the nightly job is running somewhere");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        matches!(self.verdict, Verdict::Held { .. })
    }

    /// Whether the verdict is [`Verdict::Free`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("cron:nightly").await?;
    /// assert!(!(seen.is_free() && seen.is_held()));
    /// # Ok(()) }
    /// ```
    pub fn is_free(&self) -> bool {
        matches!(self.verdict, Verdict::Free { .. })
    }

    /// The holder when the verdict is [`Verdict::Held`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let Some(holder) = locks.inspect("cron:nightly").await?.holder() {
    ///     println!("held by {holder}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Option<&TokenPrefix> {
        match &self.verdict {
            Verdict::Held { holder, .. } => Some(holder),
            _ => None,
        }
    }

    /// The largest fence counter any node reported; `None` when no node has one.
    ///
    /// It is at least the latest fencing token issued for the resource, as far as the
    /// answering nodes know (a node that granted after the quorum decided keeps its own,
    /// larger counter, so it can be above it), and below every token issued afterwards
    /// by nodes among those.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let Some(t) = locks.inspect("ledger").await?.fence() {
    ///     println!("the storage should have seen tokens up to {t}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.readings().filter_map(|r| r.fence).max()
    }

    /// The longest wait queue any herald reported; `None` when no herald answered.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let waiting = locks.inspect("orders:42").await?.queued().unwrap_or(0);
    /// # let _ = waiting;
    /// # Ok(()) }
    /// ```
    pub fn queued(&self) -> Option<u64> {
        self.readings().filter_map(|r| r.queued).max()
    }

    fn readings(&self) -> impl Iterator<Item = &NodeReading> {
        self.nodes.iter().filter_map(NodeInspection::reading)
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nodes.len();
        let q = self.quorum;
        write!(f, "{}: ", self.resource)?;
        match &self.verdict {
            Verdict::Held { holder, nodes, ttl } => {
                write!(f, "held by {holder} on {nodes}/{n} nodes (quorum {q})")?;
                match ttl {
                    Some(t) => write!(f, ", {} left", Millis(*t)),
                    None => f.write_str(", no expiry"),
                }
            }
            Verdict::Free { nodes } => write!(f, "free on {nodes}/{n} nodes (quorum {q})"),
            Verdict::Unknown => write!(
                f,
                "unknown ({}/{n} nodes answered, quorum {q})",
                self.answered()
            ),
        }
    }
}

impl Redlock {
    /// Reads, on every node, who holds `resource`, its remaining TTL, its fence counter and
    /// its wait queue's length, **without taking or touching the lock**, and says whether
    /// it is held on a quorum, free on a quorum, or unknown (see the
    /// [`inspect` module](crate::client::inspect)).
    ///
    /// Every node is asked in parallel, each bounded by the per-node timeout
    /// ([`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout); without one,
    /// the largest default, 250 ms); a node that fails or does not answer in time is
    /// reported as such. The call returns once every node answered or timed out.
    ///
    /// # Errors
    ///
    /// Only for the input: [`Error::InvalidInput`] for an empty or too long name, or when
    /// called outside a Tokio runtime. Unreachable nodes are not an error: they show in
    /// [`Inspection::nodes`], and too many of them make the verdict [`Verdict::Unknown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads; a dropped call leaves nothing behind.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// use std::time::Duration;
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// let lock = locks.try_lock("report", Duration::from_secs(10)).await?;
    /// let seen = locks.inspect("report").await?;
    /// assert!(seen.is_held());
    /// assert!(seen.holder().is_some_and(|h| h.is_prefix_of(lock.token())));
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, resource: &str) -> Result<Inspection, Error> {
        let mut all = self.inspect_many([resource]).await?;
        all.pop()
            .ok_or_else(|| Error::invalid("resource", "no inspection for the resource"))
    }

    /// [`inspect`](Redlock::inspect) for several resources at once: one transaction per
    /// node for all of them, one [`Inspection`] per resource, in the order given (a name
    /// given twice is inspected twice).
    ///
    /// Each resource is read on its own: the keys of a multi-resource lock
    /// ([`Redlock::try_lock_many`]) all hold its token, so each of its resources shows
    /// the same holder.
    ///
    /// # Errors
    ///
    /// As [`inspect`](Redlock::inspect); [`Error::InvalidInput`] also for an empty list or
    /// one of more than [`MAX_RESOURCES`](crate::MAX_RESOURCES) names.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// for seen in locks.inspect_many(["stock:1", "stock:2"]).await? {
    ///     println!("{seen}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect_many<I>(&self, resources: I) -> Result<Vec<Inspection>, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Error::ensure_runtime()?;
        let names: Vec<I::Item> = resources.into_iter().collect();
        check_count(names.len(), "inspection")?;
        let resources = names
            .iter()
            .map(|n| Resources::new(&[n.as_ref()]))
            .collect::<Result<Vec<_>, _>>()?;
        // Each resource is read in its own lock group; the answers go back in the order
        // the names were given.
        let mut by_group: Vec<Vec<usize>> = vec![Vec::new(); self.groups.members().len()];
        for (k, n) in names.iter().enumerate() {
            if let Some(list) = by_group.get_mut(self.groups.group_of(n.as_ref())) {
                list.push(k);
            }
        }
        let mut out: Vec<Option<Inspection>> = vec![None; resources.len()];
        for (inner, ks) in self.groups.members().iter().zip(by_group) {
            if ks.is_empty() {
                continue;
            }
            let mine: Vec<Resources> = ks
                .iter()
                .map(|k| inner.resources(&resources[*k]))
                .collect::<Result<_, _>>()?;
            for (k, seen) in ks.into_iter().zip(inspect_group(inner, &mine).await) {
                out[k] = Some(seen);
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::invalid("resource", "no inspection for the resource")))
            .collect()
    }
}

/// Reads `resources` on every node of one group and assembles one inspection each.
async fn inspect_group(inner: &Inner, resources: &[Resources]) -> Vec<Inspection> {
    let timeout = inner
        .config
        .node_timeout
        .unwrap_or(DEFAULTS.node_timeout_max);
    let n = inner.nodes.len();
    let span = tracing::debug_span!(
        "quorumlock.inspect",
        resources = resources.len(),
        nodes = n,
        quorum = inner.quorum,
    );
    let per_node = futures::future::join_all(
        inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| peek::read_node(node, i, n, resources, timeout)),
    )
    .instrument(span)
    .await;
    assemble(resources, inner.quorum, &inner.addrs, n, per_node)
}

/// Puts the nodes' answers together into one inspection per resource.
fn assemble(
    resources: &[Resources],
    quorum: usize,
    addrs: &[NodeAddr],
    n: usize,
    per_node: Vec<NodeAnswer>,
) -> Vec<Inspection> {
    let mut out = Vec::with_capacity(resources.len());
    for (k, res) in resources.iter().enumerate() {
        let mut seen: Vec<Seen<&[u8]>> = Vec::with_capacity(n);
        let mut nodes = Vec::with_capacity(n);
        for (i, (addr, answer)) in addrs.iter().zip(&per_node).enumerate() {
            let state = match answer {
                Ok(raws) => match raws.get(k) {
                    Some(raw) => {
                        seen.push(match &raw.value {
                            Some(v) => Seen::Held {
                                holder: v.as_slice(),
                                ttl: raw.ttl,
                            },
                            None => Seen::Free,
                        });
                        NodeState::Answered(NodeReading {
                            holder: raw.value.as_deref().map(TokenPrefix::of),
                            ttl: raw.ttl,
                            fence: raw.fence,
                            queued: raw.queued,
                        })
                    }
                    None => {
                        seen.push(Seen::Unknown);
                        NodeState::Failed("missing reply".to_owned())
                    }
                },
                Err(e) => {
                    seen.push(Seen::Unknown);
                    match e {
                        PeekError::Failed(text) => NodeState::Failed(text.clone()),
                        PeekError::TimedOut => NodeState::TimedOut,
                    }
                }
            };
            nodes.push(NodeInspection {
                addr: addr.clone(),
                herald: res.is_herald(i, n),
                state,
            });
        }
        let verdict = match read(&seen, quorum) {
            Reading::Held { holder, nodes, ttl } => Verdict::Held {
                holder: TokenPrefix::of(holder),
                nodes,
                ttl,
            },
            Reading::Free { nodes } => Verdict::Free { nodes },
            Reading::Unknown => Verdict::Unknown,
        };
        out.push(Inspection {
            resource: res.names().first().cloned().unwrap_or_default(),
            quorum,
            nodes,
            verdict,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_never_show_a_whole_value() {
        let token = "0123456789abcdef0123456789abcdef";
        let p = TokenPrefix::of(token.as_bytes());
        assert_eq!(p.as_str(), "01234567");
        assert_eq!(p.to_string(), "01234567…");
        assert!(p.is_prefix_of(token));
        assert!(!p.is_prefix_of("x1234567"));
        assert_eq!(TokenPrefix::of(b"abcd").as_str(), "ab");
        assert_eq!(TokenPrefix::of(b"x").as_str(), "");
        assert!(!TokenPrefix::of(b"x").is_prefix_of("x"));
        assert_eq!(TokenPrefix::of("ééééé".as_bytes()).as_str(), "éé");
    }
}
