//! One connection's life: its opening (handshake, preambles) under the server's bounds, then
//! turns — read what arrived (up to `max_batch`), hand it to the dispatcher, which answers it
//! together — until the peer leaves, breaks the protocol or the server shuts down.

use std::sync::Arc;
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio_util::task::TaskTracker;

use super::admission::{OpeningTicket, Served};
use super::dispatch::{Conn, Dispatch};
use super::peer::Peer;
use super::reply_room::ReplyRoom;
use super::shared::Shared;
use crate::liveness::{Action, Liveness};
use crate::proto::{Code, Message, ProtocolError, SERVER_PREAMBLE};
use crate::transport::outbox::Outbox;
use crate::transport::reader::{FrameReader, ReadError};
use crate::transport::socket::{Accepted, StreamRead, StreamWrite};
use crate::transport::stream::ByteStream;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

enum End {
    PeerClosed,
    Shutdown,
    Protocol(ProtocolError),
    Io(String),
    /// The peer sent part of a frame and then nothing for the read timeout.
    Stalled(String),
    /// A large frame found no room in the server's receive budget within the read timeout.
    OverBudget(String),
    /// Keepalive: nothing arrived within the timeout after a ping.
    Dead,
    /// The peer did not present a token the server accepts.
    Unauthenticated(&'static str),
}

/// Opens an accepted connection (handshake, preambles) under the opening bound, then serves
/// it if there is room among the served connections, or refuses it with a go-away.
pub(super) async fn accept(shared: Arc<Shared>, accepted: Accepted, ticket: OpeningTicket) {
    let peer = accepted.peer();
    let timeout = shared.config.handshake_timeout;
    let opened = tokio::select! {
        r = open(&shared, accepted) => r,
        _ = ticket.evicted.cancelled() => {
            tracing::debug!(%peer, "closing an opening connection to make room for a newer one");
            return;
        }
        _ = tokio::time::sleep(timeout) => {
            tracing::debug!(%peer, ?timeout, "closing a connection that did not open in time");
            return;
        }
        _ = shared.shutdown.cancelled() => return,
    };
    drop(ticket);
    match opened {
        Ok(Opened { reader, wr, peer }) => match shared.admission.serve(shared.config.max_connections) {
            // A task of its own, so an idle connection does not keep the opening's state too.
            Some(served) => shared.spawn(serve(shared.clone(), reader, wr, peer, served)),
            None => {
                let max = shared.config.max_connections.unwrap_or(0);
                tracing::warn!(%peer, max, "refusing connection: connection limit reached");
                let why = format!("server is at its limit of {max} connections");
                go_away_and_close(&shared, reader, wr, Code::Overloaded, &why).await;
            }
        },
        Err(OpenError::BadPreamble(opened, e)) => {
            let Opened { reader, wr, peer } = *opened;
            tracing::warn!(%peer, error = %e, "closing connection: protocol error");
            go_away_and_close(&shared, reader, wr, Code::Protocol, &e.to_string()).await;
        }
        Err(OpenError::Failed(e)) => tracing::debug!(%peer, error = %e, "connection failed while opening"),
    }
}

/// A connection past its handshake and preambles.
struct Opened {
    reader: FrameReader<StreamRead>,
    wr: StreamWrite,
    peer: String,
}

enum OpenError {
    /// The peer's preamble is not Volley's (or not this version's): it gets a go-away.
    BadPreamble(Box<Opened>, ProtocolError),
    /// A failed handshake, or the peer left: nothing to tell it.
    Failed(String),
}

/// Runs the handshake, sends our preamble (at once, as the protocol says) and waits for the
/// client's.
async fn open(shared: &Shared, accepted: Accepted) -> Result<Opened, OpenError> {
    let failed = |e: &dyn std::fmt::Display| OpenError::Failed(e.to_string());
    let stream = accepted.handshake().await.map_err(|e| failed(&format!("handshake: {e}")))?;
    let peer = stream.peer();
    let (rd, mut wr) = stream.into_halves();
    // Flushed: a TLS session may hold the bytes back, and a client may wait for them.
    wr.write_all(&SERVER_PREAMBLE).await.map_err(|e| failed(&e))?;
    wr.flush().await.map_err(|e| failed(&e))?;
    let mut reader = FrameReader::new(rd, shared.config.limits)
        .with_read_timeout(shared.config.read_timeout)
        .with_budget(Some(shared.receive.clone()));
    match reader.preamble().await {
        Ok(true) => Ok(Opened { reader, wr, peer }),
        Ok(false) => Err(failed(&"peer closed the connection before its preamble")),
        Err(ReadError::Protocol(e)) => Err(OpenError::BadPreamble(Box::new(Opened { reader, wr, peer }), e)),
        Err(e) => Err(failed(&e)),
    }
}

/// Serves an opened connection until the peer leaves, breaks the protocol, or the server shuts
/// down. `_served` holds its place among the served connections.
async fn serve(
    shared: Arc<Shared>,
    mut reader: FrameReader<StreamRead>,
    wr: StreamWrite,
    peer: String,
    _served: Served,
) {
    let outbox = Arc::new(Outbox::new(shared.config.limits));
    let writer = {
        let (outbox, shared) = (outbox.clone(), shared.clone());
        tokio::spawn(async move { outbox.write_loop(wr, &shared.counters, false).await })
    };
    // Handler batches that did not finish on their first poll run as tasks tracked here, so
    // the connection closes only after their replies are queued.
    let inflight = TaskTracker::new();
    // Layers above see the connection close when this function returns (the guard drops).
    let (peer_scope, _closes_with_serve) = Peer::open(&peer);
    let room = ReplyRoom::new(shared.receive.clone(), shared.config.read_timeout, outbox.clone());
    let end = turns(&shared, &mut reader, &outbox, &room, &inflight, Dispatch::new(peer_scope)).await;
    inflight.close();
    tokio::select! {
        _ = inflight.wait() => {}
        // Past the drain deadline the handler tasks drop their work (see `Dispatch::start`).
        _ = shared.abort.cancelled() => inflight.wait().await,
    }
    say_why(&end, &outbox, &peer);
    outbox.close();
    if matches!(end, End::Dead) {
        // It answered nothing, not even a ping: it reads nothing either, and waiting for it to
        // take the replies would hold them for another write stall.
        writer.abort();
    } else {
        flush(&shared, &outbox, writer, &peer).await;
    }
    if !matches!(end, End::PeerClosed | End::Io(_) | End::Dead) {
        // We closed first, with a go-away: let the peer read it before the socket goes.
        reader.drain(LINGER).await;
    }
}

/// The connection's turns: read a batch, check the peer's credential once, dispatch it; keep
/// the connection alive; until the peer or the server ends it.
async fn turns(
    shared: &Arc<Shared>,
    reader: &mut FrameReader<StreamRead>,
    outbox: &Arc<Outbox>,
    room: &ReplyRoom,
    inflight: &TaskTracker,
    mut dispatch: Dispatch,
) -> End {
    let mut batch = Vec::new();
    let mut authenticated = shared.config.tokens.is_empty();
    // Keepalive counts reads (no clock read per batch); its timer wakes the loop to decide.
    let mut liveness = shared.config.keepalive.map(|k| Liveness::new(k, Instant::now().into_std()));
    // Without keepalive the branch is disabled, and the timer's instant does not matter.
    let first = liveness.as_ref().map_or_else(Instant::now, |l| Instant::from_std(l.deadline()));
    let tick = tokio::time::sleep_until(first);
    tokio::pin!(tick);
    // One wait for shutdown for the connection's life: a new one per loop turn joined and left
    // the token's waiter list (a lock each time), ~350 instructions per lone round trip.
    let shutdown = shared.shutdown.cancelled();
    tokio::pin!(shutdown);
    let mut shutdown_seen = Registered::default();
    let mut reads = 0u64;
    loop {
        let read = tokio::select! {
            biased;
            r = async {
                // A peer that does not read its replies stops us reading its requests (at its
                // own bound, or when the server's budget has no room for its replies).
                room.wait().await.map_err(ReadError::OverBudget)?;
                reader.read_batch(&mut batch, shared.config.max_batch, &shared.counters).await
            } => r,
            () = std::future::poll_fn(|cx| {
                let closing = shared.closing.load(std::sync::atomic::Ordering::Acquire);
                shutdown_seen.poll(shutdown.as_mut(), cx, closing)
            }) => return End::Shutdown,
            () = &mut tick, if liveness.is_some() => {
                let live = liveness.as_mut().expect("checked by the branch condition");
                match live.poll(Instant::now().into_std(), reads) {
                    Action::Wait => {}
                    Action::Ping => {
                        let _ = outbox.push(|fb| fb.ping(reads));
                    }
                    Action::Dead => return End::Dead,
                }
                tick.as_mut().reset(Instant::from_std(live.deadline()));
                continue;
            }
        };
        reads += 1;
        match read {
            Ok(true) => {
                if !authenticated {
                    match check_auth(&shared.config.tokens, &batch) {
                        Ok(()) => {
                            authenticated = true;
                            batch.remove(0);
                        }
                        Err(why) => return End::Unauthenticated(why),
                    }
                }
                let write_now = !reader.mid_frame();
                let conn = Conn { shared, outbox, inflight, write_now };
                if let Err(e) = dispatch.run(&conn, &mut batch) {
                    return End::Protocol(e);
                }
            }
            Ok(false) => return End::PeerClosed,
            Err(ReadError::Protocol(e)) => return End::Protocol(e),
            Err(e @ ReadError::Stalled(_)) => return End::Stalled(e.to_string()),
            Err(e @ ReadError::OverBudget(_)) => return End::OverBudget(e.to_string()),
            Err(e) => return End::Io(e.to_string()),
        }
    }
}

/// A wait that the connection's `select!` polls each time its task parks, nearly always to find
/// it not ready. Once polled with the task's waker, a pending tokio wait wakes that waker itself
/// when it becomes ready, so polling it again with the same waker is skipped until `may_be_ready`
/// (a flag set before the wait completes) says otherwise. Polled every time, the shutdown
/// token's wait re-took its lock, ~100 instructions per lone round trip (scripts/callcost.py,
/// tcp-1). Only for waits outside tokio's cooperative budget: a timer whose budget ran out
/// returns pending without registering anything, and must be polled again.
#[derive(Default)]
struct Registered {
    waker: Option<std::task::Waker>,
}

impl Registered {
    fn poll<F: std::future::Future>(
        &mut self,
        wait: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
        may_be_ready: bool,
    ) -> std::task::Poll<F::Output> {
        if !may_be_ready && self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return std::task::Poll::Pending;
        }
        let polled = wait.poll(cx);
        self.waker = polled.is_pending().then(|| cx.waker().clone());
        polled
    }
}

