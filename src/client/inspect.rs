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
//! * the read-write lock of the same name ([`NodeReading::rw`]): its writer, its live
//!   readers and the intents of its waiting writers, each with its TTL;
//! * the semaphore of the same name ([`NodeReading::semaphore`]): its live permits and the
//!   configuration `P:c:Q:N` the node stores for it.
//!
//! The mutex, the read-write lock and the semaphore of one name are separate locks; one
//! inspection shows all three, each with its own verdict: [`Inspection::verdict`] (the
//! mutex), [`Inspection::rw_verdict`] (read-held, write-held, free or unknown, plus
//! [`Inspection::waiting_writers`]) and [`Inspection::semaphore_verdict`] (permits held on
//! the semaphore's own quorum, free or unknown); [`Inspection::is_all_free`] says whether
//! nothing holds the name.
//!
//! The answers are put together in an [`Inspection`] with a [`Verdict`] for the mutex:
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
//! One transaction per node, of read-only commands only: `MULTI`, `TIME` (the node's clock,
//! which the sorted sets' expiry scores are read against), then per resource `GET` and
//! `PTTL` of the lock key, `GET` of the fence counter and, on the resource's herald nodes,
//! `ZCARD` of its wait queue; `GET` and `PTTL` of the read-write lock's writer key,
//! `ZRANGE … WITHSCORES` of its readers and of its writers' intents; `ZRANGE … WITHSCORES`
//! of the semaphore's holders and `GET` of its configuration; then `EXEC`. The keys are
//! the locks' own, in the client's namespace. The transaction makes each node's answer one
//! snapshot (a holder is never paired with the next holder's TTL). Nothing is written: no
//! key, no TTL, no queue entry changes, and entries whose time ran out are left for the
//! next request to purge (they are not shown). (Reading a key updates its last access
//! time, which only eviction policies look at; quorumlock's nodes run `noeviction`.) An
//! ACL user for inspection needs `GET`, `PTTL`, `ZCARD`, `ZRANGE`, `TIME`, `MULTI` and
//! `EXEC`. A reply of an unexpected shape (a key of the wrong type, an unparsable score or
//! configuration) fails that node only, with the reason.
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
//! // The read-write lock and the semaphore of the same name:
//! println!("{:?} {:?}", seen.rw_verdict(), seen.semaphore_verdict());
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
use crate::io::peek::{self, Members, NodeAnswer, PeekError, Raw, SemConfig};
use crate::protocol::inspect::{
    Entries, Reading, RwReading, Seen, SemReading, read, read_rw, read_semaphore,
};
use crate::protocol::tally::quorum as majority;

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

/// What the nodes together say about one name: its mutex, its read-write lock and its
/// semaphore (see the [module docs](self)).
///
/// `Display` prints one line with every kind that is not free, separated by `; `
/// ([`verdict_lines`](Inspection::verdict_lines)): `orders:42: held by 3f2a9c1b… on 5/5
/// nodes (quorum 3), 8.2s left`, `catalog: read-held by 2 readers on 5/5 nodes (quorum 3),
/// 9.6s left; 1 writer waiting`, `pool: semaphore: 2 of 2 permits held (quorum 4), 29.1s
/// left`; or `free on 5/5 nodes (quorum 3)` when none is held, and `unknown: only 2/5 nodes
/// answered (quorum 3)` when too few nodes answered.
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
    rw_verdict: RwVerdict,
    waiting_writers: usize,
    semaphore_verdict: SemaphoreVerdict,
    semaphore_config: Option<SemaphoreConfig>,
    semaphore_quorum: usize,
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
    rw: RwNodeReading,
    semaphore: SemaphoreNodeReading,
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

    /// What this node holds for the read-write lock of the same name: its writer, its
    /// readers and the intents of its waiting writers.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// for r in seen.nodes().iter().filter_map(|n| n.reading()) {
    ///     println!("{} readers, writer {:?}", r.rw().readers().len(), r.rw().writer());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn rw(&self) -> &RwNodeReading {
        &self.rw
    }

    /// What this node holds for the semaphore of the same name: its holders and its
    /// stored configuration.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// for r in seen.nodes().iter().filter_map(|n| n.reading()) {
    ///     let s = r.semaphore();
    ///     println!("{} of {:?} entries", s.holders().len(), s.config().map(|c| c.per_node_limit()));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self) -> &SemaphoreNodeReading {
        &self.semaphore
    }

    /// Whether this node holds nothing of any kind for the name: no lock key, no writer,
    /// no live reader, no waiting writer, no live permit (a fence counter or a wait queue
    /// does not count).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// let empty = seen.nodes().iter().filter(|n| n.reading().is_some_and(|r| r.is_empty())).count();
    /// # let _ = empty;
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.holder.is_none() && self.rw.is_free() && self.semaphore.holders.is_empty()
    }
}

