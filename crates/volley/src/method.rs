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

/// A method's names as the key of a per-method cache. Compared by address first: comparing
/// four words costs less than comparing or hashing text. Then by text: the same literal can sit
/// at two addresses (a `const` method used from two codegen units does), and a cache that
/// compared addresses only would miss on every call of the copy whose slot the other took, and
/// look the method up each time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NamesKey {
    service: &'static str,
    method: &'static str,
}

impl NamesKey {
    /// A key no method has (both names empty), for slots not filled yet.
    pub(crate) const NONE: NamesKey = NamesKey { service: "", method: "" };

    #[inline]
    pub(crate) fn of(service: &'static str, method: &'static str) -> Self {
        NamesKey { service, method }
    }

    /// The slot of this key in a direct-mapped cache of `slots` entries (a power of two).
    #[inline]
    pub(crate) fn slot(self, slots: usize) -> usize {
        let (s, m) = (self.service.as_ptr() as usize, self.method.as_ptr() as usize);
        ((s >> 3) ^ (m >> 3) ^ self.method.len()) & (slots - 1)
    }

    /// Whether the two keys are the same names at the same addresses (the common case, and
    /// the cheap test).
    #[inline]
    pub(crate) fn same_address(self, other: NamesKey) -> bool {
        std::ptr::eq(self.service, other.service) && std::ptr::eq(self.method, other.method)
    }

    /// Whether the two keys name the same method, wherever their text sits. A cache that finds
    /// a key this way re-keys its slot to it, so that the next call from the same place is an
    /// address hit.
    #[inline(never)]
    pub(crate) fn same_text(self, other: NamesKey) -> bool {
        self.service == other.service && self.method == other.method
    }

    /// The addresses of the two names.
    #[inline]
    pub(crate) fn addresses(self) -> [usize; 2] {
        [self.service.as_ptr() as usize, self.method.as_ptr() as usize]
    }
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

/// Names a server-stream method (`docs/PROTOCOL.md` §9.9): one request, then a sequence of
/// items from the server, each of type `Item`. Declared like a [`Method`]:
///
/// ```
/// use volley::StreamMethod;
/// const TAIL: StreamMethod<String, String> = StreamMethod::new("log", "tail");
/// ```
pub struct StreamMethod<Req, Item> {
    service: &'static str,
    name: &'static str,
    _types: PhantomData<fn(Req) -> Item>,
}

impl<Req, Item> StreamMethod<Req, Item> {
    /// A stream method descriptor. Names are at most 255 bytes of UTF-8 each.
    pub const fn new(service: &'static str, name: &'static str) -> Self {
        assert!(service.len() <= crate::proto::message::MAX_NAME_LEN, "service name too long");
        assert!(name.len() <= crate::proto::message::MAX_NAME_LEN, "method name too long");
        StreamMethod { service, name, _types: PhantomData }
    }

    pub const fn service(&self) -> &'static str {
        self.service
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<Req, Item> Clone for StreamMethod<Req, Item> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Item> Copy for StreamMethod<Req, Item> {}

impl<Req, Item> std::fmt::Debug for StreamMethod<Req, Item> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (stream)", self.service, self.name)
    }
}

/// Names a client-stream method (`docs/PROTOCOL.md` §9.9): a sequence of requests from the
/// client, each of type `Req`, then one reply of type `Resp`.
pub struct ClientStreamMethod<Req, Resp> {
    service: &'static str,
    name: &'static str,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> ClientStreamMethod<Req, Resp> {
    /// A descriptor. Names are at most 255 bytes of UTF-8 each.
    pub const fn new(service: &'static str, name: &'static str) -> Self {
        assert!(service.len() <= crate::proto::message::MAX_NAME_LEN, "service name too long");
        assert!(name.len() <= crate::proto::message::MAX_NAME_LEN, "method name too long");
        ClientStreamMethod { service, name, _types: PhantomData }
    }

    pub const fn service(&self) -> &'static str {
        self.service
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<Req, Resp> Clone for ClientStreamMethod<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Resp> Copy for ClientStreamMethod<Req, Resp> {}

impl<Req, Resp> std::fmt::Debug for ClientStreamMethod<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (stream)", self.service, self.name)
    }
}

/// Names a both-way stream method (`docs/PROTOCOL.md` §9.9): requests of type `Req` from the
/// client and items of type `Resp` from the server, each a sequence, at once.
pub struct BidiStreamMethod<Req, Resp> {
    service: &'static str,
    name: &'static str,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> BidiStreamMethod<Req, Resp> {
    /// A descriptor. Names are at most 255 bytes of UTF-8 each.
    pub const fn new(service: &'static str, name: &'static str) -> Self {
        assert!(service.len() <= crate::proto::message::MAX_NAME_LEN, "service name too long");
        assert!(name.len() <= crate::proto::message::MAX_NAME_LEN, "method name too long");
        BidiStreamMethod { service, name, _types: PhantomData }
    }

    pub const fn service(&self) -> &'static str {
        self.service
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<Req, Resp> Clone for BidiStreamMethod<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Resp> Copy for BidiStreamMethod<Req, Resp> {}

impl<Req, Resp> std::fmt::Debug for BidiStreamMethod<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (stream)", self.service, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::NamesKey;

    #[test]
    fn names_keys_match_by_text_wherever_the_text_sits() {
        let (svc, m) = ("keys-svc", "keys-m");
        let copy: &'static str = Box::leak(String::from(svc).into_boxed_str());
        assert!(!std::ptr::eq(svc, copy), "the copy sits elsewhere");
        assert!(NamesKey::of(svc, m).same_address(NamesKey::of(svc, m)));
        assert!(!NamesKey::of(svc, m).same_address(NamesKey::of(copy, m)));
        assert!(NamesKey::of(svc, m).same_text(NamesKey::of(copy, m)), "same text, other address");
        assert!(!NamesKey::of(svc, m).same_text(NamesKey::of(svc, "other")));
        assert!(!NamesKey::of(svc, m).same_text(NamesKey::NONE));
        assert!(NamesKey::of(svc, m).slot(8) < 8);
    }
}
