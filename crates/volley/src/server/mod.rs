//! The server: handlers registered by service and method name, served on any number of
//! addresses, with graceful shutdown.
//!
//! ```no_run
//! # async fn demo() -> volley::Result<()> {
//! use volley::{Method, Server};
//! const ECHO: Method<String, String> = Method::new("echo", "say");
//!
//! let server = Server::builder().handle(&ECHO, |s: String| async move { Ok(s) }).build();
//! let addr = server.listen("tcp://127.0.0.1:0").await?;
//! # Ok(()) }
//! ```

mod admission;
mod batch;
mod conn;
mod dispatch;
mod handler;
mod limit;
mod local;
mod observe;
mod offload;
mod replies;
mod router;
mod running;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::Wire;
use crate::error::{Error, Status};
use crate::liveness::Keepalive;
use crate::method::Method;
use crate::metrics::MethodMetrics;
use crate::proto::Limits;
use crate::stats::{Counters, Snapshot};
use crate::transport::Address;
use crate::transport::inproc::{self, AnyMethod, LocalServer};
use crate::transport::socket;
use admission::Admission;
use handler::TypedHandler;
use router::{Route, Router};

pub use batch::BatchResult;
pub use limit::ConcurrencyLimit;
pub(crate) use observe::RegistrySource;

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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_batch: DEFAULT_MAX_BATCH,
            limits: Limits::default(),
            max_queued: 50_000,
            concurrency_limit: None,
            offload_min_bytes: 64 << 10,
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
        }
    }
}

/// A server's connections at one moment (see [`Server::connections`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionCounts {
    /// Connections being served (past their handshake and preamble).
    pub served: usize,
    /// Connections still opening: in their TLS handshake, or before the client's preamble.
    pub opening: usize,
    /// Opening connections closed so far to make room for newer ones (the handshake bound was
    /// full).
    pub opening_evicted: u64,
}

/// Registers handlers, then builds a [`Server`].
pub struct ServerBuilder {
    router: Router,
    config: ServerConfig,
}

