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
mod config;
mod conn;
mod dispatch;
mod drain;
mod fingerprint;
mod handler;
mod health;
mod host;
mod identity;
mod limit;
mod local;
mod observe;
mod offload;
mod peer;
mod replies;
mod reply_room;
mod router;
mod running;
mod shared;
mod stream;
mod stream_task;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::codec::{Json, Wire};
use crate::error::{Error, Status};
use crate::liveness::Keepalive;
use crate::method::{BidiStreamMethod, ClientStreamMethod, Method, StreamMethod};
use crate::metrics::MethodMetrics;
use crate::metrics::scrape::RegistrySource;
use crate::metrics::stats::{Counters, Snapshot};
use crate::proto::Limits;
use crate::reflect::{self, Catalog, HandlerKind, MethodInfo};
use crate::transport::Address;
use crate::transport::inproc::{self, AnyMethod, LocalServer};
use crate::transport::socket;
use handler::TypedHandler;
use host::Host;
use router::{Route, Router, StreamRoute};
use shared::{Observe, Shared};

pub use crate::metrics::{ConnectionCounts, StreamCounts};
pub use batch::BatchResult;
pub use config::ServerConfig;
pub use drain::{Drain, StopSignal, shutdown_signal};
pub(crate) use health::LeaseHealth;
pub use limit::ConcurrencyLimit;
pub use peer::current_peer;
pub(crate) use peer::{ConnectionScope, current_connection};
pub use stream::Incoming;

