//! The server's side of inproc for batch handlers: the inproc callers of a batch handler wait in a per-method queue that a dispatcher task hands to the handler in
//! batches of up to `max_batch` — so a batch handler gets every request that arrived together,
//! as over a socket. (Per-item and synchronous handlers are called in the caller's task and
//! need no queue: see `transport::inproc`.)

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::batch::{BatchFn, BatchResult, poll_now};
use super::host::Host;
use crate::error::Status;
use crate::proto::Code;
use crate::transport::inproc::Started;

type ReplyTx<Resp> = oneshot::Sender<Result<Resp, Status>>;

/// The inproc callers of one batch handler, waiting to be served together.
pub(crate) struct LocalQueue<Req, Resp> {
    state: Mutex<QueueState<Req, Resp>>,
}

struct QueueState<Req, Resp> {
    items: Vec<(Req, ReplyTx<Resp>)>,
    dispatcher: Option<Waker>,
    running: bool,
    closed: bool,
}

impl<Req: Send + 'static, Resp: Send + 'static> LocalQueue<Req, Resp> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LocalQueue {
            state: Mutex::new(QueueState {
                items: Vec::new(),
                dispatcher: None,
                running: false,
                closed: false,
            }),
        })
    }

    /// Queues `req` for `batch` and returns the wait for its reply; starts the dispatcher on
    /// the server's runtime if none runs.
    pub(crate) fn push(
        self: &Arc<Self>,
        req: Req,
        batch: &Arc<BatchFn<Req, Resp>>,
        server: &Arc<Host>,
    ) -> Started<Result<Resp, Status>> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        if st.closed {
            return Started::Done(Err(Status::new(Code::ShuttingDown, "inproc server is shutting down")));
        }
        st.items.push((req, tx));
        let start = !std::mem::replace(&mut st.running, true);
        let wake = st.dispatcher.take();
        drop(st);
        if start {
            server.spawn(dispatch_loop(self.clone(), batch.clone(), server.max_batch, server.clone()));
        } else if let Some(w) = wake {
            w.wake();
        }
        Started::Waiting(Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(Status::new(Code::ShuttingDown, "inproc server dropped the request")))
        }))
    }

    /// Refuses new requests; the dispatcher still serves those already queued, then stops.
    pub(crate) fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        let w = st.dispatcher.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Ready once something is queued or the queue is closed.
    fn poll_queued(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if !st.items.is_empty() || st.closed {
            return Poll::Ready(());
        }
        st.dispatcher = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Takes up to `max` queued requests; `false` once nothing is left (the dispatcher stops,
    /// and the next push starts another).
    fn take(&self, out: &mut Vec<(Req, ReplyTx<Resp>)>, max: usize) -> bool {
        let mut st = self.state.lock();
        if st.items.is_empty() {
            st.running = false;
            return false;
        }
        if st.items.len() <= max {
            std::mem::swap(&mut st.items, out);
        } else {
            out.extend(st.items.drain(..max));
        }
        true
    }
}

/// Drains the queue in batches and completes each caller's reply.
async fn dispatch_loop<Req: Send + 'static, Resp: Send + 'static>(
    queue: Arc<LocalQueue<Req, Resp>>,
    batch: Arc<BatchFn<Req, Resp>>,
    max: usize,
    server: Arc<Host>,
) {
    let mut taken = Vec::new();
    let yield_first = crate::transport::outbox::lifo_runtime();
    loop {
        if crate::transport::outbox::wait(|cx| queue.poll_queued(cx)).await && yield_first {
            // As in the outbox's writer: let the other callers queue before taking the batch.
            tokio::task::yield_now().await;
        }
        if !queue.take(&mut taken, max) {
            break;
        }
        let (reqs, txs): (Vec<Req>, Vec<ReplyTx<Resp>>) = taken.drain(..).unzip();
        let mut fut = batch(reqs);
        match poll_now(&mut fut) {
            Some(results) => complete(txs, results),
            None => server.spawn(async move { complete(txs, fut.await) }),
        }
    }
}

fn complete<Resp>(txs: Vec<ReplyTx<Resp>>, results: BatchResult<Resp>) {
    for (tx, r) in txs.into_iter().zip(results) {
        // A caller that timed out has dropped its receiver: the reply is dropped with it.
        let _ = tx.send(r);
    }
}
