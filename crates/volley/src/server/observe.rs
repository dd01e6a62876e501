//! What a server shows of itself: the scrape of its metrics, and its admin endpoint.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use futures_util::future::BoxFuture;

use super::{Server, Shared};
use crate::error::Error;
use crate::metrics::scrape::{Expiries, Named, RegistryScrape, Scrape, ServerScrape};
use crate::stats::Snapshot;

/// A layer built on the server that has more to show (the registry of a controller).
pub(crate) trait RegistrySource: Send + Sync + 'static {
    /// The registry now (`None` once it is gone); `server` is the server's transport counters.
    fn registry(&self, server: Snapshot) -> BoxFuture<'_, Option<RegistryScrape>>;
}

/// The server's observability state beside its counters.
pub(crate) struct Observe {
    /// Requests answered `Overloaded` because the queue bound was full.
    pub(crate) overload_refusals: AtomicU64,
    /// Of the requests answered `DeadlineExceeded` (`Shared::expired`), those whose handler
    /// was running: its work was dropped.
    pub(crate) expired_running: AtomicU64,
    started: Instant,
    /// The admin endpoint's address, once started.
    admin: tokio::sync::OnceCell<SocketAddr>,
    registry: OnceLock<Arc<dyn RegistrySource>>,
}

impl Default for Observe {
    fn default() -> Self {
        Observe {
            overload_refusals: AtomicU64::new(0),
            expired_running: AtomicU64::new(0),
            started: Instant::now(),
            admin: tokio::sync::OnceCell::new(),
            registry: OnceLock::new(),
        }
    }
}

impl Shared {
    /// Everything the admin endpoint shows, now.
    pub(crate) async fn scrape(&self, with_registry: bool) -> Scrape {
        let registry = match (with_registry, self.observe.registry.get()) {
            (true, Some(r)) => r.registry(self.counters.snapshot()).await,
            _ => None,
        };
        let mut methods: Vec<Named> = if self.config.metrics {
            self.router.routes().map(|r| Named::of(&r.metrics)).collect()
        } else {
            Vec::new()
        };
        methods.sort_by(|a, b| (&a.service, &a.method).cmp(&(&b.service, &b.method)));
        let (accepted, refused) = self.admission.totals();
        Scrape {
            uptime: self.observe.started.elapsed(),
            server: ServerScrape {
                per_method: self.config.metrics,
                methods,
                connections: self.admission.counts(),
                accepted,
                refused,
                transport: self.counters.snapshot(),
                per_frame_read: self.counters.shapes.read.snapshot(),
                per_frame_written: self.counters.shapes.written.snapshot(),
                wakeups_per_batch: self.counters.shapes.wakeups_per_batch.snapshot(),
                overload_refusals: self.observe.overload_refusals.load(Relaxed),
                expiries: self.expiries(),
                cancelled: self.cancelled.load(Relaxed),
                queued: self.queued.load(Relaxed) as u64,
            },
            client: Scrape::client_methods(),
            identity: self.identity(self.observe.registry.get().is_some()),
            registry,
        }
    }
}

impl Shared {
    /// The requests answered `DeadlineExceeded` so far, by when their budget ran out. A
    /// request is counted as running before it is counted in the total, and the total is read
    /// first, so one caught between the two counts never shows as one that did not run.
    fn expiries(&self) -> Expiries {
        let all = self.expired.load(Relaxed);
        let running = self.observe.expired_running.load(Relaxed);
        Expiries { before_handler: all.saturating_sub(running), in_handler: running }
    }
}

/// The server as the admin endpoint sees it: weakly, so the endpoint does not keep it alive.
struct Source(Weak<Shared>);

impl crate::admin::Source for Source {
    fn scrape(&self, registry: bool) -> BoxFuture<'_, Option<Scrape>> {
        Box::pin(async move {
            let shared = self.0.upgrade()?;
            Some(shared.scrape(registry).await)
        })
    }
}

impl Server {
    /// The address of the admin endpoint (see [`ServerBuilder::admin`](super::ServerBuilder::admin)),
    /// once the first [`listen`](Self::listen) started it.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.shared.observe.admin.get().copied()
    }

    /// Starts the admin endpoint if one is configured and not started yet.
    pub(super) async fn start_admin(&self) -> Result<(), Error> {
        let Some(addr) = &self.shared.config.admin else { return Ok(()) };
        let addr = crate::admin::parse_addr(addr)?;
        let shared = self.shared.clone();
        self.shared
            .observe
            .admin
            .get_or_try_init(|| async move {
                let source = Arc::new(Source(Arc::downgrade(&shared)));
                let stop = shared.shutdown.clone();
                let weak = Arc::downgrade(&shared);
                crate::admin::start(addr, source, stop, move |task| {
                    if let Some(s) = weak.upgrade() {
                        s.spawn(task)
                    }
                })
                .await
            })
            .await
            .map(drop)
    }

    /// Adds a registry to what the admin endpoint shows (a controller's).
    pub(crate) fn show_registry(&self, source: Arc<dyn RegistrySource>) {
        let _ = self.shared.observe.registry.set(source);
    }
}
