//! Resource names and the Redis keys they map to.
//!
//! Every resource maps to its own keys under fixed prefixes, so the mapping is
//! unambiguous by construction:
//!
//! | key | holds |
//! | --- | --- |
//! | `quorumlock:lock:{name}` | the lock token, with the TTL |
//! | `quorumlock:fence:{name}` | the fence counter (fencing only; never expires; the largest fencing token issued or committed on this node, in microseconds since the Unix epoch or above) |
//! | `quorumlock:queue:{name}`, `quorumlock:qlease:{name}`, `quorumlock:qattrs:{name}` | waiters by ticket, when each one's lease lapses, and what a release does with each entry (`<ttl ms>:<kind>[:<channel>]`: transfer, fenced transfer, name-only; the channel a transfer is announced on, the waiter's client's inbox) (notify waiting, on every node; vanish with the last lease) |
//! | `quorumlock:qset:<token>` | a multi-resource waiter's set: the channel a transfer to it is announced on, then each of its resources' lock key, queue, leases and attributes (`<length>:<bytes>` each); its entries' attributes are `<ttl ms>:m:quorumlock:qset:<token>`; lapses with the entries' lease |
//! | `quorumlock:released:{name}` | the pub/sub channel announcing releases that hand the lock to no one |
//! | `quorumlock:released:\xFFinbox:<16 hex>` | one client's inbox: the pub/sub channel announcing transfers to its waiters (byte `0xFF` never occurs in a name, so no resource's channel is an inbox) |
//! | `quorumlock:rw:{name}` | a read-write lock's writer token, with the TTL |
//! | `quorumlock:readers:{name}` | a read-write lock's readers: a sorted set, member = reader token, score = its expiry in ms by this node's clock |
//! | `quorumlock:wintent:{name}` | waiting writers' intents: member = writer id, score = the intent lease's expiry (node ms) |
//! | `quorumlock:rwfence:{name}` | the writer fence counter (fencing only; as `fence`) |
//! | `quorumlock:sem:{name}` | a semaphore's holders: member = permit token, score = its expiry (node ms) |
//! | `quorumlock:semcfg:{name}` | the semaphore's `"P:c:Q:N"`, expiring with the last holder |
//!
//! Every sorted set expires at its largest score (`PEXPIREAT`, set again after every change),
//! so an idle one vanishes by itself; a member is live while its score is ahead of the
//! node's clock, and every script purges the others first.
//!
//! Names are arbitrary non-empty byte strings (up to 4 KiB); nothing is concatenated, so no
//! two different names share a key, and the namespaces never collide because the prefixes
//! differ before the name starts: a mutex, a read-write lock and a semaphore of the same
//! name are three independent things. A multi-resource lock is a
//! *set*: its keys are the keys of its names, sorted; duplicates are refused, so two
//! different sets never map to the same keys, and `["a", "b"]` and `["b", "a"]` are the
//! same lock.

use std::sync::Arc;

use crate::error::Error;

const LOCK_PREFIX: &[u8] = b"quorumlock:lock:";
const FENCE_PREFIX: &[u8] = b"quorumlock:fence:";
const CHANNEL_PREFIX: &[u8] = b"quorumlock:released:";
const QUEUE_PREFIX: &[u8] = b"quorumlock:queue:";
const QUEUE_LEASE_PREFIX: &[u8] = b"quorumlock:qlease:";
const QUEUE_ATTRS_PREFIX: &[u8] = b"quorumlock:qattrs:";
const QUEUE_SET_PREFIX: &[u8] = b"quorumlock:qset:";
const RW_PREFIX: &[u8] = b"quorumlock:rw:";
const READERS_PREFIX: &[u8] = b"quorumlock:readers:";
const INTENT_PREFIX: &[u8] = b"quorumlock:wintent:";
const RW_FENCE_PREFIX: &[u8] = b"quorumlock:rwfence:";
const SEM_PREFIX: &[u8] = b"quorumlock:sem:";
const SEM_CONFIG_PREFIX: &[u8] = b"quorumlock:semcfg:";

/// The longest resource name accepted, in bytes.
pub const MAX_RESOURCE_LEN: usize = 4096;
/// The most resources one multi-resource lock may take.
pub const MAX_RESOURCES: usize = 1024;

/// The validated resources of one lock, sorted, with their keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resources {
    names: Arc<[String]>,
    lock_keys: Arc<[Vec<u8>]>,
    layout: Layout,
}

