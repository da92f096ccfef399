//! Resource names and the Redis keys they map to.
//!
//! Every resource maps to its own keys under fixed prefixes, so the mapping is
//! unambiguous by construction. Every key and channel starts with the client's
//! *namespace* ([`RedlockBuilder::namespace`](crate::RedlockBuilder::namespace), checked by
//! [`check_namespace`]), then `:`, a kind word ([`KINDS`]) and `:`; the table spells them
//! with the default namespace, `quorumlock`, and another namespace replaces that first
//! part only (`app:locks:lock:{name}`), so an ACL user confined to `~<namespace>:*
//! &<namespace>:*` reaches all of them. [`Keyspace`] builds every one of them:
//!
//! | key | holds |
//! | --- | --- |
//! | `quorumlock:lock:{name}` | the lock token, with the TTL |
//! | `quorumlock:fence:{name}` | the fence counter (fencing only; never expires; the largest fencing token issued or committed on this node, in microseconds since the Unix epoch or above) |
//! | `quorumlock:queue:{name}`, `quorumlock:qlease:{name}`, `quorumlock:qattrs:{name}` | waiters by ticket, when each one's lease lapses (and multi-resource waiters' listening marks: the leases key exists exactly while someone waits, and only then does a release run its hand-off), and what a release does with each entry (`<ttl ms>:<kind>[:<channel>]`: transfer, fenced transfer; the channel a transfer is announced on, the waiter's client's inbox) (notify waiting, on every node; vanish with the last lease) |
//! | `quorumlock:qset:<token>` | a multi-resource waiter's set: the channel a transfer to it is announced on, then each of its resources' lock key, queue, leases and attributes (`<length>:<bytes>` each); its entries' attributes are `<ttl ms>:m:quorumlock:qset:<token>`; lapses with the entries' lease |
//! | `quorumlock:released:{name}` | the pub/sub channel announcing releases that hand the lock to no one |
//! | `quorumlock:released:\xFFinbox:<16 hex>` | one client's inbox: the pub/sub channel announcing transfers to its waiters (byte `0xFF` never occurs in a name, so no resource's channel is an inbox) |
//! | `quorumlock:rw:{name}` | a read-write lock's writer token, with the TTL |
//! | `quorumlock:readers:{name}` | a read-write lock's readers: a sorted set, member = reader token, score = its expiry in ms by this node's clock |
//! | `quorumlock:wintent:{name}` | waiting writers' intents: member = writer id, score = the intent lease's expiry (node ms) |
//! | `quorumlock:rwfence:{name}` | the writer fence counter (fencing only; as `fence`) |
//! | `quorumlock:sem:{name}` | a semaphore's holders: member = permit token, score = its expiry (node ms) |
//! | `quorumlock:semcfg:{name}` | the semaphore's `"P:c:Q:N"`, expiring with the last holder |
//! | `quorumlock:groupmap` | the group-map record (see `groupmap`); the one key with no name |
//!
//! With [`Layout::Slotted`] (Redis Cluster voters), every key of a name carries the hash
//! tag of the name's slot right after `<namespace>:<kind>:`, and the channels are shard
//! channels: `<namespace>:released:`, byte [`SHARD_MARK`], the tag, then the name or the
//! inbox part. A namespace holds no `{` or `}`, so the tag is always the one Redis hashes.
//!
//! Every sorted set expires at its largest score (`PEXPIREAT`, set again after every change),
//! so an idle one vanishes by itself; a member is live while its score is ahead of the
//! node's clock, and every script purges the others first.
//!
//! Names are arbitrary non-empty byte strings (up to 4 KiB); nothing is concatenated, so no
//! two different names share a key, and the kinds never collide because the prefixes
//! differ before the name starts (two namespaces never collide either: [`KINDS`]): a
//! mutex, a read-write lock and a semaphore of the same name are three independent
//! things. A multi-resource lock is a *set*: its keys are the keys of its names, sorted; duplicates are refused, so two
//! different sets never map to the same keys, and `["a", "b"]` and `["b", "a"]` are the
//! same lock.

use std::sync::Arc;

use crate::error::Error;

/// The namespace every key and channel starts with unless
/// [`RedlockBuilder::namespace`](crate::RedlockBuilder::namespace) gives another.
pub const DEFAULT_NAMESPACE: &str = "quorumlock";
/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 256;

