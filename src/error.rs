//! Errors: one [`Error`] enum, with what every node answered when the error
//! comes from a vote.
//!
//! The variants tell apart the cases a caller acts on differently:
//!
//! | variant | what happened | what to do |
//! | --- | --- | --- |
//! | [`Error::Held`] | enough nodes answered, but some other holder owns the resource | wait, retry later, or give up |
//! | [`Error::NoQuorum`] | too few nodes answered (down, paused, cut off, or replied with an error) | check the nodes; retrying may help |
//! | [`Error::Timeout`] | the time budget ran out: the validity was used up before the quorum, or the maximum wait passed | retry with a longer TTL or wait |
//! | [`Error::Lost`] | the lock expired or could no longer be confirmed on a quorum | stop the work the lock protected |
//! | [`Error::Config`] | the builder was given an invalid configuration | fix the configuration |
//! | [`Error::InvalidInput`] | a call was given an invalid argument (empty resource, zero TTL, …) | fix the call |
//! | [`Error::RandomSource`] | the operating system's random number generator failed, so no lock token could be drawn | fix the host; nothing was sent to any node |
//! | [`Error::PermitsMismatch`] | a semaphore is in use with another number of permits (or quorum, or node count) | use the same settings in every client; nothing was written |
//! | [`Error::GroupMapMismatch`] | a node records another group map: clients with other lock groups are running | give every client the same groups; nothing was sent |
//!
//! Errors that come from a vote carry a [`Votes`] value: the answer of every node, in the
//! order the nodes were configured. An error's message names the resource(s) and says what
//! the nodes did, like
//! `"orders:42" is held by another owner: 2 of 5 nodes granted (3 needed); 2 held by
//! another owner, 1 did not answer in time`; the alternate form (`{:#}`) adds one line per
//! node with its cause (an error's text, such as a TLS certificate the node refused).
//!
//! No error ever prints a password from a node URL or a whole lock token.

use std::fmt;
use std::time::Duration;

use crate::addr::NodeAddr;

/// A specialized `Result` for quorumlock operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, extending or releasing a lock.
///
/// The enum is `#[non_exhaustive]`: match on [`Error::kind`] or use the predicates
/// ([`Error::is_held`], [`Error::is_retryable`], …) to stay compatible with future versions.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::{Error, Redlock};
///
/// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// match locks.try_lock("orders:42", Duration::from_secs(10)).await {
///     Ok(lock) => lock.release().await?,
///     Err(Error::Held(votes)) => println!("busy: {votes}"),
///     Err(e) if e.is_retryable() => println!("try again later: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The resource is held by someone else: enough nodes answered for a quorum, but too
    /// many of them already hold another owner's token.
    Held(Votes),
    /// Too few nodes answered with a grant for a quorum to be possible (nodes down,
    /// paused, unreachable, or answering with errors).
    NoQuorum(Votes),
    /// A time budget ran out: the validity was used up during the acquisition, or the
    /// maximum wait of the retry policy passed.
    Timeout(Timeout),
    /// The lock was lost: it expired before the call, or an extension could not be
    /// confirmed before the validity ran out.
    Lost(Lost),
    /// The builder was given an invalid configuration.
    Config(ConfigError),
    /// A call was given an invalid argument.
    InvalidInput(InvalidInput),
    /// The operating system's random number generator failed, so no lock token could be
    /// drawn. Nothing was sent to any node. This is a fault of the host, not of the call:
    /// the lock is never taken with a weaker token instead.
    RandomSource(RandomSourceError),
    /// A semaphore is in use by clients with another configuration (permits, per-node
    /// limit, quorum or number of nodes): the nodes that hold its permits refused, and
    /// nothing was written on them. Every client of one semaphore must use the same
    /// settings, or the bound on holders would not hold.
    PermitsMismatch(PermitsMismatch),
    /// A node records another group map (other lock groups, or another version of them;
    /// see [`RedlockBuilder::group`](crate::RedlockBuilder::group)): clients that route
    /// resources differently are running, and two of them could hold one resource in two
    /// groups at once. This client refuses every acquisition from then on; nothing is
    /// sent for the refused call.
    GroupMapMismatch(GroupMapMismatch),
}