/// A live entry of a read-write lock or a semaphore on one node: a reader, a waiting
/// writer's intent, or a permit. Entries whose time ran out (the next request on the node
/// purges them) are not shown.
///
/// `Display` prints `3f2a9c1b… 8.2s`.
///
/// # Example
///
/// ```no_run
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// let reader = locks.try_read_lock("catalog", Duration::from_secs(10)).await?;
/// let seen = locks.inspect("catalog").await?;
/// let node = seen.nodes()[0].reading().expect("answered");
/// let entry = &node.rw().readers()[0];
/// assert!(entry.id().is_prefix_of(reader.token()));
/// assert!(entry.ttl() <= Duration::from_secs(10));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    id: TokenPrefix,
    ttl: Duration,
}

impl Entry {
    /// Whose entry: a reader's or a permit's token prefix, or the start of a waiting
    /// writer's intent id (never the whole value).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// if let Some(r) = seen.nodes()[0].reading() {
    ///     let ids: Vec<&str> = r.rw().readers().iter().map(|e| e.id().as_str()).collect();
    ///     # let _ = ids;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &TokenPrefix {
        &self.id
    }

    /// How long the entry stays on this node if it is neither extended nor released, by
    /// the node's own clock (whole milliseconds).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// let soonest = seen.nodes().iter().filter_map(|n| n.reading())
    ///     .flat_map(|r| r.semaphore().holders().iter().map(|e| e.ttl())).min();
    /// # let _ = soonest;
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id, Millis(self.ttl))
    }
}

/// What one node holds for a read-write lock (see [`NodeReading::rw`]).
///
/// # Example
///
/// ```no_run
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// let seen = locks.inspect("catalog").await?;
/// for r in seen.nodes().iter().filter_map(|n| n.reading()) {
///     let rw = r.rw();
///     match rw.writer() {
///         Some(w) => println!("writer {w}, ttl {:?}", rw.writer_ttl()),
///         None => println!("{} readers, {} writers waiting", rw.readers().len(), rw.waiting_writers().len()),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RwNodeReading {
    writer: Option<TokenPrefix>,
    writer_ttl: Option<Duration>,
    readers: Vec<Entry>,
    waiting: Vec<Entry>,
}

impl RwNodeReading {
    /// The writer key's holder on this node; `None` when there is none.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// let writer = locks.try_write_lock("catalog", Duration::from_secs(10)).await?;
    /// let seen = locks.inspect("catalog").await?;
    /// let w = seen.nodes()[0].reading().and_then(|r| r.rw().writer().cloned());
    /// assert!(w.is_some_and(|w| w.is_prefix_of(writer.token())));
    /// # Ok(()) }
    /// ```
    pub fn writer(&self) -> Option<&TokenPrefix> {
        self.writer.as_ref()
    }

    /// The writer key's remaining TTL (`PTTL`); `None` when there is no writer, or when
    /// its key has no expiry (not set by quorumlock).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// let ttl = seen.nodes()[0].reading().and_then(|r| r.rw().writer_ttl());
    /// # let _ = ttl;
    /// # Ok(()) }
    /// ```
    pub fn writer_ttl(&self) -> Option<Duration> {
        self.writer_ttl
    }

    /// The live readers on this node, soonest to expire first.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// let most = seen.nodes().iter().filter_map(|n| Some(n.reading()?.rw().readers().len())).max();
    /// # let _ = most;
    /// # Ok(()) }
    /// ```
    pub fn readers(&self) -> &[Entry] {
        &self.readers
    }

