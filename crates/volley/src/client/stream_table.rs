//! The streams of one client connection, by id (PROTOCOL.md §9.9): where the reader hands each
//! stream's items, end, reply or error, and the credit the server grants a stream the client
//! sends on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::{Semaphore, mpsc};

use crate::error::Error;

/// Credit a stream's sender may hold: far beyond any window, far below what the semaphore
/// allows (it would panic), so a server that grants without end cannot crash the client.
const MAX_SEND_CREDIT: usize = 1 << 40;

/// What the reader hands a stream.
#[derive(Debug)]
pub(crate) enum Event {
    Item(Bytes),
    End,
    /// A client stream's one reply.
    Reply(Bytes),
    Failed(Error),
    /// The server grants room for more of the client's items (kept by the table).
    Credit(u32),
}

/// One open stream: where its events go, and, if the client sends items on it, the credit
/// the server granted.
struct Slot {
    tx: mpsc::UnboundedSender<Event>,
    credit: Option<Arc<Semaphore>>,
}

impl Drop for Slot {
    /// The stream ended: a sender waiting for credit learns it.
    fn drop(&mut self) {
        if let Some(c) = &self.credit {
            c.close();
        }
    }
}

/// The streams of one connection, by id.
#[derive(Default)]
pub(crate) struct Streams {
    by_id: Mutex<FxHashMap<u64, Slot>>,
    /// How many are open: the reader looks at the table only when some are.
    open: AtomicUsize,
}

/// A stream's events and, if the client sends on it, its credit.
pub(crate) type Registered = (mpsc::UnboundedReceiver<Event>, Option<Arc<Semaphore>>);

impl Streams {
    /// Registers stream `id` (with credit for the client's items if it `sends`); `None` if it
    /// is open already.
    pub fn insert(&self, id: u64, sends: bool) -> Option<Registered> {
        let mut by_id = self.by_id.lock();
        if by_id.contains_key(&id) {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = sends.then(|| Arc::new(Semaphore::new(0)));
        by_id.insert(id, Slot { tx, credit: credit.clone() });
        self.open.store(by_id.len(), Ordering::Release);
        Some((rx, credit))
    }

    /// Forgets stream `id`; whether it was open.
    pub fn remove(&self, id: u64) -> bool {
        let mut by_id = self.by_id.lock();
        let was = by_id.remove(&id).is_some();
        self.open.store(by_id.len(), Ordering::Release);
        was
    }

    pub fn is_empty(&self) -> bool {
        self.open.load(Ordering::Acquire) == 0
    }

    /// Whether `id` is an open stream.
    pub fn contains(&self, id: u64) -> bool {
        !self.is_empty() && self.by_id.lock().contains_key(&id)
    }

    /// Hands a turn's stream messages to their streams, under one lock; an end removes its
    /// stream. Messages for ids not open (crossing an end or a cancel) are dropped.
    pub fn deliver(&self, events: &mut Vec<(u64, Event)>) {
        if events.is_empty() {
            return;
        }
        let mut by_id = self.by_id.lock();
        for (id, ev) in events.drain(..) {
            let Some(slot) = by_id.get(&id) else { continue };
            let last = match ev {
                Event::Credit(n) => {
                    if let Some(c) = &slot.credit {
                        c.add_permits(
                            (n as usize).min(MAX_SEND_CREDIT.saturating_sub(c.available_permits())),
                        );
                    }
                    continue;
                }
                Event::Item(_) => false,
                _ => true,
            };
            let _ = slot.tx.send(ev);
            if last {
                by_id.remove(&id);
            }
        }
        self.open.store(by_id.len(), Ordering::Release);
    }

    /// The connection ended: every stream ends with `err`.
    pub fn fail_all(&self, err: &Error) {
        let mut by_id = self.by_id.lock();
        for (_, slot) in by_id.drain() {
            let _ = slot.tx.send(Event::Failed(err.clone()));
        }
        self.open.store(0, Ordering::Release);
    }
}