impl fmt::Display for Error {
    /// One line that names the resource(s) and says what each node did; the alternate
    /// form (`{:#}`) adds one line per node with its cause (an error's text, a timeout).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let alt = f.alternate();
        let votes = |f: &mut fmt::Formatter<'_>, v: &Votes| {
            if alt {
                write!(f, "{v:#}")
            } else {
                write!(f, "{v}")
            }
        };
        match self {
            Error::Held(v) => {
                write!(f, "{} is held by another owner: ", Names(&v.resources))?;
                votes(f, v)
            }
            Error::NoQuorum(v) => {
                write!(f, "no quorum for {}: ", Names(&v.resources))?;
                votes(f, v)
            }
            Error::Timeout(t) => {
                t.headline(f)?;
                if let Some(v) = &t.votes {
                    f.write_str("; last attempt: ")?;
                    votes(f, v)?;
                }
                Ok(())
            }
            Error::Lost(l) => {
                l.headline(f)?;
                if let Some(v) = &l.votes {
                    f.write_str("; ")?;
                    votes(f, v)?;
                }
                Ok(())
            }
            Error::Config(e) => write!(f, "invalid configuration: {e}"),
            Error::InvalidInput(e) => write!(f, "invalid input: {e}"),
            Error::RandomSource(e) => write!(f, "{e}"),
            Error::PermitsMismatch(e) => {
                if alt {
                    write!(f, "{e:#}")
                } else {
                    write!(f, "{e}")
                }
            }
            Error::GroupMapMismatch(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A lost lock is an [`Error::Lost`]: `return Err(kept.lost().await.into())`.
impl From<Lost> for Error {
    fn from(lost: Lost) -> Error {
        Error::Lost(lost)
    }
}

impl std::error::Error for Lost {}

/// Resource names as an error message says them: `"a"`, `"a", "b"`, or `the resource`
/// when the error was made before they were known.
struct Names<'a>(&'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("the resource");
        }
        for (i, name) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name:?}")?;
        }
        Ok(())
    }
}

/// The kind of an [`Error`], for matching without the payload.
///
/// # Example
///
/// ```
/// use quorumlock::{Error, ErrorKind};
/// fn should_page_someone(e: &Error) -> bool {
///     matches!(e.kind(), ErrorKind::NoQuorum | ErrorKind::Config)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::Held`].
    Held,
    /// See [`Error::NoQuorum`].
    NoQuorum,
    /// See [`Error::Timeout`].
    Timeout,
    /// See [`Error::Lost`].
    Lost,
    /// See [`Error::Config`].
    Config,
    /// See [`Error::InvalidInput`].
    InvalidInput,
    /// See [`Error::RandomSource`].
    RandomSource,
    /// See [`Error::PermitsMismatch`].
    PermitsMismatch,
    /// See [`Error::GroupMapMismatch`].
    GroupMapMismatch,
}

