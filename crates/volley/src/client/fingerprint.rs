//! The client's side of schema fingerprints (docs/PROTOCOL.md §15.6): the first request of a
//! fast-tier method on a connection to a server that checks them carries the fingerprints of
//! the method's types, once; the server refuses that request, and the connection's later ones
//! of the method, if its own types differ.

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

/// The methods whose fingerprints this connection has sent. Keyed by the names' addresses: the
/// same method's names at another address (a `const` method used from two codegen units) only
/// cost it one more sending.
#[derive(Default)]
pub(crate) struct Sent {
    methods: parking_lot::Mutex<FxHashSet<[usize; 4]>>,
}

fn key((service, method): (&'static str, &'static str)) -> [usize; 4] {
    [service.as_ptr() as usize, service.len(), method.as_ptr() as usize, method.len()]
}

impl Sent {
    /// The fingerprints a request from `source` carries: `None` once they were sent.
    pub fn due(&self, source: &Source) -> Option<Fingerprints> {
        if self.methods.lock().contains(&key(source.names)) {
            return None;
        }
        (source.of)()
    }

    /// Records that a request carrying `source`'s fingerprints was queued.
    pub fn sent(&self, source: &Source) {
        self.methods.lock().insert(key(source.names));
    }
}
