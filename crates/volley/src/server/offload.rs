//! Large payloads are decoded, handled and encoded on a CPU pool instead of the connection's
//! task: the IO task only moves bytes, and worker threads do the (de)serialization, as in the
//! MF report's design that Volley follows.
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

use futures_util::future::BoxFuture;

use super::batch::poll_now;
use super::handler::{Handler, panic_message};
use super::replies::{Replies, ReplyTo, Results};
use crate::error::Status;
use crate::proto::encode::{FrameBuilder, Frames};
use crate::proto::{Code, Limits};

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

/// Serves a request group (or one batch request) on the codec pool: `job` decodes it and runs
/// the handler (on `handler`, with a builder to answer into), a handler that finishes without
/// waiting finishes there, and the replies are encoded there into finished frames, which the
/// connection only links into its output. A handler that waits is awaited on the runtime, and
/// its replies go back to the pool to be encoded. If anything panics on the pool, every
/// request in `ids` gets an `Internal` error.
pub(super) fn offloaded(
    handler: Arc<dyn Handler>,
    ids: Vec<u64>,
    limits: Limits,
    job: impl FnOnce(&dyn Handler, &mut FrameBuilder) -> Option<BoxFuture<'static, Box<dyn Replies>>>
    + Send
    + 'static,
) -> BoxFuture<'static, Box<dyn Replies>> {
    Box::pin(async move {
        // Handlers may use the runtime (timers, IO) in their first poll, here on a pool thread.
        let runtime = tokio::runtime::Handle::current();
        let first = run(move || {
            let _entered = runtime.enter();
            let mut out = FrameBuilder::new(limits);
            match job(&*handler, &mut out) {
                None => Ok(out.take_frames()),
                Some(mut fut) => match poll_now(&mut fut) {
                    Some(replies) => Ok(encoded(replies, &mut out)),
                    None => Err(fut),
                },
            }
        })
        .await;
        let frames = match first {
            Ok(Ok(frames)) => Ok(frames),
            Ok(Err(waiting)) => {
                let replies = waiting.await;
                run(move || encoded(replies, &mut FrameBuilder::new(limits))).await
            }
            Err(p) => Err(p),
        };
        match frames {
            Ok(frames) => Box::new(frames) as Box<dyn Replies>,
            Err(p) => {
                let what = panic_message(&p);
                tracing::error!(panic = %what, "decoding or encoding a large payload panicked");
                let status = Status::new(Code::Internal, format!("the request's codec panicked: {what}"));
                let results = ids.iter().map(|_| Err(status.clone())).collect();
                Box::new(Results::<()> { to: ReplyTo::Each(ids), results })
            }
        }
    })
}

fn encoded(replies: Box<dyn Replies>, out: &mut FrameBuilder) -> Frames {
    replies.write(out);
    out.take_frames()
}
