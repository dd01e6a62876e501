//! Memory pools for the hot path (issue 6; seeds/002 and seeds/003).
//!
//! Three pools, each where a profile or an allocation count showed the system allocator on the
//! path of every call:
//!
//! - [`object`] — a pool of fixed-size objects with a per-thread cache in front of a shared,
//!   bounded free list (seeds/002's "recoverable fixed-length pool"). Used for the client's
//!   **completion slots** ([`Completion`](crate::pool::object::Completion)): the one-shot through
//!   which the reader hands a reply to the caller. It replaced a tokio oneshot, whose shared state
//!   was a fresh `Arc` allocation on every call.
//! - [`buffer`] — size classes of byte buffers (64 B – 1 MiB, powers of two) recycled through a
//!   per-thread cache and a shared list, with a bound on the bytes it keeps; anything outside the
//!   classes or over the bound goes straight to the system allocator (seeds/002's "recoverable
//!   variable-length pool"). Used for **receive buffers** and **send buffers** of unix/tcp
//!   connections: a connection takes one when it has bytes to read or write and gives it back
//!   when it goes idle, so a busy connection reuses warm memory (seeds/003's +23%) while ten
//!   thousand idle connections pin none (seeds/003's warning).
//! - [`arena`] — a per-thread bump arena (bumpalo) for the scratch of one server turn: the
//!   decoded requests and the results of a synchronous (`handle_fn`) handler live there until
//!   the replies are written, then the whole turn is released in one step (seeds/002's
//!   "allocate-not-free pool"). It replaced about eight small allocations per turn (vectors of
//!   ids, values and results, boxed futures and reply writers).
//!
//! **The switch.** Pools can be turned off for a before/after comparison in one binary:
//! `VOLLEY_POOLS=0` in the environment (read once), or [`set_enabled`] before the first
//! connection. Off means the allocation behaviour from before the pools: completion slots
//! come from the system allocator, receive and send buffers are released to it when idle, and
//! server turns take the boxed path of every handler.

pub mod arena;
pub mod buffer;
pub mod object;

use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNSET);

/// Whether the pools are in use (default: yes; `VOLLEY_POOLS=0`, `off` or `false` turns them
/// off).
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => init_from_env(),
    }
}

#[cold]
fn init_from_env() -> bool {
    let on = !matches!(
        std::env::var("VOLLEY_POOLS").as_deref().map(str::trim),
        Ok("0") | Ok("off") | Ok("false") | Ok("no")
    );
    let _ = STATE.compare_exchange(UNSET, if on { ON } else { OFF }, Ordering::Relaxed, Ordering::Relaxed);
    STATE.load(Ordering::Relaxed) == ON
}

/// Turns the pools on or off for the whole process. Meant to be called once, before the first
/// connection (benchmarks compare both in one binary); connections already open keep the
/// buffers they hold.
pub fn set_enabled(on: bool) {
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}
