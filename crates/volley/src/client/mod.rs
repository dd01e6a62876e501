//! The client: typed calls over any transport, with client-generated request ids, a pending
//! table of one-shot waiters, per-call deadlines, and reconnection on demand.
//!
//! ```no_run
//! # async fn demo() -> volley::Result<()> {
//! use volley::{Client, Method};
//! const ECHO: Method<String, String> = Method::new("echo", "say");
//!
//! let client = Client::connect("tcp://127.0.0.1:7000").await?;
//! let reply = client.call(&ECHO, "hello".to_string()).await?;
//! # Ok(()) }
//! ```

mod batch;
mod clock;
mod conn;
mod fingerprint;
mod flow;
mod id_table;
mod pending;
mod stream;
mod stream_table;

pub use batch::{BatchOptions, BatchStream};
pub use stream::{StreamOptions, StreamSender, Streaming, Upload};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::runtime::Handle;

use crate::codec::Wire;
use crate::error::Error;
use crate::method::Method;
use crate::metrics::stats::{Counters, Snapshot};
use crate::metrics::{self, CallMeter, Timing};
use crate::proto::Limits;
use crate::proto::message::FLAG_IDEMPOTENT;
use crate::trace;
use crate::transport::Address;
use crate::transport::inproc::{self, LocalConn};
use crate::transport::socket;
use conn::StreamConn;

/// Client settings: `ClientConfig::default()`, then a setter per field to change
/// (`.timeout(d)`, `.token("secret")`, `.tls(settings)` ...).
#[derive(Debug, Clone, derive_setters::Setters)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Deadline of a call that does not set its own (default 30 s).
    pub timeout: Duration,
    /// How long connecting may take (default 5 s); the server's preamble, which it sends on
    /// accept, must arrive within it too, or the connection fails and its calls with it.
    pub connect_timeout: Duration,
    /// Protocol limits for the connection.
    pub limits: Limits,
    /// The client-id half of request ids. Until a registry assigns one, a process-local
    /// counter does.
    #[setters(strip_option)]
    pub client_id: Option<u32>,
    /// Most requests in flight on one connection (a batch chunk counts its items). Callers
    /// beyond it wait for room. Default 65,536.
    pub max_in_flight: usize,
    /// Bytes of unanswered requests on one connection above which new calls wait (a soft
    /// bound, see ARCHITECTURE.md). Default 64 MiB.
    pub max_in_flight_bytes: usize,
    /// The sequence half of request ids, shared with other `Client`s that act as one logical
    /// client under one `client_id` (a `ServiceClient`'s connections to each instance of a
    /// service), so that their request ids stay unique together. `None`: a sequence of its own.
    #[setters(strip_option)]
    pub shared_sequence: Option<Arc<AtomicU32>>,
    /// The token presented to servers that require one (sent first on every connection; see
    /// [`ServerBuilder::token`](crate::ServerBuilder::token)). `None`: no token.
    #[setters(strip_option, into)]
    pub token: Option<Vec<u8>>,
    /// Pings when nothing arrived for a while, to find a server (or network path) that died
    /// without closing: pending calls then fail with a connection error. Default: a ping after
    /// 30 s without traffic, the connection declared dead 20 s after it. `None`: off.
    pub keepalive: Option<crate::Keepalive>,
    /// Sends each call's time budget with its request, to servers that accept request
    /// extensions (`docs/PROTOCOL.md` §6.2.2): such a server answers `DeadlineExceeded` instead
    /// of running a request whose caller has given up, and stops a handler still running when
    /// the budget runs out. Default: on.
    pub send_deadlines: bool,
    /// TLS settings for `tls://` addresses (feature `tls`).
    #[cfg(feature = "tls")]
    #[setters(strip_option)]
    pub tls: Option<crate::transport::tls::TlsClient>,
    /// Whether this client's calls count in the process's per-method client metrics (calls,
    /// errors, latency, in flight, batch sizes; shown by a server's admin endpoint). Default on.
    pub metrics: bool,
    /// Bytes of each of the two rings (one per direction) of a `shm://` connection: a power of
    /// two from 4 KiB to 64 MiB. The memory is shared with the server and held while the
    /// connection is open. Larger messages stream through. A server refuses rings larger than
    /// its own bound (`ServerConfig::shm_max_ring`, default 4 MiB), naming it in the error.
    /// Default 1 MiB.
    pub shm_ring: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            limits: Limits::default(),
            client_id: None,
            max_in_flight: 65_536,
            max_in_flight_bytes: 64 << 20,
            shared_sequence: None,
            token: None,
            keepalive: Some(crate::Keepalive::default()),
            send_deadlines: true,
            #[cfg(feature = "tls")]
            tls: None,
            metrics: true,
            shm_ring: 1 << 20,
        }
    }
}

