//! `quorumlock run`: take the lock, run COMMAND with the lock kept alive, release it.
//!
//! Which lock is taken ([`Mode`]):
//!
//! * by default the mutex of the resource ([`Redlock::try_lock`], [`Redlock::lock_with`]);
//! * `--shared`: a read lock, shared with other readers ([`Redlock::read_lock`]), like
//!   `flock -s`;
//! * `--write`: the write side of the same read-write lock ([`Redlock::write_lock`]),
//!   which excludes the readers and other writers;
//! * `--permits P`: one of `P` permits of the semaphore named by the resource
//!   ([`Redlock::semaphore`]).
//!
//! The mutex, the read-write lock and the semaphore of one name have separate keys and do
//! not exclude each other, so every run that must exclude another has to use the same
//! kind of lock. Each is taken and kept alive the same way:
//!
//! * The lock is kept alive by the library's watchdog ([`quorumlock::Watchdog`]), which
//!   extends it every third of the TTL. When it cannot be extended and its guaranteed
//!   validity drops below a safety margin (a tenth of the TTL), it counts as lost: COMMAND gets SIGTERM, then SIGKILL after `--grace`, and
//!   `run` exits with [`exit::LOST`].
//! * SIGINT, SIGTERM and SIGHUP received by `quorumlock` are forwarded to COMMAND (its
//!   process only, not its children: a shell script should pass them on itself).
//! * COMMAND's exit status becomes ours; death by signal N becomes 128+N.
//! * COMMAND sees `QUORUMLOCK_RESOURCE`, and with `--fencing` `QUORUMLOCK_FENCING_TOKEN`.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use quorumlock::{Error, Lock, Redlock, Retry, Semaphore, Watchdog};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit;

/// The shortest TTL `run` accepts: the keep-alive needs room for a few round trips.
const MIN_TTL: Duration = Duration::from_millis(100);

/// Arguments of `quorumlock run`.
#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct RunArgs {
    #[command(flatten)]
    nodes: crate::Nodes,
    /// The resource to lock (any non-empty name, e.g. `cron:nightly-report`).
    #[arg(long, short = 'r', value_name = "NAME")]
    resource: String,
    /// Lock TTL: how long the lock outlives a crashed `quorumlock`. Kept alive (extended
    /// every TTL/3) while COMMAND runs. At least 100ms.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock when it is busy (`0` = do not wait).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    wait: Duration,
    /// Fail at once if the lock is busy (same as `--wait 0`).
    #[arg(long, conflicts_with = "wait")]
    no_wait: bool,
    /// Take a read lock instead of the mutex, shared with the other `--shared` runs of
    /// the resource (like `flock -s`) and excluded by `--write` runs. A waiting `--write`
    /// run goes first: new readers wait until it has run. The read-write lock has its own
    /// keys: it does not exclude, and is not excluded by, a plain `run` of the same name.
    #[arg(long, conflicts_with_all = ["write", "permits", "fencing"])]
    shared: bool,
    /// Take the write side of the read-write lock: excludes the `--shared` runs and the
    /// other `--write` runs of the resource. While it waits, new readers are held back.
    /// With --fencing, the token counts the writers of the resource.
    #[arg(long, conflicts_with = "permits")]
    write: bool,
    /// Take one of P permits of the semaphore named by --resource: at most P runs hold
    /// one at a time. The quorum Q is the smallest at or above the majority that lets
    /// exactly P runs in with every node up (each node admits c = ceil((P+1)*Q/N)-1
    /// permits, and floor(c*N/Q) = P runs fit); where the majority cannot, Q is larger
    /// and fewer nodes may be down. Every run of a name must give the same P (and the
    /// same nodes): a mismatch is refused with exit code 78.
    #[arg(
        long,
        value_name = "P",
        value_parser = clap::value_parser!(u32).range(1..=1_000_000),
        conflicts_with = "fencing"
    )]
    permits: Option<u32>,
    /// Take a fencing token and pass it to COMMAND in `QUORUMLOCK_FENCING_TOKEN` (the
    /// mutex and --write; readers and permits have none).
    #[arg(long)]
    fencing: bool,
    /// How long one Redis node may take to answer one request. Default: 2% of the TTL,
    /// between 50ms and 250ms (a CLI often runs on busy machines).
    #[arg(long, value_parser = crate::parse_duration)]
    node_timeout: Option<Duration>,
    /// When the lock is lost, time between SIGTERM and SIGKILL to COMMAND.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    grace: Duration,
    /// The command to run while holding the lock, and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