impl ServerBuilder {
    /// Registers an async handler for single requests. Requests arriving together are run
    /// concurrently and their replies leave together.
    pub fn handle<Req, Resp, F, Fut>(self, m: &Method<Req, Resp>, f: F) -> Self
    where
        Req: Wire,
        Resp: Wire,
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        self.route(m, TypedHandler::from_item_fn(f))
    }

    /// Registers a synchronous handler, for work that never waits (lookups, arithmetic, echo):
    /// a batch is served by a plain loop, and an inproc call is a direct function call, with no
    /// future or allocation per request. It runs on the connection's task: anything that can
    /// block or wait belongs in [`handle`](Self::handle) instead.
    pub fn handle_fn<Req, Resp, F>(self, m: &Method<Req, Resp>, f: F) -> Self
    where
        Req: Wire,
        Resp: Wire,
        F: Fn(Req) -> Result<Resp, Status> + Send + Sync + 'static,
    {
        self.route(m, TypedHandler::from_sync_fn(f))
    }

    /// Registers a batch handler: it receives every request that arrived together (up to
    /// `max_batch`) and returns one result per request, in order. A single call is a batch of
    /// one. Use it when a batch is cheaper to serve as a whole (one lock, one disk write, one
    /// lookup pass).
    pub fn handle_batch<Req, Resp, F, Fut>(self, m: &Method<Req, Resp>, f: F) -> Self
    where
        Req: Wire,
        Resp: Wire,
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = BatchResult<Resp>> + Send + 'static,
    {
        self.route(m, TypedHandler::from_batch_fn(f))
    }

    /// Most requests handed to a handler per turn (default 1000).
    pub fn max_batch(mut self, n: usize) -> Self {
        self.config.max_batch = n.max(1);
        self
    }

    /// Bound on requests held by unfinished handlers before new ones get `Overloaded`.
    pub fn max_queued(mut self, n: usize) -> Self {
        self.config.max_queued = n;
        self
    }

    /// Bounds the requests handled at once by a limit that adapts to the latency the server
    /// observes (see [`ConcurrencyLimit`]); beyond it requests are answered `Overloaded` at
    /// once. `ConcurrencyLimit::default()` aims at a 5 ms sojourn.
    pub fn concurrency_limit(mut self, limit: ConcurrencyLimit) -> Self {
        self.config.concurrency_limit = Some(limit);
        self
    }

    /// Payload size from which requests are decoded and answered on the codec pool instead of
    /// the connection's task (default 64 KiB; `usize::MAX` turns it off). See
    /// [`ServerConfig::offload_min_bytes`].
    pub fn offload_min_bytes(mut self, n: usize) -> Self {
        self.config.offload_min_bytes = n;
        self
    }

    /// Protocol limits for every connection.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// Closes a connection whose peer sent part of a frame and then nothing for `t`
    /// (`None`: wait forever). See [`ServerConfig::read_timeout`].
    pub fn read_timeout(mut self, t: Option<Duration>) -> Self {
        self.config.read_timeout = t;
        self
    }

    /// Most connections served at once; more are refused with a go-away (`Overloaded`).
    pub fn max_connections(mut self, n: Option<usize>) -> Self {
        self.config.max_connections = n;
        self
    }

    /// Most connections still opening (TLS handshake, preamble) at once, and how long one may
    /// take. See [`ServerConfig::max_handshakes`].
    pub fn handshakes(mut self, max: usize, timeout: Duration) -> Self {
        self.config.max_handshakes = max.max(1);
        self.config.handshake_timeout = timeout;
        self
    }

    /// Most bytes each ring of a `shm://` connection may hold; a client asking for more is
    /// refused. See [`ServerConfig::shm_max_ring`].
    pub fn shm_max_ring(mut self, bytes: usize) -> Self {
        self.config.shm_max_ring = bytes;
        self
    }

    /// Keepalive pings on idle connections (`None`: off).
    pub fn keepalive(mut self, k: Option<Keepalive>) -> Self {
        self.config.keepalive = k;
        self
    }

    /// Requires clients to present this token (several calls accept any of the tokens, for
    /// rotation). Tokens are compared in constant time.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.config.tokens.push(token.as_ref().to_vec());
        self
    }

    /// Certificate, key and (for mutual TLS) client CA for `tls://` listeners.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::transport::tls::TlsServer) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// Keeps per-method metrics (the default) or not. See [`ServerConfig::metrics`].
    pub fn metrics(mut self, on: bool) -> Self {
        self.config.metrics = on;
        self
    }

    /// Serves the admin endpoint on `addr` (`HOST:PORT`, or a bare `PORT` on 127.0.0.1) from
    /// the first [`Server::listen`] on: `GET /metrics` (Prometheus), `GET /vars.json` and a
    /// status page at `/`. It never serves RPC. See [`Server::admin_address`].
    pub fn admin(mut self, addr: impl Into<String>) -> Self {
        self.config.admin = Some(addr.into());
        self
    }

    pub fn build(self) -> Server {
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            for route in self.router.routes() {
                route.handler.attach(me.clone(), self.config.metrics.then(|| route.metrics.clone()));
            }
            let limiter =
                self.config.concurrency_limit.map(|c| limit::Limiter::new(c, tokio::time::Instant::now()));
            Shared {
                limiter,
                router: self.router,
                config: self.config,
                counters: Counters::default(),
                shutdown: CancellationToken::new(),
                closing: AtomicBool::new(false),
                abort: CancellationToken::new(),
                admission: Arc::default(),
                tasks: TaskTracker::new(),
                runtime: OnceLock::new(),
                bound: Mutex::new(Vec::new()),
                queued: AtomicUsize::new(0),
                expired: Default::default(),
                cancelled: Default::default(),
                observe: observe::Observe::default(),
            }
        });
        Server { shared }
    }

    fn route<Req: Wire, Resp: Wire>(mut self, m: &Method<Req, Resp>, h: TypedHandler<Req, Resp>) -> Self {
        let h = Arc::new(h);
        let local: AnyMethod<Req, Resp> = h.clone();
        let metrics = Arc::new(MethodMetrics::new(m.service(), m.name()));
        let route = Route { handler: h, local: Box::new(local), metrics };
        if !self.router.insert(m.service(), m.name(), route) {
            panic!("{m:?} registered twice");
        }
        self
    }
}

