//! Hash tables that give their room back. A `HashMap` keeps its table at the largest size it
//! ever reached: after a flood of short leases (or connections, or relayed services) the
//! controller's tables would stay at the flood's peak for the life of the process. Each table
//! that a peer can grow is shrunk when it falls to a quarter of its room, to twice its size,
//! so that a shrink's rehash is paid for by the removals before it.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// Tables with room for fewer entries than this are left alone (not worth a rehash).
const SMALL: usize = 64;

pub(crate) trait Shrink {
    /// Shrinks the table to twice its entries if it holds fewer than a quarter of its room.
    fn shrink_if_sparse(&mut self);
}

fn sparse(len: usize, capacity: usize) -> bool {
    capacity > SMALL && len < capacity / 4
}

impl<K: Eq + Hash, V, S: BuildHasher> Shrink for HashMap<K, V, S> {
    fn shrink_if_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<K: Eq + Hash, S: BuildHasher> Shrink for HashSet<K, S> {
    fn shrink_if_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_emptied_to_a_quarter_shrinks_and_a_full_one_does_not() {
        let mut m: HashMap<u64, u64> = (0..10_000).map(|k| (k, k)).collect();
        m.retain(|&k, _| k < 5_000);
        m.shrink_if_sparse();
        // (Removals leave tombstones that `capacity` no longer counts as room: not a shrink.)
        assert!(m.capacity() > 10_000, "half full: kept, {}", m.capacity());
        m.retain(|&k, _| k < 100);
        m.shrink_if_sparse();
        assert!(m.capacity() >= 200 && m.capacity() < 1_000, "shrunk to {}", m.capacity());
        assert_eq!(m.len(), 100, "nothing lost");
        m.clear();
        m.shrink_if_sparse();
        assert!(m.capacity() <= SMALL, "emptied: {}", m.capacity());

        let mut s: HashSet<u32> = (0..10_000).collect();
        s.retain(|&k| k < 10);
        s.shrink_if_sparse();
        assert!(s.capacity() < 100 && s.len() == 10, "{}", s.capacity());
    }
}
