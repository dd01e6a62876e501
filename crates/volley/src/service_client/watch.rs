//! The watch task of a [`ServiceClient`](crate::ServiceClient)'s service: a long poll
//! re-issued in a loop, which turns request/reply into a push of instance-list changes.

use std::sync::Weak;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::balance::Pool;
use crate::discovery::wire::WatchRequest;
use crate::registry::Registry;

/// How long a watch the registry answered at once, unchanged, waits before the next.
pub(crate) const NOT_HELD_PAUSE: Duration = Duration::from_secs(1);

/// Keeps one service's cache fresh: a long poll re-issued in a loop. When the registry is
/// unreachable the cache is left as it is (calls go on from it) and the poll is retried with
/// a growing pause; when it answers again, polling resumes where it left off. A controller
/// holding all the watches it may answers a new one at once, unchanged: then the next poll
/// waits a pause ([`NOT_HELD_PAUSE`], or the timeout if shorter) instead of asking again at once.
pub(crate) async fn watch_loop(
    pool: Weak<Pool>,
    registry: Registry,
    stop: CancellationToken,
    timeout: Duration,
    max_backoff: Duration,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    let not_held_pause = NOT_HELD_PAUSE.min(timeout);
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
        let asked = tokio::time::Instant::now();
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            r = registry.watch(req) => r,
        };
        match r {
            Ok(resolved) => {
                backoff = MIN_BACKOFF;
                let not_held = resolved.epoch == epoch
                    && resolved.revision <= from_revision
                    && asked.elapsed() < timeout / 2;
                let Some(p) = pool.upgrade() else { return };
                if p.apply(resolved) {
                    tracing::debug!(service = %p.service, instances = p.view().listed.len(), "instances changed");
                }
                drop(p);
                if not_held {
                    tracing::debug!("the registry did not hold the watch; polling again after a pause");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(not_held_pause) => {}
                    }
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