// The kind words: the segment after the namespace in every key and channel.
const LOCK: &str = "lock";
const FENCE: &str = "fence";
const RELEASED: &str = "released";
const QUEUE: &str = "queue";
const QUEUE_LEASE: &str = "qlease";
const QUEUE_ATTRS: &str = "qattrs";
/// Reserved: the set keys of an earlier multi-resource wait queue.
const QUEUE_SET: &str = "qset";
const RW: &str = "rw";
const READERS: &str = "readers";
const INTENT: &str = "wintent";
const RW_FENCE: &str = "rwfence";
const SEM: &str = "sem";
const SEM_CONFIG: &str = "semcfg";
const GROUP_MAP: &str = "groupmap";

/// Every kind word, the one list [`check_namespace`] refuses as a namespace's later
/// segment. A key is `<namespace>:<kind>:<rest>` (the group-map record
/// `<namespace>:groupmap`); were `a:lock` a namespace besides `a`, then `a` + `lock` +
/// `lock:x` and `a:lock` + `lock` + `x` would both spell `a:lock:lock:x`. With no kind word
/// after a namespace's first segment, the shorter of two namespaces that start one key is
/// followed in it by a kind word, which the longer one would have to contain as a later
/// segment: so two different namespaces never share a key or a channel.
const KINDS: &[&str] = &[
    LOCK,
    FENCE,
    RELEASED,
    QUEUE,
    QUEUE_LEASE,
    QUEUE_ATTRS,
    QUEUE_SET,
    RW,
    READERS,
    INTENT,
    RW_FENCE,
    SEM,
    SEM_CONFIG,
    GROUP_MAP,
];

/// Refuses a namespace that is not usable as the first part of every key and channel:
/// empty, longer than [`MAX_NAMESPACE_LEN`], with a `{` or `}` (a Redis Cluster hash tag
/// must be the one the keys carry after their kind), a glob character `* ? [ ] \` (the ACL
/// pattern `~<namespace>:*` must match this namespace only), whitespace or control characters, an
/// empty `:`-separated segment (a leading, trailing or double colon), or a kind word as a
/// segment after the first ([`KINDS`]: two namespaces could then spell one key). A `&str`
/// never holds byte `0xFE` or `0xFF`, which mark shard channels and inboxes.
pub(crate) fn check_namespace(ns: &str) -> Result<(), Error> {
    let refuse = |why: String| Err(Error::config("namespace", why));
    if ns.is_empty() {
        return refuse("empty; the default is \"quorumlock\"".to_owned());
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return refuse(format!("{} bytes; at most {MAX_NAMESPACE_LEN}", ns.len()));
    }
    if let Some(c) = ns.chars().find(|c| {
        matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\') || c.is_whitespace() || c.is_control()
    }) {
        return refuse(format!(
            "{:?} holds {c:?}; a namespace has no braces (they would make a Redis Cluster \
             hash tag), no glob characters `* ? [ ] \\` (an ACL pattern `~<namespace>:*` \
             would then reach other namespaces' keys), whitespace or control characters",
            shorten(ns)
        ));
    }
    let mut segments = ns.split(':');
    if ns.split(':').any(str::is_empty) {
        return refuse(format!(
            "{:?} has an empty segment (a leading, trailing or double colon)",
            shorten(ns)
        ));
    }
    segments.next();
    if let Some(kind) = segments.find(|s| KINDS.contains(s)) {
        return refuse(format!(
            "{:?} has {kind:?} as a segment after its first; the library's keys use it after \
             the namespace, so another namespace could spell the same keys",
            shorten(ns)
        ));
    }
    Ok(())
}

/// Where a lock group's keys and channels are: the namespace every one starts with, and
/// the key layout of the group's voters. The same for every client of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keyspace {
    /// A namespace [`check_namespace`] accepted.
    ns: Arc<str>,
    layout: Layout,
}

impl Default for Keyspace {
    fn default() -> Keyspace {
        Keyspace::in_default(Layout::Plain)
    }
}