    /// The live intents of writers waiting for the lock on this node (a waiting writer
    /// registers one on each node that refused it; new readers are refused there while it
    /// lives), soonest to lapse first.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// let blocked = seen.nodes().iter().filter(|n| n.reading().is_some_and(|r| !r.rw().waiting_writers().is_empty())).count();
    /// # let _ = blocked;
    /// # Ok(()) }
    /// ```
    pub fn waiting_writers(&self) -> &[Entry] {
        &self.waiting
    }

    /// Whether the node holds no writer, no live reader and no waiting writer.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("catalog").await?;
    /// let idle = seen.nodes().iter().all(|n| n.reading().is_some_and(|r| r.rw().is_free()));
    /// # let _ = idle;
    /// # Ok(()) }
    /// ```
    pub fn is_free(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.waiting.is_empty()
    }
}

/// What one node holds for a semaphore (see [`NodeReading::semaphore`]).
///
/// # Example
///
/// ```no_run
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// let seen = locks.inspect("api-quota").await?;
/// for node in seen.nodes() {
///     if let Some(s) = node.reading().map(|r| r.semaphore()) {
///         match s.config() {
///             Some(c) => println!("{}: {} of {} entries", node.addr(), s.holders().len(), c.per_node_limit()),
///             None => println!("{}: no permit held", node.addr()),
///         }
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SemaphoreNodeReading {
    holders: Vec<Entry>,
    config: Option<SemaphoreConfig>,
}

impl SemaphoreNodeReading {
    /// The live permits on this node, soonest to expire first. A node admits at most the
    /// per-node limit of them ([`SemaphoreConfig::per_node_limit`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// let loads: Vec<usize> = seen.nodes().iter().filter_map(|n| Some(n.reading()?.semaphore().holders().len())).collect();
    /// # let _ = loads;
    /// # Ok(()) }
    /// ```
    pub fn holders(&self) -> &[Entry] {
        &self.holders
    }

    /// The configuration the node stores for the semaphore (`P:c:Q:N`); `None` when it
    /// stores none (it expires with the node's last permit).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// let stored = seen.nodes()[0].reading().and_then(|r| r.semaphore().config().map(|c| c.to_string()));
    /// # let _ = stored;
    /// # Ok(()) }
    /// ```
    pub fn config(&self) -> Option<&SemaphoreConfig> {
        self.config.as_ref()
    }
}

/// A semaphore's configuration, as each node stores it while it holds permits: `P:c:Q:N`,
/// the permits, the per-node limit, the quorum and the number of nodes the semaphore's
/// clients use ([`Semaphore`](crate::Semaphore)).
///
/// `Display` prints `P:c:Q:N`, as stored.
///
/// # Example
///
/// ```no_run
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// let pool = locks.semaphore("api-quota", 2)?;
/// let permit = pool.try_acquire(Duration::from_secs(10)).await?;
/// let seen = locks.inspect("api-quota").await?;
/// let config = seen.semaphore_config().expect("a permit is held");
/// assert_eq!(config.permits(), pool.permits());
/// assert_eq!(config.per_node_limit(), pool.per_node_limit());
/// assert_eq!(config.quorum(), pool.quorum());
/// assert_eq!(config.nodes(), locks.nodes().len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SemaphoreConfig {
    permits: u32,
    limit: u32,
    quorum: usize,
    nodes: usize,
}

impl SemaphoreConfig {
    /// `P`, the number of permits.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let permits = locks.inspect("api-quota").await?.semaphore_config().map(|c| c.permits());
    /// # let _ = permits;
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// `c`, the per-node limit: how many live permits one node admits.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let limit = locks.inspect("api-quota").await?.semaphore_config().map(|c| c.per_node_limit());
    /// # let _ = limit;
    /// # Ok(()) }
    /// ```
    pub fn per_node_limit(&self) -> u32 {
        self.limit
    }

