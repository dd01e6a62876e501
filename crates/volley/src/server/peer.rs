//! Who sent the request being handled: the peer and the connection of a handler's request, for
//! logs and for layers that keep state per connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

thread_local! {
    static CURRENT_PEER: std::cell::RefCell<Option<Arc<Peer>>> = const { std::cell::RefCell::new(None) };
}

/// The peer of one unix or tcp connection, as its handlers see it (see [`current_peer`] and
/// [`current_connection`]).
pub(crate) struct Peer {
    addr: Arc<str>,
    connection: ConnectionScope,
}

impl Peer {
    /// The peer at `addr` of a connection that is open until the returned guard drops.
    pub(crate) fn open(addr: &str) -> (Arc<Peer>, tokio_util::sync::DropGuard) {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let closed = CancellationToken::new();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let connection = ConnectionScope { id, closed: closed.clone() };
        (Arc::new(Peer { addr: addr.into(), connection }), closed.drop_guard())
    }
}

/// One unix or tcp connection to this process's servers, for layers that keep state per
/// connection: the registry's controller holds a client id for as long as the connection that
/// asked for it is open.
#[derive(Clone)]
pub(crate) struct ConnectionScope {
    /// Unique among the connections of this process.
    pub id: u64,
    closed: CancellationToken,
}

impl ConnectionScope {
    /// Completes when the connection has closed (at once if it already has).
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }
}

/// The address of the peer whose request is being handled, for logs (a handler that refuses
/// something says who asked). Known during the synchronous start of a handler — before its
/// first `.await` — on unix and tcp connections; `None` elsewhere (inproc calls, and after
/// the handler first waited).
pub fn current_peer() -> Option<Arc<str>> {
    CURRENT_PEER.with(|p| p.borrow().as_ref().map(|p| p.addr.clone()))
}

/// The connection whose request is being handled, known when [`current_peer`] is.
pub(crate) fn current_connection() -> Option<ConnectionScope> {
    CURRENT_PEER.with(|p| p.borrow().as_ref().map(|p| p.connection.clone()))
}

/// Runs `f` (the first poll of a handler) with `peer` as the [`current_peer`].
pub(crate) fn with_peer<R>(peer: Option<&Arc<Peer>>, f: impl FnOnce() -> R) -> R {
    let Some(peer) = peer else { return f() };
    let before = CURRENT_PEER.with(|p| p.replace(Some(peer.clone())));
    let r = f();
    CURRENT_PEER.with(|p| *p.borrow_mut() = before);
    r
}