impl Error {
    /// The kind of this error.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::{Error, ErrorKind};
    /// # fn f(e: Error) {
    /// if e.kind() == ErrorKind::Held { /* someone else has it */ }
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Held(_) => ErrorKind::Held,
            Error::NoQuorum(_) => ErrorKind::NoQuorum,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::Lost(_) => ErrorKind::Lost,
            Error::Config(_) => ErrorKind::Config,
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::RandomSource(_) => ErrorKind::RandomSource,
            Error::PermitsMismatch(_) => ErrorKind::PermitsMismatch,
            Error::GroupMapMismatch(_) => ErrorKind::GroupMapMismatch,
        }
    }

    /// `true` when the resource is held by another owner.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) -> bool {
    /// e.is_held()
    /// # }
    /// ```
    pub fn is_held(&self) -> bool {
        matches!(self, Error::Held(_))
    }

    /// `true` when the lock was lost or had expired.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) -> bool {
    /// e.is_lost()
    /// # }
    /// ```
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost(_))
    }

    /// `true` when the same call may succeed later without any change: the resource was
    /// held, too few nodes answered, or a time budget ran out. Configuration errors,
    /// invalid input and lost locks are not retryable.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) -> bool {
    /// e.is_retryable()
    /// # }
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Held(_) | Error::NoQuorum(_) | Error::Timeout(_)
        )
    }

    /// The answers of every node, when the error comes from a vote.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) {
    /// if let Some(votes) = e.votes() {
    ///     println!("{} of {} nodes granted", votes.granted(), votes.len());
    /// }
    /// # }
    /// ```
    pub fn votes(&self) -> Option<&Votes> {
        match self {
            Error::Held(v) | Error::NoQuorum(v) => Some(v),
            Error::Timeout(t) => t.votes.as_deref(),
            Error::Lost(l) => l.votes.as_deref(),
            Error::PermitsMismatch(m) => Some(m.votes()),
            Error::Config(_)
            | Error::InvalidInput(_)
            | Error::RandomSource(_)
            | Error::GroupMapMismatch(_) => None,
        }
    }

    /// This error, naming `names` as the resources it is about where it did not yet.
    pub(crate) fn about<S: AsRef<str>>(mut self, names: &[S]) -> Error {
        let fill = |into: &mut Vec<String>| {
            if into.is_empty() {
                let mut all: Vec<String> = names.iter().map(|n| n.as_ref().to_owned()).collect();
                all.sort();
                *into = all;
            }
        };
        match &mut self {
            Error::Held(v) | Error::NoQuorum(v) => fill(&mut v.resources),
            Error::Timeout(t) => {
                fill(&mut t.resources);
                if let Some(v) = &mut t.votes {
                    fill(&mut v.resources);
                }
            }
            Error::Lost(l) => {
                fill(&mut l.resources);
                if let Some(v) = &mut l.votes {
                    fill(&mut v.resources);
                }
            }
            Error::Config(_)
            | Error::InvalidInput(_)
            | Error::RandomSource(_)
            | Error::PermitsMismatch(_)
            | Error::GroupMapMismatch(_) => {}
        }
        self
    }

    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Error {
        Error::InvalidInput(InvalidInput {
            what,
            detail: detail.into(),
        })
    }

    /// `Err` unless called within a Tokio runtime (timers and connections need one):
    /// a clear error instead of the panic Tokio would raise.
    pub(crate) fn ensure_runtime() -> Result<(), Error> {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::invalid(
                "runtime",
                "quorumlock must be used within a Tokio runtime (with the time and net drivers enabled)",
            )),
        }
    }

    pub(crate) fn config(field: &'static str, detail: impl Into<String>) -> Error {
        Error::Config(ConfigError {
            field,
            detail: detail.into(),
        })
    }

    pub(crate) fn lost(reason: LostReason, votes: Option<Votes>) -> Error {
        Error::Lost(Lost {
            reason,
            votes: votes.map(Box::new),
            resources: Vec::new(),
        })
    }

    /// A round that reached the quorum with no validity left.
    pub(crate) fn no_validity(waited: Duration, votes: Votes) -> Error {
        Error::Timeout(Timeout {
            budget: TimeoutBudget::Validity,
            waited,
            attempts: 1,
            votes: Some(Box::new(votes)),
            resources: Vec::new(),
        })
    }
}

/// What one node answered in a vote.
///
/// # Example
///
/// ```
/// use quorumlock::NodeOutcome;
/// assert_eq!(NodeOutcome::TimedOut.to_string(), "timed out");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeOutcome {
    /// The node did what was asked: set, extended or deleted our key.
    Granted,
    /// The node refused: the key is held by another owner (on release and extend: the key
    /// no longer holds our token).
    HeldByOther,
    /// The node answered with an error or the connection failed. The text is the error,
    /// without credentials.
    Failed(String),
    /// The node did not answer within the per-node timeout.
    TimedOut,
    /// The decision was already certain before this node answered; its answer was not
    /// waited for (its command may still run, and is cleaned up if needed).
    NotAwaited,
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeOutcome::Granted => f.write_str("granted"),
            NodeOutcome::HeldByOther => f.write_str("held by another owner"),
            NodeOutcome::Failed(e) => write!(f, "failed: {e}"),
            NodeOutcome::TimedOut => f.write_str("timed out"),
            NodeOutcome::NotAwaited => {
                f.write_str("not waited for (the outcome was already decided)")
            }
        }
    }
}

/// One node's answer, with the node's (password-free) address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVote {
    /// The node, as configured (password redacted).
    pub node: NodeAddr,
    /// What it answered.
    pub outcome: NodeOutcome,
}

