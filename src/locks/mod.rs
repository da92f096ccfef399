//! The lock kinds built on the client's mutex machinery: read-write locks, counting
//! semaphores, and kept locks (the watchdog that extends a held lock until it is released
//! or lost, and scoped use).
//!
//! * [`rwlock`]: many readers or one writer (writers are preferred);
//! * [`semaphore`]: at most `P` holders at a time ([`Semaphore`](crate::Semaphore));
//! * [`watchdog`]: the [`Watchdog`](crate::Watchdog) policy, [`KeptLock`](crate::KeptLock),
//!   the lost signal, and [`Redlock::with_lock`](crate::Redlock::with_lock).
//!
//! **May use:** [`client`](crate::client) (the attempt, the guard, waiting), and every
//! layer below it: [`io`](crate::io), [`base`](crate::base), [`protocol`](crate::protocol).
//! Each kind adds its entry points to [`Redlock`](crate::Redlock) (`read_lock`,
//! `semaphore`, `with_lock`); its arithmetic is in the protocol layer, its requests in
//! [`io::node`](crate::io::node), and its held guard is the client's
//! [`Lock`](crate::Lock).

pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod watchdog;