/// Runs `quorumlock run`; returns the exit code.
pub async fn run(args: RunArgs) -> u8 {
    if args.ttl < MIN_TTL {
        eprintln!(
            "quorumlock: --ttl {} is too short; use at least {}",
            humantime::format_duration(args.ttl),
            humantime::format_duration(MIN_TTL)
        );
        return exit::USAGE;
    }
    let Some((program, program_args)) = args.command.split_first() else {
        eprintln!("quorumlock: no COMMAND given");
        return exit::USAGE;
    };
    // Extend with two thirds of the validity left (every third of the TTL); the lost
    // signal fires a tenth of the TTL before the guaranteed validity ends. Checked against
    // the TTL before anything is taken or run.
    let policy = Watchdog::new().refresh_at(2.0 / 3.0);
    if let Err(e) = policy.check(args.ttl) {
        eprintln!("quorumlock: {e}");
        return exit::USAGE;
    }
    let node_timeout = args.node_timeout.unwrap_or_else(|| {
        (args.ttl / 50).clamp(Duration::from_millis(50), Duration::from_millis(250))
    });
    let builder = match args.nodes.builder() {
        Ok(builder) => builder,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::USAGE;
        }
    };
    let mut builder = builder.node_timeout(node_timeout).fencing(args.fencing);
    if !args.no_wait && !args.wait.is_zero() {
        // Read locks, write locks and permits wait with the client's retry policy.
        builder = builder.retry(Retry::new().max_wait(args.wait));
    }
    let locks = match builder.build().await {
        Ok(locks) => locks,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::for_error(&e);
        }
    };
    let res = args.resource.as_str();
    let wait = if args.no_wait {
        Duration::ZERO
    } else {
        args.wait
    };
    let mode = match Mode::new(&args, &locks) {
        Ok(mode) => mode,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::for_error(&e);
        }
    };
    let lock = match mode.acquire(&locks, res, args.ttl, wait).await {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("quorumlock: {}", mode.not_taken(res, &e));
            return exit::for_error(&e);
        }
    };
    tracing::debug!(resource = res, validity = ?lock.remaining(), "lock taken");

    let mut cmd = Command::new(program);
    cmd.args(program_args).env("QUORUMLOCK_RESOURCE", res);
    match lock.fencing_token() {
        Some(t) => cmd.env("QUORUMLOCK_FENCING_TOKEN", t.to_string()),
        None => cmd.env_remove("QUORUMLOCK_FENCING_TOKEN"),
    };
    // Install the handlers before COMMAND starts so no signal slips through.
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quorumlock: cannot install signal handlers: {e}");
            release(&locks, lock.release(), args.ttl, false).await;
            return exit::UNAVAILABLE;
        }
    };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("quorumlock: cannot run {}: {e}", program.to_string_lossy());
            release(&locks, lock.release(), args.ttl, false).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
        }
    };

    let kept = match lock.keep_alive(policy) {
        Ok(kept) => kept,
        Err(refused) => {
            // Checked above, so not reached; if it were, COMMAND must not run unguarded,
            // and is stopped before the lock is released.
            eprintln!("quorumlock: {}", refused.error());
            let _ = child.kill().await;
            let _ = child.wait().await;
            release(&locks, refused.into_lock().release(), args.ttl, false).await;
            return exit::USAGE;
        }
    };
    let mut lost = kept.lost();

    let code = loop {
        tokio::select! {
            status = child.wait() => break match status {
                Ok(status) => status_code(status),
                Err(e) => {
                    eprintln!("quorumlock: waiting for COMMAND failed: {e}");
                    exit::UNAVAILABLE
                }
            },
            Some(sig) = signals.next() => forward(&child, sig),
            why = &mut lost => {
                eprintln!(
                    "quorumlock: {res}: {why}; stopping COMMAND (SIGTERM, SIGKILL after {})",
                    humantime::format_duration(args.grace)
                );
                stop_child(&mut child, args.grace).await;
                break exit::LOST;
            }
        }
    };

    release(&locks, kept.release(), args.ttl, code == exit::LOST).await;
    code
}