/// The answers of every node in one vote, in the order the nodes were configured.
///
/// `Display` prints a one-line summary such as `2 of 5 nodes granted (3 needed); 2 held by
/// another owner, 1 did not answer in time`; `{:#}` (alternate) adds one line per node.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// if let Err(e) = locks.try_lock("job", Duration::from_secs(5)).await {
///     if let Some(votes) = e.votes() {
///         for vote in votes.iter() {
///             println!("{}: {}", vote.node, vote.outcome);
///         }
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Votes {
    pub(crate) quorum: usize,
    pub(crate) votes: Vec<NodeVote>,
    pub(crate) elapsed: Duration,
    pub(crate) largest_holder: Option<usize>,
    /// The release ids (a token's first eight characters, as release announcements name
    /// them) of the owners that refused a single-resource acquire (empty otherwise).
    pub(crate) holder_ids: Vec<String>,
    /// The resources the vote was about, when the error reached the caller.
    pub(crate) resources: Vec<String>,
}

impl Votes {
    /// The resources the vote was about (sorted, as the lock names them); empty for a
    /// vote that was not about resources (a check at start-up).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), quorumlock::Error> {
    /// # use std::time::Duration;
    /// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
    /// if let Err(quorumlock::Error::Held(votes)) = locks.try_lock("job", Duration::from_secs(5)).await {
    ///     assert_eq!(votes.resources(), ["job"]);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn resources(&self) -> &[String] {
        &self.resources
    }
    /// The number of grants needed.
    pub fn quorum(&self) -> usize {
        self.quorum
    }
    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.votes.len()
    }
    /// `true` when there are no nodes (never the case for a vote quorumlock made).
    pub fn is_empty(&self) -> bool {
        self.votes.is_empty()
    }
    /// How many nodes granted.
    pub fn granted(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Granted))
    }
    /// How many nodes refused because another owner holds the key.
    pub fn held(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::HeldByOther))
    }
    /// How many nodes failed with an error.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Failed(_)))
    }
    /// How many nodes timed out.
    pub fn timed_out(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::TimedOut))
    }
    /// On how many nodes the most widespread *other* owner holds the key, when the nodes
    /// said who holds it (single-resource acquisitions); `None` when unknown.
    ///
    /// Below the quorum while the attempt failed, no one holds the lock: the votes were
    /// split between contenders (or a failed attempt's keys were not cleaned up yet), and
    /// the resource is about to be free. [`Redlock::lock`](crate::Redlock::lock) then
    /// retries after a short random back-off instead of waiting for a release.
    pub fn largest_holder(&self) -> Option<usize> {
        self.largest_holder
    }
    /// Whether these votes of a failed attempt show that no one holds a quorum
    /// ([`contention::is_split`](crate::protocol::contention::is_split)): the waiters
    /// back off instead of waiting for a release that will not be announced.
    pub(crate) fn is_split(&self) -> bool {
        crate::protocol::contention::is_split(
            self.len(),
            self.granted(),
            self.held(),
            self.largest_holder(),
            self.quorum(),
        )
    }
    /// How long the vote took, from the first request to the decision.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// Every node's answer, in configuration order.
    pub fn iter(&self) -> std::slice::Iter<'_, NodeVote> {
        self.votes.iter()
    }
    fn count(&self, f: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.votes.iter().filter(|v| f(&v.outcome)).count()
    }
}

impl<'a> IntoIterator for &'a Votes {
    type Item = &'a NodeVote;
    type IntoIter = std::slice::Iter<'a, NodeVote>;
    fn into_iter(self) -> Self::IntoIter {
        self.votes.iter()
    }
}

impl Votes {
    /// The answers to a check that guards the vote (the group-map record), when too few
    /// of them allow it: the lock is refused as if the nodes had not answered.
    pub(crate) fn of_check(quorum: usize, votes: Vec<NodeVote>, elapsed: Duration) -> Votes {
        Votes {
            quorum,
            votes,
            elapsed,
            largest_holder: None,
            holder_ids: Vec::new(),
            resources: Vec::new(),
        }
    }

