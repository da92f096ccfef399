//! Redis Cluster's key slots: which of the 16,384 slots a key lives in, and the hash tag
//! that puts quorumlock's keys for a name in the very slot Redis gives the name itself.
//!
//! Redis Cluster hashes a key to a slot with CRC16 (XMODEM) modulo 16,384; if the key
//! holds a *hash tag*, a non-empty `{…}` (from the first `{` to the first `}` after it),
//! only the tag is hashed. A script may only touch keys of one slot, so on a voter that is
//! a Redis Cluster every key of one resource (lock, fence counter, wait queue) carries the
//! same tag. The tag quorumlock uses is chosen from a table: for each slot `s`, the first
//! of the strings `0`, `1`, `2`, … (in hex) whose own slot is `s`. The key of name `n`
//! is then `quorumlock:lock:{<tag of slot(n)>}n`, which is in `slot(n)`: names Redis would
//! keep together (a common hash tag such as `{order:7}`) stay together, and
//! `CLUSTER KEYSLOT <name>` tells which shard holds a resource's keys.
//!
//! ```text
//!   name ──key_slot──▶ s ──tag_for(s)──▶ "{1f3}" ──▶ quorumlock:lock:{1f3}name   (key_slot = s)
//! ```

use std::sync::OnceLock;

/// The number of slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The slot Redis Cluster gives `key`: CRC16 of its hash tag (the bytes between the
/// first `{` and the first `}` after it, when not empty), or of the whole key.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| rest.get(..close)).flatten()
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum of Redis
/// Cluster's key slots.
pub(crate) fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash tag (with its braces) that puts a key in `slot`: `{<hex>}`, the first hex
/// number whose CRC16 lands there. The same in every process and version (a fixed search).
pub(crate) fn tag_for(slot: u16) -> String {
    let table = TAGS.get_or_init(build_tags);
    let n = table.get(usize::from(slot % SLOTS)).copied().unwrap_or(0);
    format!("{{{n:x}}}")
}

/// The hash tag of `name`'s own slot: `tag_for(key_slot(name))`, what every key and shard
/// channel of the resource `name` carries on a Redis Cluster voter.
pub(crate) fn name_tag(name: &str) -> String {
    tag_for(key_slot(name.as_bytes()))
}

static TAGS: OnceLock<Vec<u32>> = OnceLock::new();

/// For every slot, the first number whose hex form hashes to it (about 180,000 numbers
/// are tried; every slot is covered well before 2^20, and the loop is bounded by it).
fn build_tags() -> Vec<u32> {
    let mut table = vec![u32::MAX; usize::from(SLOTS)];
    let mut left = usize::from(SLOTS);
    for n in 0u32..(1 << 20) {
        let s = usize::from(crc16(format!("{n:x}").as_bytes()) % SLOTS);
        if let Some(t) = table.get_mut(s)
            && *t == u32::MAX
        {
            *t = n;
            left -= 1;
            if left == 0 {
                break;
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        // The checksum itself, from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot(b"{}foo"), crc16(b"{}foo") % SLOTS);
        // Only the first tag counts; an unclosed brace is no tag.
        assert_eq!(key_slot(b"a{b}{c}"), key_slot(b"b"));
        assert_eq!(key_slot(b"a{b"), crc16(b"a{b") % SLOTS);
    }

    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for s in 0..SLOTS {
            let tag = tag_for(s);
            assert_eq!(key_slot(format!("x:{tag}y").as_bytes()), s, "slot {s}");
        }
    }

    #[test]
    fn a_tagged_key_is_in_its_names_slot() {
        for name in ["a", "order:7", "{order:7}:stock", "}weird{", "{}", "ünï"] {
            let s = key_slot(name.as_bytes());
            let key = format!("quorumlock:lock:{}{name}", tag_for(s));
            assert_eq!(key_slot(key.as_bytes()), s, "{name}");
        }
    }
}
