//! What the controller bounds so that no caller can take it from the others: the watches it
//! holds (in all and per connection), the relayed calls it has in flight, and the size of what
//! one registration may add.
//!
//! Held watches and relays are the registry's only long-lived requests; every other method
//! answers from the store at once. The server's bound on queued requests is sized as the
//! bound for those other calls *plus* these two bounds, so no number of watches or relays can
//! leave a lease renewal without room.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::shrink::Shrink;

/// Watches held now, in all and by connection.
pub(crate) struct HeldWatches {
    max: usize,
    max_per_connection: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    /// Connections holding at least one watch (an entry leaves with the connection's last).
    by_connection: FxHashMap<u64, usize>,
}

impl HeldWatches {
    pub fn new(max: usize, max_per_connection: usize) -> HeldWatches {
        HeldWatches { max, max_per_connection, held: Mutex::default() }
    }

    /// A slot to hold one watch of `connection` (`None`: a caller in the process) in, unless
    /// either bound is reached.
    pub fn hold(&self, connection: Option<u64>) -> Option<WatchSlot<'_>> {
        let key = connection.unwrap_or(0);
        let mut guard = self.held.lock();
        let h = &mut *guard;
        let n = h.by_connection.get(&key).copied().unwrap_or(0);
        if h.total >= self.max || n >= self.max_per_connection {
            return None;
        }
        h.by_connection.insert(key, n + 1);
        h.total += 1;
        Some(WatchSlot { of: self, key })
    }

    /// Watches held now.
    pub fn held(&self) -> usize {
        self.held.lock().total
    }
}

/// One held watch; given back when dropped (answered, or the caller went away).
pub(crate) struct WatchSlot<'a> {
    of: &'a HeldWatches,
    key: u64,
}

impl Drop for WatchSlot<'_> {
    fn drop(&mut self) {
        let mut h = self.of.held.lock();
        h.total -= 1;
        if let Some(n) = h.by_connection.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                h.by_connection.remove(&self.key);
                h.by_connection.shrink_if_sparse();
            }
        }
    }
}

/// Relayed calls in flight, up to a bound.
pub(crate) struct RelaysInFlight {
    max: usize,
    now: AtomicUsize,
}

impl RelaysInFlight {
    pub fn new(max: usize) -> RelaysInFlight {
        RelaysInFlight { max, now: AtomicUsize::new(0) }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for one relayed call, unless `max` are in flight.
    pub fn start(&self) -> Option<RelaySlot<'_>> {
        self.now
            .fetch_update(Relaxed, Relaxed, |n| (n < self.max).then_some(n + 1))
            .ok()
            .map(|_| RelaySlot(self))
    }
}

pub(crate) struct RelaySlot<'a>(&'a RelaysInFlight);

impl Drop for RelaySlot<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Relaxed);
    }
}

/// The bytes `value` takes as JSON: how registry replies are encoded, so sums of these bound
/// a reply's size.
pub(crate) fn json_len<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_bounded_per_connection_and_in_all() {
        let w = HeldWatches::new(5, 2);
        let a: Vec<_> = (0..2).map(|_| w.hold(Some(1)).expect("room")).collect();
        assert!(w.hold(Some(1)).is_none(), "connection 1 holds its bound");
        let b: Vec<_> = (0..2).map(|_| w.hold(Some(2)).expect("room")).collect();
        let c = w.hold(None).expect("the fifth");
        assert!(w.hold(Some(3)).is_none(), "the bound in all");
        assert_eq!(w.held(), 5);
        drop(a);
        assert_eq!(w.held(), 3);
        assert!(w.hold(Some(3)).is_some(), "room again");
        drop((b, c));
        assert_eq!(w.held(), 0);
        assert!(w.held.lock().by_connection.is_empty(), "no entry left for gone connections");
    }

    #[test]
    fn relays_are_bounded() {
        let r = RelaysInFlight::new(2);
        let a = r.start().unwrap();
        let _b = r.start().unwrap();
        assert!(r.start().is_none());
        drop(a);
        assert!(r.start().is_some());
    }

    #[test]
    fn json_len_is_the_encoded_length() {
        let v = serde_json::json!({"a": "x\u{1}\"", "b": [1, 2]});
        assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len());
    }
}