    /// `Q`, the grants a permit needs.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let q = locks.inspect("api-quota").await?.semaphore_config().map(|c| c.quorum());
    /// # let _ = q;
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// `N`, the number of nodes of the semaphore's clients.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let Some(c) = locks.inspect("api-quota").await?.semaphore_config() {
    ///     assert_eq!(c.nodes(), locks.nodes().len(), "used with other nodes");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

impl From<SemConfig> for SemaphoreConfig {
    fn from(c: SemConfig) -> SemaphoreConfig {
        SemaphoreConfig {
            permits: c.permits,
            limit: c.limit,
            quorum: c.quorum,
            nodes: c.nodes,
        }
    }
}

impl fmt::Display for SemaphoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.permits, self.limit, self.quorum, self.nodes
        )
    }
}

/// The verdict on the read-write lock of an [`Inspection`]'s name
/// ([`Inspection::rw_verdict`]): a writer or readers on a quorum, as for the mutex.
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::RwVerdict;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// match locks.inspect("catalog").await?.rw_verdict() {
///     RwVerdict::WriteHeld { writer, nodes, .. } => println!("written by {writer} on {nodes} nodes"),
///     RwVerdict::ReadHeld { readers, ttl, .. } => println!("{readers} readers, {ttl:?} more"),
///     RwVerdict::Free { .. } => println!("free"),
///     RwVerdict::Unknown | _ => println!("cannot tell"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RwVerdict {
    /// One writer's key is on at least a quorum of nodes.
    WriteHeld {
        /// The writer.
        writer: TokenPrefix,
        /// On how many nodes its key is.
        nodes: usize,
        /// How long its key stays on a quorum if nothing changes (`None`: keys that never
        /// expire, not set by quorumlock).
        ttl: Option<Duration>,
    },
    /// At least one reader's entry is on a quorum of nodes (and no writer's).
    ReadHeld {
        /// How many readers are on a quorum.
        readers: usize,
        /// On how many nodes at least one of them is.
        nodes: usize,
        /// How long the lock stays read-held if no reader extends or releases: the longest
        /// of the readers' quorum TTLs.
        ttl: Duration,
    },
    /// Neither a writer nor a reader on at least a quorum of nodes: no writer key and no
    /// live reader on that many nodes. A waiting writer does not hold the lock
    /// ([`Inspection::waiting_writers`] counts them).
    Free {
        /// On how many nodes there is neither.
        nodes: usize,
    },
    /// Neither: fewer than a quorum of nodes answered, or the answers are split.
    Unknown,
}

impl fmt::Display for RwVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RwVerdict::WriteHeld { writer, nodes, .. } => {
                write!(f, "write-held by {writer} on {nodes} nodes")
            }
            RwVerdict::ReadHeld { readers, nodes, .. } => {
                write!(
                    f,
                    "read-held by {} on {nodes} nodes",
                    Count(*readers, "reader")
                )
            }
            RwVerdict::Free { nodes } => write!(f, "free on {nodes} nodes"),
            RwVerdict::Unknown => f.write_str("unknown"),
        }
    }
}

/// The verdict on the semaphore of an [`Inspection`]'s name
/// ([`Inspection::semaphore_verdict`]). A holder holds a permit once its entries are on
/// the semaphore's own quorum of nodes ([`Inspection::semaphore_quorum`]: the stored one,
/// which can be above the majority).
///
/// # Example
///
/// ```no_run
/// use quorumlock::inspect::SemaphoreVerdict;
///
/// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// match locks.inspect("api-quota").await?.semaphore_verdict() {
///     SemaphoreVerdict::Held { holders, permits: Some(p), .. } => println!("{holders} of {p} permits held"),
///     SemaphoreVerdict::Held { holders, .. } => println!("{holders} permits held"),
///     SemaphoreVerdict::Free { .. } => println!("no permit held"),
///     SemaphoreVerdict::Unknown | _ => println!("cannot tell"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SemaphoreVerdict {
    /// At least one holder's entries are on the semaphore's quorum of nodes.
    Held {
        /// How many holders are (those whose entries are on nodes that did not answer are
        /// not counted).
        holders: usize,
        /// `P`, from the stored configuration; `None` when no answering node stores one.
        permits: Option<u32>,
        /// The semaphore's quorum the holders were counted with.
        quorum: usize,
        /// How long the semaphore stays held if no holder extends or releases: the longest
        /// of the holders' quorum TTLs.
        ttl: Duration,
    },
    /// No holder fits: at least `N − Q + 1` nodes have no live permit (`Q` the
    /// semaphore's quorum).
    Free {
        /// How many nodes have no live permit.
        nodes: usize,
    },
    /// Neither: too few nodes answered, or the answers leave it open.
    Unknown,
}