/// Logs why the connection ends and, where the server ends it, queues the go-away that says so.
fn say_why(end: &End, outbox: &Outbox, peer: &str) {
    match end {
        End::PeerClosed => tracing::debug!(%peer, "peer closed the connection"),
        End::Shutdown => {
            let _ = outbox.push(|fb| fb.go_away(Code::ShuttingDown, "server is shutting down"));
        }
        End::Protocol(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: protocol error");
            let _ = outbox.push(|fb| fb.go_away(Code::Protocol, &e.to_string()));
        }
        End::Io(e) => tracing::debug!(%peer, error = %e, "connection failed"),
        End::Stalled(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: read timeout");
            let _ = outbox.push(|fb| fb.go_away(Code::Protocol, e));
        }
        End::OverBudget(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: no room in the server's budget");
            let _ = outbox.push(|fb| fb.go_away(Code::Overloaded, e));
        }
        End::Dead => tracing::info!(%peer, "closing connection: no answer to a keepalive ping"),
        End::Unauthenticated(why) => {
            tracing::warn!(%peer, reason = why, "refusing connection: not authenticated");
            let _ = outbox.push(|fb| fb.go_away(Code::Unauthenticated, why));
        }
    }
}

/// Lets the writer finish what is queued, unless the peer stops reading: one that takes no
/// byte for a read timeout (it may have half-closed and gone) must not hold the task and its
/// unsent replies forever.
async fn flush(
    shared: &Shared,
    outbox: &Outbox,
    mut writer: tokio::task::JoinHandle<std::io::Result<()>>,
    peer: &str,
) {
    let stall = shared.config.read_timeout.unwrap_or(DEFAULT_WRITE_STALL);
    let written = loop {
        let progress = outbox.bytes_written();
        tokio::select! {
            r = &mut writer => break Some(r),
            _ = async {
                shared.abort.cancelled().await;
                tokio::time::sleep(LINGER).await;
            } => break None,
            () = tokio::time::sleep(stall) => if outbox.bytes_written() == progress {
                tracing::info!(%peer, ?stall, "closing connection: the peer reads nothing");
                break None;
            },
        }
    };
    match written {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => tracing::debug!(%peer, error = %e, "write failed"),
        Some(Err(e)) => tracing::error!(%peer, error = %e, "writer task failed"),
        None => writer.abort(),
    }
}

