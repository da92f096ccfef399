//! The scripts a node runs: each Lua script of `src/scripts/`, included once, with its
//! SHA1 for `EVALSHA`, and the group-map record's request.

use super::*;

/// A Lua script: its source (the one copy, from `src/scripts/`) and its SHA1, computed
/// once from that source on first use.
pub(crate) struct Lua {
    pub(super) code: &'static str,
    hash: OnceLock<String>,
    /// Running it twice has the effect of running it once (compare-and-X scripts).
    pub(super) idempotent: bool,
}

impl Lua {
    pub(crate) const fn new(code: &'static str, idempotent: bool) -> Lua {
        Lua {
            code,
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

/// A script of `src/scripts/` (`$file` is relative to `src/`), optionally with
/// `scripts/sets.lua` in front.
macro_rules! lua {
    ($file:literal, idempotent: $idem:literal) => {
        $crate::io::node::Lua::new(include_str!(concat!("../../", $file)), $idem)
    };
    // With `scripts/sets.lua` (the functions that read multi-resource entries) in front.
    ($file:literal, sets, idempotent: $idem:literal) => {
        $crate::io::node::Lua::new(
            concat!(
                include_str!("../../scripts/sets.lua"),
                include_str!(concat!("../../", $file))
            ),
            $idem,
        )
    };
}

/// The acquire script for multi-resource locks (every key or none).
pub(crate) static ACQUIRE_MANY: Lua = lua!("scripts/acquire.lua", idempotent: false);
/// Compare-and-delete (and announce the release).
pub(crate) static RELEASE: Lua = lua!("scripts/release.lua", idempotent: true);
/// Compare-and-delete of one key, handing over to the wait queue's head.
pub(crate) static RELEASE_ONE: Lua = lua!("scripts/release_one.lua", sets, idempotent: true);
/// Join a wait queue. Never finished late nor retried (as an acquire): a first join landing
/// after the waiter's leave release would queue a token no one waits with, and the next
/// release would transfer the lock to it (found by `faults::row06b_…`).
pub(super) static ENQUEUE: Lua = lua!("scripts/enqueue.lua", sets, idempotent: false);
/// A queued waiter's acquire of one key: its own token there counts as granted.
pub(crate) static CLAIM: Lua = lua!("scripts/claim.lua", idempotent: false);
/// A multi-resource waiter's join of all its queues at once (never finished late nor
/// retried, as [`ENQUEUE`]).
pub(super) static ENQUEUE_MANY: Lua = lua!("scripts/enqueue_many.lua", sets, idempotent: false);
/// A queued multi-resource waiter's acquire: every key or none, its own token counting as
/// free.
pub(crate) static CLAIM_MANY: Lua = lua!("scripts/claim_many.lua", idempotent: false);
/// Compare-and-extend.
pub(crate) static EXTEND: Lua = lua!("scripts/extend.lua", idempotent: true);
/// The fenced acquire (round 1): every lock key or none, and the fence counters raised.
pub(crate) static ACQUIRE_FENCED: Lua = lua!("scripts/acquire_fenced.lua", idempotent: false);
/// The fence commit (round 2): raise the counters where our token still holds the keys.
pub(crate) static COMMIT_FENCE: Lua = lua!("scripts/commit_fence.lua", idempotent: true);
/// A reader's acquire (read-write locks).
pub(crate) static READ_ACQUIRE: Lua = lua!("scripts/read_acquire.lua", idempotent: false);
/// The writer's acquire (read-write locks), optionally fenced; registers a waiting
/// writer's intent when refused.
pub(crate) static WRITE_ACQUIRE: Lua = lua!("scripts/write_acquire.lua", idempotent: false);
/// A semaphore permit's acquire.
pub(crate) static SEM_ACQUIRE: Lua = lua!("scripts/sem_acquire.lua", idempotent: false);
/// Compare-and-extend of a sorted-set entry (reader, permit).
pub(crate) static SHARED_EXTEND: Lua = lua!("scripts/shared_extend.lua", idempotent: true);
/// Compare-and-delete of a sorted-set entry (reader, permit, writer intent).
pub(crate) static SHARED_RELEASE: Lua = lua!("scripts/shared_release.lua", idempotent: true);

/// The group-map record (see `groupmap`): sent with `EVAL`, a few times a minute per
/// node, so never cached.
const GROUP_MAP: &str = include_str!("../../scripts/groupmap.lua");

/// The group-map record request: on the node, record `map` in `key` with `lease` (or only
/// read it, when `lease` is zero); whole milliseconds, at least 1 when not zero.
pub(crate) fn group_map_request(key: &[u8], map: &str, lease: Duration) -> Cmd {
    let ms = if lease.is_zero() {
        0
    } else {
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    };
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(GROUP_MAP).arg(1).arg(key).arg(map).arg(ms);
    cmd
}