impl fmt::Display for SemaphoreVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SemaphoreVerdict::Held {
                holders,
                permits: Some(p),
                quorum,
                ..
            } => write!(
                f,
                "{holders} of {} held (quorum {quorum})",
                Count(*p as usize, "permit")
            ),
            SemaphoreVerdict::Held {
                holders, quorum, ..
            } => write!(f, "{} held (quorum {quorum})", Count(*holders, "permit")),
            SemaphoreVerdict::Free { nodes } => write!(f, "free on {nodes} nodes"),
            SemaphoreVerdict::Unknown => f.write_str("unknown"),
        }
    }
}

/// `1 reader`, `2 readers`.
struct Count(usize, &'static str);

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.0 == 1 { "" } else { "s" };
        write!(f, "{} {}{s}", self.0, self.1)
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
        let rw = &r.rw;
        match (&rw.writer, rw.writer_ttl) {
            (Some(w), Some(t)) => write!(f, "; writer {w}, ttl {}", Millis(t))?,
            (Some(w), None) => write!(f, "; writer {w}, no expiry")?,
            (None, _) => {}
        }
        if !rw.readers.is_empty() {
            write!(
                f,
                "; {}: {}",
                Count(rw.readers.len(), "reader"),
                List(&rw.readers)
            )?;
        }
        if !rw.waiting.is_empty() {
            write!(f, "; writers waiting: {}", List(&rw.waiting))?;
        }
        let sem = &r.semaphore;
        if !sem.holders.is_empty() || sem.config.is_some() {
            write!(f, "; permits {}", sem.holders.len())?;
            if let Some(c) = &sem.config {
                write!(f, "/{} (stored {c})", c.limit)?;
            }
            if !sem.holders.is_empty() {
                write!(f, ": {}", List(&sem.holders))?;
            }
        }
        Ok(())
    }
}

/// Entries separated by `, `.
struct List<'a>(&'a [Entry]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{e}")?;
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

    /// The mutex's verdict (see [`Verdict`]); the other kinds':
    /// [`rw_verdict`](Self::rw_verdict), [`semaphore_verdict`](Self::semaphore_verdict).
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

    /// The verdict on the read-write lock of the same name (see [`RwVerdict`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::inspect::RwVerdict;
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let RwVerdict::ReadHeld { readers, .. } = locks.inspect("catalog").await?.rw_verdict() {
    ///     println!("{readers} readers hold the catalog");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn rw_verdict(&self) -> &RwVerdict {
        &self.rw_verdict
    }

    /// How many distinct writers wait for the read-write lock: the live intents seen on
    /// the nodes that answered. While one lives on a node, that node refuses new readers.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if locks.inspect("catalog").await?.waiting_writers() > 0 {
    ///     println!("new readers wait: a writer goes first");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn waiting_writers(&self) -> usize {
        self.waiting_writers
    }

    /// The verdict on the semaphore of the same name (see [`SemaphoreVerdict`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::inspect::SemaphoreVerdict;
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// if let SemaphoreVerdict::Held { holders, .. } = seen.semaphore_verdict() {
    ///     println!("{holders} permits held");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn semaphore_verdict(&self) -> &SemaphoreVerdict {
        &self.semaphore_verdict
    }

    /// The semaphore's configuration as most of the answering nodes that store one store
    /// it; `None` when none does (no permit is held on them).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if let Some(c) = locks.inspect("api-quota").await?.semaphore_config() {
    ///     println!("{} permits, {} per node, quorum {}", c.permits(), c.per_node_limit(), c.quorum());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn semaphore_config(&self) -> Option<&SemaphoreConfig> {
        self.semaphore_config.as_ref()
    }

    /// The quorum the semaphore's verdict was read with: the stored configuration's
    /// ([`semaphore_config`](Self::semaphore_config)) when it is between the majority and
    /// the number of nodes, otherwise the majority ([`quorum`](Self::quorum)).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// let seen = locks.inspect("api-quota").await?;
    /// assert!(seen.semaphore_quorum() >= seen.quorum());
    /// # Ok(()) }
    /// ```
    pub fn semaphore_quorum(&self) -> usize {
        self.semaphore_quorum
    }

    /// Whether every kind of lock of the name is free on a quorum: the mutex, the
    /// read-write lock (with no writer waiting) and the semaphore.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// if locks.inspect("catalog").await?.is_all_free() {
    ///     println!("nothing holds the name");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_all_free(&self) -> bool {
        self.is_free()
            && matches!(self.rw_verdict, RwVerdict::Free { .. })
            && self.waiting_writers == 0
            && matches!(self.semaphore_verdict, SemaphoreVerdict::Free { .. })
    }

    fn readings(&self) -> impl Iterator<Item = &NodeReading> {
        self.nodes.iter().filter_map(NodeInspection::reading)
    }
}

