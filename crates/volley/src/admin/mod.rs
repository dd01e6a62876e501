//! The admin endpoint of a server (`ServerBuilder::admin`): plain HTTP on an address of its
//! own, never the RPC port, serving
//!
//! - `GET /metrics` — every metric in the Prometheus text format;
//! - `GET /vars.json` — the same as JSON, with each method's rates and quantiles over the
//!   last seconds (what `volley top` reads);
//! - `GET /` — a status page (HTML and inline JavaScript, nothing fetched from elsewhere)
//!   that polls `/vars.json` and draws the methods' rates and latencies;
//!
//! and 404 for any other path. `http.rs` holds the HTTP, `page.rs` the page, `slots.rs` the
//! bound on connections served at once.
//!
//! The endpoint runs on a thread and runtime of its own: a flood of scrapes then takes turns
//! among themselves on that thread, never among the RPC server's tasks, whose latency it would
//! otherwise add to.

mod http;
mod page;
mod slots;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::metrics::scrape::Scrape;
use crate::metrics::vars::Window;
use http::{Request, Response};

/// Most admin connections served at once. When all are taken, the oldest one still sending
/// its request head is closed to make room for a newcomer (as the RPC server's opening bound
/// does), so connections that never finish their head cannot keep scrapers out; if every one
/// is past its head (being answered), the newcomer is closed.
const MAX_CONNECTIONS: usize = 32;

/// What the endpoint shows: a server (and, on a controller, its registry).
pub(crate) trait Source: Send + Sync + 'static {
    /// Everything now; the registry's listing only if `registry` (the once-a-second snapshots
    /// for recent rates need only the methods).
    fn scrape(&self, registry: bool) -> BoxFuture<'_, Option<Scrape>>;
    /// Whether the server takes new callers, or why not (`None` once it is gone).
    fn ready(&self) -> Option<Result<(), String>>;
}

/// Parses an admin address: `HOST:PORT`, or a bare `PORT` on the loopback interface.
pub(crate) fn parse_addr(addr: &str) -> Result<SocketAddr, Error> {
    let invalid = |reason: &str| Error::InvalidAddress { addr: addr.to_string(), reason: reason.to_string() };
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    addr.parse::<SocketAddr>().map_err(|_| invalid("an admin address is HOST:PORT (an IP address) or PORT"))
}

/// Starts the endpoint on a thread of its own: binds `addr` and serves until `stop` is
/// cancelled or the source is gone; returns the address bound.
pub(crate) async fn start_thread(
    addr: SocketAddr,
    source: Arc<dyn Source>,
    stop: CancellationToken,
) -> Result<SocketAddr, Error> {
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Connection(format!("admin endpoint: cannot start its runtime: {e}")))?;
    std::thread::Builder::new()
        .name("volley-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let window = Arc::new(Window::default());
                let spawn = |task: BoxFuture<'static, ()>| drop(tokio::spawn(task));
                let started = start(addr, source.clone(), window.clone(), stop.clone(), spawn).await;
                let ok = started.is_ok();
                let _ = bound_tx.send(started);
                if ok {
                    // The thread ends when the server is gone (the window's scrapes find no
                    // server) or told to stop; its runtime's tasks end with it.
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = keep_window(source, window, stop.clone()) => {}
                    }
                }
            })
        })
        .map_err(|e| Error::Connection(format!("admin endpoint: cannot start its thread: {e}")))?;
    bound_rx.await.map_err(|_| Error::Connection("admin endpoint: its thread ended".into()))?
}

/// Binds `addr` and serves the endpoint until `stop` is cancelled; returns the address bound.
/// `spawn` runs the endpoint's tasks.
async fn start(
    addr: SocketAddr,
    source: Arc<dyn Source>,
    window: Arc<Window>,
    stop: CancellationToken,
    spawn: impl Fn(BoxFuture<'static, ()>) + Send + Sync + 'static,
) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Connection(format!("admin endpoint: cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| Error::Connection(e.to_string()))?;
    if !bound.ip().is_loopback() {
        tracing::warn!(address = %bound, "admin endpoint reachable beyond this machine");
    }
    tracing::info!(address = %bound, "admin endpoint listening");
    let spawn = Arc::new(spawn);
    let spawn_conn = spawn.clone();
    let slots = Arc::new(slots::Slots::new(MAX_CONNECTIONS));
    let accept = async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::debug!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let Some(slot) = slots.take() else { continue };
            let (source, window, stop) = (source.clone(), window.clone(), stop.clone());
            let evicted = slot.evicted.clone();
            spawn_conn(Box::pin(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = evicted.cancelled() => {}
                    _ = serve(stream, slot, &*source, &window) => {}
                }
            }));
            // The connection's task reads its head before the next accept can evict it.
            tokio::task::yield_now().await;
        }
    };
    spawn(Box::pin(accept));
    Ok(bound)
}

/// Takes the methods' snapshot once a second, for the recent rates and quantiles.
async fn keep_window(source: Arc<dyn Source>, window: Arc<Window>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match source.scrape(false).await {
            Some(s) => window.record(&s),
            None => return,
        }
    }
}

async fn serve(mut stream: TcpStream, slot: slots::Slot, source: &dyn Source, window: &Window) {
    let request = http::read_request(&mut stream).await;
    // Past its head: no longer a candidate for eviction.
    slot.headed();
    let (response, head_only) = match request {
        Request::Get { path, head_only } => (route(&path, source, window).await, head_only),
        Request::OtherMethod => (Response::text(405, "only GET and HEAD\n"), false),
        Request::Bad => (Response::text(400, "bad request\n"), false),
    };
    http::respond(&mut stream, response, head_only).await;
}

async fn route(path: &str, source: &dyn Source, window: &Window) -> Response {
    use crate::metrics::prometheus;
    match path {
        "/" => return Response::new(200, "text/html; charset=utf-8", page::HTML),
        // Liveness: the process serves (this endpoint lives until the server is gone).
        "/healthz" => return Response::text(200, "ok\n"),
        // Readiness: the server takes new callers (not while it leaves, nor with a dead
        // listener), as Kubernetes' readiness probes expect.
        "/readyz" => {
            return match source.ready() {
                Some(Ok(())) => Response::text(200, "ready\n"),
                Some(Err(why)) => Response::text(503, &format!("not ready: {why}\n")),
                None => Response::text(503, "not ready: the server is gone\n"),
            };
        }
        "/metrics" | "/vars.json" => {}
        _ => {
            return Response::text(
                404,
                "not found: the admin endpoint serves /, /metrics, /vars.json, /healthz and /readyz\n",
            );
        }
    }
    let Some(scrape) = source.scrape(true).await else {
        return Response::text(404, "the server is gone\n");
    };
    if path == "/metrics" {
        Response::new(200, prometheus::CONTENT_TYPE, prometheus::encode(scrape))
    } else {
        Response::new(200, "application/json", window.render(&scrape).to_string())
    }
}
