//! The Redis keys and channels of a resource, as this crate names them, and the hash
//! slot Redis Cluster puts a key in.
//!
//! For operators and tests: to read a lock by hand (`redis-cli GET`, `PTTL`), to write an
//! ACL, to ask which shard of a Redis Cluster voter holds a resource
//! (`CLUSTER KEYSLOT`), or to aim a fault at one resource's node. Every client names its
//! keys through the same rule, so what [`Keys`] returns is exactly what a
//! [`Redlock`](crate::Redlock) with that namespace uses.
//!
//! A key is `<namespace>:<kind>:<name>`. On a voter that is a Redis Cluster
//! (`redis+cluster://`), every key of a name also carries a hash tag right after
//! `<namespace>:<kind>:`, chosen so that the key is in the very slot Redis gives the name
//! itself, and the release channel is a shard channel (`SSUBSCRIBE`) in that slot.
//!
//! ```
//! use quorumlock::keys::{Keys, key_slot};
//!
//! # fn main() -> Result<(), quorumlock::Error> {
//! let keys = Keys::new("app:locks")?;
//! assert_eq!(keys.lock("orders:42"), b"app:locks:lock:orders:42");
//! assert_eq!(keys.fence("orders:42"), b"app:locks:fence:orders:42");
//!
//! // On a Redis Cluster voter: tagged, and in the name's own slot.
//! let cluster = Keys::new("app:locks")?.on_cluster();
//! let key = cluster.lock("orders:42");
//! assert!(key.starts_with(b"app:locks:lock:{"));
//! assert_eq!(key_slot(&key), key_slot(b"orders:42"));
//! # Ok(()) }
//! ```

use std::sync::Arc;

use crate::base::error::Error;
use crate::base::resource::{Keyspace, Layout, check_namespace};
use crate::base::slot;

/// The number of hash slots of a Redis Cluster (16,384).
pub const SLOTS: u16 = slot::SLOTS;

/// The hash slot Redis Cluster gives `key`: CRC16 (XMODEM) of the key, or of its hash tag
/// (the bytes between the first `{` and the first `}` after it, when not empty), modulo
/// [`SLOTS`]. The same answer as `CLUSTER KEYSLOT`.
///
/// # Example
///
/// ```
/// use quorumlock::keys::key_slot;
/// assert_eq!(key_slot(b"foo"), 12182);
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    slot::key_slot(key)
}

/// The keys and channels of resources under one namespace, for voters that are plain
/// masters ([`Keys::new`], [`Keys::default`]) or Redis Clusters ([`Keys::on_cluster`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    space: Keyspace,
}

/// The default namespace's keys ([`DEFAULT_NAMESPACE`](crate::DEFAULT_NAMESPACE)) on
/// plain masters.
///
/// # Example
///
/// ```
/// let keys = quorumlock::keys::Keys::default();
/// assert_eq!(keys.lock("job"), b"quorumlock:lock:job");
/// ```
impl Default for Keys {
    fn default() -> Keys {
        Keys {
            space: Keyspace::in_default(Layout::Plain),
        }
    }
}

impl Keys {
    /// The keys of namespace `namespace` (as given to
    /// [`RedlockBuilder::namespace`](crate::RedlockBuilder::namespace); the default is
    /// [`DEFAULT_NAMESPACE`](crate::DEFAULT_NAMESPACE)) on plain masters.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a namespace the builder refuses too.
    ///
    /// # Example
    ///
    /// ```
    /// # fn main() -> Result<(), quorumlock::Error> {
    /// let keys = quorumlock::keys::Keys::new(quorumlock::DEFAULT_NAMESPACE)?;
    /// assert_eq!(keys.lock("job"), b"quorumlock:lock:job");
    /// # Ok(()) }
    /// ```
    pub fn new(namespace: &str) -> Result<Keys, Error> {
        check_namespace(namespace)?;
        Ok(Keys {
            space: Keyspace::new(Arc::from(namespace), Layout::Plain),
        })
    }

    /// The same namespace's keys on voters that are Redis Clusters: each key of a name
    /// carries the hash tag of the name's slot, and the release channel is a shard
    /// channel.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::keys::{Keys, key_slot};
    /// let keys = Keys::default().on_cluster();
    /// assert_eq!(key_slot(&keys.fence("job")), key_slot(b"job"));
    /// ```
    #[must_use]
    pub fn on_cluster(self) -> Keys {
        Keys {
            space: self.space.with_layout(Layout::Slotted),
        }
    }

    /// The lock key of resource `name`: it holds the holder's token, with the TTL.
    ///
    /// # Example
    ///
    /// ```
    /// # fn main() -> Result<(), quorumlock::Error> {
    /// let keys = quorumlock::keys::Keys::new("quorumlock")?;
    /// assert_eq!(keys.lock("orders:42"), b"quorumlock:lock:orders:42");
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, name: &str) -> Vec<u8> {
        self.space.lock_key(name)
    }

    /// The fence counter key of resource `name` (with fencing on): the largest fencing
    /// token issued or committed on that node. It never expires.
    ///
    /// # Example
    ///
    /// ```
    /// # fn main() -> Result<(), quorumlock::Error> {
    /// let keys = quorumlock::keys::Keys::new("quorumlock")?;
    /// assert_eq!(keys.fence("orders:42"), b"quorumlock:fence:orders:42");
    /// # Ok(()) }
    /// ```
    pub fn fence(&self, name: &str) -> Vec<u8> {
        self.space.fence_key(name)
    }

    /// The pub/sub channel that announces releases of resource `name` that hand the lock
    /// to no one: a plain channel (`SUBSCRIBE`) on plain masters, a shard channel
    /// (`SSUBSCRIBE`) in the name's slot on a Redis Cluster.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::keys::{Keys, key_slot};
    /// # fn main() -> Result<(), quorumlock::Error> {
    /// let plain = Keys::new("quorumlock")?;
    /// assert_eq!(plain.release_channel("job"), b"quorumlock:released:job");
    /// let sharded = Keys::new("quorumlock")?.on_cluster().release_channel("job");
    /// assert_eq!(key_slot(&sharded), key_slot(b"job"));
    /// # Ok(()) }
    /// ```
    pub fn release_channel(&self, name: &str) -> Vec<u8> {
        self.space.channel(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_namespace_is_refused() {
        assert!(Keys::new("").is_err());
        assert!(Keys::new("a{b}").is_err());
        assert_eq!(
            Keys::default(),
            Keys::new(crate::DEFAULT_NAMESPACE).unwrap_or_default()
        );
    }
}
