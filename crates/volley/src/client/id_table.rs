//! A table keyed by request id, direct-mapped by the id's low bits: an insert and a removal
//! are an index into a vector and one comparison, where a hash map probes groups of buckets.
//!
//! The ids come from the client's sequence (PROTOCOL.md §7), so consecutive calls land in
//! consecutive slots and a table at most half full rarely finds a slot taken. When it does (a
//! call still pending from a full turn of the table ago, or ids another client sharing the
//! sequence took leaving a pattern), the entry goes to a small overflow hash map instead: ids
//! are never chosen by the table, so they stay unique across the clients that share one
//! sequence and keep the 2³² calls between two uses of an id that the sequence gives. (A slab,
//! such as the `slab` crate, chooses the key itself: its ids would repeat within a few calls
//! and could not come from a shared sequence.)
//!
//! The table grows (doubling) to stay at most half full, and does not shrink, like the hash
//! map before it: its size follows the peak of calls in flight on the connection, which
//! `ClientConfig::max_in_flight` bounds.

use rustc_hash::FxHashMap;

/// Slots of the first allocation, made by the first insert (an idle connection holds none).
const MIN_SLOTS: usize = 64;

pub(crate) struct IdTable<V> {
    /// A power-of-two number of slots (or none); the entry for `id` sits at `id & mask`, or
    /// in `overflow` if that slot was taken when it arrived.
    slots: Vec<Option<(u64, V)>>,
    overflow: FxHashMap<u64, V>,
    len: usize,
}

impl<V> Default for IdTable<V> {
    fn default() -> Self {
        IdTable { slots: Vec::new(), overflow: FxHashMap::default(), len: 0 }
    }
}

impl<V> IdTable<V> {
    #[inline]
    fn slot(&self, id: u64) -> usize {
        // Truncating is the point: the low bits of the id name the slot.
        id as usize & (self.slots.len() - 1)
    }

    /// Adds `value` under `id`, or hands it back if `id` is already in the table.
    #[inline(always)]
    pub fn insert(&mut self, id: u64, value: V) -> Result<(), V> {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let i = self.slot(id);
        match &self.slots[i] {
            None => {
                if !self.overflow.is_empty() && self.overflow.contains_key(&id) {
                    return Err(value);
                }
                self.slots[i] = Some((id, value));
            }
            Some((held, _)) if *held == id => return Err(value),
            Some(_) => {
                if self.overflow.contains_key(&id) {
                    return Err(value);
                }
                self.overflow.insert(id, value);
            }
        }
        self.len += 1;
        Ok(())
    }

    /// Takes the value under `id` out of the table, if it is there.
    #[inline(always)]
    pub fn remove(&mut self, id: u64) -> Option<V> {
        if self.len == 0 {
            return None;
        }
        let i = self.slot(id);
        let value = match &self.slots[i] {
            Some((held, _)) if *held == id => self.slots[i].take().map(|(_, v)| v),
            _ if self.overflow.is_empty() => None,
            _ => self.overflow.remove(&id),
        };
        self.len -= value.is_some() as usize;
        value
    }