    /// Every node's outcome on one line, for tracing: `addr=outcome; …`.
    pub(crate) fn per_node(&self) -> String {
        let all: Vec<String> = self
            .votes
            .iter()
            .map(|v| format!("{}={}", v.node, v.outcome))
            .collect();
        all.join("; ")
    }
}

impl fmt::Display for Votes {
    /// `2 of 5 nodes granted (3 needed); 2 held by another owner, 1 did not answer in
    /// time`; `{:#}` adds one line per node with what it answered.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} nodes granted ({} needed)",
            self.granted(),
            self.len(),
            self.quorum
        )?;
        let mut sep = "; ";
        for (n, label) in [
            (self.held(), "held by another owner"),
            (self.failed(), "failed"),
            (self.timed_out(), "did not answer in time"),
            (
                self.count(|o| matches!(o, NodeOutcome::NotAwaited)),
                "not waited for (the outcome was already decided)",
            ),
        ] {
            if n > 0 {
                write!(f, "{sep}{n} {label}")?;
                sep = ", ";
            }
        }
        if f.alternate() {
            for v in &self.votes {
                write!(f, "\n  {}: {}", v.node, v.outcome)?;
            }
        }
        Ok(())
    }
}

/// Which time budget ran out; the payload of [`Error::Timeout`].
///
/// # Example
///
/// ```
/// # fn f(e: quorumlock::Error) {
/// if let quorumlock::Error::Timeout(t) = &e {
///     println!("gave up after {:?} and {} attempts", t.waited(), t.attempts());
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeout {
    pub(crate) budget: TimeoutBudget,
    pub(crate) waited: Duration,
    pub(crate) attempts: u32,
    pub(crate) votes: Option<Box<Votes>>,
    pub(crate) resources: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutBudget {
    /// Grants reached the quorum but no validity was left.
    Validity,
    /// The retry policy's maximum wait (or attempt count) was reached.
    MaxWait,
}

impl Timeout {
    /// A lock spanning several lock groups whose parts were all granted, but whose
    /// earliest part had no validity left by the time the last was (it was released);
    /// `elapsed` is the time its parts took (the TTL less the validity left). The parts'
    /// votes are not kept: each part's own attempt succeeded.
    pub(crate) fn spanning(elapsed: std::time::Duration) -> Error {
        Error::Timeout(Timeout {
            budget: TimeoutBudget::Validity,
            waited: elapsed,
            attempts: 1,
            votes: None,
            resources: Vec::new(),
        })
    }

    /// The error of a wait that ran out of its retry policy's attempts or maximum wait:
    /// started at `start`, `attempts` sent, `votes` those of the last one.
    pub(crate) fn gave_up(start: std::time::Instant, attempts: u32, votes: Option<Votes>) -> Error {
        Error::Timeout(Timeout {
            budget: TimeoutBudget::MaxWait,
            waited: start.elapsed(),
            attempts,
            votes: votes.map(Box::new),
            resources: Vec::new(),
        })
    }

    /// `true` when the quorum was reached but the TTL was used up (less the drift)
    /// before it was: the lock was never valid, and was released.
    pub fn is_validity(&self) -> bool {
        self.budget == TimeoutBudget::Validity
    }
    /// `true` when the retry policy's maximum wait or attempt count was reached.
    pub fn is_max_wait(&self) -> bool {
        self.budget == TimeoutBudget::MaxWait
    }
    /// How long the caller waited in total.
    pub fn waited(&self) -> Duration {
        self.waited
    }
    /// How many attempts were made.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
    /// The last attempt's votes, if any.
    pub fn votes(&self) -> Option<&Votes> {
        self.votes.as_deref()
    }
}

impl Timeout {
    fn headline(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = Names(&self.resources);
        match self.budget {
            TimeoutBudget::Validity => write!(
                f,
                "timed out on {names}: a quorum granted it, but no validity was left (it took {:?})",
                self.waited
            ),
            TimeoutBudget::MaxWait => write!(
                f,
                "timed out on {names}: gave up waiting after {:?} and {} attempt(s)",
                self.waited, self.attempts
            ),
        }
    }
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.headline(f)?;
        if let Some(v) = &self.votes {
            if f.alternate() {
                write!(f, "; last attempt: {v:#}")?;
            } else {
                write!(f, "; last attempt: {v}")?;
            }
        }
        Ok(())
    }
}