impl fmt::Display for Inspection {
    /// `<resource>: ` then the [verdict lines](Inspection::verdict_lines), separated by
    /// `; `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.resource, self.verdict_lines().join("; "))
    }
}

impl Inspection {
    /// The verdict in words: one line per kind that is not free (the mutex, the read-write
    /// lock with its waiting writers, the semaphore), or one line saying every kind is free
    /// on `k/N` nodes (the fewest any kind is free on), or one saying the verdict is
    /// unknown because fewer than a quorum of nodes answered. The CLI's `inspect` prints
    /// these as its `verdict:` lines; [`Display`](fmt::Display) joins them.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// for line in locks.inspect("catalog").await?.verdict_lines() {
    ///     println!("verdict: {line}"); // e.g. "read-held by 2 readers on 3/3 nodes (quorum 2), 9.6s left"
    /// }
    /// # Ok(()) }
    /// ```
    pub fn verdict_lines(&self) -> Vec<String> {
        let n = self.nodes.len();
        let q = self.quorum;
        let answered = self.answered();
        if answered < q {
            return vec![format!(
                "unknown: only {answered}/{n} nodes answered (quorum {q})"
            )];
        }
        let split = |what: &str| {
            format!(
                "{what}unknown: neither one holder nor \"free\" on a quorum of the \
                 {answered}/{n} nodes that answered (quorum {q})"
            )
        };
        let left = |ttl: Option<Duration>| match ttl {
            Some(t) => format!("{} left", Millis(t)),
            None => "no expiry".to_owned(),
        };
        let mut lines = Vec::new();
        match &self.verdict {
            Verdict::Held { holder, nodes, ttl } => lines.push(format!(
                "held by {holder} on {nodes}/{n} nodes (quorum {q}), {}",
                left(*ttl)
            )),
            Verdict::Free { .. } => {}
            Verdict::Unknown => lines.push(split("")),
        }
        let mut rw = match &self.rw_verdict {
            RwVerdict::WriteHeld { writer, nodes, ttl } => Some(format!(
                "write-held by {writer} on {nodes}/{n} nodes (quorum {q}), {}",
                left(*ttl)
            )),
            RwVerdict::ReadHeld {
                readers,
                nodes,
                ttl,
            } => Some(format!(
                "read-held by {} on {nodes}/{n} nodes (quorum {q}), {}",
                Count(*readers, "reader"),
                left(Some(*ttl))
            )),
            RwVerdict::Free { .. } => None,
            RwVerdict::Unknown => Some(split("read-write lock ")),
        };
        if self.waiting_writers > 0 {
            let waiting = format!("{} waiting", Count(self.waiting_writers, "writer"));
            rw = Some(match rw {
                Some(r) => format!("{r}; {waiting}"),
                None => format!("read-write lock: {waiting}"),
            });
        }
        lines.extend(rw);
        match &self.semaphore_verdict {
            v @ SemaphoreVerdict::Held { ttl, .. } => {
                lines.push(format!("semaphore: {v}, {}", left(Some(*ttl))));
            }
            SemaphoreVerdict::Free { .. } => {}
            SemaphoreVerdict::Unknown => lines.push(format!(
                "semaphore unknown: neither a holder on its quorum ({}) nor room for none \
                 (quorum {q})",
                self.semaphore_quorum
            )),
        }
        if lines.is_empty() {
            let free = [self.verdict_free(), self.rw_free(), self.semaphore_free()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(0);
            lines.push(format!("free on {free}/{n} nodes (quorum {q})"));
        }
        lines
    }
}

impl Inspection {
    fn verdict_free(&self) -> Option<usize> {
        match self.verdict {
            Verdict::Free { nodes } => Some(nodes),
            _ => None,
        }
    }
    fn rw_free(&self) -> Option<usize> {
        match self.rw_verdict {
            RwVerdict::Free { nodes } => Some(nodes),
            _ => None,
        }
    }
    fn semaphore_free(&self) -> Option<usize> {
        match self.semaphore_verdict {
            SemaphoreVerdict::Free { nodes } => Some(nodes),
            _ => None,
        }
    }
}

impl Redlock {
    /// Reads, on every node, who holds `resource`, its remaining TTL, its fence counter and
    /// its wait queue's length, and the readers, writer, waiting writers and permits of the
    /// read-write lock and the semaphore of the same name, **without taking or touching
    /// any of them**, and says for each kind whether it is held on a quorum, free on a
    /// quorum, or unknown (see the [`inspect` module](crate::client::inspect)).
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
        // Each node's raw answer for this resource, or why there is none.
        let raws: Vec<Result<&Raw, PeekError>> = per_node
            .iter()
            .map(|answer| match answer {
                Ok(raws) => raws
                    .get(k)
                    .ok_or_else(|| PeekError::Failed("missing reply".to_owned())),
                Err(e) => Err(e.clone()),
            })
            .collect();
        let nodes = addrs
            .iter()
            .zip(&raws)
            .enumerate()
            .map(|(i, (addr, raw))| NodeInspection {
                addr: addr.clone(),
                herald: res.is_herald(i, n),
                state: match raw {
                    Ok(raw) => NodeState::Answered(reading(raw)),
                    Err(PeekError::Failed(text)) => NodeState::Failed(text.clone()),
                    Err(PeekError::TimedOut) => NodeState::TimedOut,
                },
            })
            .collect();
        let answered: Vec<Option<&Raw>> = raws.iter().map(|r| r.as_ref().ok().copied()).collect();
        let (rw_verdict, waiting_writers) = rw_verdict(&answered, quorum);
        let (semaphore_verdict, semaphore_config, semaphore_quorum) =
            semaphore_verdict(&answered, quorum, n);
        out.push(Inspection {
            resource: res.names().first().cloned().unwrap_or_default(),
            quorum,
            nodes,
            verdict: mutex_verdict(&answered, quorum),
            rw_verdict,
            waiting_writers,
            semaphore_verdict,
            semaphore_config,
            semaphore_quorum,
        });
    }
    out
}

