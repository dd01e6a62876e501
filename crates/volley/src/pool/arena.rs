//! The per-batch arena: bump allocation (bumpalo) for the scratch of one server turn, released
//! in one step when the turn's replies are written.
//!
//! One arena per thread, not per connection: a turn runs to completion without awaiting, so
//! the connections served by a thread take turns using it, and an idle connection holds no
//! arena memory at all. After a turn the arena is reset (its largest chunk is kept for the next
//! turn); a turn that made it grow past [`KEEP`] gets a fresh arena, so one huge batch does not
//! pin its memory for ever.
//!
//! bumpalo because it is the well-kept bump allocator (about 28× the system allocator for tiny
//! allocations, `volley bench pools` measures it here), and its `Vec` and `Box` run their
//! contents' destructors, which the server needs: replies hold `Bytes` and `String`s.

use std::cell::RefCell;

pub use bumpalo::Bump;

/// After a turn, an arena that grew beyond this many bytes is dropped rather than reset.
pub const KEEP: usize = 1 << 20;

thread_local! {
    static ARENA: RefCell<Bump> = RefCell::new(Bump::new());
}

/// Runs `f` with this thread's arena and resets it afterwards. Everything `f` allocated in the
/// arena must be dropped by then (the borrow checker sees to it). If the arena is already in
/// use further up the stack, `f` gets a fresh one.
#[inline]
pub fn with_turn<R>(f: impl FnOnce(&Bump) -> R) -> R {
    ARENA.with(|cell| match cell.try_borrow_mut() {
        Ok(mut arena) => {
            let r = f(&arena);
            if arena.allocated_bytes() > KEEP {
                *arena = Bump::new();
            } else {
                arena.reset();
            }
            r
        }
        Err(_) => f(&Bump::new()),
    })
}
