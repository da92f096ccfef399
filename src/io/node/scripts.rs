//! The scripts a node runs: each Lua script of `src/scripts/`, included once, with its
//! SHA1 for `EVALSHA`, and the group-map record's request.

use super::*;

/// A Lua script: its source (the one copy, from `src/scripts/`) and its SHA1, computed
/// once from that source on first use.
pub(crate) struct Lua {
    pub(super) code: &'static str,
    /// The files of `src/scripts/` its source is made of, in order (read by the simulator).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(super) files: &'static [&'static str],
    hash: OnceLock<String>,
    /// Running it twice has the effect of running it once (compare-and-X scripts).
    pub(super) idempotent: bool,
}

impl Lua {
    pub(crate) const fn new(
        code: &'static str,
        files: &'static [&'static str],
        idempotent: bool,
    ) -> Lua {
        Lua {
            code,
            files,
            hash: OnceLock::new(),
            idempotent,
        }
    }

    /// The script's SHA1, for `EVALSHA`.
    pub(super) fn hash(&self) -> &str {
        self.hash
            .get_or_init(|| redis::Script::new(self.code).get_hash().to_owned())
    }
}

macro_rules! lua {
    ($file:literal, idempotent: $idem:literal) => {
        $crate::io::node::Lua::new(
            include_str!(concat!("../../scripts/", $file)),
            &[$file],
            $idem,
        )
    };
    // With `scripts/queue.lua` (the wait-queue helpers: clock, purge, tidy) in front.
    ($file:literal, queue, idempotent: $idem:literal) => {
        $crate::io::node::Lua::new(
            concat!(
                include_str!("../../scripts/queue.lua"),
                include_str!(concat!("../../scripts/", $file))
            ),
            &["queue.lua", $file],
            $idem,
        )
    };
}

/// The acquire script for multi-resource locks (every key or none).
pub(crate) static ACQUIRE_MANY: Lua = lua!("acquire.lua", idempotent: false);
/// Compare-and-delete (and announce the release).
pub(crate) static RELEASE: Lua = lua!("release.lua", idempotent: true);
/// Compare-and-delete of a mutex's keys: a plain compare-and-delete where no one waits
/// (`release_one.lua`, which returns there), else the hand-off to the wait queue's head
/// (`queue.lua`, then `handoff.lua`, run only for the resources someone waits for).
pub(crate) static RELEASE_ONE: Lua = Lua::new(
    concat!(
        include_str!("../../scripts/release_one.lua"),
        include_str!("../../scripts/queue.lua"),
        include_str!("../../scripts/handoff.lua")
    ),
    &["release_one.lua", "queue.lua", "handoff.lua"],
    true,
);
/// Join a wait queue. Never finished late nor retried (as an acquire): a first join landing
/// after the waiter's leave release would queue a token no one waits with, and the next
/// release would transfer the lock to it (found by `faults::row06b_…`).
pub(crate) static ENQUEUE: Lua = lua!("enqueue.lua", queue, idempotent: false);
/// A queued waiter's acquire of one key: its own token there counts as granted.
pub(crate) static CLAIM: Lua = lua!("claim.lua", idempotent: false);
/// A multi-resource waiter's mark on its resources' leases: releases there announce.
pub(crate) static LISTEN: Lua = lua!("listen.lua", queue, idempotent: true);
/// Compare-and-extend.
pub(crate) static EXTEND: Lua = lua!("extend.lua", idempotent: true);
/// The fenced acquire (round 1): every lock key or none, and the fence counters raised.
pub(crate) static ACQUIRE_FENCED: Lua = lua!("acquire_fenced.lua", idempotent: false);
/// The fence commit (round 2): raise the counters where our token still holds the keys.
pub(crate) static COMMIT_FENCE: Lua = lua!("commit_fence.lua", idempotent: true);
/// A reader's acquire (read-write locks).
pub(crate) static READ_ACQUIRE: Lua = lua!("read_acquire.lua", idempotent: false);
/// The writer's acquire (read-write locks), optionally fenced; registers a waiting
/// writer's intent when refused.
pub(crate) static WRITE_ACQUIRE: Lua = lua!("write_acquire.lua", idempotent: false);
/// A semaphore permit's acquire.
pub(crate) static SEM_ACQUIRE: Lua = lua!("sem_acquire.lua", idempotent: false);
/// Compare-and-extend of a sorted-set entry (reader, permit).
pub(crate) static SHARED_EXTEND: Lua = lua!("shared_extend.lua", idempotent: true);
/// Compare-and-delete of a sorted-set entry (reader, permit, writer intent).
pub(crate) static SHARED_RELEASE: Lua = lua!("shared_release.lua", idempotent: true);

/// The group-map record (see `groupmap`): sent with `EVAL`, a few times a minute per
/// node, so never cached.
pub(crate) static GROUP_MAP: Lua = lua!("groupmap.lua", idempotent: true);

/// Every script the crate sends, by name (its file under `src/scripts/` without `.lua`):
/// the one table of them, which the simulator (feature `sim`) loads too.
#[cfg_attr(not(feature = "sim"), allow(dead_code))]
pub(crate) static SCRIPTS: [(&str, &Lua); 15] = [
    ("acquire", &ACQUIRE_MANY),
    ("acquire_fenced", &ACQUIRE_FENCED),
    ("commit_fence", &COMMIT_FENCE),
    ("extend", &EXTEND),
    ("release", &RELEASE),
    ("release_one", &RELEASE_ONE),
    ("enqueue", &ENQUEUE),
    ("claim", &CLAIM),
    ("listen", &LISTEN),
    ("read_acquire", &READ_ACQUIRE),
    ("write_acquire", &WRITE_ACQUIRE),
    ("sem_acquire", &SEM_ACQUIRE),
    ("shared_extend", &SHARED_EXTEND),
    ("shared_release", &SHARED_RELEASE),
    ("groupmap", &GROUP_MAP),
];

/// The group-map record request: on the node, record `map` in `key` with `lease` (or only
/// read it, when `lease` is zero); whole milliseconds, at least 1 when not zero.
pub(crate) fn group_map_request(key: &[u8], map: &str, lease: Duration) -> Cmd {
    let ms = if lease.is_zero() {
        0
    } else {
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    };
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(GROUP_MAP.code).arg(1).arg(key).arg(map).arg(ms);
    cmd
}
