//! Counters kept per client and per server, readable at runtime.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

impl Counters {
    pub(crate) fn sent(&self, frames: u64, messages: u64, bytes: u64) {
        self.frames_sent.fetch_add(frames, Relaxed);
        self.messages_sent.fetch_add(messages, Relaxed);
        self.bytes_sent.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn received(&self, frames: u64, messages: u64, bytes: u64) {
        self.frames_received.fetch_add(frames, Relaxed);
        self.messages_received.fetch_add(messages, Relaxed);
        self.bytes_received.fetch_add(bytes, Relaxed);
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
