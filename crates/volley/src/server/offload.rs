//! Large payloads are decoded, handled and encoded on a CPU pool instead of the connection's
//! task (seeds/000 §5: the IO thread only moves bytes; "work" threads do the (de)serialization).
//!
//! A connection is served by one task. For small requests that task is the cheapest place to
//! decode and answer them — handing each to another thread would cost more than the work. For a
//! 1 MiB request, though, decoding and encoding take far longer than the IO, and doing them on
//! the connection's task caps the connection at one core. Requests whose payload reaches
//! [`ServerConfig::offload_min_bytes`](super::ServerConfig) go to this pool instead.
//!
//! The pool is rayon's (a work-stealing pool sized to the machine, made for CPU-bound jobs);
//! ours is a dedicated instance so that a user's own rayon work cannot starve request decoding.
//! Async handlers that wait are awaited on the runtime, not on a pool thread, so the pool never
//! blocks; only their replies come back to the pool for encoding.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use futures_util::future::BoxFuture;

use super::handler::{ErasedHandler, ReplyWriter, panic_message};
use crate::error::Status;
use crate::proto::Code;

/// The codec pool: one thread per core, started on first use.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("volley-codec-{i}"))
            .build()
            .expect("the codec pool's threads start")
    })
}

/// Runs `f` on the codec pool and waits for it without blocking the runtime. A panic in `f`
/// comes back as `Err` (rayon would otherwise abort the process).
async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Box<dyn Any + Send>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    pool().spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
    });
    rx.await.unwrap_or_else(|_| Err(Box::new("the codec pool dropped a job")))
}

/// `call` (a handler's `call` or `call_chunk` on this batch) with the decoding, a handler that
/// finishes without waiting, and the encoding of its replies all on the pool. If anything
/// panics there, every request in `ids` (or the one batch request) gets an `Internal` error.
pub(super) fn offloaded(
    handler: Arc<dyn ErasedHandler>,
    ids: Vec<u64>,
    call: impl FnOnce(&dyn ErasedHandler) -> BoxFuture<'static, Box<dyn ReplyWriter>> + Send + 'static,
) -> BoxFuture<'static, Box<dyn ReplyWriter>> {
    Box::pin(async move {
        // Handlers may use the runtime (timers, IO) in their first poll, here on a pool thread.
        let runtime = tokio::runtime::Handle::current();
        let first = run(move || {
            let _entered = runtime.enter();
            let mut fut = call(&*handler);
            // The noop waker is safe: a pending future is awaited again below, on the runtime.
            match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(w) => Ok(w.encoded()),
                Poll::Pending => Err(fut),
            }
        })
        .await;
        let outcome = match first {
            Ok(Ok(encoded)) => Ok(encoded),
            Ok(Err(waiting)) => {
                let w = waiting.await;
                run(move || w.encoded()).await
            }
            Err(p) => Err(p),
        };
        outcome.unwrap_or_else(|p| {
            let what = panic_message(&p);
            tracing::error!(panic = %what, "decoding or encoding a large payload panicked");
            let status = Status::new(Code::Internal, format!("the request's codec panicked: {what}"));
            Box::new(Failed { ids, status })
        })
    })
}

/// Error replies for requests whose offloaded work panicked.
struct Failed {
    ids: Vec<u64>,
    status: Status,
}

impl ReplyWriter for Failed {
    fn write(self: Box<Self>, fb: &mut crate::proto::encode::FrameBuilder) {
        for id in self.ids {
            fb.error(id, self.status.code, &self.status.message);
        }
    }

    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter> {
        self
    }
}