/// Per-call options.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct CallOptions {
    /// Overrides the client's default deadline.
    pub timeout: Option<Duration>,
    /// A point in time the call must not outlive (on top of its timeout): say, the
    /// [`current_deadline`](crate::current_deadline) a handler read at its start, for calls it
    /// makes after it first waited.
    pub deadline: Option<tokio::time::Instant>,
    /// The call is safe to repeat (used by retries and failover).
    pub idempotent: bool,
}

impl CallOptions {
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    pub fn deadline(mut self, at: tokio::time::Instant) -> Self {
        self.deadline = Some(at);
        self
    }
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// The time the call may take: its timeout (or the client's), cut to its deadline and to
    /// the deadline of the request being handled when a handler makes the call.
    pub(crate) fn budget(&self, default: Duration) -> Duration {
        let timeout = self.timeout.unwrap_or(default);
        let timeout = match self.deadline {
            Some(at) => timeout.min(at.saturating_duration_since(tokio::time::Instant::now())),
            None => timeout,
        };
        crate::context::budget(timeout)
    }
}

/// A connection to one server address. Cheap to clone; clones share the connection.
/// Dropping the last clone closes it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    addr: Address,
    config: ClientConfig,
    client_id: u32,
    seq: Arc<AtomicU32>,
    /// The current connection; swapped on reconnect. Read without a lock on every call.
    conn: ArcSwapOption<Conn>,
    /// Serializes reconnect attempts.
    reconnect: tokio::sync::Mutex<()>,
    counters: Arc<Counters>,
    runtime: Handle,
}

enum Conn {
    /// A server of this process: calls hand values over (no bytes).
    Local(Box<LocalConn>),
    Stream(Arc<StreamConn>),
}

static NEXT_LOCAL_CLIENT_ID: AtomicU32 = AtomicU32::new(1);

impl Client {
    /// Connects to `addr` (`inproc://NAME`, `unix:///PATH` or `tcp://HOST:PORT`) with the
    /// default settings.
    pub async fn connect(addr: &str) -> Result<Client, Error> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit settings.
    pub async fn connect_with(addr: &str, config: ClientConfig) -> Result<Client, Error> {
        let addr = Address::parse(addr)?;
        let client_id =
            config.client_id.unwrap_or_else(|| NEXT_LOCAL_CLIENT_ID.fetch_add(1, Ordering::Relaxed));
        let inner = Inner {
            conn: ArcSwapOption::empty(),
            reconnect: tokio::sync::Mutex::new(()),
            counters: Arc::new(Counters::default()),
            runtime: Handle::current(),
            seq: config.shared_sequence.clone().unwrap_or_default(),
            client_id,
            addr,
            config,
        };
        inner.conn.store(Some(Arc::new(inner.open().await?)));
        Ok(Client { inner: Arc::new(inner) })
    }

    /// Calls `m` with `req` and waits for the reply, up to the default deadline.
    pub async fn call<Req: Wire, Resp: Wire>(&self, m: &Method<Req, Resp>, req: Req) -> Result<Resp, Error> {
        self.call_with(m, req, CallOptions::default()).await
    }