impl Keyspace {
    /// The keyspace of the namespace `ns` (checked with [`check_namespace`]) in `layout`.
    pub(crate) fn new(ns: Arc<str>, layout: Layout) -> Keyspace {
        Keyspace { ns, layout }
    }
    /// The default namespace's keyspace in `layout`.
    pub(crate) fn in_default(layout: Layout) -> Keyspace {
        Keyspace::new(Arc::from(DEFAULT_NAMESPACE), layout)
    }
    /// `<namespace>:<kind>:`.
    fn prefix(&self, kind: &str) -> Vec<u8> {
        let mut p = Vec::with_capacity(self.ns.len() + kind.len() + 2);
        p.extend_from_slice(self.ns.as_bytes());
        p.push(b':');
        p.extend_from_slice(kind.as_bytes());
        p.push(b':');
        p
    }
    /// `<namespace>:<kind>:`, in the slotted layout the hash tag of `name`'s slot, `name`.
    fn key(&self, kind: &str, name: &str) -> Vec<u8> {
        let tag = match self.layout {
            Layout::Plain => String::new(),
            Layout::Slotted => crate::slot::name_tag(name),
        };
        let mut k = self.prefix(kind);
        k.extend_from_slice(tag.as_bytes());
        k.extend_from_slice(name.as_bytes());
        k
    }
    /// The lock key of one resource name.
    pub(crate) fn lock_key(&self, name: &str) -> Vec<u8> {
        self.key(LOCK, name)
    }
    /// The fence counter key of one resource name.
    pub(crate) fn fence_key(&self, name: &str) -> Vec<u8> {
        self.key(FENCE, name)
    }
    /// The wait queue, its leases and its entries' attributes of one resource name.
    pub(crate) fn queue_keys(&self, name: &str) -> [Vec<u8>; 3] {
        [
            self.key(QUEUE, name),
            self.key(QUEUE_LEASE, name),
            self.key(QUEUE_ATTRS, name),
        ]
    }
    /// The release channel of one resource name: with [`Layout::Slotted`] a *shard
    /// channel* (`SPUBLISH`/`SSUBSCRIBE`): byte [`SHARD_MARK`] after the prefix, then the
    /// hash tag of the name's slot and the name.
    pub(crate) fn channel(&self, name: &str) -> Vec<u8> {
        match self.layout {
            Layout::Plain => self.key(RELEASED, name),
            Layout::Slotted => self.sharded(name, name.as_bytes()),
        }
    }
    /// `<namespace>:released:`, [`SHARD_MARK`], the hash tag of `name`'s slot, then `rest`.
    fn sharded(&self, name: &str, rest: &[u8]) -> Vec<u8> {
        let tag = crate::slot::name_tag(name);
        let mut ch = self.prefix(RELEASED);
        ch.push(SHARD_MARK);
        ch.extend_from_slice(tag.as_bytes());
        ch.extend_from_slice(rest);
        ch
    }
    /// A client's inbox channel: `<namespace>:released:`, byte `0xFF`, `inbox:` and `id` in
    /// 16 hex digits. Under the release channels' prefix, so an ACL that allows
    /// `&<namespace>:released:*` allows the inbox too; never equal to a resource's channel.
    /// (Its sharded form, in a resources' slot: [`Resources::inbox`].)
    pub(crate) fn inbox_channel(&self, id: u64) -> Vec<u8> {
        let mut ch = self.prefix(RELEASED);
        ch.extend_from_slice(INBOX_MARK);
        ch.extend_from_slice(format!("{id:016x}").as_bytes());
        ch
    }
    /// The group-map record's key (see `groupmap`): `<namespace>:groupmap`.
    pub(crate) fn record_key(&self) -> Vec<u8> {
        let mut k = self.prefix(GROUP_MAP);
        k.pop();
        k
    }
}

/// The longest resource name accepted, in bytes.
pub const MAX_RESOURCE_LEN: usize = 4096;
/// The most resources one multi-resource lock may take.
pub const MAX_RESOURCES: usize = 1024;

/// The validated resources of one lock, sorted, with their keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resources {
    names: Arc<[String]>,
    lock_keys: Arc<[Vec<u8>]>,
    space: Keyspace,
}

/// How a lock group spells its keys: the same on every voter of the group, so that every
/// client of the group finds every other client's keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Layout {
    /// Plain masters: `<namespace>:lock:<name>`, as in every release before cluster voters
    /// (clients of different versions share a group of plain masters).
    #[default]
    Plain,
    /// Redis Cluster voters: every key of a name carries, right after its prefix, the hash
    /// tag of the name's own slot ([`crate::slot`]), `<namespace>:lock:{1f3}<name>`, so one
    /// script can touch all of them and they live in the slot `CLUSTER KEYSLOT <name>` names.
    Slotted,
}

impl Resources {
    /// Validates one or more names, in the default namespace with the
    /// [plain](Layout::Plain) key layout (a lock group then gives them its own keyspace:
    /// `Inner::resources`).
    pub(crate) fn new<S: AsRef<str>>(names: &[S]) -> Result<Resources, Error> {
        Resources::in_space(names, &Keyspace::default())
    }