/// Whether the first message of a connection presents one of the server's tokens.
fn check_auth(tokens: &[Vec<u8>], batch: &[Message]) -> Result<(), &'static str> {
    match batch.first() {
        Some(Message::Auth { token }) => {
            // Every configured token is compared, in constant time, whatever matches.
            let ok = tokens.iter().fold(subtle::Choice::from(0), |ok, t| ok | t.as_slice().ct_eq(token));
            if bool::from(ok) { Ok(()) } else { Err("the token presented is not accepted") }
        }
        _ => Err("this server requires a token (none was presented)"),
    }
}

/// Sends a go-away and closes: for a connection that is refused or broke the protocol before
/// being served.
async fn go_away_and_close(
    shared: &Shared,
    mut reader: FrameReader<StreamRead>,
    wr: StreamWrite,
    code: Code,
    why: &str,
) {
    let outbox = Outbox::new(shared.config.limits);
    let _ = outbox.push(|fb| fb.go_away(code, why));
    outbox.close();
    let _ = tokio::time::timeout(LINGER, outbox.write_loop(wr, &shared.counters, false)).await;
    reader.drain(LINGER).await;
}

/// Without a read timeout, how long a closing connection waits for its peer to read anything.
const DEFAULT_WRITE_STALL: Duration = Duration::from_secs(30);

/// How long a connection we close keeps reading (and discarding) so its go-away arrives.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
