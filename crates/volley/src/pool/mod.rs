//! Memory pools for the hot path, each where a profile or an allocation count showed the system
//! allocator on the path of every call (the design follows a published study of memory pools
//! in a high-concurrency search service, and a mailing-list thread on per-session receive
//! buffers; docs/ARCHITECTURE.md, "pool", tells the figures):
//!
//! - [`object`] — a pool of fixed-size objects with a per-thread cache in front of a shared,
//!   bounded free list. Used for the client's **completion slots**
//!   ([`Completion`](crate::pool::object::Completion)): the one-shot through which the reader
//!   hands a reply to the caller. It replaced a tokio oneshot, whose shared state was a fresh
//!   `Arc` allocation on every call.
//! - [`buffer`] — size classes of byte buffers (64 B – 1 MiB, powers of two) recycled through a
//!   per-thread cache and a shared list, with a bound on the bytes it keeps; anything outside the
//!   classes or over the bound goes straight to the system allocator. Used for **receive
//!   buffers** and **send buffers** of unix/tcp connections, and for the buffer a server turn
//!   encodes its answers into: a connection takes one when it has bytes to read or write and
//!   gives it back when it goes idle, so a busy connection reuses warm memory while ten thousand
//!   idle connections pin none.
//!
//! A third pool, a per-thread bump arena for a server turn's scratch (typed results kept until
//! the turn's replies were written), is gone: a turn now encodes each answer as soon as it has
//! it, so there is no scratch to keep.
//!
//! The pools are always on. Whether they pay was measured with a process-wide switch that
//! turned them off; the figures are in docs/BENCHMARKS.md ("Memory pools"), and the switch is
//! gone: a global read on the path of every message does not belong in the product.

pub mod buffer;
pub mod object;
