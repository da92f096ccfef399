//! Exit codes of the `quorumlock` binary (sysexits.h where one fits).
//!
//! | code | meaning |
//! | --- | --- |
//! | COMMAND's own status | `run`: COMMAND ran and exited (killed by signal N: 128+N) |
//! | 0 | `inspect`, `demo`: done |
//! | 64 (`EX_USAGE`) | bad arguments, invalid node URL, TTL or resource name; a node refused the credentials at start (without `--lenient`) |
//! | 69 (`EX_UNAVAILABLE`) | too few nodes answered for a quorum |
//! | 70 (`EX_SOFTWARE`) | `run`: the lock was lost while COMMAND ran; COMMAND was stopped |
//! | 71 (`EX_OSERR`) | the operating system's random number generator failed (no lock token) |
//! | 75 (`EX_TEMPFAIL`) | `run`: held by another owner, or the wait timed out |
//! | 78 (`EX_CONFIG`) | `run --permits P`: the semaphore is in use with another P (or other nodes); or the nodes record another group map (clients with other lock groups) |
//! | 126 / 127 | `run`: COMMAND could not be executed / was not found |

use quorumlock::{Error, ErrorKind};

/// Bad arguments or configuration (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// Too few nodes reachable for a quorum (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// The lock was lost while COMMAND ran (`EX_SOFTWARE`).
pub const LOST: u8 = 70;
/// The operating system failed us: no random lock token could be drawn (`EX_OSERR`).
pub const OS_ERROR: u8 = 71;
/// Held by another owner, or the wait timed out (`EX_TEMPFAIL`).
pub const BUSY: u8 = 75;
/// `--permits P` does not match the semaphore's configuration on the nodes, or the nodes
/// record another group map (`EX_CONFIG`).
pub const MISMATCH: u8 = 78;
/// COMMAND exists but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// COMMAND was not found.
pub const NOT_FOUND: u8 = 127;

/// The exit-code table shown at the end of `--help`.
pub const HELP: &str = "\
Exit codes:
  COMMAND's status    run: COMMAND exited (killed by signal N: 128+N)
  0                   inspect, demo: done
  64  EX_USAGE        bad arguments, invalid node URL, TTL or resource name,
                      unreadable or invalid TLS file; a node refused the
                      credentials at start (a wrong password, a certificate
                      refused; see --lenient)
  69  EX_UNAVAILABLE  too few nodes answered for a quorum
  70  EX_SOFTWARE     run: the lock was lost while COMMAND ran (COMMAND was stopped)
  71  EX_OSERR        the operating system's random number generator failed
  75  EX_TEMPFAIL     run: held by another owner, or the wait timed out
  78  EX_CONFIG       run --permits P: the semaphore is in use with another P
                      (or by clients with other nodes); or the nodes record
                      another group map (clients with other lock groups);
                      COMMAND was not run
  126 / 127           run: COMMAND could not be executed / was not found";

/// The exit code for a failure to take the lock (or to build the client).
pub fn for_error(e: &Error) -> u8 {
    match e.kind() {
        ErrorKind::Held => BUSY,
        ErrorKind::NoQuorum => UNAVAILABLE,
        ErrorKind::Timeout => match e {
            // The wait ran out: busy, unless the last attempt failed for want of nodes
            // rather than because someone else held the lock.
            Error::Timeout(t) if t.is_max_wait() => match t.votes() {
                Some(v) if v.held() == 0 && v.granted() < v.quorum() => UNAVAILABLE,
                _ => BUSY,
            },
            // The quorum came too late for any validity: the nodes are too slow.
            _ => UNAVAILABLE,
        },
        ErrorKind::Lost => LOST,
        ErrorKind::Config | ErrorKind::InvalidInput => USAGE,
        ErrorKind::RandomSource => OS_ERROR,
        ErrorKind::PermitsMismatch | ErrorKind::GroupMapMismatch => MISMATCH,
        _ => UNAVAILABLE,
    }
}