/// One node's reading, with prefixes in place of whole values.
fn reading(raw: &Raw) -> NodeReading {
    NodeReading {
        holder: raw.value.as_deref().map(TokenPrefix::of),
        ttl: raw.ttl,
        fence: raw.fence,
        queued: raw.queued,
        rw: RwNodeReading {
            writer: raw.rw.writer.as_ref().map(|(w, _)| TokenPrefix::of(w)),
            writer_ttl: raw.rw.writer.as_ref().and_then(|(_, t)| *t),
            readers: entries(&raw.rw.readers),
            waiting: entries(&raw.rw.intents),
        },
        semaphore: SemaphoreNodeReading {
            holders: entries(&raw.sem.holders),
            config: raw.sem.config.map(SemaphoreConfig::from),
        },
    }
}

fn entries(members: &Members) -> Vec<Entry> {
    members
        .iter()
        .map(|(m, ttl)| Entry {
            id: TokenPrefix::of(m),
            ttl: *ttl,
        })
        .collect()
}

/// The mutex's verdict (the lock key).
fn mutex_verdict(answered: &[Option<&Raw>], quorum: usize) -> Verdict {
    let seen: Vec<Seen<&[u8]>> = answered
        .iter()
        .map(|raw| match raw {
            Some(Raw {
                value: Some(v),
                ttl,
                ..
            }) => Seen::Held {
                holder: v.as_slice(),
                ttl: *ttl,
            },
            Some(_) => Seen::Free,
            None => Seen::Unknown,
        })
        .collect();
    match read(&seen, quorum) {
        Reading::Held { holder, nodes, ttl } => Verdict::Held {
            holder: TokenPrefix::of(holder),
            nodes,
            ttl,
        },
        Reading::Free { nodes } => Verdict::Free { nodes },
        Reading::Unknown => Verdict::Unknown,
    }
}

