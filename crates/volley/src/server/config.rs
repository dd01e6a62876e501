//! A server's settings.

use std::time::Duration;

use super::limit::ConcurrencyLimit;
use crate::liveness::Keepalive;
use crate::proto::Limits;

/// Server settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Most requests handed to handlers per turn of a connection (default 1000, the batch size of
    /// the BookKeeper proposal the server's turns follow: drain up to a cap, serve together,
    /// answer together).
    pub max_batch: usize,
    /// Protocol limits enforced on every connection.
    pub limits: Limits,
    /// Most requests the server holds in handlers that have not finished (summed over all
    /// connections). Requests beyond it are answered [`Code::Overloaded`](crate::Code) at
    /// once instead of queueing. Default 50,000.
    pub max_queued: usize,
    /// An adaptive bound on the requests handled at once, beside `max_queued`: it follows the
    /// latency the server observes, and requests beyond it are answered
    /// [`Code::Overloaded`](crate::Code) at once, so that under overload the server sheds load
    /// early instead of queueing requests until their callers have given up. Calls made in
    /// process (`inproc://`) are not bounded by it: their caller's task runs the handler.
    /// `None` (the default): no adaptive bound.
    pub concurrency_limit: Option<ConcurrencyLimit>,
    /// Requests (and batch requests) whose payload has at least this many bytes are decoded,
    /// handled (if the handler does not wait) and their replies encoded on a CPU pool rather
    /// than on the connection's task, so that large payloads are not capped at one core per
    /// connection. `usize::MAX` keeps everything on the connection's task.
    /// Default 64 KiB, chosen by estimate, not yet by a sweep: a hand-off to the pool costs a
    /// few microseconds, about what decoding 16–64 KiB of bitcode takes.
    pub offload_min_bytes: usize,
    /// Most bytes the server holds, over all its connections, in buffers for large frames being
    /// received (those over a connection's 64 KiB read buffer, whose size the peer chooses by
    /// announcing a frame's length). A connection whose frame finds no room waits, reading
    /// nothing more (its peer's bytes stay in the kernel), until other frames complete; if
    /// none does within `read_timeout` it is closed with a go-away (`Overloaded`) saying so. A
    /// frame larger than the whole budget is refused so at once. Connections' ordinary read
    /// buffers (64 KiB while reading, none while idle) are not counted.
    ///
    /// The same budget counts each connection's unsent replies beyond 1 MiB (its peer does not
    /// read them): a connection whose replies find no room reads no more requests until its
    /// peer takes some or room frees, and is closed with a go-away (`Overloaded`) if neither
    /// happens within `read_timeout`. So peers that read nothing hold no more than the budget
    /// together (each is also parked at 16 MiB of its own). Default 256 MiB.
    pub receive_budget: usize,
    /// How long a peer that sent part of a frame may stay silent before its connection is
    /// closed (a stalled or malicious peer must not hold a buffer and a task forever). An idle
    /// connection between frames is not affected. Default 30 s; `None`: no limit.
    pub read_timeout: Option<Duration>,
    /// Most connections served at once (every listener together). A connection over the
    /// limit gets a go-away ([`Code::Overloaded`](crate::Code)) and is closed. Connections
    /// still opening do not count (see `max_handshakes`). Default 10,000; `None`: no limit.
    pub max_connections: Option<usize>,
    /// Most connections still opening at once: in their TLS handshake, or not yet past the
    /// client's 8-byte preamble. When all are taken, the oldest opening connection is closed to
    /// make room for the newcomer, so connections that never finish opening (a flood of
    /// connects that send nothing) cannot keep real clients out. Default 1,024.
    pub max_handshakes: usize,
    /// How long a connection may take to open (TLS handshake and preamble) before it is
    /// closed. Default 10 s.
    pub handshake_timeout: Duration,
    /// Pings on idle connections, to find peers that died without closing. Default: a ping
    /// after 30 s without traffic, the connection closed if nothing arrives 20 s after it.
    pub keepalive: Option<Keepalive>,
    /// Most bytes each of the two rings of a `shm://` connection may hold: the shared memory a
    /// client may make the server fill is at most twice this per connection (plus a page). A
    /// client asking for larger rings is refused at the set-up, with this limit in the reason
    /// (docs/PROTOCOL.md §2.1.1); it is not clamped, since the client sized the mapping.
    /// A power of two is not required. Default 4 MiB (the client's default ring is 1 MiB).
    pub shm_max_ring: usize,
    /// Tokens a client must present ([`ClientConfig::token`](crate::ClientConfig)) before any
    /// request is served. Empty (the default): no authentication.
    pub tokens: Vec<Vec<u8>>,
    /// Certificate and key for `tls://` listeners (feature `tls`).
    #[cfg(feature = "tls")]
    pub tls: Option<crate::transport::tls::TlsServer>,
    /// Whether per-method metrics are kept (calls, errors, latency, in flight, batch sizes).
    /// Default on; the transport and connection counters are kept either way.
    pub metrics: bool,
    /// Where to serve the admin endpoint (`/metrics`, `/vars.json`, a status page) over HTTP:
    /// `HOST:PORT`, or a bare `PORT` on 127.0.0.1. Started by the first `listen`. `None` (the
    /// default): no endpoint.
    pub admin: Option<String>,
    /// Whether the server answers the built-in service `volley.reflect` (its services, methods
    /// and their types, for tools such as `volley describe` and `volley call`: see
    /// [`reflect`](crate::reflect)). Default on; a server that should not show what it serves
    /// turns it off, and is then answered `UnknownService` for it like any other name.
    pub reflection: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_batch: DEFAULT_MAX_BATCH,
            limits: Limits::default(),
            max_queued: 50_000,
            concurrency_limit: None,
            offload_min_bytes: 64 << 10,
            receive_budget: 256 << 20,
            read_timeout: Some(Duration::from_secs(30)),
            max_connections: Some(10_000),
            max_handshakes: 1024,
            handshake_timeout: Duration::from_secs(10),
            keepalive: Some(Keepalive::default()),
            shm_max_ring: 4 << 20,
            tokens: Vec::new(),
            #[cfg(feature = "tls")]
            tls: None,
            metrics: true,
            admin: None,
            reflection: true,
        }
    }
}

/// Most requests handed to a handler at once, unless the server says otherwise.
pub(crate) const DEFAULT_MAX_BATCH: usize = 1000;
