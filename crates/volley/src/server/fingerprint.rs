//! The server's side of schema fingerprints (docs/PROTOCOL.md §15.6): a request whose caller
//! sent the fingerprints of its method's types is compared with the types this server
//! registered, and a mismatch is refused with an error naming the method and both
//! fingerprints, instead of decoding fast-tier bytes into a wrong value. The caller sends them
//! once per connection and method, so a refusal is remembered for the connection's later
//! requests of that method.

use rustc_hash::FxHashMap;

use super::router::Router;
use crate::error::Status;
use crate::proto::{Code, Fingerprints, Names};

/// Service name → method name → the error its requests get.
type ByMethod = FxHashMap<Box<str>, FxHashMap<Box<str>, Status>>;

/// A connection's refused methods. Empty (and not allocated) until a caller's fingerprints
/// differ, so a connection whose fingerprints match pays one branch per request.
#[derive(Default)]
pub(super) struct Refused {
    methods: Option<Box<ByMethod>>,
}

impl Refused {
    /// The error request `names` gets, if its method's fingerprints do not match: those it
    /// carries (`sent`), or those an earlier request of the method carried.
    #[inline]
    pub fn check(&mut self, router: &Router, names: &Names, sent: Option<Fingerprints>) -> Option<Status> {
        match sent {
            Some(fp) => self.compare(router, names, fp),
            None => self.methods.as_ref()?.get(names.service())?.get(names.method()).cloned(),
        }
    }

    #[cold]
    fn compare(&mut self, router: &Router, names: &Names, sent: Fingerprints) -> Option<Status> {
        let (service, method) = (names.service(), names.method());
        // An unknown method is answered as such by the usual path.
        let ours = router.lookup(service, method).ok()?.fingerprints;
        if ours == sent {
            if let Some(m) = self.methods.as_mut().and_then(|s| s.get_mut(service)) {
                m.remove(method);
            }
            return None;
        }
        let status = mismatch(service, method, sent, ours);
        tracing::debug!(service, method, message = %status.message, "refused a caller's types");
        self.methods
            .get_or_insert_with(Default::default)
            .entry(service.into())
            .or_default()
            .insert(method.into(), status.clone());
        Some(status)
    }
}

/// The error of a method whose caller declares other types than this server.
fn mismatch(service: &str, method: &str, theirs: Fingerprints, ours: Fingerprints) -> Status {
    let hex = |fp: u64| if fp == 0 { "none".to_string() } else { format!("{fp:016x}") };
    let mut differ = Vec::new();
    if theirs.request != ours.request {
        differ.push(format!("request type: caller {}, server {}", hex(theirs.request), hex(ours.request)));
    }
    if theirs.reply != ours.reply {
        differ.push(format!("reply type: caller {}, server {}", hex(theirs.reply), hex(ours.reply)));
    }
    Status::new(
        Code::BadRequest,
        format!(
            "schema mismatch on {service}/{method}: the caller's build declares other types than this \
             server's ({}); fast-tier bytes carry no field names, so the call is refused rather than \
             decoded into a wrong value: deploy one version of the types, or move them to a general tier",
            differ.join("; ")
        ),
    )
}