/// Why a lock is lost; the payload of [`Error::Lost`].
///
/// # Example
///
/// ```
/// # fn f(e: quorumlock::Error) {
/// if let quorumlock::Error::Lost(lost) = &e {
///     if lost.is_expired() { println!("the validity had run out"); }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub(crate) reason: LostReason,
    pub(crate) votes: Option<Box<Votes>>,
    pub(crate) resources: Vec<String>,
}

/// Why a lock was lost: the answer of [`Lost::reason`].
///
/// The cases call for different reactions: a lock that is [`NotHeld`](LostReason::NotHeld)
/// may already be someone else's, so the work it protected must stop at once and may have
/// to be checked; one whose extension failed ([`ExtendFailed`](LostReason::ExtendFailed))
/// points at the nodes; a cap ([`MaxHold`](LostReason::MaxHold),
/// [`MaxExtensions`](LostReason::MaxExtensions)) is the policy working as configured.
///
/// # Example
///
/// ```
/// use quorumlock::{Error, LostReason};
/// fn explain(e: &Error) -> &'static str {
///     match e {
///         Error::Lost(lost) => match lost.reason() {
///             LostReason::NotHeld => "someone else may have it now",
///             LostReason::MaxHold | LostReason::MaxExtensions => "held as long as allowed",
///             _ => "expired",
///         },
///         _ => "not a lost lock",
///     }
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The validity had already run out before the call (release or extend of an expired
    /// lock, or a lock handed to a watchdog after its deadline).
    Expired,
    /// A quorum of nodes no longer holds our token: the keys expired or were deleted, and
    /// another client may hold the resource now.
    NotHeld,
    /// Extending was refused or failed on too many nodes, and the validity (less the
    /// watchdog's safety margin) ran out meanwhile.
    ExtendFailed,
    /// The watchdog's [`max_hold`](crate::Watchdog::max_hold) cap was reached.
    MaxHold,
    /// The watchdog's [`max_extensions`](crate::Watchdog::max_extensions) cap was reached.
    MaxExtensions,
    /// The lock was released (or its guard dropped) by its holder. Only a
    /// [`LostSignal`](crate::LostSignal) that outlived the guard (a spawned task holding a
    /// [`LockContext`](crate::LockContext)) reports it: the work it protects must stop.
    Released,
    /// The watchdog's internal state was left inconsistent by a panic (a poisoned mutex).
    /// The lock is reported lost rather than trusted: it fails closed.
    WatchdogFailed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its validity had already run out",
            LostReason::NotHeld => "a quorum of nodes no longer holds our token",
            LostReason::ExtendFailed => "it could not be extended before it expired",
            LostReason::MaxHold => "the watchdog's maximum hold time was reached",
            LostReason::MaxExtensions => "the watchdog's maximum number of extensions was reached",
            LostReason::Released => "it was released by its holder",
            LostReason::WatchdogFailed => {
                "the watchdog's state was poisoned by a panic (failing closed)"
            }
        })
    }
}

impl Lost {
    /// Why the lock was lost.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) {
    /// if let quorumlock::Error::Lost(lost) = &e {
    ///     println!("lost: {}", lost.reason());
    /// }
    /// # }
    /// ```
    pub fn reason(&self) -> LostReason {
        self.reason
    }

    /// `true` when the lock's validity had already run out.
    pub fn is_expired(&self) -> bool {
        self.reason == LostReason::Expired
    }
    /// The votes of the operation that found the lock lost, if any.
    pub fn votes(&self) -> Option<&Votes> {
        self.votes.as_deref()
    }
}

impl Lost {
    fn headline(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock on {} lost: {}",
            Names(&self.resources),
            self.reason
        )
    }

    /// The lost lock's resources (sorted); empty when not known where it was found lost.
    ///
    /// # Example
    ///
    /// ```
    /// # fn f(e: quorumlock::Error) {
    /// if let quorumlock::Error::Lost(lost) = &e {
    ///     println!("stop the work on {:?}", lost.resources());
    /// }
    /// # }
    /// ```
    pub fn resources(&self) -> &[String] {
        &self.resources
    }
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.headline(f)?;
        if let Some(v) = &self.votes {
            if f.alternate() {
                write!(f, "; {v:#}")?;
            } else {
                write!(f, "; {v}")?;
            }
        }
        Ok(())
    }
}