/// How a lock group spells its keys: the same on every voter of the group, so that every
/// client of the group finds every other client's keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Layout {
    /// Plain masters: `quorumlock:lock:<name>`, as in every release before cluster voters
    /// (clients of different versions share a group of plain masters).
    #[default]
    Plain,
    /// Redis Cluster voters: every key of a name carries, right after its prefix, the hash
    /// tag of the name's own slot ([`crate::slot`]), `quorumlock:lock:{1f3}<name>`, so one
    /// script can touch all of them and they live in the slot `CLUSTER KEYSLOT <name>` names.
    Slotted,
}

impl Resources {
    /// Validates one or more names, with the [plain](Layout::Plain) key layout.
    pub(crate) fn new<S: AsRef<str>>(names: &[S]) -> Result<Resources, Error> {
        Resources::in_layout(names, Layout::Plain)
    }

    /// Validates one or more names for a group with this key layout. With
    /// [`Layout::Slotted`], every name of a multi-resource lock must be in one hash slot
    /// (a script touches the keys of one slot only).
    pub(crate) fn in_layout<S: AsRef<str>>(
        names: &[S],
        layout: Layout,
    ) -> Result<Resources, Error> {
        check_count(names.len(), "lock")?;
        let mut sorted: Vec<String> = Vec::with_capacity(names.len());
        for n in names {
            let n = n.as_ref();
            if n.is_empty() {
                return Err(Error::invalid("resource", "a resource name is empty"));
            }
            if n.len() > MAX_RESOURCE_LEN {
                return Err(Error::invalid(
                    "resource",
                    format!("a name of {} bytes; at most {MAX_RESOURCE_LEN}", n.len()),
                ));
            }
            sorted.push(n.to_owned());
        }
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                "resources",
                format!("{:?} appears more than once", shorten(&w[0])),
            ));
        }
        if layout == Layout::Slotted {
            check_one_slot(&sorted)?;
        }
        let lock_keys = sorted.iter().map(|n| key(layout, LOCK_PREFIX, n)).collect();
        Ok(Resources {
            names: sorted.into(),
            lock_keys,
            layout,
        })
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }
    pub(crate) fn lock_keys(&self) -> &[Vec<u8>] {
        &self.lock_keys
    }
    pub(crate) fn fence_keys(&self) -> Vec<Vec<u8>> {
        self.names
            .iter()
            .map(|n| key(self.layout, FENCE_PREFIX, n))
            .collect()
    }
    /// The key layout of the group these resources were validated for.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }
    /// A multi-resource waiter's set key (`enqueue_many.lua`), for its token: in the
    /// resources' slot with [`Layout::Slotted`].
    pub(crate) fn set_key(&self, token: &[u8]) -> Vec<u8> {
        let tag = match (self.layout, self.names.first()) {
            (Layout::Slotted, Some(n)) => crate::slot::name_tag(n),
            _ => String::new(),
        };
        let mut k = Vec::with_capacity(QUEUE_SET_PREFIX.len() + tag.len() + token.len());
        k.extend_from_slice(QUEUE_SET_PREFIX);
        k.extend_from_slice(tag.as_bytes());
        k.extend_from_slice(token);
        k
    }
    /// Whether node `i` of `n` is one of the two *heralds* of the first resource ([`is_herald`]).
    pub(crate) fn is_herald(&self, i: usize, n: usize) -> bool {
        is_herald(self.names.first().map_or("", String::as_str), i, n)
    }

    /// Whether node `i` of `n` announces this lock's plain releases (and names name-only
    /// heads), with notify waiting: a lock on one resource on the resource's two heralds; a
    /// lock on several on every node (a waiter for several resources listens to each of
    /// them, and with the two heralds of each unavailable, 5 nodes and more, no one would
    /// announce the release to it).
    pub(crate) fn announces_on(&self, i: usize, n: usize) -> bool {
        self.names.len() > 1 || self.is_herald(i, n)
    }

    /// The wait queue and its leases (single-resource locks use the first name).
    pub(crate) fn queue_keys(&self) -> [Vec<u8>; 3] {
        queue_keys(self.layout, self.names.first().map_or("", String::as_str))
    }
    pub(crate) fn channels(&self) -> Vec<Vec<u8>> {
        self.names
            .iter()
            .map(|n| channel_in(self.layout, n))
            .collect()
    }
    /// The channel a transfer to a waiter of this client is announced on, from the
    /// client's `inbox` ([`inbox_channel`]): the inbox itself on plain masters; on Redis
    /// Cluster voters a *sharded* inbox in the resources' slot (a script may publish to a
    /// shard channel of its own slot only).
    pub(crate) fn inbox(&self, inbox: &[u8]) -> Vec<u8> {
        match (self.layout, self.names.first()) {
            (Layout::Slotted, Some(n)) => {
                let own = inbox.get(CHANNEL_PREFIX.len()..).unwrap_or_default();
                sharded(n, own)
            }
            _ => inbox.to_vec(),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
    /// A short human label for tracing: the name, or the first name and a count.
    pub(crate) fn label(&self) -> String {
        let first = self.names.first().map_or("", |n| shorten(n));
        match self.names.len() {
            0 | 1 => first.to_owned(),
            n => format!("{first}(+{})", n - 1),
        }
    }
}

/// The keys of one read-write lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RwKeys {
    /// The writer's token (a string with a TTL).
    pub(crate) writer: Vec<u8>,
    /// The readers (a sorted set by expiry).
    pub(crate) readers: Vec<u8>,
    /// The waiting writers' intents (a sorted set by lease expiry).
    pub(crate) intent: Vec<u8>,
    /// The writer fence counter.
    pub(crate) fence: Vec<u8>,
}

