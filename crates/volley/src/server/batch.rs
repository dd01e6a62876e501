//! What a batch handler is: its function type, its result, and running its future in place.
//! The typed handlers and the inproc batch queue both build on these.

use std::task::{Context, Poll, Waker};

use futures_util::future::BoxFuture;

use crate::error::Status;

/// What a batch handler returns: one result per request, in request order.
pub type BatchResult<Resp> = Vec<Result<Resp, Status>>;

pub(crate) type BatchFn<Req, Resp> = dyn Fn(Vec<Req>) -> BoxFuture<'static, BatchResult<Resp>> + Send + Sync;

/// Runs `fut` once, in place, and returns its output if it is done. Most handlers finish
/// without waiting, and then their replies go out at once, with no task switch. `None` means
/// it waits: the caller spawns it, and its task polls it again with a real waker — which is
/// what makes the no-op waker here safe.
pub(crate) fn poll_now<T>(fut: &mut BoxFuture<'static, T>) -> Option<T> {
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}
