//! A server's state, shared by its handle, its accept loops, its connections and (through
//! [`Host`]) its handlers; and the server as inproc callers find it.

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::admission::Admission;
use super::config::ServerConfig;
use super::health::Health;
use super::host::Host;
use super::limit::Limiter;
use super::router::Router;
use crate::error::Status;
use crate::metrics::scrape::RegistrySource;
use crate::metrics::stats::Counters;
use crate::proto::Code;
use crate::transport::Address;
use crate::transport::inproc::{LocalServer, Started};

/// The error a request still running at a shutdown's drain deadline gets. Its handler may have
/// partly run.
pub(crate) const DROPPED_AT_DEADLINE: &str = "the server shut down: its drain deadline passed before this request finished (the handler may have partly run)";

pub(crate) struct Shared {
    pub(crate) router: Router,
    pub(crate) config: ServerConfig,
    pub(crate) counters: Counters,
    pub(crate) shutdown: CancellationToken,
    /// Set with `shutdown`, for the questions asked on every call: a token's `is_cancelled`
    /// takes its lock (~40 instructions, twice per inproc call, a tenth of its cost); this is a
    /// load.
    pub(crate) closing: AtomicBool,
    /// Whether it takes new callers (`/readyz`, `volley.health`): not while it leaves, nor with
    /// a dead listener or a lease not confirmed.
    pub(crate) health: Arc<Health>,
    /// Cancelled when the server starts to leave: its registrations revoke their leases first,
    /// so that callers stop picking it while it still serves.
    pub(crate) leaving: CancellationToken,
    /// The tasks that take the server out of the registry when it leaves (a graceful stop
    /// waits for them, briefly, before it stops serving).
    pub(crate) departures: tokio_util::task::TaskTracker,
    /// Cancelled once a shutdown has finished: what outlives the drain (the admin endpoint)
    /// stops then.
    pub(crate) gone: CancellationToken,
    /// Cancelled when a shutdown's drain deadline passes: work still running is dropped and
    /// its connections closed.
    pub(crate) abort: CancellationToken,
    /// Connections opening and served now, and their bounds.
    pub(crate) admission: Arc<Admission>,
    /// What the handlers need of the server (its tasks, runtime, batch size, expiry count).
    pub(crate) host: Arc<Host>,
    pub(crate) bound: Mutex<Vec<Address>>,
    /// Requests held by handlers that did not finish on their first poll.
    pub(crate) queued: AtomicUsize,
    /// Of `queued`, the items of batch requests.
    pub(crate) queued_in_batches: AtomicUsize,
    /// Requests whose running handler was stopped because the client cancelled them.
    pub(crate) cancelled: std::sync::atomic::AtomicU64,
    /// What the admin endpoint needs beyond the counters above.
    pub(crate) observe: Observe,
    /// The adaptive concurrency limit, if the server has one.
    pub(crate) limiter: Option<Limiter>,
    /// The bound on buffers of large frames being received, over every connection.
    pub(crate) receive: Arc<crate::transport::budget::ReceiveBudget>,
}

impl Shared {
    /// Whether a shutdown has begun.
    #[inline]
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// How many more single requests may be queued. Batch requests count in the bound up to
    /// their share of it (half): a batch at the protocol's item limit (65,536) held beside the
    /// default bound (50,000) leaves the other half to single calls instead of all of it.
    pub(crate) fn room(&self) -> usize {
        let (all, batched) = self.queued_now();
        let singles = all.saturating_sub(batched);
        self.config.max_queued.saturating_sub(singles + batched.min(self.batch_share()))
    }

    /// Whether a batch request of `n` items may be queued: it fits in the batches' share of the
    /// bound beside the batches held, or no batch is held at all — which keeps every chunk the
    /// protocol allows (65,536 items) servable whatever `max_queued` is. Either way the single
    /// requests held must leave room for its share.
    pub(crate) fn admits_chunk(&self, n: usize) -> bool {
        let (all, batched) = self.queued_now();
        let singles = all.saturating_sub(batched);
        let share = self.batch_share();
        (batched == 0 || batched + n <= share) && singles + (batched + n).min(share) <= self.config.max_queued
    }

    /// The part of `max_queued` that batch requests may take from single calls.
    fn batch_share(&self) -> usize {
        self.config.max_queued / 2
    }

    /// Requests queued now, and of them the items of batch requests.
    fn queued_now(&self) -> (usize, usize) {
        // `queued` takes batch items before `queued_in_batches` does and gives them back after
        // it; read apart, the two may still disagree for a moment.
        let batched = self.queued_in_batches.load(Ordering::Relaxed);
        (self.queued.load(Ordering::Relaxed).max(batched), batched)
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
        self.host.spawn(fut);
    }
}

/// The server's observability state beside its counters.
pub(crate) struct Observe {
    /// Requests answered `Overloaded` because the queue bound was full.
    pub(crate) overload_refusals: AtomicU64,
    /// Of the requests answered `DeadlineExceeded` (`Shared::expired`), those whose handler
    /// was running: its work was dropped.
    pub(crate) expired_running: AtomicU64,
    pub(crate) started: Instant,
    /// The admin endpoint's address, once started.
    pub(crate) admin: tokio::sync::OnceCell<SocketAddr>,
    pub(crate) registry: OnceLock<Arc<dyn RegistrySource>>,
    /// Streams opened, their items, and how they ended.
    pub(crate) streams: Arc<super::stream::StreamStats>,
}

impl Default for Observe {
    fn default() -> Self {
        Observe {
            overload_refusals: AtomicU64::new(0),
            expired_running: AtomicU64::new(0),
            started: Instant::now(),
            admin: tokio::sync::OnceCell::new(),
            registry: OnceLock::new(),
            streams: Default::default(),
        }
    }
}

impl LocalServer for Shared {
    fn method(&self, service: &str, method: &str) -> Result<&(dyn Any + Send + Sync), Status> {
        self.router.lookup(service, method).map(|route| &*route.local)
    }

    fn stream_method(&self, service: &str, method: &str) -> Result<&(dyn Any + Send + Sync), Status> {
        self.router.lookup_stream(service, method).map(|route| route.handler.local())
    }

    fn call_raw(&self, service: &str, method: &str, payload: Bytes) -> Started<Result<Bytes, Status>> {
        match self.router.lookup(service, method) {
            Ok(route) => route.handler.serve_raw(payload),
            Err(status) => Started::Done(Err(status)),
        }
    }

    fn enter(&self) -> Option<TaskTrackerToken> {
        (!self.is_closing()).then(|| self.host.tasks.token())
    }

    fn is_open(&self) -> bool {
        !self.is_closing()
    }

    fn closed(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.shutdown.clone().cancelled_owned())
    }

    fn aborted(&self) -> BoxFuture<'static, Status> {
        let abort = self.abort.clone();
        Box::pin(async move {
            abort.cancelled_owned().await;
            Status::new(Code::ShuttingDown, DROPPED_AT_DEADLINE)
        })
    }
}