    /// Moves every entry whose value `due` accepts to `out`.
    pub fn take_where(&mut self, mut due: impl FnMut(&V) -> bool, out: &mut Vec<(u64, V)>) {
        let before = out.len();
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|(_, v)| due(v)) {
                out.extend(slot.take());
            }
        }
        out.extend(self.overflow.extract_if(|_, v| due(v)));
        self.len -= out.len() - before;
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten().map(|(_, v)| v).chain(self.overflow.values())
    }

    /// Empties the table, returning what it held.
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, V)> + use<V> {
        self.len = 0;
        std::mem::take(&mut self.slots).into_iter().flatten().chain(std::mem::take(&mut self.overflow))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Doubles the slots. Entries in distinct slots stay in distinct slots (the new index
    /// keeps the old one's bits), so only the overflow may need to stay where it is.
    #[cold]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, Vec::with_capacity(size));
        self.slots.resize_with(size, || None);
        for (id, v) in old.into_iter().flatten() {
            let i = self.slot(id);
            self.slots[i] = Some((id, v));
        }
        for (id, v) in std::mem::take(&mut self.overflow) {
            let i = self.slot(id);
            match &self.slots[i] {
                None => self.slots[i] = Some((id, v)),
                Some(_) => _ = self.overflow.insert(id, v),
            }
        }
    }

    #[cfg(test)]
    fn overflowed(&self) -> usize {
        self.overflow.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids of one client, as `Inner::next_id` builds them.
    fn id(seq: u32) -> u64 {
        (7 << 32) | seq as u64
    }

    #[test]
    fn an_id_is_found_until_removed_and_only_once() {
        let mut t = IdTable::default();
        for s in 0..100 {
            t.insert(id(s), s).unwrap();
        }
        assert_eq!(t.len(), 100);
        assert_eq!(t.overflowed(), 0, "consecutive ids take consecutive slots");
        assert_eq!(t.remove(id(42)), Some(42));
        assert_eq!(t.remove(id(42)), None, "a second reply to one id finds nobody");
        assert_eq!(t.remove(id(1000)), None, "an id never inserted");
        assert_eq!(t.remove(43), None, "the same sequence under another client id");
        assert_eq!(t.len(), 99);
    }

    #[test]
    fn an_id_in_use_is_refused_wherever_it_sits() {
        let mut t = IdTable::default();
        t.insert(id(1), 'a').unwrap();
        assert_eq!(t.insert(id(1), 'b'), Err('b'));
        // Two ids a table's size apart share a slot: the second overflows, and is refused too.
        let apart = id(1) + t.slots.len() as u64;
        t.insert(apart, 'c').unwrap();
        assert_eq!(t.overflowed(), 1);
        assert_eq!(t.insert(apart, 'd'), Err('d'));
        assert_eq!(t.remove(id(1)), Some('a'));
        assert_eq!(t.insert(apart, 'e'), Err('e'), "its slot is free now, but the id is still in use");
        assert_eq!(t.remove(apart), Some('c'));
        assert_eq!(t.len(), 0);
    }

    /// A late reply for a slot's earlier occupant (same low bits, another id) takes nothing.
    #[test]
    fn a_stale_id_does_not_take_the_slot_s_new_occupant() {
        let mut t = IdTable::default();
        t.insert(id(5), "old").unwrap();
        let size = t.slots.len() as u32;
        assert_eq!(t.remove(id(5)), Some("old"));
        t.insert(id(5 + size), "new").unwrap();
        assert_eq!(t.overflowed(), 0, "the slot was free");
        assert_eq!(t.remove(id(5)), None, "the late reply is dropped");
        assert_eq!(t.remove(id(5 + size)), Some("new"));
    }

    /// Across the sequence's wrap, ids map to slots as before, and one from before the wrap is
    /// told apart from the one after it that shares its slot.
    #[test]
    fn ids_across_the_sequence_wrap() {
        let mut t = IdTable::default();
        let before = [u32::MAX - 2, u32::MAX - 1, u32::MAX];
        for s in before {
            t.insert(id(s), s).unwrap();
        }
        for s in 0..3 {
            t.insert(id(s), s).unwrap();
        }
        assert_eq!(t.overflowed(), 0);
        assert_eq!(t.remove(id(u32::MAX)), Some(u32::MAX));
        assert_eq!(t.remove(id(0)), Some(0));
        // A sequence that wrapped all the way back to an id still pending: refused.
        assert_eq!(t.insert(id(u32::MAX - 1), 9), Err(9));
        assert_eq!(t.len(), 4);
    }

    /// Growing keeps every entry reachable, moves the overflow back into slots it now fits,
    /// and keeps the table at most half full.
    #[test]
    fn growing_keeps_every_entry() {
        let mut t = IdTable::default();
        // Every 64th id shares slot 0 of the first allocation: all but one overflow.
        let ids: Vec<u64> = (0..20).map(|k| id(k * 64)).collect();
        for (n, &i) in ids.iter().enumerate() {
            t.insert(i, n).unwrap();
        }
        assert_eq!(t.slots.len(), 64);
        assert_eq!(t.overflowed(), 19);
        for s in 1..40 {
            t.insert(id(s), 100 + s as usize).unwrap();
        }
        assert!(t.slots.len() >= 2 * t.len(), "{} slots for {}", t.slots.len(), t.len());
        assert!(t.overflowed() < 19, "a larger table gives some overflowed ids a slot");
        for (n, &i) in ids.iter().enumerate() {
            assert_eq!(t.remove(i), Some(n));
        }
        for s in 1..40 {
            assert_eq!(t.remove(id(s)), Some(100 + s as usize));
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.overflowed(), 0);
    }

    #[test]
    fn take_where_and_drain_see_slots_and_overflow() {
        let mut t = IdTable::default();
        for k in 0..10u32 {
            t.insert(id(k * 64), k).unwrap(); // slot 0, then the overflow
            t.insert(id(k * 64 + 1), k + 100).unwrap(); // slot 1, then the overflow
        }
        let mut out = Vec::new();
        t.take_where(|v| v % 2 == 0, &mut out);
        assert_eq!(out.len(), 10);
        assert!(out.iter().all(|(_, v)| v % 2 == 0));
        assert_eq!(t.len(), 10);
        assert_eq!(t.values().count(), 10);
        assert!(t.values().all(|v| v % 2 == 1));
        let mut rest: Vec<u32> = t.drain().map(|(_, v)| v).collect();
        rest.sort();
        assert_eq!(rest, [1, 3, 5, 7, 9, 101, 103, 105, 107, 109]);
        assert_eq!(t.len(), 0);
        assert_eq!(t.remove(id(1)), None);
        t.insert(id(1), 1).unwrap();
        assert_eq!(t.remove(id(1)), Some(1), "a drained table takes new entries");
    }
}