impl RwKeys {
    /// The keys of the read-write lock `name` (validated by [`Resources::new`]).
    pub(crate) fn new(name: &str, layout: Layout) -> RwKeys {
        RwKeys {
            writer: key(layout, RW_PREFIX, name),
            readers: key(layout, READERS_PREFIX, name),
            intent: key(layout, INTENT_PREFIX, name),
            fence: key(layout, RW_FENCE_PREFIX, name),
        }
    }
}

/// The keys of one semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SemKeys {
    /// The holders (a sorted set by expiry).
    pub(crate) holders: Vec<u8>,
    /// The configuration `"P:c:Q:N"`.
    pub(crate) config: Vec<u8>,
}

impl SemKeys {
    /// The keys of the semaphore `name` (validated by [`Resources::new`]).
    pub(crate) fn new(name: &str, layout: Layout) -> SemKeys {
        SemKeys {
            holders: key(layout, SEM_PREFIX, name),
            config: key(layout, SEM_CONFIG_PREFIX, name),
        }
    }
}

/// What a held lock is, and so which keys its extend, release and clean-up requests name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The mutex: the lock keys of its [`Resources`].
    Exclusive,
    /// A reader of a read-write lock: its entry in the readers' set.
    Read(Arc<RwKeys>),
    /// The writer of a read-write lock: the writer key.
    Write(Arc<RwKeys>),
    /// A permit of a semaphore: its entry in the holders' set.
    Permit(Arc<SemKeys>),
}

impl Kind {
    /// The word tracing records as a lock's `mode`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive",
            Kind::Read(_) => "read",
            Kind::Write(_) => "write",
            Kind::Permit(_) => "permit",
        }
    }
}

/// The lock key of one resource name.
pub(crate) fn lock_key(layout: Layout, name: &str) -> Vec<u8> {
    key(layout, LOCK_PREFIX, name)
}
/// The fence counter key of one resource name.
pub(crate) fn fence_key(layout: Layout, name: &str) -> Vec<u8> {
    key(layout, FENCE_PREFIX, name)
}
/// The wait queue, its leases and its entries' attributes of one resource name.
pub(crate) fn queue_keys(layout: Layout, name: &str) -> [Vec<u8>; 3] {
    [
        key(layout, QUEUE_PREFIX, name),
        key(layout, QUEUE_LEASE_PREFIX, name),
        key(layout, QUEUE_ATTRS_PREFIX, name),
    ]
}

/// Refuses names that are not all in one hash slot, for a group of Redis Cluster voters.
fn check_one_slot(sorted: &[String]) -> Result<(), Error> {
    let mut slots = sorted
        .iter()
        .map(|n| (n, crate::slot::key_slot(n.as_bytes())));
    let Some((first, slot)) = slots.next() else {
        return Ok(());
    };
    match slots.find(|(_, s)| *s != slot) {
        None => Ok(()),
        Some((other, s)) => Err(Error::invalid(
            "resources",
            format!(
                "{:?} (hash slot {slot}) and {:?} (hash slot {s}) are in different hash slots, \
                 and the group's voters are Redis Clusters: a lock on several resources \
                 needs them in one slot; give the names a common hash tag, such as \
                 \"{{order:7}}:stock\" and \"{{order:7}}:payment\"",
                shorten(first),
                shorten(other)
            ),
        )),
    }
}