/// An invalid configuration; names the field and the offending value.
///
/// # Example
///
/// ```no_run
/// # async fn demo() {
/// let err = quorumlock::Redlock::builder(["not a url"]).build().await.unwrap_err();
/// assert!(matches!(err, quorumlock::Error::Config(_)));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub(crate) field: &'static str,
    pub(crate) detail: String,
}

impl ConfigError {
    /// The configuration field that is invalid (`"nodes"`, `"drift_factor"`, …).
    pub fn field(&self) -> &str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// The operating system's random number generator failed; the payload of
/// [`Error::RandomSource`].
///
/// # Example
///
/// ```
/// # fn f(e: quorumlock::Error) {
/// if let quorumlock::Error::RandomSource(err) = &e {
///     eprintln!("cannot draw lock tokens on this host: {err}");
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomSourceError {
    pub(crate) detail: String,
}

impl fmt::Display for RandomSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the operating system's random number generator failed: {}",
            self.detail
        )
    }
}

/// A semaphore used with another configuration; the payload of
/// [`Error::PermitsMismatch`]. Both configurations read `"P:c:Q:N"`: permits, per-node
/// limit, quorum, number of nodes.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// match locks.semaphore("pool", 4)?.try_acquire(Duration::from_secs(5)).await {
///     Err(quorumlock::Error::PermitsMismatch(m)) => {
///         eprintln!("pool is in use as {}, we asked for {}", m.stored(), m.requested());
///     }
///     other => drop(other?),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PermitsMismatch(Box<Mismatch>);

/// What [`PermitsMismatch`] holds (boxed: the error stays small).
#[derive(Debug, Clone)]
struct Mismatch {
    stored: String,
    requested: String,
    votes: Votes,
}

impl PermitsMismatch {
    pub(crate) fn new(stored: String, requested: String, votes: Votes) -> PermitsMismatch {
        PermitsMismatch(Box::new(Mismatch {
            stored,
            requested,
            votes,
        }))
    }

    /// The configuration the nodes hold, `"P:c:Q:N"`.
    pub fn stored(&self) -> &str {
        &self.0.stored
    }

    /// The configuration this client asked with, `"P:c:Q:N"`.
    pub fn requested(&self) -> &str {
        &self.0.requested
    }

    /// Every node's answer.
    pub fn votes(&self) -> &Votes {
        &self.0.votes
    }
}

impl fmt::Display for PermitsMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "semaphore in use with another configuration: stored {} (permits:per-node limit:quorum:nodes), requested {}; nothing was written on the nodes that refused",
            self.0.stored, self.0.requested
        )
    }
}

/// Another group map recorded on a node; the payload of [`Error::GroupMapMismatch`].
/// A map reads `v<version>/<groups>/<hash of the groups' nodes>`; a client with a single
/// group and no version records `unsharded`. A record the client cannot read (a value of
/// another type at the key, an ACL that forbids it) counts as another map, reading
/// `an unreadable record (<the node's error>)`.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// match locks.try_lock("orders:42", Duration::from_secs(5)).await {
///     Err(quorumlock::Error::GroupMapMismatch(m)) => {
///         eprintln!("{} records {}, we route with {}", m.node(), m.recorded(), m.ours());
///     }
///     other => drop(other?),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMapMismatch(Box<MapMismatch>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct MapMismatch {
    node: NodeAddr,
    recorded: String,
    ours: String,
}

impl GroupMapMismatch {
    pub(crate) fn new(node: NodeAddr, recorded: String, ours: String) -> GroupMapMismatch {
        GroupMapMismatch(Box::new(MapMismatch {
            node,
            recorded,
            ours,
        }))
    }

    /// The node that records the other map.
    pub fn node(&self) -> &NodeAddr {
        &self.0.node
    }

    /// The map that node records.
    pub fn recorded(&self) -> &str {
        &self.0.recorded
    }

    /// This client's map (`unsharded` for one group without a version).
    pub fn ours(&self) -> &str {
        &self.0.ours
    }
}

