//! Counters kept per client and per server, readable at runtime.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::histogram::{Histogram, Shape};

/// Live counters. Updated once per frame or batch, not per message, so they cost nothing
/// measurable on the hot path.
#[derive(Debug, Default)]
pub struct Counters {
    frames_sent: AtomicU64,
    messages_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    messages_received: AtomicU64,
    bytes_received: AtomicU64,
    /// Messages per frame each way, and reader wake-ups per batch.
    pub(crate) shapes: Shapes,
}

/// A copy of the counters at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Snapshot {
    pub frames_sent: u64,
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub messages_received: u64,
    pub bytes_received: u64,
}

impl Snapshot {
    /// Adds `s` to these counters (the connections of a pool, together).
    pub(crate) fn add(&mut self, s: &Snapshot) {
        self.frames_sent += s.frames_sent;
        self.messages_sent += s.messages_sent;
        self.bytes_sent += s.bytes_sent;
        self.frames_received += s.frames_received;
        self.messages_received += s.messages_received;
        self.bytes_received += s.bytes_received;
    }
}

impl Counters {
    pub(crate) fn sent(&self, frames: u64, messages: u64, bytes: u64) {
        self.frames_sent.fetch_add(frames, Relaxed);
        self.messages_sent.fetch_add(messages, Relaxed);
        self.bytes_sent.fetch_add(bytes, Relaxed);
        if let Some(per_frame) = messages.checked_div(frames) {
            self.shapes.written.record(per_frame, frames);
        }
    }

    /// A connection's reader handed up one batch: `frames` holding `messages` in `bytes`, after
    /// waking up `wakeups` times since its previous batch.
    pub(crate) fn received(&self, frames: u64, messages: u64, bytes: u64, wakeups: u64) {
        self.frames_received.fetch_add(frames, Relaxed);
        self.messages_received.fetch_add(messages, Relaxed);
        self.bytes_received.fetch_add(bytes, Relaxed);
        if let Some(per_frame) = messages.checked_div(frames) {
            self.shapes.read.record(per_frame, frames);
        }
        self.shapes.wakeups_per_batch.record(wakeups, 1);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            frames_sent: self.frames_sent.load(Relaxed),
            messages_sent: self.messages_sent.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            frames_received: self.frames_received.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
        }
    }
}

/// How the traffic came (kept per server and per client with the transport counters, once per
/// batch read or write).
pub(crate) struct Shapes {
    /// Messages per frame read.
    pub read: Histogram,
    /// Messages per frame written.
    pub written: Histogram,
    /// For each batch of messages a connection's reader handed up: how many times it had
    /// waited for its socket and been woken since the batch before. 0 when the batch was
    /// already in the buffer or came with the first read; more than 1 when a frame arrived in
    /// pieces (or the socket woke the reader with nothing to read).
    pub wakeups_per_batch: Histogram,
}

impl Default for Shapes {
    fn default() -> Self {
        Shapes {
            read: Histogram::new(Shape::COUNT),
            written: Histogram::new(Shape::COUNT),
            wakeups_per_batch: Histogram::new(Shape::COUNT),
        }
    }
}

impl std::fmt::Debug for Shapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shapes")
    }
}
