//! The I/O layer: talking to the nodes. Connections, requests and their decoded replies,
//! parallel rounds, subscriptions, and the tasks that go on in the background.
//!
//! * [`node`]: one node: its URL, its one connection, its timeout, its scripts, the
//!   request builders (the only place a duration becomes a `PX` or script argument) and
//!   the decoding of every raw Redis answer into a typed
//!   [`protocol::Reply`](crate::protocol::Reply);
//! * [`fanout`]: one request to every node in parallel, the decision as soon as it is
//!   certain, the stragglers, and the clean-up run;
//! * [`background`]: requests that go on after their caller stopped waiting, and
//!   `flush`, which waits for them;
//! * [`notifier`]: the release announcements (pub/sub, one subscription per node);
//! * [`extender`]: the watchdog's pipelined extension rounds, one per node and tick;
//! * [`groupmap`]: the group-map record that keeps clients with different lock groups
//!   apart;
//! * [`peek`]: read-only reads of a resource's keys on one node, for inspection.
//!
//! **May use:** [`base`](crate::base) and [`protocol`](crate::protocol). It executes what
//! the protocol decides; it holds no policy of its own about when a lock is held. Nothing
//! above this layer names `redis`: they see typed replies only.

pub(crate) mod background;
pub(crate) mod extender;
pub(crate) mod fanout;
pub(crate) mod groupmap;
pub(crate) mod node;
pub(crate) mod notifier;
pub(crate) mod peek;
