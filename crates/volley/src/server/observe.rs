//! What a server shows of itself: the scrape of its metrics, and its admin endpoint.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;

use super::shared::Shared;
use crate::error::Error;
use crate::metrics::scrape::{Expiries, Named, Scrape, ServerScrape};

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
                streams: self.observe.streams.counts(),
                receive_held: self.receive.held() as u64,
                receive_budget: self.receive.bytes() as u64,
                concurrency: self.limiter.as_ref().map(|l| (l.limit() as u64, l.in_flight() as u64)),
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
        let all = self.host.expired.load(Relaxed);
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

    fn ready(&self) -> Option<Result<(), String>> {
        Some(self.0.upgrade()?.health.ready())
    }
}

/// Starts the server's admin endpoint if one is configured and not started yet.
pub(super) async fn start_admin(shared: &Arc<Shared>) -> Result<(), Error> {
    let Some(addr) = &shared.config.admin else { return Ok(()) };
    let addr = crate::admin::parse_addr(addr)?;
    let owner = shared.clone();
    shared
        .observe
        .admin
        .get_or_try_init(|| async move {
            let source = Arc::new(Source(Arc::downgrade(&owner)));
            // The endpoint outlives the drain (`/healthz` answers until the server is gone), so
            // its tasks are not among those a shutdown waits for.
            let stop = owner.gone.clone();
            crate::admin::start_thread(addr, source, stop).await
        })
        .await
        .map(drop)
}