/// The read-write lock's verdict, and how many distinct writers wait.
fn rw_verdict(answered: &[Option<&Raw>], quorum: usize) -> (RwVerdict, usize) {
    let seen: Vec<Entries<&[u8]>> = answered
        .iter()
        .map(|raw| match raw {
            Some(raw) => Entries::Answered {
                writer: raw.rw.writer.as_ref().map(|(w, t)| (w.as_slice(), *t)),
                members: borrowed(&raw.rw.readers),
            },
            None => Entries::Unknown,
        })
        .collect();
    let mut intents: Vec<&[u8]> = answered
        .iter()
        .flatten()
        .flat_map(|raw| raw.rw.intents.iter().map(|(id, _)| id.as_slice()))
        .collect();
    intents.sort_unstable();
    intents.dedup();
    let verdict = match read_rw(&seen, quorum) {
        RwReading::Write { holder, nodes, ttl } => RwVerdict::WriteHeld {
            writer: TokenPrefix::of(holder),
            nodes,
            ttl,
        },
        RwReading::Read {
            readers,
            nodes,
            ttl,
        } => RwVerdict::ReadHeld {
            readers,
            nodes,
            ttl,
        },
        RwReading::Free { nodes } => RwVerdict::Free { nodes },
        RwReading::Unknown => RwVerdict::Unknown,
    };
    (verdict, intents.len())
}

/// The semaphore's verdict, the configuration most answering nodes store, and the quorum
/// the holders were counted with: the stored one when it is a valid quorum for `n` nodes,
/// otherwise the majority.
fn semaphore_verdict(
    answered: &[Option<&Raw>],
    quorum: usize,
    n: usize,
) -> (SemaphoreVerdict, Option<SemaphoreConfig>, usize) {
    let mut configs: Vec<(SemConfig, usize)> = Vec::new();
    for c in answered.iter().flatten().filter_map(|raw| raw.sem.config) {
        match configs.iter_mut().find(|(x, _)| *x == c) {
            Some((_, count)) => *count += 1,
            None => configs.push((c, 1)),
        }
    }
    let config = configs
        .iter()
        .max_by_key(|(_, count)| *count)
        .map(|(c, _)| SemaphoreConfig::from(*c));
    let sem_quorum = config
        .map(|c| c.quorum)
        .filter(|q| (majority(n).max(quorum)..=n).contains(q))
        .unwrap_or(quorum);
    let seen: Vec<Entries<&[u8]>> = answered
        .iter()
        .map(|raw| match raw {
            Some(raw) => Entries::Answered {
                writer: None,
                members: borrowed(&raw.sem.holders),
            },
            None => Entries::Unknown,
        })
        .collect();
    let verdict = match read_semaphore(&seen, sem_quorum) {
        SemReading::Held { holders, ttl } => SemaphoreVerdict::Held {
            holders,
            permits: config.map(|c| c.permits),
            quorum: sem_quorum,
            ttl,
        },
        SemReading::Free { nodes } => SemaphoreVerdict::Free { nodes },
        SemReading::Unknown => SemaphoreVerdict::Unknown,
    };
    (verdict, config, sem_quorum)
}

fn borrowed(members: &Members) -> Vec<(&[u8], Duration)> {
    members.iter().map(|(m, t)| (m.as_slice(), *t)).collect()
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
