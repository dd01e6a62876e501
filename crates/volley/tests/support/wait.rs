//! Waiting for a condition instead of sleeping and hoping: poll it, and give up (panicking with
//! what was awaited) only after a generous deadline. On tokio's paused clock each poll lets
//! simulated time run on; the deadline is kept on both clocks (the runtime's and the machine's),
//! so a paused test cannot give up early while it waits on a real thread, and a loaded machine
//! cannot make a real-time test give up early either.
#![allow(dead_code)] // each test binary uses the helpers it needs

use std::time::Duration;

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(5);

/// Polls `cond` until it holds, and returns how long that took on the runtime's clock
/// (simulated time on a paused clock); `None` once `within` passed on both clocks.
async fn poll(within: Duration, mut cond: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let (runtime, machine) = (tokio::time::Instant::now(), std::time::Instant::now());
    loop {
        if cond().await {
            return Some(runtime.elapsed());
        }
        if runtime.elapsed() >= within && machine.elapsed() >= within {
            return None;
        }
        // The poll: on the runtime's clock, so simulated time runs on under a paused one.
        tokio::time::sleep(POLL).await;
    }
}

/// Like [`wait_until`], for conditions that need an `.await` (a call, a listing).
pub async fn wait_for(within: Duration, what: &str, cond: impl AsyncFnMut() -> bool) -> Duration {
    poll(within, cond).await.unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// Waits until `cond` holds; panics naming `what` after `within`. Returns how long it took on
/// the runtime's clock.
pub async fn wait_until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    wait_for(within, what, async || cond()).await
}

/// Whether `cond` comes to hold within `within` (for tests that assert with their own message).
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll(within, async || cond()).await.is_some()
}

/// [`eventually`] for conditions that need an `.await`.
pub async fn eventually_for(within: Duration, cond: impl AsyncFnMut() -> bool) -> bool {
    poll(within, cond).await.is_some()
}

/// [`wait_until`] for a plain thread, outside any runtime.
pub fn wait_until_blocking(within: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t0 = std::time::Instant::now();
    poll_blocking(within, what, || cond().then_some(()));
    t0.elapsed()
}

/// Polls `f` on a plain thread until it gives a value, for up to `within` (`None` after that).
pub fn try_poll_blocking<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() >= within {
            return None;
        }
        // Four times the async poll: these conditions are mostly other processes.
        std::thread::sleep(POLL * 4);
    }
}

/// [`try_poll_blocking`] that panics, naming `what`, when no value came within `within`.
pub fn poll_blocking<T>(within: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    try_poll_blocking(within, f).unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// Whether `cond` comes to hold within `within`, on a plain thread (for a test that must clean
/// up before it fails).
pub fn eventually_blocking(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    try_poll_blocking(within, || cond().then_some(())).is_some()
}