/// Which lock `run` takes.
enum Mode {
    /// The mutex (the default).
    Exclusive,
    /// A read lock (`--shared`).
    Shared,
    /// The write lock of the read-write lock (`--write`).
    Write,
    /// A permit of a semaphore (`--permits P`), on this many nodes.
    Permit(Semaphore, usize),
}

impl Mode {
    /// The mode the arguments ask for (clap already refused the conflicting ones).
    fn new(args: &RunArgs, locks: &Redlock) -> Result<Mode, Error> {
        Ok(match (args.shared, args.write, args.permits) {
            (true, _, _) => Mode::Shared,
            (_, true, _) => Mode::Write,
            (_, _, Some(p)) => {
                Mode::Permit(
                    locks.semaphore(&args.resource, p)?,
                    // The nodes of the semaphore's lock group (all of them when unsharded).
                    locks
                        .group_nodes(locks.group_of(&args.resource))
                        .map_or(0, <[_]>::len),
                )
            }
            _ => Mode::Exclusive,
        })
    }

    /// Takes the lock: one attempt when `wait` is zero, else waits up to `wait`. A first
    /// attempt that finds a majority of the nodes unreachable (failed or silent past the
    /// node timeout) is reported at once instead of being waited out: a dead majority is
    /// an outage to report, not contention to wait for.
    async fn acquire(
        &self,
        locks: &Redlock,
        res: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let first = self.attempt(locks, res, ttl).await;
        if wait.is_zero() {
            return first;
        }
        match first {
            Ok(lock) => return Ok(lock),
            Err(Error::NoQuorum(votes)) if unreachable_majority(&votes) => {
                return Err(Error::NoQuorum(votes));
            }
            Err(_) => {}
        }
        match self {
            Mode::Exclusive => locks.lock_with(res, ttl, Retry::new().max_wait(wait)).await,
            Mode::Shared => locks.read_lock(res, ttl).await,
            Mode::Write => locks.write_lock(res, ttl).await,
            Mode::Permit(sem, _) => sem.acquire(ttl).await,
        }
    }

    /// One attempt, without waiting.
    async fn attempt(&self, locks: &Redlock, res: &str, ttl: Duration) -> Result<Lock, Error> {
        match self {
            Mode::Exclusive => locks.try_lock(res, ttl).await,
            Mode::Shared => locks.try_read_lock(res, ttl).await,
            Mode::Write => locks.try_write_lock(res, ttl).await,
            Mode::Permit(sem, _) => sem.try_acquire(ttl).await,
        }
    }

    /// What is taken, for messages: `x`, `a read lock on x`, ...
    fn what(&self, res: &str) -> String {
        match self {
            Mode::Exclusive => res.to_string(),
            Mode::Shared => format!("a read lock on {res}"),
            Mode::Write => format!("the write lock on {res}"),
            Mode::Permit(..) => format!("a permit of {res}"),
        }
    }

    /// `cannot lock x`, `cannot take a read lock on x`, ...
    fn cannot(&self, res: &str) -> String {
        match self {
            Mode::Exclusive => format!("cannot lock {res}"),
            _ => format!("cannot take {}", self.what(res)),
        }
    }

