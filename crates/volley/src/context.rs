//! The context of the request a handler serves, as far as it travels with calls the handler
//! makes: its deadline. The server sets it while a handler starts; the client reads it when a
//! call starts, so a call made by a handler never outlives the request it serves.
//!
//! Like [`current_peer`](crate::current_peer), it is known during the synchronous start of a
//! handler — before its first `.await` — and calls the handler starts there (an `async` handler
//! that awaits a call polls the call's start within its own) inherit it. A handler that makes
//! calls after waiting reads [`current_deadline`] at its start and passes it on with
//! [`CallOptions::deadline`](crate::CallOptions::deadline).

use std::cell::Cell;

use tokio::time::Instant;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// When the caller of the request being handled gives up on it, if it said so (a Volley client
/// sends its call's time budget with each request; see `docs/PROTOCOL.md` §6.2.2). `None`
/// outside a handler's start, and for a request that came without a deadline.
pub fn current_deadline() -> Option<Instant> {
    DEADLINE.with(Cell::get)
}

/// Runs `f` with `deadline` as the [`current_deadline`] (and the one before it afterwards).
pub(crate) fn with_deadline<R>(deadline: Option<Instant>, f: impl FnOnce() -> R) -> R {
    let before = DEADLINE.with(|d| d.replace(deadline));
    let r = f();
    DEADLINE.with(|d| d.set(before));
    r
}

/// The time a call may take: its own timeout, cut to what is left of the deadline of the
/// request being handled (if the call is made by a handler).
pub(crate) fn budget(timeout: std::time::Duration) -> std::time::Duration {
    match current_deadline() {
        Some(d) => timeout.min(d.saturating_duration_since(Instant::now())),
        None => timeout,
    }
}
