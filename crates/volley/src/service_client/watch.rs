//! The watch task of a [`ServiceClient`](crate::ServiceClient)'s service: a long poll
//! re-issued in a loop, which turns request/reply into a push of instance-list changes.

use std::sync::Weak;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::balance::Pool;
use crate::discovery::wire::WatchRequest;
use crate::registry::Registry;

/// Keeps one service's cache fresh: a long poll re-issued in a loop. When the registry is
/// unreachable the cache is left as it is (calls go on from it) and the poll is retried with
/// a growing pause; when it answers again, polling resumes where it left off.
pub(crate) async fn watch_loop(
    pool: Weak<Pool>,
    registry: Registry,
    stop: CancellationToken,
    timeout: Duration,
    max_backoff: Duration,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    let mut backoff = MIN_BACKOFF;
    loop {
        let Some(p) = pool.upgrade() else { return };
        let (epoch, from_revision, _) = p.position();
        let req = WatchRequest {
            service: p.service.clone(),
            epoch,
            from_revision,
            timeout_ms: timeout.as_millis() as u64,
            client_id: registry.client_id(),
        };
        drop(p);
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            r = registry.watch(req) => r,
        };
        match r {
            Ok(resolved) => {
                backoff = MIN_BACKOFF;
                let Some(p) = pool.upgrade() else { return };
                if p.apply(resolved) {
                    tracing::debug!(service = %p.service, instances = p.view().listed.len(), "instances changed");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "watch failed; calls continue from the cache");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
}
