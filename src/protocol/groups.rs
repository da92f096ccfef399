//! Lock groups: which of G independent groups of nodes a resource lives in, and the
//! record that lets clients with different group maps notice one another.
//!
//! # Routing: rendezvous hashing
//!
//! Every group has an identity (the canonical addresses of its nodes, see
//! [`identity`]). A resource goes to the group whose `weight(identity, resource)` is the
//! largest (ties: the first group). Adding a group moves only the resources for which the
//! new group wins, about `1/(G+1)` of them; removing one moves only that group's
//! resources. The weight is a fixed hash (FNV-1a, then the SplitMix64 finalizer), written
//! here so that it never changes with a Rust release or a platform: two clients built from
//! different versions of this crate route alike.
//!
//! # The group map
//!
//! The ordered identities and a version number make the *group map*. Its
//! [`fingerprint`] is what clients compare: a client that finds another map recorded on a
//! node refuses to lock, because two maps may route the same resource to two groups and
//! then two clients would hold it at once.

/// A group's identity: its nodes' canonical addresses (no passwords), sorted, joined by
/// newlines. Independent of the order the nodes were listed in.
pub(crate) fn identity<I, S>(addrs: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut all: Vec<String> = addrs.into_iter().map(|a| a.as_ref().to_owned()).collect();
    all.sort();
    all.join("\n").into_bytes()
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// The SplitMix64 finalizer: spreads FNV-1a's weak high bits over the whole word.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a resource name is routed by: its hash tag, as Redis Cluster reads it (the part
/// between the first `{` and the next `}`, when that part is not empty), else the whole
/// name. Names with one tag share a group whatever else they hold.
pub(crate) fn routing_key(name: &str) -> &[u8] {
    if let Some(open) = name.find('{') {
        let rest = &name[open + 1..];
        if let Some(close) = rest.find('}')
            && close > 0
        {
            return &rest.as_bytes()[..close];
        }
    }
    name.as_bytes()
}

/// The rendezvous weight of `resource` in the group `identity`.
pub(crate) fn weight(identity: &[u8], resource: &[u8]) -> u64 {
    let h = fnv1a(FNV_OFFSET, identity);
    // A separator that no address contains, so that (id, resource) pairs cannot collide
    // by moving bytes from one to the other.
    let h = fnv1a(h, &[0xff]);
    mix(fnv1a(h, resource))
}

/// The group of `resource`: the index of the identity with the largest weight (the first
/// on a tie). `None` when there is no group.
pub(crate) fn route<T: AsRef<[u8]>>(identities: &[T], resource: &[u8]) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (i, id) in identities.iter().enumerate() {
        let w = weight(id.as_ref(), resource);
        if best.is_none_or(|(_, b)| w > b) {
            best = Some((i, w));
        }
    }
    best.map(|(i, _)| i)
}

