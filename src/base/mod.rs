//! The base layer: the crate's vocabulary, plain data and arithmetic shared by every layer
//! above it.
//!
//! * [`resource`]: resource names and namespaces, and the Redis keys and channels they
//!   map to (one rule, used by the requests, the notifier and the inspection);
//! * [`keys`]: the public view of that rule ([`Keys`](crate::keys::Keys),
//!   [`key_slot`](crate::keys::key_slot)), for operators and tests;
//! * [`slot`]: Redis Cluster's hash slots, and the hash tag that keeps a name's keys in
//!   one slot;
//! * [`token`]: lock tokens, 128 random bits per acquisition;
//! * [`error`]: the public [`Error`](crate::Error) and everything it carries;
//! * [`time`]: saturating arithmetic on the process's clocks;
//! * [`addr`]: a node's address as it may be shown (passwords redacted);
//! * [`metrics`]: every metric name, label and recording function (empty without the
//!   `metrics` feature).
//!
//! **May use:** [`protocol`](crate::protocol) (the pure rules), and the standard library.
//! No sockets, no tasks, no Redis client: nothing here waits or talks to a node, so the
//! layers above can all share it.

pub(crate) mod addr;
pub mod error;
pub mod keys;
pub(crate) mod metrics;
pub(crate) mod resource;
pub(crate) mod slot;
pub(crate) mod time;
pub(crate) mod token;