    /// Calls `m` with per-call options.
    pub async fn call_with<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> Result<Resp, Error> {
        let meter = self.inner.meter(m, 1, Timing::Single);
        // The span lives as long as the call; it is not entered. Wrapping the call's future in
        // it (`Instrument`) cost every call, traced or not, 15-20 % more CPU per call in the
        // 256-caller tcp benchmark (a nested future the compiler no longer inlines, copied once
        // more), for one thing only: an inproc handler's calls would be the span's children
        // rather than its siblings. The check of a disabled span allocates nothing.
        let traced = trace::call_span(m.service(), m.name());
        let trace = traced.as_ref().map(|t| &t.parent);
        let timeout = opts.budget(self.inner.config.timeout);
        // Written out here rather than in a function of its own: each future one deeper cost an
        // inproc call ~70 instructions (scripts/callcost.py). A local connection is only
        // borrowed: its handler starts (and most often finishes) before the call waits, so the
        // call needs no reference count of its own — taking one from the `ArcSwap` and giving
        // it back cost an inproc call a tenth of its instructions.
        let current = self.inner.conn.load();
        let result = if let Some(Conn::Local(local)) = current.as_deref()
            && local.server.is_open()
        {
            let begun = inproc::start(local, m, req, trace);
            drop(current);
            match begun {
                Ok(inproc::Begun::Done(result)) => {
                    if inproc::owes_budget() {
                        tokio::task::consume_budget().await;
                    }
                    result.map_err(Error::Remote)
                }
                Ok(waiting) => inproc::finish(waiting, timeout).await,
                Err(e) => Err(e),
            }
        } else {
            let conn = match arc_swap::Guard::into_inner(current).filter(|c| c.is_alive()) {
                Some(c) => Ok(c),
                None => self.inner.connection().await,
            };
            match conn {
                Err(e) => Err(e),
                Ok(conn) => match &*conn {
                    Conn::Local(local) => match inproc::start(local, m, req, trace) {
                        Ok(begun) => inproc::finish(begun, timeout).await,
                        Err(e) => Err(e),
                    },
                    Conn::Stream(c) => {
                        let flags = if opts.idempotent { FLAG_IDEMPOTENT } else { 0 };
                        let id = self.inner.next_id();
                        c.call(id, || self.inner.next_id(), m, &req, flags, (timeout, trace)).await
                    }
                },
            }
        };
        drop(traced);
        if let Some(meter) = meter {
            meter.finish(&result);
        }
        result
    }

    /// Calls `service`/`method` with an already encoded request and returns the reply payload
    /// as it arrived, undecoded. For layers that forward calls they do not know the types of
    /// (the registry's relay). On `inproc://` the server's handler decodes the payload and
    /// encodes its reply, as a byte transport would.
    pub async fn call_raw(
        &self,
        service: &str,
        method: &str,
        payload: bytes::Bytes,
        opts: CallOptions,
    ) -> Result<bytes::Bytes, Error> {
        let timeout = opts.budget(self.inner.config.timeout);
        let traced = trace::call_span(service, method); // as in `call_with`
        let trace = traced.as_ref().map(|t| &t.parent);
        match &*self.inner.connection().await? {
            Conn::Local(local) => {
                inproc::call_raw(&*local.server, service, method, payload, timeout, trace).await
            }
            Conn::Stream(c) => {
                let flags = if opts.idempotent { FLAG_IDEMPOTENT } else { 0 };
                let id = self.inner.next_id();
                c.call_raw(id, || self.inner.next_id(), service, method, payload, flags, (timeout, trace))
                    .await
            }
        }
    }

    /// The blocking form of [`call`](Self::call), for code that is not async. Must not be
    /// called from inside an async runtime (it would block one of its threads): there it
    /// returns an error instead.
    pub fn call_blocking<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
    ) -> Result<Resp, Error> {
        self.blocking_guard()?;
        self.inner.runtime.block_on(self.call(m, req))
    }

    /// Blocking calls from inside a runtime would block one of its threads (and can deadlock a
    /// single-threaded one): refuse them with a clear error.
    fn blocking_guard(&self) -> Result<(), Error> {
        if Handle::try_current().is_ok() {
            return Err(Error::Usage("blocking call inside an async runtime; use the async form".into()));
        }
        Ok(())
    }

    /// The address this client talks to.
    pub fn address(&self) -> &Address {
        &self.inner.addr
    }

    /// This client's id: the upper 32 bits of every request id it generates.
    pub fn client_id(&self) -> u32 {
        self.inner.client_id
    }

    /// Counters of this client (frames, messages and bytes sent and received).
    pub fn counters(&self) -> Snapshot {
        self.inner.counters.snapshot()
    }

    /// Whether the client holds a live connection now. A call on a client that is not connected
    /// first reconnects; layers that route between servers use this to connect (and fail)
    /// before handing over a request that must not be sent twice.
    pub fn is_connected(&self) -> bool {
        self.inner.conn.load().as_deref().is_some_and(Conn::is_alive)
    }

    /// Makes the connection now if it is down (layers that pace their reconnects call this
    /// rather than letting a call reconnect).
    pub(crate) async fn connect_now(&self) -> Result<(), Error> {
        self.inner.connection().await.map(drop)
    }

    /// Completes when the current connection has closed (at once if there is none).
    pub(crate) async fn disconnected(&self) {
        let Some(conn) = self.inner.conn.load_full() else { return };
        match &*conn {
            Conn::Local(local) => local.server.closed().await,
            Conn::Stream(c) => c.closed().await,
        }
    }

    /// Calls sent and not yet answered on the current connection.
    pub fn pending_calls(&self) -> usize {
        match self.inner.conn.load().as_deref() {
            Some(Conn::Stream(c)) => c.pending_len(),
            _ => 0,
        }
    }
}