/// A set of handlers, served on the addresses passed to [`Server::listen`]. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) router: Router,
    pub(crate) config: ServerConfig,
    pub(crate) counters: Counters,
    pub(crate) shutdown: CancellationToken,
    /// Set with `shutdown`, for the questions asked on every call: a token's `is_cancelled`
    /// takes its lock (~40 instructions, twice per inproc call, a tenth of its cost); this is a
    /// load.
    closing: AtomicBool,
    /// Cancelled when a shutdown's drain deadline passes: work still running is dropped and
    /// its connections closed.
    pub(crate) abort: CancellationToken,
    /// Connections opening and served now, and their bounds.
    pub(crate) admission: Arc<Admission>,
    /// Accept loops, connections, inproc dispatchers and handler batches still running.
    pub(crate) tasks: TaskTracker,
    runtime: OnceLock<Handle>,
    bound: Mutex<Vec<Address>>,
    /// Requests held by handlers that did not finish on their first poll.
    pub(crate) queued: AtomicUsize,
    /// Requests answered `DeadlineExceeded` because their caller's budget ran out first.
    pub(crate) expired: std::sync::atomic::AtomicU64,
    /// Requests whose running handler was stopped because the client cancelled them.
    pub(crate) cancelled: std::sync::atomic::AtomicU64,
    /// What the admin endpoint needs beyond the counters above.
    pub(crate) observe: observe::Observe,
    /// The adaptive concurrency limit, if the server has one.
    pub(crate) limiter: Option<limit::Limiter>,
}

impl Shared {
    /// Whether a shutdown has begun.
    #[inline]
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// How many more requests may be queued.
    pub(crate) fn room(&self) -> usize {
        self.config.max_queued.saturating_sub(self.queued.load(Ordering::Relaxed))
    }

    /// Whether a batch request of `n` items may be queued: it fits in the room left, or nothing
    /// is queued at all. The second case keeps every chunk the protocol allows (65,536 items)
    /// servable whatever `max_queued` is: alone, it cannot pile up behind anything.
    pub(crate) fn admits_chunk(&self, n: usize) -> bool {
        n <= self.room() || self.queued.load(Ordering::Relaxed) == 0
    }

    /// The answer to `refused` requests turned away because the queue bound is full.
    pub(crate) fn overloaded(&self, refused: usize) -> Status {
        self.refuse(
            refused,
            format!("server is over its bound of {} queued requests", self.config.max_queued),
        )
    }

    /// The answer to `refused` requests turned away by the adaptive concurrency limit.
    pub(crate) fn over_limit(&self, refused: usize, limit: usize) -> Status {
        self.refuse(
            refused,
            format!(
                "server is over its concurrency limit ({limit} requests at once, adapted to its latency)"
            ),
        )
    }

    /// Counts `refused` overload refusals and says why.
    fn refuse(&self, refused: usize, why: String) -> Status {
        self.observe.overload_refusals.fetch_add(refused as u64, Ordering::Relaxed);
        Status::new(crate::Code::Overloaded, why)
    }