/// Whether node `i` of `n` is one of the resource's two *heralds*: the nodes that
/// announce its releases and keep its wait queue (a deterministic choice from the name, so
/// every client agrees; two, so one node down does not silence them).
pub(crate) fn is_herald(name: &str, i: usize, n: usize) -> bool {
    if n <= 2 {
        return true;
    }
    // FNV-1a: stable across processes and versions.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let first = usize::try_from(h % n as u64).unwrap_or(0);
    i == first || i == (first + 1) % n
}
/// The release channel of one resource name.
pub(crate) fn channel(name: &str) -> Vec<u8> {
    key(Layout::Plain, CHANNEL_PREFIX, name)
}

/// The release channel of one resource name in a group with this key layout: with
/// [`Layout::Slotted`] a *shard channel* (`SPUBLISH`/`SSUBSCRIBE`): byte [`SHARD_MARK`]
/// after the prefix, then the hash tag of the name's slot and the name.
pub(crate) fn channel_in(layout: Layout, name: &str) -> Vec<u8> {
    match layout {
        Layout::Plain => channel(name),
        Layout::Slotted => sharded(name, name.as_bytes()),
    }
}

/// Marks a shard channel: the byte right after `quorumlock:released:` (byte 21 of the
/// channel, which the release scripts test to choose `SPUBLISH` over `PUBLISH`). `0xFE`
/// never occurs in UTF-8, so no resource name starts a plain channel with it.
pub(crate) const SHARD_MARK: u8 = 0xFE;

/// `quorumlock:released:`, [`SHARD_MARK`], the hash tag of `name`'s slot, then `rest`.
fn sharded(name: &str, rest: &[u8]) -> Vec<u8> {
    let tag = crate::slot::name_tag(name);
    let mut ch = Vec::with_capacity(CHANNEL_PREFIX.len() + 1 + tag.len() + rest.len());
    ch.extend_from_slice(CHANNEL_PREFIX);
    ch.push(SHARD_MARK);
    ch.extend_from_slice(tag.as_bytes());
    ch.extend_from_slice(rest);
    ch
}

/// Whether `channel` is a shard channel ([`channel_in`] with [`Layout::Slotted`], or a
/// sharded inbox).
pub(crate) fn is_sharded(channel: &[u8]) -> bool {
    channel.starts_with(CHANNEL_PREFIX) && channel.get(CHANNEL_PREFIX.len()) == Some(&SHARD_MARK)
}

/// The marker that starts a client's inbox name after [`CHANNEL_PREFIX`]: byte `0xFF`,
/// which never occurs in UTF-8, so no resource name (a `str`) can produce an inbox's
/// channel.
const INBOX_MARK: &[u8] = b"\xffinbox:";

/// A client's inbox channel: `quorumlock:released:`, byte `0xFF`, `inbox:` and `id` in 16
/// hex digits. Under the release channels' prefix, so an ACL that allows
/// `&quorumlock:released:*` allows the inbox too; never equal to a resource's channel.
pub(crate) fn inbox_channel(id: u64) -> Vec<u8> {
    let mut ch = Vec::with_capacity(CHANNEL_PREFIX.len() + INBOX_MARK.len() + 16);
    ch.extend_from_slice(CHANNEL_PREFIX);
    ch.extend_from_slice(INBOX_MARK);
    ch.extend_from_slice(format!("{id:016x}").as_bytes());
    ch
}

fn key(layout: Layout, prefix: &[u8], name: &str) -> Vec<u8> {
    let tag = match layout {
        Layout::Plain => String::new(),
        Layout::Slotted => crate::slot::name_tag(name),
    };
    let mut k = Vec::with_capacity(prefix.len() + tag.len() + name.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(tag.as_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// Refuses an empty list of names, or one longer than [`MAX_RESOURCES`]; `what` names the
/// operation in the message ("lock", "inspection").
pub(crate) fn check_count(len: usize, what: &str) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::invalid(
            "resources",
            "the list of resources is empty",
        ));
    }
    if len > MAX_RESOURCES {
        return Err(Error::invalid(
            "resources",
            format!("{len} resources in one {what}; at most {MAX_RESOURCES}"),
        ));
    }
    Ok(())
}