    /// The one line printed when the lock could not be taken.
    fn not_taken(&self, res: &str, e: &Error) -> String {
        match e {
            Error::Held(votes) => match self {
                Mode::Exclusive => format!("{res} is held by another owner ({votes})"),
                Mode::Shared => {
                    format!("{res} is held by a writer, or a writer waits for it ({votes})")
                }
                Mode::Write => format!("{res} is held by readers or a writer ({votes})"),
                Mode::Permit(sem, nodes) => {
                    format!(
                        "all permits of {res} are taken ({votes}); {}",
                        capacity(sem, *nodes)
                    )
                }
            },
            Error::PermitsMismatch(m) => {
                let theirs = m.stored().split(':').next().unwrap_or("?");
                let ours = match self {
                    Mode::Permit(sem, _) => sem.permits().to_string(),
                    _ => "?".to_string(),
                };
                format!(
                    "--permits {ours} does not match: {res} is in use with {theirs} permits \
                     (permits:per-node limit:quorum:nodes stored {}, ours {}); every run of \
                     a name must use the same --permits and the same nodes",
                    m.stored(),
                    m.requested()
                )
            }
            Error::NoQuorum(votes) => format!(
                "{}: too few nodes answered for a quorum ({votes})",
                self.cannot(res)
            ),
            Error::Timeout(t) if t.is_max_wait() => {
                let mut s = format!(
                    "gave up waiting for {} after {} ({} attempts)",
                    self.what(res),
                    humantime::format_duration(round_ms(t.waited())),
                    t.attempts()
                );
                if let Some(v) = t.votes() {
                    s.push_str(&format!("; last attempt: {v}"));
                }
                if let Mode::Permit(sem, nodes) = self {
                    s.push_str(&format!("; {}", capacity(sem, *nodes)));
                }
                s
            }
            other => format!("{}: {other}", self.cannot(res)),
        }
    }
}

/// How many holders a semaphore admits at once, for messages.
fn capacity(sem: &Semaphore, nodes: usize) -> String {
    format!(
        "at most {} of the {} permits can be held at once with {nodes} nodes and quorum {}",
        sem.capacity(),
        sem.permits(),
        sem.quorum()
    )
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Our exit code for COMMAND's status.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}

/// Awaits a release, bounded in time; the TTL cleans up whatever is not released.
async fn release(
    locks: &Redlock,
    release: impl Future<Output = Result<(), Error>>,
    ttl: Duration,
    lost: bool,
) {
    let budget = ttl.clamp(Duration::from_secs(1), Duration::from_secs(5));
    match tokio::time::timeout(budget, release).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) | Err(_) if lost => {}
        Ok(Err(e)) => eprintln!(
            "quorumlock: warning: release failed ({e}); the lock expires by itself within {}",
            humantime::format_duration(ttl)
        ),
        Err(_) => eprintln!(
            "quorumlock: warning: release timed out; the lock expires by itself within {}",
            humantime::format_duration(ttl)
        ),
    }
    // The release returned at the quorum: let the slower nodes finish before we exit, so
    // no node keeps the key until its TTL.
    locks.flush(budget).await;
}

/// Sends SIGTERM to COMMAND, then SIGKILL after `grace`, and reaps it.
async fn stop_child(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        send_signal(pid, libc::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn forward(child: &Child, sig: libc::c_int) {
    // `id()` is `None` once the child was reaped, so the pid cannot have been reused.
    if let Some(pid) = child.id() {
        tracing::debug!(pid, sig, "forwarding signal to COMMAND");
        send_signal(pid, sig);
    }
}

fn send_signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// The signals forwarded to COMMAND.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received (never `None` in practice: the streams do not end).
    async fn next(&mut self) -> Option<libc::c_int> {
        tokio::select! {
            s = self.int.recv() => s.map(|()| libc::SIGINT),
            s = self.term.recv() => s.map(|()| libc::SIGTERM),
            s = self.hup.recv() => s.map(|()| libc::SIGHUP),
        }
    }
}

/// Whether so many nodes failed or stayed silent that no quorum could have answered: more
/// than `nodes − quorum` of them.
fn unreachable_majority(votes: &quorumlock::Votes) -> bool {
    votes.failed() + votes.timed_out() > votes.len().saturating_sub(votes.quorum())
}