/// Registers handlers, then builds a [`Server`].
pub struct ServerBuilder {
    router: Router,
    config: ServerConfig,
    catalog: Catalog,
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
        self.route(m, TypedHandler::from_item_fn(f), HandlerKind::Single)
    }

    /// Registers an async handler whose requests are each served on their own: one that waits
    /// long (a long poll) never holds back the reply of another that arrived with it, as it
    /// would under [`handle`](Self::handle), which answers the requests of one turn together.
    /// Costs a task per request that waits. Such requests are not under the
    /// [concurrency limit](Self::concurrency_limit): the time a long poll waits says nothing
    /// of the server's load, and counting it would shrink the limit for every other method.
    /// Bound how many the handler holds yourself (the controller's watches do).
    pub fn handle_each<Req, Resp, F, Fut>(mut self, m: &Method<Req, Resp>, f: F) -> Self
    where
        Req: Wire,
        Resp: Wire,
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        self = self.route(m, TypedHandler::from_item_fn(f), HandlerKind::Single);
        self.router.set_alone(m.service(), m.name());
        self
    }

    /// Registers a server-stream handler (`docs/PROTOCOL.md` §9.9): for each request it
    /// returns a stream of items, sent to the client as it grants credit. The stream is
    /// polled only while the client has room, so a slow reader holds the producer back; it is
    /// dropped when the client cancels, the stream's deadline passes or the connection ends.
    ///
    /// ```
    /// # use volley::{Server, Status, StreamMethod};
    /// const COUNT: StreamMethod<u32, u32> = StreamMethod::new("demo", "count");
    /// let builder = Server::builder().handle_stream(&COUNT, |n| async move {
    ///     Ok(futures_util::stream::iter((0..n).map(Ok::<u32, Status>)))
    /// });
    /// ```
    pub fn handle_stream<Req, Item, F, Fut, S>(self, m: &StreamMethod<Req, Item>, f: F) -> Self
    where
        Req: Wire,
        Item: Wire,
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, Status>> + Send + 'static,
        S: futures_util::Stream<Item = Result<Item, Status>> + Send + 'static,
    {
        self.stream_route(m.service(), m.name(), Arc::new(stream::TypedStreamHandler::new(f)))
    }

    /// Registers a client-stream handler (`docs/PROTOCOL.md` §9.9): it reads the client's
    /// items from an [`Incoming`] (taking them grants the client room for more) and returns
    /// one reply.
    pub fn handle_client_stream<Req, Resp, F, Fut>(self, m: &ClientStreamMethod<Req, Resp>, f: F) -> Self
    where
        Req: Wire,
        Resp: Wire,
        F: Fn(Incoming<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        self.stream_route(m.service(), m.name(), Arc::new(stream::ClientStreamHandler::new(f)))
    }

    /// Registers a both-way stream handler (`docs/PROTOCOL.md` §9.9): it reads the client's
    /// items from an [`Incoming`] and returns a stream of its own items, sent as the client
    /// grants credit (as for [`handle_stream`](Self::handle_stream)).
    pub fn handle_bidi_stream<Req, Item, F, Fut, S>(self, m: &BidiStreamMethod<Req, Item>, f: F) -> Self
    where
        Req: Wire,
        Item: Wire,
        F: Fn(Incoming<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, Status>> + Send + 'static,
        S: futures_util::Stream<Item = Result<Item, Status>> + Send + 'static,
    {
        self.stream_route(m.service(), m.name(), Arc::new(stream::BidiStreamHandler::new(f)))
    }

    fn stream_route(mut self, service: &str, method: &str, handler: Arc<dyn stream::StreamHandler>) -> Self {
        if !self.router.insert_stream(service, method, StreamRoute { handler }) {
            panic!("{service}/{method} registered twice");
        }
        self
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
        self.route(m, TypedHandler::from_sync_fn(f), HandlerKind::Single)
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
        self.route(m, TypedHandler::from_batch_fn(f), HandlerKind::Batch)
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

    /// Most bytes held, over all connections, for large frames being received (default 256 MiB).
    /// See [`ServerConfig::receive_budget`].
    pub fn receive_budget(mut self, bytes: usize) -> Self {
        self.config.receive_budget = bytes;
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

    /// Answers the built-in reflection service `volley.reflect` (the default) or not. See
    /// [`ServerConfig::reflection`].
    pub fn reflection(mut self, on: bool) -> Self {
        self.config.reflection = on;
        self
    }

    pub fn build(mut self) -> Server {
        let health = Arc::new(health::Health::new(self.router.service_names().map(str::to_string).collect()));
        self = self.serve_health(&health);
        if self.config.reflection {
            // The catalog lists the reflection method too, so it is filled in after its route.
            let catalog = Arc::new(std::sync::OnceLock::new());
            let served = catalog.clone();
            self =
                self.handle_fn(&reflect::LIST, move |()| Ok(Json(served.get().cloned().unwrap_or_default())));
            let _ = catalog.set(self.catalog.clone());
        }
        let host = Arc::new(Host::new(self.config.max_batch));
        for route in self.router.routes() {
            route.handler.attach(Arc::downgrade(&host), self.config.metrics.then(|| route.metrics.clone()));
        }
        let limiter =
            self.config.concurrency_limit.map(|c| limit::Limiter::new(c, tokio::time::Instant::now()));
        let receive = crate::transport::budget::ReceiveBudget::new(self.config.receive_budget);
        let shared = Arc::new(Shared {
            limiter,
            receive,
            router: self.router,
            config: self.config,
            counters: Counters::default(),
            shutdown: CancellationToken::new(),
            closing: AtomicBool::new(false),
            health,
            leaving: CancellationToken::new(),
            departures: tokio_util::task::TaskTracker::new(),
            gone: CancellationToken::new(),
            abort: CancellationToken::new(),
            admission: Arc::default(),
            host,
            bound: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            queued_in_batches: AtomicUsize::new(0),
            cancelled: Default::default(),
            observe: Observe::default(),
        });
        Server { shared }
    }

    /// The `volley.health` service (unless the user registered one of their own).
    fn serve_health(self, health: &Arc<health::Health>) -> Self {
        if self.router.has_service(crate::health::SERVICE) {
            return self;
        }
        let (check, watch) = (health.clone(), health.clone());
        self.handle_fn(&crate::health::CHECK, move |req| check.check(req))
            .handle_each(&crate::health::WATCH, move |req| watch.clone().watch(req))
    }

    fn route<Req: Wire, Resp: Wire>(
        mut self,
        m: &Method<Req, Resp>,
        h: TypedHandler<Req, Resp>,
        kind: HandlerKind,
    ) -> Self {
        let h = Arc::new(h);
        let local: AnyMethod<Req, Resp> = h.clone();
        let metrics = Arc::new(MethodMetrics::new(m.service(), m.name()));
        let fingerprints = crate::codec::fingerprint::of_method::<Req, Resp>().unwrap_or_default();
        let route = Route { handler: h, local: Box::new(local), metrics, alone: false, fingerprints };
        if !self.router.insert(m.service(), m.name(), route) {
            panic!("{m:?} registered twice");
        }
        self.catalog.add(m.service(), MethodInfo::of(m, kind));
        self
    }
}

/// A set of handlers, served on the addresses passed to [`Server::listen`]. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            router: Router::default(),
            config: ServerConfig::default(),
            catalog: Catalog::default(),
        }
    }

    /// Starts serving on `addr` (`inproc://NAME`, `unix:///PATH` or `tcp://HOST:PORT`) and
    /// returns the address actually bound (with the real port for `tcp://HOST:0`).
    pub async fn listen(&self, addr: &str) -> Result<Address, Error> {
        let addr = Address::parse(addr)?;
        if self.shared.is_closing() {
            return Err(Error::Closed);
        }
        let _ = self.shared.host.runtime.set(Handle::current());
        observe::start_admin(&self.shared).await?;
        let bound = if let Address::Inproc(name) = &addr {
            inproc::bind(name, self.local())?;
            addr.clone()
        } else {
            let max_ring = self.shared.config.shm_max_ring;
            #[cfg(feature = "tls")]
            let (listener, bound) = socket::bind(&addr, max_ring, self.shared.config.tls.as_ref()).await?;
            #[cfg(not(feature = "tls"))]
            let (listener, bound) = socket::bind(&addr, max_ring).await?;
            self.shared.spawn(accept_loop(self.shared.clone(), listener, bound.clone()));
            bound
        };
        tracing::info!(address = %bound, "listening");
        self.shared.bound.lock().push(bound.clone());
        Ok(bound)
    }

    /// Graceful shutdown: stops accepting, lets every request already received finish and its
    /// reply be written, then closes every connection. Returns when all of that is done.
    pub async fn shutdown(&self) {
        // What outlives the drain (the admin endpoint) stops when this returns, or when a
        // caller gives up waiting and drops it.
        let _gone = self.shared.gone.clone().drop_guard();
        self.leave();
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
        self.shared.host.tasks.close();
        self.shared.host.tasks.wait().await;
    }

    /// Stops in the order a deploy needs, each step bounded by `drain`: the server stops being
    /// ready (`/readyz` answers 503); its registrations revoke their leases, so callers stop
    /// picking it (waited for up to `deregister_within`); it goes on serving for `grace` while
    /// their watches move them elsewhere; then every connection gets a go-away
    /// (`ShuttingDown`: what is unanswered then never ran, and a
    /// [`ServiceClient`](crate::ServiceClient) sends it to another instance) and the handlers
    /// still running get `deadline` to finish. Returns whether everything drained in time.
    pub async fn stop_gracefully(&self, drain: Drain) -> bool {
        self.leave();
        self.shared.departures.close();
        let _ = tokio::time::timeout(drain.deregister_within, self.shared.departures.wait()).await;
        tokio::time::sleep(drain.grace).await;
        self.shutdown_with_deadline(drain.deadline).await
    }

    /// Serves until the process gets `SIGTERM` or `SIGINT`, then stops gracefully
    /// ([`stop_gracefully`](Self::stop_gracefully)); a second signal during the stop drops the
    /// work still running and closes every connection at once. Returns the first signal, and
    /// whether everything drained in time.
    pub async fn serve_until_signal(&self, drain: Drain) -> std::io::Result<(StopSignal, bool)> {
        let first = shutdown_signal().await?;
        tracing::info!(signal = ?first, "stopping gracefully (a second signal stops at once)");
        let stop = self.stop_gracefully(drain);
        tokio::pin!(stop);
        let drained = tokio::select! {
            drained = &mut stop => drained,
            second = shutdown_signal() => {
                tracing::warn!(signal = ?second.ok(), "second signal: stopping at once");
                self.shared.abort.cancel();
                self.shutdown_with_deadline(Duration::ZERO).await;
                false
            }
        };
        Ok((first, drained))
    }

    /// The start of every way out: not ready any more, and the registrations revoke.
    fn leave(&self) {
        self.shared.health.start_draining();
        self.shared.leaving.cancel();
    }

    /// Whether the server takes new callers: it is not leaving, and every listener it opened
    /// still accepts (what `/readyz` answers).
    pub fn is_ready(&self) -> bool {
        self.shared.health.ready().is_ok()
    }

    /// Why the server does not take new callers (`None` when it does): what `/readyz` says.
    pub fn not_ready_because(&self) -> Option<String> {
        self.shared.health.ready().err()
    }

    /// Marks `service` as taking new calls or not (`volley.health` answers `not_serving`, with
    /// `reason`), for what the server knows and the registry does not: a database it needs is
    /// down, a cache still warming. The server still answers calls it gets; callers that ask
    /// (a `ServiceClient` probing an instance it left out, an orchestrator) keep away.
    pub fn set_serving(&self, service: &str, serving: bool, reason: &str) {
        self.shared.health.set_serving(service, (!serving).then(|| reason.to_string()));
    }

    /// What `volley.health` answers for `service` now (empty: the server as a whole).
    pub fn health(&self, service: &str) -> Result<crate::health::Health, Status> {
        self.shared.health.status(service)
    }

    /// The listeners that failed for good (their socket closed under them, or the kernel
    /// refused it for good), with the error each ended with. Each stopped accepting; if none is
    /// left, the server left the registry.
    pub fn failed_listeners(&self) -> Vec<(Address, String)> {
        self.shared.health.failed_listeners()
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
        self.shared.host.expired.load(Ordering::Relaxed)
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

    /// The server's streams so far: opened, items sent, and how they ended.
    pub fn stream_stats(&self) -> StreamCounts {
        self.shared.observe.streams.counts()
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

    /// A registration's say in the server's readiness (whether its lease is held).
    pub(crate) fn lease_health(&self) -> LeaseHealth {
        LeaseHealth::new(self.shared.health.clone())
    }

    /// Cancelled when the server starts to leave (a graceful stop, a shutdown, its last
    /// listener failing). The registry's lease keeper watches it to deregister at once.
    pub(crate) fn leaving_token(&self) -> CancellationToken {
        self.shared.leaving.clone()
    }

    /// Runs `fut`, which takes the server out of the registry when it leaves, as one of its
    /// tasks: a graceful stop waits for it (briefly) before it stops serving.
    pub(crate) fn spawn_departure(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.shared.spawn(self.shared.departures.track_future(fut));
    }

    /// Runs `fut` as one of the server's tasks: [`shutdown`](Self::shutdown) waits for it.
    pub(crate) fn spawn_tracked(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.shared.spawn(fut);
    }

    /// The address of the admin endpoint (see [`ServerBuilder::admin`]), once the first
    /// [`listen`](Self::listen) started it.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.shared.observe.admin.get().copied()
    }

    /// Adds a registry to what the admin endpoint shows (a controller's).
    pub(crate) fn show_registry(&self, source: Arc<dyn RegistrySource>) {
        let _ = self.shared.observe.registry.set(source);
    }
}

