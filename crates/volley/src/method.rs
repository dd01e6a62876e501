//! Typed method descriptors: a service name, a method name, and the request and reply types.

use std::marker::PhantomData;

/// Names a method of a service and fixes its request and reply types, so that both sides of a
/// call are checked by the compiler. Declaring one takes a line:
///
/// ```
/// use volley::Method;
/// const ECHO: Method<String, String> = Method::new("echo", "say");
/// ```
pub struct Method<Req, Resp> {
    service: &'static str,
    name: &'static str,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> Method<Req, Resp> {
    /// A method descriptor. Names are at most 255 bytes of UTF-8 each.
    pub const fn new(service: &'static str, name: &'static str) -> Self {
        assert!(service.len() <= crate::proto::message::MAX_NAME_LEN, "service name too long");
        assert!(name.len() <= crate::proto::message::MAX_NAME_LEN, "method name too long");
        Method { service, name, _types: PhantomData }
    }

    pub const fn service(&self) -> &'static str {
        self.service
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }
}

/// A method's names as a cache key: their addresses and lengths. The names are `'static` text,
/// never freed, so one key names one text (the same text at two addresses only takes two
/// entries), and comparing four words costs less than comparing or hashing the names.
pub(crate) type NamesKey = (usize, usize, usize, usize);

/// The key of `service`/`method` (see [`NamesKey`]).
#[inline]
pub(crate) fn names_key(service: &'static str, method: &'static str) -> NamesKey {
    (service.as_ptr() as usize, service.len(), method.as_ptr() as usize, method.len())
}

/// The slot of `key` in a direct-mapped cache of `slots` entries (a power of two).
#[inline]
pub(crate) fn names_slot(key: NamesKey, slots: usize) -> usize {
    ((key.0 >> 3) ^ (key.2 >> 3) ^ key.3) & (slots - 1)
}

impl<Req, Resp> Clone for Method<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Resp> Copy for Method<Req, Resp> {}

impl<Req, Resp> std::fmt::Debug for Method<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.service, self.name)
    }
}
