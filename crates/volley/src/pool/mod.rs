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
//!
//! The pools are always on. Whether they pay was measured with a process-wide switch that
//! turned them off; the figures are in docs/BENCHMARKS.md ("Memory pools"), and the switch is
//! gone: a global read on the path of every message does not belong in the product.

pub mod arena;
pub mod buffer;
pub mod object;