/// After the drain deadline, how long aborted connections get to send their go-away and close.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Accepts connections and runs each in a task of its own: its handshake (none, or TLS) and
/// preamble under the opening bound, then serving it. A listener whose socket fails for good
/// ends here: it says so once, and a server left with no listener leaves the registry.
async fn accept_loop(shared: Arc<Shared>, listener: socket::Listener, address: Address) {
    loop {
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(accepted) => {
                    let ticket = shared.admission.opening(shared.config.max_handshakes);
                    shared.spawn(conn::accept(shared.clone(), accepted, ticket));
                }
                Err(e) if listener_dead(&e) => {
                    tracing::error!(address = %address, error = %e, "listener failed: it stops accepting");
                    let none_left = {
                        let mut bound = shared.bound.lock();
                        bound.retain(|a| *a != address);
                        bound.is_empty()
                    };
                    shared.health.listener_failed(address.clone(), e.to_string());
                    if none_left {
                        // Nothing reaches this server any more: callers must stop picking it.
                        shared.health.start_draining();
                        shared.leaving.cancel();
                    }
                    break;
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

/// Whether an accept error means the listening socket itself is gone (closed under the server,
/// or not a listening socket any more), not a passing shortage.
#[cfg(target_os = "linux")]
fn listener_dead(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    Errno::from_io_error(e)
        .is_some_and(|n| [Errno::BADF, Errno::INVAL, Errno::NOTSOCK, Errno::OPNOTSUPP].contains(&n))
}

/// Elsewhere every accept error counts as passing (the errno values are Linux's).
#[cfg(not(target_os = "linux"))]
fn listener_dead(_: &std::io::Error) -> bool {
    false
}
