//! The client's side of schema fingerprints (docs/PROTOCOL.md §15.6): the first request of a
//! fast-tier method on a connection to a server that checks them carries the fingerprints of
//! the method's types, once; the server refuses that request, and the connection's later ones
//! of the method, if its own types differ.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use rustc_hash::FxHashSet;

use crate::proto::Fingerprints;

/// Where a call's fingerprints come from: its method's names, and the function that works
/// them out (once per type, then kept), called only when the connection still has to send
/// them.
#[derive(Clone, Copy)]
pub(crate) struct Source {
    pub names: (&'static str, &'static str),
    pub of: fn() -> Option<Fingerprints>,
}

impl Source {
    /// The source of method `m`'s fingerprints, `None` for methods of types that have none
    /// (decided at compile time: every method without a fast-tier type skips all of this).
    #[inline]
    pub fn of<Req: crate::Wire, Resp: crate::Wire>(m: &crate::Method<Req, Resp>) -> Option<Source> {
        if !crate::codec::fingerprint::may_have::<Req, Resp>() {
            return None;
        }
        Some(Source { names: (m.service(), m.name()), of: crate::codec::fingerprint::of_method::<Req, Resp> })
    }
}

/// Direct-mapped slots of [`Sent`] (a power of two): more than the methods most callers call on
/// one connection.
const SLOTS: usize = 8;

/// The methods whose fingerprints this connection has sent. Asked on every call of a fast-tier
/// method, so the common answer ("sent") is a few compares without a lock: each method is
/// written once into the slot its names' addresses map to, if that slot is free; a method whose
/// slot another took goes to a locked set. Keyed by the names' addresses: the same method's
/// names at another address (a `const` method used from two codegen units) only cost it one
/// more sending. A torn read (it cannot happen under the outbox's lock, where both are called,
/// but costs nothing if it did) only sends the fingerprints again, which the server accepts.
#[derive(Default)]
pub(crate) struct Sent {
    slots: [[AtomicUsize; 4]; SLOTS],
    others: parking_lot::Mutex<FxHashSet<[usize; 4]>>,
}

fn key((service, method): (&'static str, &'static str)) -> [usize; 4] {
    [service.as_ptr() as usize, service.len(), method.as_ptr() as usize, method.len()]
}

impl Sent {
    /// The fingerprints a request from `source` carries: `None` once they were sent.
    #[inline]
    pub fn due(&self, source: &Source) -> Option<Fingerprints> {
        let key = key(source.names);
        if self.slot(&key).iter().zip(key).all(|(held, k)| held.load(Relaxed) == k) {
            return None;
        }
        self.due_slow(source, key)
    }

    #[cold]
    fn due_slow(&self, source: &Source, key: [usize; 4]) -> Option<Fingerprints> {
        if self.others.lock().contains(&key) {
            return None;
        }
        (source.of)()
    }

    /// Records that a request carrying `source`'s fingerprints was queued.
    #[cold]
    pub fn sent(&self, source: &Source) {
        let key = key(source.names);
        let slot = self.slot(&key);
        // A reference is never null: a zero address marks a free slot.
        if slot[0].load(Relaxed) == 0 {
            for (held, k) in slot.iter().zip(key) {
                held.store(k, Relaxed);
            }
        } else {
            self.others.lock().insert(key);
        }
    }

    fn slot(&self, key: &[usize; 4]) -> &[AtomicUsize; 4] {
        &self.slots[((key[0] >> 3) ^ (key[2] >> 3) ^ key[3]) & (SLOTS - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::{Sent, Source};
    use crate::proto::Fingerprints;

    fn fingerprints() -> Option<Fingerprints> {
        Some(Fingerprints { request: 1, reply: 2 })
    }

    #[test]
    fn each_method_is_due_until_sent_then_never_again() {
        // More methods than slots: some share a slot and go to the locked set.
        let names: Vec<(&'static str, &'static str)> =
            (0..40).map(|i| ("svc", &*Box::leak(format!("m{i}").into_boxed_str()))).collect();
        let sent = Sent::default();
        for &names in &names {
            let source = Source { names, of: fingerprints };
            assert_eq!(sent.due(&source), fingerprints(), "{names:?} before it was sent");
            sent.sent(&source);
            assert_eq!(sent.due(&source), None, "{names:?} after it was sent");
        }
        for &names in &names {
            assert_eq!(sent.due(&Source { names, of: fingerprints }), None, "{names:?} later");
        }
        // The same text at another address is another key: sent once more.
        let copy: &'static str = Box::leak(String::from(names[0].1).into_boxed_str());
        assert_eq!(sent.due(&Source { names: ("svc", copy), of: fingerprints }), fingerprints());
        // A prefix of a sent name, at the same address, is another method.
        let prefix = &names[10].1[..2];
        assert_eq!(sent.due(&Source { names: ("svc", prefix), of: fingerprints }), fingerprints());
    }
}