/// The fingerprint of a group map: the version, the number of groups and a hash of the
/// ordered identities, as `v<version>/<groups>/<16 hex digits>`. Equal maps have equal
/// fingerprints; a changed node, order or version changes it.
pub(crate) fn fingerprint<T: AsRef<[u8]>>(version: u16, identities: &[T]) -> String {
    let mut h = FNV_OFFSET;
    for id in identities {
        h = fnv1a(h, id.as_ref());
        h = fnv1a(h, &[0xff]);
    }
    format!("v{version}/{}/{:016x}", identities.len(), mix(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(g: usize) -> Vec<Vec<u8>> {
        (0..g)
            .map(|i| identity((0..5).map(|n| format!("redis://127.0.0.1:{}", 7000 + 100 * i + n))))
            .collect()
    }

    fn names(count: usize, seed: u64) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| format!("resource:{seed}:{i}").into_bytes())
            .collect()
    }

    #[test]
    fn weights_are_fixed_values() {
        // Pinned so that a change of the hash (which would re-route every resource and
        // make two versions of this crate disagree) fails here first.
        assert_eq!(weight(b"", b""), mix(fnv1a(FNV_OFFSET, &[0xff])));
        let a = weight(b"redis://127.0.0.1:7001", b"orders:42");
        let b = weight(b"redis://127.0.0.1:7001", b"orders:43");
        assert_ne!(a, b);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
    }

    #[test]
    fn identity_ignores_order() {
        assert_eq!(
            identity(["redis://b:1", "redis://a:1"]),
            identity(["redis://a:1", "redis://b:1"])
        );
        assert_ne!(identity(["redis://a:1"]), identity(["redis://a:2"]));
    }

    /// Within ±10 % of the mean for 10,000 resources and G = 2, 3, 4, 8.
    #[test]
    fn spreads_evenly() {
        for g in [2usize, 3, 4, 8] {
            let ids = ids(g);
            let mut counts = vec![0usize; g];
            for r in names(10_000, g as u64) {
                counts[route(&ids, &r).unwrap()] += 1;
            }
            let mean = 10_000.0 / g as f64;
            for c in &counts {
                let off = (*c as f64 - mean).abs() / mean;
                assert!(off < 0.10, "G = {g}: {counts:?}");
            }
        }
    }

    /// Adding a group moves only resources to the new group, about 1/(G+1) of them.
    #[test]
    fn adding_a_group_moves_only_its_share() {
        for g in [1usize, 2, 3, 4, 7] {
            let before = ids(g);
            let after = ids(g + 1);
            let mut moved = 0usize;
            let all = names(10_000, 99);
            for r in &all {
                let a = route(&before, r).unwrap();
                let b = route(&after, r).unwrap();
                if a != b {
                    assert_eq!(b, g, "a resource moved between old groups");
                    moved += 1;
                }
            }
            let share = moved as f64 / all.len() as f64;
            let expected = 1.0 / (g + 1) as f64;
            assert!(
                (share - expected).abs() < 0.1 * expected,
                "G {g} → {}: {share} moved, expected {expected}",
                g + 1
            );
        }
    }

    #[test]
    fn fingerprints_tell_maps_apart() {
        let two = ids(2);
        let f = fingerprint(1, &two);
        assert!(f.starts_with("v1/2/"), "{f}");
        assert_eq!(f, fingerprint(1, &ids(2)));
        assert_ne!(f, fingerprint(2, &two));
        assert_ne!(f, fingerprint(1, &ids(3)));
        let swapped = vec![two[1].clone(), two[0].clone()];
        assert_ne!(f, fingerprint(1, &swapped));
    }

    #[test]
    fn hash_tags_as_redis_cluster_reads_them() {
        assert_eq!(routing_key("orders:42"), b"orders:42");
        assert_eq!(routing_key("order:{42}:stock"), b"42");
        assert_eq!(routing_key("{42}"), b"42");
        assert_eq!(
            routing_key("a{}b{c}"),
            b"a{}b{c}",
            "an empty first tag: the whole name"
        );
        assert_eq!(routing_key("a{b"), b"a{b");
        assert_eq!(routing_key("a{b}{c}"), b"b");
        assert_eq!(routing_key("a}{b}"), b"b");
        assert_eq!(routing_key("{é}"), "é".as_bytes());
    }

    #[test]
    fn no_group_no_route() {
        let none: Vec<Vec<u8>> = Vec::new();
        assert_eq!(route(&none, b"x"), None);
        assert_eq!(route(&ids(1), b"x"), Some(0));
    }

    proptest! {
        /// Routing is a pure function of the identities and the name; removing a group
        /// moves only that group's resources.
        #[test]
        fn removing_a_group_moves_only_its_resources(
            g in 2usize..8,
            gone in 0usize..8,
            name in proptest::collection::vec(any::<u8>(), 1..64),
        ) {
            let gone = gone % g;
            let all = ids(g);
            let rest: Vec<Vec<u8>> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, id)| id.clone())
                .collect();
            let before = route(&all, &name).unwrap();
            prop_assert_eq!(before, route(&all, &name).unwrap());
            let after = route(&rest, &name).unwrap();
            if before != gone {
                prop_assert_eq!(&rest[after], &all[before]);
            }
        }

    }
}
