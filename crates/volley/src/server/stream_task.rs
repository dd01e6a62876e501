//! The task that runs one open stream (PROTOCOL.md §9.9): it opens the stream in the
//! connection's table, runs the handler's side, and sends the stream's end — unless the client
//! cancelled it or the connection stopped reading.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::time::Instant;

use super::shared::Shared;
use super::stream::{Ended, OpenStreams, Sink, StreamHandler, gone, panicked};
use crate::error::Status;
use crate::proto::Code;
use crate::proto::message::shape;
use crate::transport::outbox::Outbox;

/// Completes at `deadline`; never without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Opens stream `id` and runs it as a task of the connection: `handler` produces, the task
/// sends its end (`StreamEnd` or `Error`) unless the client cancelled it. Answers at once, in
/// `out`, a stream that cannot be opened.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    streams: &Arc<OpenStreams>,
    shared: &Arc<Shared>,
    outbox: &Arc<Outbox>,
    inflight: &tokio_util::task::TaskTracker,
    handler: Arc<dyn StreamHandler>,
    (id, credit, request): (u64, u32, Bytes),
    deadline: Option<Instant>,
) -> Result<(), Status> {
    let takes_items = handler.shape() != shape::SERVER;
    let Some((open, input)) = streams.open(id, credit, takes_items) else {
        return Err(Status::new(Code::BadRequest, format!("stream id {id:#x} is open already")));
    };
    let stats = &shared.observe.streams;
    stats.opened.fetch_add(1, Ordering::Relaxed);
    let sink = Sink::new(id, outbox.clone(), open.clone(), shared.observe.streams.clone());
    let work = AssertUnwindSafe(handler.serve(request, input, sink)).catch_unwind();
    let (streams, shared, outbox) = (streams.clone(), shared.clone(), outbox.clone());
    inflight.spawn(async move {
        let (how, ended) = tokio::select! {
            r = work => {
                let r = r.unwrap_or_else(|_| Err(panicked()));
                (if r.is_ok() { Ended::Done } else { Ended::Failed }, r)
            }
            _ = open.cancelled.cancelled() => {
                if shared.is_closing() {
                    (Ended::Shutdown, Err(Status::new(Code::ShuttingDown, "server is shutting down")))
                } else {
                    (Ended::Cancelled, Err(gone()))
                }
            }
            () = sleep_until_some(deadline) => {
                (Ended::Deadline, Err(Status::new(Code::DeadlineExceeded, "the stream's deadline passed")))
            }
        };
        streams.close(id);
        shared.observe.streams.ended(how);
        // A cancelled stream's client has forgotten its id, or its connection is gone.
        if how != Ended::Cancelled {
            let _ = outbox.push(|fb| match ended {
                Ok(None) => fb.stream_end(id),
                Ok(Some(reply)) => {
                    if let Err(e) = fb.reply_bytes(id, reply) {
                        fb.error(id, Code::TooLarge, &format!("the reply does not fit in a frame: {e:?}"));
                    }
                }
                Err(s) => fb.error(id, s.code, &s.message),
            });
        }
    });
    Ok(())
}