fn shorten(name: &str) -> &str {
    match name.char_indices().nth(64) {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn rejects_bad_lists() {
        assert!(Resources::new::<&str>(&[]).is_err());
        assert!(Resources::new(&[""]).is_err());
        assert!(Resources::new(&["a", "a"]).is_err());
        assert!(Resources::new(&["x".repeat(MAX_RESOURCE_LEN + 1)]).is_err());
        assert!(Resources::new(&["x".repeat(MAX_RESOURCE_LEN)]).is_ok());
    }

    #[test]
    fn order_does_not_matter() {
        assert_eq!(
            Resources::new(&["b", "a"]).unwrap(),
            Resources::new(&["a", "b"]).unwrap()
        );
    }

    #[test]
    fn slotted_keys_of_a_name_share_its_slot() {
        use crate::slot::key_slot;
        for name in ["a", "{order:7}:stock", "}x{", "{}"] {
            let res = Resources::in_layout(&[name], Layout::Slotted).unwrap();
            let slot = key_slot(name.as_bytes());
            let mut keys = vec![res.lock_keys()[0].clone(), res.set_key(b"tok")];
            keys.extend(res.fence_keys());
            keys.extend(res.queue_keys());
            let rw = RwKeys::new(name, Layout::Slotted);
            keys.extend([rw.writer, rw.readers, rw.intent, rw.fence]);
            let sem = SemKeys::new(name, Layout::Slotted);
            keys.extend([sem.holders, sem.config]);
            for k in &keys {
                assert_eq!(key_slot(k), slot, "{name}: {}", String::from_utf8_lossy(k));
            }
            // The plain layout is unchanged: the name right after the prefix.
            let plain = Resources::new(&[name]).unwrap();
            assert_eq!(
                plain.lock_keys()[0],
                [LOCK_PREFIX, name.as_bytes()].concat()
            );
            assert_ne!(plain.lock_keys(), res.lock_keys());
        }
    }

    #[test]
    fn slotted_sets_must_share_a_slot() {
        let together = ["{order:7}:stock", "{order:7}:payment"];
        assert!(Resources::in_layout(&together, Layout::Slotted).is_ok());
        let apart = ["stock", "payment"];
        assert_ne!(
            crate::slot::key_slot(b"stock"),
            crate::slot::key_slot(b"payment")
        );
        let e = Resources::in_layout(&apart, Layout::Slotted).unwrap_err();
        assert!(e.to_string().contains("hash tag"), "{e}");
        // Plain masters take any set.
        assert!(Resources::in_layout(&apart, Layout::Plain).is_ok());
    }

    #[test]
    fn concatenation_does_not_collide() {
        // The classic defect: ["ab", "c"] and ["a", "bc"] joined without a separator.
        let x = Resources::new(&["ab", "c"]).unwrap();
        let y = Resources::new(&["a", "bc"]).unwrap();
        assert_ne!(x.lock_keys(), y.lock_keys());
    }

    #[test]
    fn namespaces_are_disjoint() {
        assert_ne!(
            lock_key(Layout::Plain, "fence:x"),
            fence_key(Layout::Plain, "x")
        );
        assert_ne!(lock_key(Layout::Plain, "x"), channel("x"));
        assert!(lock_key(Layout::Plain, "x").starts_with(b"quorumlock:lock:"));
        let rw = RwKeys::new("x", Layout::Plain);
        let sem = SemKeys::new("x", Layout::Plain);
        let all = [
            lock_key(Layout::Plain, "x"),
            fence_key(Layout::Plain, "x"),
            channel("x"),
            rw.writer.clone(),
            rw.readers.clone(),
            rw.intent.clone(),
            rw.fence.clone(),
            sem.holders.clone(),
            sem.config.clone(),
        ];
        let distinct: BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert_eq!(rw.writer, b"quorumlock:rw:x");
        assert_eq!(rw.readers, b"quorumlock:readers:x");
        assert_eq!(rw.intent, b"quorumlock:wintent:x");
        assert_eq!(rw.fence, b"quorumlock:rwfence:x");
        assert_eq!(sem.holders, b"quorumlock:sem:x");
        assert_eq!(sem.config, b"quorumlock:semcfg:x");
    }

    proptest! {
        /// Different sets of names never map to the same set of keys; equal sets always do.
        #[test]
        fn different_sets_different_keys(
            a in prop::collection::btree_set("[a-c:]{1,4}", 1..5),
            b in prop::collection::btree_set("[a-c:]{1,4}", 1..5),
        ) {
            let ra = Resources::new(&a.iter().collect::<Vec<_>>()).unwrap();
            let rb = Resources::new(&b.iter().collect::<Vec<_>>()).unwrap();
            let ka: BTreeSet<_> = ra.lock_keys().iter().cloned().collect();
            let kb: BTreeSet<_> = rb.lock_keys().iter().cloned().collect();
            prop_assert_eq!(a == b, ka == kb);
            for n in &a {
                for m in &b {
                    prop_assert_ne!(lock_key(Layout::Plain, n), fence_key(Layout::Plain, m));
                    prop_assert_ne!(lock_key(Layout::Plain, n), channel(m));
                    prop_assert_ne!(fence_key(Layout::Plain, n), channel(m));
                }
            }
        }
    }
}