impl fmt::Display for GroupMapMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "group map mismatch: {} records {}, this client routes with {}; clients with different lock groups could hold one resource in two groups, so this client takes no lock (stop the other clients, or give every client the same groups and version)",
            self.0.node, self.0.recorded, self.0.ours
        )
    }
}

/// An invalid argument to a call; names the argument and the offending value.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), quorumlock::Error> {
/// # use std::time::Duration;
/// # let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build().await?;
/// let err = locks.try_lock("", Duration::from_secs(1)).await.unwrap_err();
/// assert!(matches!(err, quorumlock::Error::InvalidInput(_)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidInput {
    pub(crate) what: &'static str,
    pub(crate) detail: String,
}

impl InvalidInput {
    /// The argument that is invalid (`"resource"`, `"ttl"`, …).
    pub fn what(&self) -> &str {
        self.what
    }
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    fn vote(port: u16, outcome: NodeOutcome) -> NodeVote {
        let url = format!("redis://127.0.0.1:{port}");
        let info = url
            .as_str()
            .into_connection_info()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let node = NodeAddr::from_info(&info);
        NodeVote { node, outcome }
    }

    fn votes(outcomes: Vec<NodeOutcome>) -> Votes {
        Votes {
            quorum: outcomes.len() / 2 + 1,
            votes: outcomes
                .into_iter()
                .enumerate()
                .map(|(i, o)| vote(7001 + u16::try_from(i).unwrap_or(0), o))
                .collect(),
            elapsed: Duration::ZERO,
            largest_holder: None,
            holder_ids: Vec::new(),
            resources: Vec::new(),
        }
    }

    #[test]
    fn a_held_resource_is_named_and_each_node_said_in_plain_words() {
        let e = Error::Held(votes(vec![
            NodeOutcome::HeldByOther,
            NodeOutcome::HeldByOther,
            NodeOutcome::HeldByOther,
            NodeOutcome::NotAwaited,
            NodeOutcome::NotAwaited,
        ]))
        .about(&["orders:42"]);
        assert_eq!(
            e.to_string(),
            "\"orders:42\" is held by another owner: 0 of 5 nodes granted (3 needed); \
             3 held by another owner, 2 not waited for (the outcome was already decided)"
        );
    }

    #[test]
    fn the_alternate_form_shows_each_nodes_cause() {
        let e = Error::NoQuorum(votes(vec![
            NodeOutcome::Granted,
            NodeOutcome::Failed("TLS: invalid peer certificate: UnknownIssuer".into()),
            NodeOutcome::TimedOut,
        ]))
        .about(&["b", "a"]);
        assert_eq!(
            e.to_string(),
            "no quorum for \"a\", \"b\": 1 of 3 nodes granted (2 needed); 1 failed, \
             1 did not answer in time"
        );
        let full = format!("{e:#}");
        assert!(
            full.ends_with(
                "\n  redis://127.0.0.1:7001: granted\
                 \n  redis://127.0.0.1:7002: failed: TLS: invalid peer certificate: UnknownIssuer\
                 \n  redis://127.0.0.1:7003: timed out"
            ),
            "{full}"
        );
    }

    #[test]
    fn timeouts_and_lost_locks_name_their_resources() {
        let t = Timeout::gave_up(std::time::Instant::now(), 3, None).about(&["cron"]);
        let text = t.to_string();
        assert!(
            text.starts_with("timed out on \"cron\": gave up waiting after "),
            "{text}"
        );
        assert!(text.ends_with(" and 3 attempt(s)"), "{text}");
        let lost = Error::lost(LostReason::NotHeld, None).about(&["job"]);
        assert_eq!(
            lost.to_string(),
            "lock on \"job\" lost: a quorum of nodes no longer holds our token"
        );
        // Made before the names were known, and never told: still a sentence.
        let anonymous = Error::lost(LostReason::Expired, None);
        assert_eq!(
            anonymous.to_string(),
            "lock on the resource lost: its validity had already run out"
        );
    }

    #[test]
    fn names_already_given_are_kept() {
        let e = Error::Held(votes(vec![NodeOutcome::HeldByOther]))
            .about(&["inner"])
            .about(&["outer"]);
        assert_eq!(
            e.votes().map(Votes::resources),
            Some(&["inner".to_owned()][..])
        );
    }
}