    /// Validates one or more names for a group with this keyspace. With
    /// [`Layout::Slotted`], every name of a multi-resource lock must be in one hash slot
    /// (a script touches the keys of one slot only).
    pub(crate) fn in_space<S: AsRef<str>>(
        names: &[S],
        space: &Keyspace,
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
        if space.layout == Layout::Slotted {
            check_one_slot(&sorted)?;
        }
        let lock_keys = sorted.iter().map(|n| space.lock_key(n)).collect();
        Ok(Resources {
            names: sorted.into(),
            lock_keys,
            space: space.clone(),
        })
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }
    pub(crate) fn lock_keys(&self) -> &[Vec<u8>] {
        &self.lock_keys
    }
    pub(crate) fn fence_keys(&self) -> Vec<Vec<u8>> {
        self.names.iter().map(|n| self.space.fence_key(n)).collect()
    }
    /// The keyspace of the group these resources were validated for.
    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.space
    }
    /// Whether node `i` of `n` is one of the two *heralds* of the first resource ([`is_herald`]).
    pub(crate) fn is_herald(&self, i: usize, n: usize) -> bool {
        is_herald(self.names.first().map_or("", String::as_str), i, n)
    }

    /// Whether node `i` of `n` announces this lock's plain releases (and names unservable
    /// heads), with notify waiting: a lock on one resource on the resource's two heralds; a
    /// lock on several on every node (a waiter for several resources listens to each of
    /// them, and with the two heralds of each unavailable, 5 nodes and more, no one would
    /// announce the release to it).
    pub(crate) fn announces_on(&self, i: usize, n: usize) -> bool {
        self.names.len() > 1 || self.is_herald(i, n)
    }

    /// The wait queue and its leases (single-resource locks use the first name).
    pub(crate) fn queue_keys(&self) -> [Vec<u8>; 3] {
        self.space
            .queue_keys(self.names.first().map_or("", String::as_str))
    }
    pub(crate) fn channels(&self) -> Vec<Vec<u8>> {
        self.names.iter().map(|n| self.space.channel(n)).collect()
    }
    /// The channel a transfer to a waiter of this client is announced on, from the
    /// client's `inbox` ([`Keyspace::inbox_channel`]): the inbox itself on plain masters;
    /// on Redis Cluster voters a *sharded* inbox in the resources' slot (a script may
    /// publish to a shard channel of its own slot only).
    pub(crate) fn inbox(&self, inbox: &[u8]) -> Vec<u8> {
        match (self.space.layout, self.names.first()) {
            (Layout::Slotted, Some(n)) => {
                let skip = self.space.prefix(RELEASED).len();
                let own = inbox.get(skip..).unwrap_or_default();
                self.space.sharded(n, own)
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
    pub(crate) fn new(name: &str, space: &Keyspace) -> RwKeys {
        RwKeys {
            writer: space.key(RW, name),
            readers: space.key(READERS, name),
            intent: space.key(INTENT, name),
            fence: space.key(RW_FENCE, name),
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
    pub(crate) fn new(name: &str, space: &Keyspace) -> SemKeys {
        SemKeys {
            holders: space.key(SEM, name),
            config: space.key(SEM_CONFIG, name),
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
/// Marks a shard channel: the byte right after `<namespace>:released:`. `0xFE` never
/// occurs in UTF-8, so no namespace or resource name holds it, and an inbox's id is hex:
/// a channel is a shard channel exactly when it holds this byte anywhere, which is what
/// the release scripts test to choose `SPUBLISH` over `PUBLISH` (`release_one.lua`), with
/// no need to know the namespace's length.
pub(crate) const SHARD_MARK: u8 = 0xFE;

/// Whether `channel` is a shard channel ([`Keyspace::channel`] with [`Layout::Slotted`],
/// or a sharded inbox): whether it holds [`SHARD_MARK`].
pub(crate) fn is_sharded(channel: &[u8]) -> bool {
    channel.contains(&SHARD_MARK)
}

/// The marker that starts a client's inbox name after `<namespace>:released:`: byte `0xFF`,
/// which never occurs in UTF-8, so no resource name (a `str`) can produce an inbox's
/// channel.
const INBOX_MARK: &[u8] = b"\xffinbox:";

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

    fn slotted() -> Keyspace {
        Keyspace::in_default(Layout::Slotted)
    }
    fn plain() -> Keyspace {
        Keyspace::default()
    }

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
            let res = Resources::in_space(&[name], &slotted()).unwrap();
            let slot = key_slot(name.as_bytes());
            let mut keys = vec![res.lock_keys()[0].clone()];
            keys.extend(res.fence_keys());
            keys.extend(res.queue_keys());
            let rw = RwKeys::new(name, &slotted());
            keys.extend([rw.writer, rw.readers, rw.intent, rw.fence]);
            let sem = SemKeys::new(name, &slotted());
            keys.extend([sem.holders, sem.config]);
            for k in &keys {
                assert_eq!(key_slot(k), slot, "{name}: {}", String::from_utf8_lossy(k));
            }
            // The plain layout is unchanged: the name right after the prefix.
            let plain = Resources::new(&[name]).unwrap();
            assert_eq!(
                plain.lock_keys()[0],
                [b"quorumlock:lock:", name.as_bytes()].concat()
            );
            assert_ne!(plain.lock_keys(), res.lock_keys());
        }
    }

    #[test]
    fn slotted_sets_must_share_a_slot() {
        let together = ["{order:7}:stock", "{order:7}:payment"];
        assert!(Resources::in_space(&together, &slotted()).is_ok());
        let apart = ["stock", "payment"];
        assert_ne!(
            crate::slot::key_slot(b"stock"),
            crate::slot::key_slot(b"payment")
        );
        let e = Resources::in_space(&apart, &slotted()).unwrap_err();
        assert!(e.to_string().contains("hash tag"), "{e}");
        // Plain masters take any set.
        assert!(Resources::in_space(&apart, &plain()).is_ok());
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
        assert_ne!(plain().lock_key("fence:x"), plain().fence_key("x"));
        assert_ne!(plain().lock_key("x"), plain().channel("x"));
        assert!(plain().lock_key("x").starts_with(b"quorumlock:lock:"));
        let rw = RwKeys::new("x", &plain());
        let sem = SemKeys::new("x", &plain());
        let all = [
            plain().lock_key("x"),
            plain().fence_key("x"),
            plain().channel("x"),
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

    /// Every key and channel of `name` in `space`: each kind's key, the set key of a
    /// token, the sharded inbox, the client inbox and the group-map record.
    fn every_key(space: &Keyspace, name: &str) -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = KINDS.iter().map(|k| space.key(k, name)).collect();
        all.push(space.channel(name));
        all.push(space.inbox_channel(7));
        all.push(space.record_key());
        if let Ok(res) = Resources::in_space(&[name], space) {
            all.push(res.inbox(&space.inbox_channel(7)));
        }
        all
    }

    #[test]
    fn the_default_namespace_spells_every_key_as_before() {
        let p = plain();
        let res = Resources::new(&["x"]).unwrap();
        assert_eq!(res.lock_keys()[0], b"quorumlock:lock:x");
        assert_eq!(res.fence_keys()[0], b"quorumlock:fence:x");
        assert_eq!(
            res.queue_keys(),
            [
                b"quorumlock:queue:x".to_vec(),
                b"quorumlock:qlease:x".to_vec(),
                b"quorumlock:qattrs:x".to_vec()
            ]
        );
        assert_eq!(res.channels()[0], b"quorumlock:released:x");
        assert_eq!(
            p.inbox_channel(0xab),
            b"quorumlock:released:\xffinbox:00000000000000ab"
        );
        assert_eq!(p.record_key(), b"quorumlock:groupmap");
        let s = slotted();
        let tag = crate::slot::name_tag("x");
        assert_eq!(
            s.lock_key("x"),
            format!("quorumlock:lock:{tag}x").as_bytes()
        );
        let mut ch = b"quorumlock:released:\xfe".to_vec();
        ch.extend_from_slice(format!("{tag}x").as_bytes());
        assert_eq!(s.channel("x"), ch);
        // Byte 21 of a shard channel is still the mark, as scripts of earlier releases test.
        assert_eq!(ch[20], SHARD_MARK);
    }

    #[test]
    fn a_namespace_replaces_the_first_part_of_every_key_and_channel() {
        for layout in [Layout::Plain, Layout::Slotted] {
            let ns = Keyspace::new(Arc::from("app:locks"), layout);
            let default = Keyspace::in_default(layout);
            let ours = every_key(&ns, "orders:42");
            let theirs = every_key(&default, "orders:42");
            assert_eq!(ours.len(), theirs.len());
            for (o, t) in ours.iter().zip(&theirs) {
                assert!(
                    o.starts_with(b"app:locks:"),
                    "{}",
                    String::from_utf8_lossy(o)
                );
                assert_eq!(&o[b"app:locks".len()..], &t[DEFAULT_NAMESPACE.len()..]);
                // The shard mark, and so the choice of SPUBLISH, is found with any namespace.
                assert_eq!(is_sharded(o), is_sharded(t));
            }
            let res = Resources::in_space(&["orders:42"], &ns).unwrap();
            assert_eq!(is_sharded(&res.channels()[0]), layout == Layout::Slotted);
            if layout == Layout::Slotted {
                // The hash tag is the name's own: the namespace cannot hold braces.
                let slot = crate::slot::key_slot(b"orders:42");
                for k in [&res.lock_keys()[0], &res.channels()[0]] {
                    assert_eq!(crate::slot::key_slot(k), slot);
                }
            }
        }
    }

    #[test]
    fn namespaces_are_checked() {
        let field = |ns: &str| match check_namespace(ns) {
            Err(Error::Config(c)) => Some(c.field().to_owned()),
            Err(other) => panic!("{ns:?}: not a config error: {other}"),
            Ok(()) => None,
        };
        for ok in [
            "quorumlock",
            "app",
            "app:locks",
            "lock",
            "a-b_c.d:e/f",
            "ünï",
            &"x".repeat(MAX_NAMESPACE_LEN),
        ] {
            assert_eq!(field(ok), None, "{ok:?}");
        }
        for bad in [
            "",
            &"x".repeat(MAX_NAMESPACE_LEN + 1),
            "{app}",
            "app}",
            "a b",
            "a\tb",
            "a\nb",
            "a\u{7f}b",
            "a\u{0}b",
            "a\u{a0}b",
            ":app",
            "app:",
            "a::b",
            ":",
            "app:lock",
            "app:locks:released",
            "a:groupmap",
            "a:b:qset",
            "a*",
            "app?",
            "a[b]",
            "a\\b",
        ] {
            assert_eq!(field(bad).as_deref(), Some("namespace"), "{bad:?}");
        }
        let e = check_namespace("app:lock").unwrap_err().to_string();
        assert!(e.contains("\"lock\""), "{e}");
    }

    /// Valid namespaces built to come close to one another: a first segment that may be a
    /// kind word, then up to two segments that prefix one another.
    fn namespace() -> impl Strategy<Value = String> {
        let first = prop::sample::select(vec!["a", "b", "lock", "qset", "groupmap", "released"]);
        let later = prop::collection::vec(prop::sample::select(vec!["a", "b", "ab"]), 0..3);
        (first, later).prop_map(|(f, l)| std::iter::once(f).chain(l).collect::<Vec<_>>().join(":"))
    }

    #[test]
    fn a_kind_word_after_the_first_segment_would_let_two_namespaces_share_a_key() {
        // Why check_namespace refuses "a:lock": "a" would spell its keys.
        let a = Keyspace::new(Arc::from("a"), Layout::Plain);
        let a_lock = Keyspace::new(Arc::from("a:lock"), Layout::Plain);
        assert_eq!(a.lock_key("lock:x"), a_lock.lock_key("x"));
        assert!(check_namespace("a").is_ok());
        assert!(check_namespace("a:lock").is_err());
    }

    proptest! {
        /// Two different valid namespaces never spell one key or channel, whatever the
        /// kinds and names: even with kind words as first segments and in names.
        #[test]
        fn different_namespaces_never_share_a_key(
            a in namespace(),
            b in namespace(),
            names in prop::collection::vec("(lock|fence|groupmap|a|b|:){1,5}", 1..4),
            slotted in any::<bool>(),
        ) {
            prop_assume!(a != b);
            prop_assert!(check_namespace(&a).is_ok() && check_namespace(&b).is_ok());
            let layout = if slotted { Layout::Slotted } else { Layout::Plain };
            let (sa, sb) = (Keyspace::new(Arc::from(a.as_str()), layout), Keyspace::new(Arc::from(b.as_str()), layout));
            let ka: BTreeSet<Vec<u8>> = names.iter().flat_map(|n| every_key(&sa, n)).collect();
            for n in &names {
                for k in every_key(&sb, n) {
                    prop_assert!(!ka.contains(&k), "{a:?} and {b:?} share {}", String::from_utf8_lossy(&k));
                }
            }
        }
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
                    prop_assert_ne!(plain().lock_key(n), plain().fence_key(m));
                    prop_assert_ne!(plain().lock_key(n), plain().channel(m));
                    prop_assert_ne!(plain().fence_key(n), plain().channel(m));
                }
            }
        }
    }
}
