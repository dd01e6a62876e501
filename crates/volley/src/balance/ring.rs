//! Key routing: the stable key hash and the consistent-hash ring.
//!
//! A key is hashed over its canonical encoded form with the codec's documented
//! [`StableHash`] (hashing through serialization, as the MF report does), so equal keys hash equally on
//! every machine, in every process and in every release, whatever their in-memory layout.

use crate::codec::StableHash;

/// The stable hash of an encoded key: **xxh3-64, seed 0**, over the bytes as they are.
///
/// Stable means: the same bytes give the same value on every platform, in every process and
/// in every version of Volley that speaks this protocol — relayed calls carry this value to
/// the controller, so it is part of the wire contract (docs/PROTOCOL.md §16.4). Everything in
/// Volley that hashes keys calls this one function, so it can be swapped for the codec
/// module's documented stable hash in one place.
pub fn key_hash(encoded: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(encoded)
}

/// The routing hash of `key`: its [`StableHash`] (xxh3-64, seed 0, over the canonical bytes
/// of PROTOCOL.md §15.2 — for bytes, strings and integers, the same bytes as their encoding).
pub fn hash_key<K: StableHash + ?Sized>(key: &K) -> u64 {
    key.stable_hash()
}

/// Virtual nodes per unit of weight. 128 keeps each node's share within a few percent of its
/// fair share (the spread falls with the square root of the count) for a ring of a few
/// thousand points, which is built once per membership change.
pub const VNODES_PER_WEIGHT: u32 = 128;
/// Weights above this count as this on the ring (bounds the ring's size).
pub const MAX_RING_WEIGHT: u32 = 64;

/// A consistent-hash ring with virtual nodes.
///
/// Each node (an instance, named by its address) owns `VNODES_PER_WEIGHT × weight` points at
/// `xxh3-64(name, seed = i)`; a key belongs to the first point at or after its hash, wrapping
/// around. Points depend only on a node's own name, so adding or removing a node moves only
/// the keys on that node's arcs: about 1/N of them for N nodes of equal weight.
#[derive(Debug, Clone, Default)]
pub struct HashRing {
    /// (point, node index), sorted by point.
    points: Vec<(u64, u32)>,
    nodes: usize,
}

impl HashRing {
    /// A ring over `nodes` (name, weight), in the order that [`node`](Self::node) indexes.
    pub fn new<'a>(nodes: impl IntoIterator<Item = (&'a str, u32)>) -> HashRing {
        let mut points = Vec::new();
        let mut count = 0;
        for (i, (name, weight)) in nodes.into_iter().enumerate() {
            let vnodes = VNODES_PER_WEIGHT * weight.clamp(1, MAX_RING_WEIGHT);
            points.extend(
                (0..vnodes)
                    .map(|v| (xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), v as u64), i as u32)),
            );
            count = i + 1;
        }
        // Ties (practically never) are broken by node index so the ring is deterministic.
        points.sort_unstable();
        HashRing { points, nodes: count }
    }

    /// The node owning `hash`, or `None` for an empty ring.
    pub fn node(&self, hash: u64) -> Option<usize> {
        self.node_skipping(hash, |_| false)
    }

    /// The first node at or after `hash` that `skip` does not reject: where a key goes when
    /// its own node failed (the next node clockwise, as if the failed one had left).
    pub fn node_skipping(&self, hash: u64, skip: impl Fn(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let start = self.points.partition_point(|&(p, _)| p < hash);
        let n = self.points.len();
        (0..n).map(|k| self.points[(start + k) % n].1 as usize).find(|&i| !skip(i))
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes
    }

    pub fn is_empty(&self) -> bool {
        self.nodes == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_hash_is_pinned() {
        // These values are part of the wire contract: a change here breaks relayed key routing
        // between versions.
        assert_eq!(key_hash(b""), 0x2d06800538d394c2);
        assert_eq!(key_hash(b"volley"), xxhash_rust::xxh3::xxh3_64(b"volley"));
        assert_eq!(hash_key(&7u32), key_hash(&7u32.to_le_bytes()));
        assert_eq!(hash_key(&"k".to_string()), key_hash(b"k"));
    }

    #[test]
    fn skipping_walks_clockwise_to_another_node() {
        let ring = HashRing::new([("a", 1), ("b", 1), ("c", 1)]);
        assert_eq!(ring.len(), 3);
        for h in [0u64, 1 << 40, u64::MAX] {
            let first = ring.node(h).unwrap();
            let second = ring.node_skipping(h, |i| i == first).unwrap();
            assert_ne!(first, second);
            assert_eq!(ring.node_skipping(h, |_| true), None);
        }
        assert_eq!(HashRing::new([]).node(5), None);
    }

    #[test]
    fn weight_scales_the_share() {
        let ring = HashRing::new([("light", 1), ("heavy", 3)]);
        let heavy = (0..20_000u64).filter(|k| ring.node(key_hash(&k.to_le_bytes())) == Some(1)).count();
        let share = heavy as f64 / 20_000.0;
        assert!((0.68..0.82).contains(&share), "heavy share {share}");
    }
}