impl Inner {
    /// Starts measuring `n` calls of `m`, if this client keeps metrics.
    #[inline]
    fn meter<Req, Resp>(&self, m: &Method<Req, Resp>, n: usize, timing: Timing) -> Option<CallMeter> {
        if !self.config.metrics {
            return None;
        }
        let (method, home) = metrics::client::method(m.service(), m.name());
        Some(CallMeter::start_on(method, home, n, timing))
    }

    /// Request ids are the client id (upper half) and a per-client sequence (lower half).
    /// The sequence wraps; the pending table skips any id still in use.
    fn next_id(&self) -> u64 {
        ((self.client_id as u64) << 32) | self.seq.fetch_add(1, Ordering::Relaxed) as u64
    }

    /// The live connection, reconnecting first if there is none. The reconnect is boxed: its
    /// future is large and rarely needed, and every call's future would otherwise carry it.
    #[inline]
    async fn connection(&self) -> Result<Arc<Conn>, Error> {
        match self.conn.load_full().filter(|c| c.is_alive()) {
            Some(c) => Ok(c),
            None => Box::pin(self.reconnect()).await,
        }
    }

    #[cold]
    async fn reconnect(&self) -> Result<Arc<Conn>, Error> {
        let _one_at_a_time = self.reconnect.lock().await;
        if let Some(c) = self.conn.load_full().filter(|c| c.is_alive()) {
            return Ok(c);
        }
        tracing::debug!(addr = %self.addr, "reconnecting");
        let conn = Arc::new(self.open().await?);
        self.conn.store(Some(conn.clone()));
        Ok(conn)
    }

    fn flow_limits(&self) -> flow::FlowLimits {
        flow::FlowLimits {
            max_items: self.config.max_in_flight.clamp(1, u32::MAX as usize),
            max_bytes: self.config.max_in_flight_bytes,
        }
    }

    fn conn_options(&self) -> conn::ConnOptions {
        conn::ConnOptions {
            limits: self.config.limits,
            flow: self.flow_limits(),
            token: self.config.token.clone(),
            keepalive: self.config.keepalive,
            send_deadlines: self.config.send_deadlines,
            preamble_within: self.config.connect_timeout,
        }
    }

    async fn open(&self) -> Result<Conn, Error> {
        if let Some(t) = &self.config.token
            && t.len() > crate::proto::message::MAX_TOKEN_LEN
        {
            return Err(Error::Usage(format!(
                "a token of {} bytes exceeds the limit of {}",
                t.len(),
                crate::proto::message::MAX_TOKEN_LEN
            )));
        }
        let connect = async {
            if let Address::Inproc(name) = &self.addr {
                return inproc::connect(name).map(|c| Conn::Local(Box::new(c))).ok_or_else(|| {
                    Error::Connection(format!("no inproc server is listening on {}", self.addr))
                });
            }
            #[cfg(feature = "tls")]
            let stream = socket::connect(&self.addr, self.config.shm_ring, self.config.tls.as_ref()).await?;
            #[cfg(not(feature = "tls"))]
            let stream = socket::connect(&self.addr, self.config.shm_ring).await?;
            Ok(Conn::Stream(StreamConn::start(stream, self.conn_options(), self.counters.clone())))
        };
        tokio::time::timeout(self.config.connect_timeout, connect)
            .await
            .map_err(|_| Error::Connection(format!("connect to {} timed out", self.addr)))?
    }
}

impl Conn {
    fn is_alive(&self) -> bool {
        match self {
            Conn::Local(local) => local.server.is_open(),
            Conn::Stream(c) => c.is_alive(),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(Conn::Stream(c)) = self.conn.load().as_deref() {
            c.close();
        }
    }
}
