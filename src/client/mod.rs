//! The client layer: [`Redlock`](crate::Redlock) and the mutex. The configuration, what
//! every clone shares, one acquisition attempt, the held [`Lock`](crate::Lock) guard,
//! waiting, and the multi-resource and multi-group forms.
//!
//! * [`redlock`]: [`Redlock`](crate::Redlock), the public entry points: validates each
//!   call's input and hands the work down;
//! * [`config`]: the builder, the retry policy, the defaults and their validation;
//! * [`shared`]: what every clone of a client and every lock share (nodes, quorum,
//!   notifier, kept-lock registry);
//! * [`acquire`]: one attempt, decided at the quorum, and its clean-up;
//! * [`fencing`]: fencing tokens, the fenced acquire's two rounds;
//! * [`lock`]: the guard of every kind of held lock (mutex, reader, writer, permit):
//!   extend, release, drop;
//! * [`wait`], [`transfer`]: waiting between attempts: retry, notify, hand-off;
//! * [`spanning`], [`groups`]: locks over several lock groups, and the groups themselves;
//! * [`inspect`]: who holds a resource, read from every node without touching it.
//!
//! **May use:** [`io`](crate::io), [`base`](crate::base) and
//! [`protocol`](crate::protocol); never `redis` directly (the I/O layer decodes every
//! reply). Each rule (a vote, a verdict, a wait) is a call into the protocol.

pub(crate) mod acquire;
pub(crate) mod config;
pub(crate) mod fencing;
pub(crate) mod groups;
pub mod inspect;
pub(crate) mod lock;
pub(crate) mod redlock;
pub(crate) mod shared;
pub(crate) mod spanning;
pub(crate) mod transfer;
pub(crate) mod wait;