    /// Spawns on the server's runtime (the one `listen` was first called on).
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let rt = self.runtime.get().cloned().unwrap_or_else(Handle::current);
        self.tasks.spawn_on(fut, &rt);
    }
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder { router: Router::default(), config: ServerConfig::default() }
    }

    /// Starts serving on `addr` (`inproc://NAME`, `unix:///PATH` or `tcp://HOST:PORT`) and
    /// returns the address actually bound (with the real port for `tcp://HOST:0`).
    pub async fn listen(&self, addr: &str) -> Result<Address, Error> {
        let addr = Address::parse(addr)?;
        if self.shared.is_closing() {
            return Err(Error::Closed);
        }
        let _ = self.shared.runtime.set(Handle::current());
        self.start_admin().await?;
        let bound = if let Address::Inproc(name) = &addr {
            inproc::bind(name, self.local())?;
            addr.clone()
        } else {
            let max_ring = self.shared.config.shm_max_ring;
            #[cfg(feature = "tls")]
            let (listener, bound) = socket::bind(&addr, max_ring, self.shared.config.tls.as_ref()).await?;
            #[cfg(not(feature = "tls"))]
            let (listener, bound) = socket::bind(&addr, max_ring).await?;
            self.shared.spawn(accept_loop(self.shared.clone(), listener));
            bound
        };
        tracing::info!(address = %bound, "listening");
        self.shared.bound.lock().push(bound.clone());
        Ok(bound)
    }

    /// Graceful shutdown: stops accepting, lets every request already received finish and its
    /// reply be written, then closes every connection. Returns when all of that is done.
    pub async fn shutdown(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.shutdown.cancel();
        for addr in self.shared.bound.lock().drain(..) {
            match addr {
                Address::Inproc(name) => inproc::unbind(&name, &self.local()),
                other => socket::unbind(&other),
            }
        }
        for route in self.shared.router.routes() {
            route.handler.close();
        }
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }

    /// Like [`shutdown`](Self::shutdown), giving up waiting after `deadline` (the drain goes on
    /// in the background). Returns whether everything finished in time.
    pub async fn shutdown_within(&self, deadline: Duration) -> bool {
        tokio::time::timeout(deadline, self.shutdown()).await.is_ok()
    }

    /// Graceful shutdown with a drain deadline: like [`shutdown`](Self::shutdown), but requests
    /// still running when `deadline` passes are dropped: each is answered with an error reply
    /// of code [`Code::ShuttingDown`](crate::Code) (its caller sees [`Error::Remote`]; the
    /// handler may have partly run), then its connection gets a go-away and is closed.
    /// Returns whether everything drained before the deadline.
    pub async fn shutdown_with_deadline(&self, deadline: Duration) -> bool {
        let drain = self.shutdown();
        tokio::pin!(drain);
        if tokio::time::timeout(deadline, &mut drain).await.is_ok() {
            return true;
        }
        tracing::warn!(?deadline, "drain deadline passed; dropping the requests still running");
        self.shared.abort.cancel();
        // Aborted connections close at once; bound the wait anyway (a peer may not read).
        let _ = tokio::time::timeout(ABORT_GRACE, drain).await;
        false
    }

    /// The server's counters (all connections together).
    pub fn counters(&self) -> Snapshot {
        self.shared.counters.snapshot()
    }

    /// Requests answered `DeadlineExceeded` because the time budget their caller sent ran out:
    /// before their handler ran (it never ran for them), or while it was still running (its
    /// work was dropped).
    pub fn expired_requests(&self) -> u64 {
        self.shared.expired.load(Ordering::Relaxed)
    }

    /// The adaptive concurrency limit's value now, and the requests admitted under it that are
    /// not yet answered; `None` without [`ServerBuilder::concurrency_limit`].
    pub fn concurrency(&self) -> Option<(usize, usize)> {
        self.shared.limiter.as_ref().map(|l| (l.limit(), l.in_flight()))
    }

    /// Requests whose handler was still running when the client cancelled them (it dropped
    /// the call): the handler's work was dropped.
    pub fn cancelled_requests(&self) -> u64 {
        self.shared.cancelled.load(Ordering::Relaxed)
    }

    /// How many connections the server serves and has opening now.
    pub fn connections(&self) -> ConnectionCounts {
        self.shared.admission.counts()
    }

    /// The names of the services this server has handlers for, sorted.
    pub fn services(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.router.service_names().map(str::to_string).collect();
        names.sort();
        names
    }

    /// Addresses this server is listening on.
    pub fn addresses(&self) -> Vec<Address> {
        self.shared.bound.lock().clone()
    }

    /// The server as inproc callers find it.
    fn local(&self) -> Weak<dyn LocalServer> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        weak
    }

    /// Cancelled when shutdown starts. Layers built on the server (the registry's lease
    /// keeper) watch it to act at once, for example to deregister before the drain ends.
    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// Runs `fut` as one of the server's tasks: [`shutdown`](Self::shutdown) waits for it.
    pub(crate) fn spawn_tracked(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.shared.spawn(fut);
    }
}

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

/// After the drain deadline, how long aborted connections get to send their go-away and close.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Accepts connections and runs each in a task of its own: its handshake (none, or TLS) and
/// preamble under the opening bound, then serving it.
async fn accept_loop(shared: Arc<Shared>, listener: socket::Listener) {
    loop {
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(accepted) => {
                    let ticket = shared.admission.opening(shared.config.max_handshakes);
                    shared.spawn(conn::accept(shared.clone(), accepted, ticket));
                }
                Err(e) => {
                    // Out of file descriptors and the like: say so, back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// Most requests handed to a handler at once, unless the server says otherwise.
pub(crate) const DEFAULT_MAX_BATCH: usize = 1000;
