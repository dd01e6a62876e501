//! One direction of a shm connection: a single-producer single-consumer byte ring in the shared
//! mapping. The index arithmetic and its validation are pure functions ([`ready`], [`room`],
//! [`spans`]); [`RingReader`] and [`RingWriter`] apply them to a [`Region`].
//!
//! Positions are free-running `u64` byte counts (the stream offset), never reduced modulo the
//! capacity: a byte at position `p` sits at `p mod capacity` in the data area. Each side keeps
//! its own position privately and only *publishes* it; what it reads of the peer's position is
//! validated before use, because the peer may be buggy or hostile.
//!
//! Wake-ups cost a syscall, so they are sent only to a side that said it sleeps: the consumer
//! sets `READER_SLEEPING` before it waits and then looks again; the producer, after
//! publishing, takes the flag and, if it was set, wakes the consumer. A full fence on both
//! sides (store, fence, load) means at least one of them sees the other: no lost wake-up.
//! `WRITER_WAITING` works the same way the other round, for room.

use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use bytes::BytesMut;

use super::sys::Region;
use crate::proto::ProtocolError;

/// Offsets inside a ring's control block (256 bytes). Words written by different sides sit on
/// different cache lines.
pub const WRITE_POS: usize = 0;
/// `u32`, written by the producer: 1 once it will write nothing more (end of stream).
pub const CLOSED: usize = 8;
/// `u64`, written by the consumer: bytes read since the start.
pub const READ_POS: usize = 64;
/// `u32`: 1 = the consumer is about to wait for bytes; the producer clears it and wakes it.
pub const READER_SLEEPING: usize = 128;
/// `u32`: 1 = the producer waits for room; the consumer clears it and wakes it.
pub const WRITER_WAITING: usize = 192;

/// Bytes ready for a consumer that has read up to `read`, when the producer published `write`.
pub fn ready(cap: u64, read: u64, write: u64) -> Result<u64, ProtocolError> {
    let n = write.wrapping_sub(read);
    if n > cap {
        return Err(ProtocolError::Ring(
            "the peer's write position is not within one ring of the read position",
        ));
    }
    Ok(n)
}

/// Room left for a producer that has written up to `write`, when the consumer published
/// `read`; `read_seen` is the consumer position it saw last. The consumer's position may only
/// move forwards, and never past what was written.
pub fn room(cap: u64, write: u64, read_seen: u64, read: u64) -> Result<u64, ProtocolError> {
    if read.wrapping_sub(read_seen) > write.wrapping_sub(read_seen) {
        return Err(ProtocolError::Ring(
            "the peer's read position moved backwards or past the write position",
        ));
    }
    // `write - read_seen <= cap` holds (this side never writes more than the room), and
    // `read` lies between the two.
    Ok(cap - write.wrapping_sub(read))
}

/// Whether `read`, a consumer position loaded between two loads of the producer's own write
/// position (`before`, then `after`), can be true: the consumer never reads past what was
/// written (`read <= after`), and the producer never writes more than a ring ahead of a
/// position the consumer published (`read >= before - cap`, since `read` was loaded after
/// `before` and only moves forwards). The producer's side checks it on every read of its
/// *other* ring, so that a corrupted position is caught even while the producer has nothing to
/// write.
pub fn check_read_pos(cap: u64, before: u64, read: u64, after: u64) -> Result<(), ProtocolError> {
    let low = before.wrapping_sub(cap);
    if read.wrapping_sub(low) > after.wrapping_sub(low) {
        return Err(ProtocolError::Ring(
            "the peer's read position is past the write position or more than a ring behind it",
        ));
    }
    Ok(())
}

/// Where the `len` bytes from stream position `pos` lie in the data area of a ring of `cap`
/// bytes (a power of two, `len <= cap`): the part up to the end of the area, then the part
/// that wrapped to its start (empty if none did).
pub fn spans(cap: u64, pos: u64, len: usize) -> [Range<usize>; 2] {
    debug_assert!(cap.is_power_of_two() && len as u64 <= cap);
    let start = (pos & (cap - 1)) as usize;
    let first = len.min(cap as usize - start);
    [start..start + first, 0..len - first]
}

/// Takes a wake-up flag the other side set: true if it was set (and is now clear).
fn take_flag(flag: &AtomicU32) -> bool {
    flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
}

/// Where one ring sits in the region.
#[derive(Debug, Clone, Copy)]
pub struct RingAt {
    pub control: usize,
    pub data: usize,
    pub cap: usize,
}

/// What a read did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub n: usize,
    /// The producer waits for room: wake it.
    pub wake_writer: bool,
}

/// The consumer's side of a ring.
#[derive(Debug)]
pub struct RingReader {
    at: RingAt,
    read: u64,
}

impl RingReader {
    pub fn new(at: RingAt) -> RingReader {
        RingReader { at, read: 0 }
    }

    /// Bytes ready to read now (validated against the capacity).
    pub fn ready(&self, r: &Region) -> Result<usize, ProtocolError> {
        let write = r.u64_at(self.at.control + WRITE_POS).load(Ordering::Acquire);
        ready(self.at.cap as u64, self.read, write).map(|n| n as usize)
    }

    /// Whether the producer said it will write no more. Bytes it wrote before are visible
    /// after this returns true.
    pub fn closed(&self, r: &Region) -> bool {
        r.u32_at(self.at.control + CLOSED).load(Ordering::Acquire) != 0
    }

    /// Appends up to `max` ready bytes to `out` and publishes the new read position.
    pub fn read(&mut self, r: &Region, out: &mut BytesMut, max: usize) -> Result<Read, ProtocolError> {
        let n = self.ready(r)?.min(max);
        if n == 0 {
            return Ok(Read { n: 0, wake_writer: false });
        }
        for span in spans(self.at.cap as u64, self.read, n) {
            if !span.is_empty() {
                r.copy_out(self.at.data + span.start, span.len(), out);
            }
        }
        self.read = self.read.wrapping_add(n as u64);
        r.u64_at(self.at.control + READ_POS).store(self.read, Ordering::Release);
        fence(Ordering::SeqCst);
        Ok(Read { n, wake_writer: take_flag(r.u32_at(self.at.control + WRITER_WAITING)) })
    }

    /// Says the consumer is about to wait. The caller must look for bytes (and the end) once
    /// more afterwards, and wait only if there are none.
    pub fn announce_sleep(&self, r: &Region) {
        r.u32_at(self.at.control + READER_SLEEPING).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Withdraws [`announce_sleep`](Self::announce_sleep): there was something after all.
    pub fn cancel_sleep(&self, r: &Region) {
        r.u32_at(self.at.control + READER_SLEEPING).store(0, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub fn starting_at(at: RingAt, pos: u64) -> RingReader {
        RingReader { at, read: pos }
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub n: usize,
    /// The consumer said it sleeps: wake it.
    pub wake_reader: bool,
}

/// The producer's side of a ring.
#[derive(Debug)]
pub struct RingWriter {
    at: RingAt,
    write: u64,
    read_seen: u64,
    /// Our write position, stored before it is published in the mapping: what the other
    /// half checks the consumer's position against ([`check_read_pos`]), out of the peer's
    /// reach.
    published: Arc<AtomicU64>,
    /// The consumer's position was found corrupt: it is not read any more.
    violated: bool,
}

impl RingWriter {
    pub fn new(at: RingAt) -> RingWriter {
        RingWriter::starting_at(at, 0)
    }

    /// Room left now (validating the consumer's published position). After a violation the
    /// room is what the last valid position left (writing into it overwrites nothing the
    /// consumer may still read), so a last message can still go out; it never grows again.
    pub fn room(&mut self, r: &Region) -> Result<usize, ProtocolError> {
        if self.violated {
            return Ok(self.at.cap - self.write.wrapping_sub(self.read_seen) as usize);
        }
        let read = r.u64_at(self.at.control + READ_POS).load(Ordering::Acquire);
        let room = room(self.at.cap as u64, self.write, self.read_seen, read).inspect_err(|_| {
            self.violated = true;
        })?;
        self.read_seen = read;
        Ok(room as usize)
    }

    /// Whether the consumer's position was found corrupt (see [`room`](Self::room)).
    pub fn violated(&self) -> bool {
        self.violated
    }

    /// Our write position as published, for [`check_read_pos`] by the other half.
    pub fn published(&self) -> Arc<AtomicU64> {
        self.published.clone()
    }

    /// Where this ring sits.
    pub fn at(&self) -> RingAt {
        self.at
    }

    /// Copies as much of `bufs` as `room` allows (in order) and publishes it.
    pub fn write(&mut self, r: &Region, bufs: &[IoSlice<'_>], room: usize) -> Written {
        let mut n = 0;
        for buf in bufs {
            let take = buf.len().min(room - n);
            let mut done = 0;
            for span in spans(self.at.cap as u64, self.write.wrapping_add(n as u64), take) {
                r.copy_in(self.at.data + span.start, &buf[done..done + span.len()]);
                done += span.len();
            }
            n += take;
            if n == room {
                break;
            }
        }
        if n == 0 {
            return Written { n, wake_reader: false };
        }
        self.write = self.write.wrapping_add(n as u64);
        self.published.store(self.write, Ordering::Release);
        r.u64_at(self.at.control + WRITE_POS).store(self.write, Ordering::Release);
        Written { n, wake_reader: self.take_sleeper(r) }
    }

    /// Marks the end of the stream; returns whether to wake the consumer.
    pub fn close(&mut self, r: &Region) -> bool {
        r.u32_at(self.at.control + CLOSED).store(1, Ordering::Release);
        self.take_sleeper(r)
    }

    fn take_sleeper(&self, r: &Region) -> bool {
        fence(Ordering::SeqCst);
        take_flag(r.u32_at(self.at.control + READER_SLEEPING))
    }

    /// Says the producer waits for room. The caller must look for room once more afterwards,
    /// and wait only if there is none.
    pub fn announce_wait(&self, r: &Region) {
        r.u32_at(self.at.control + WRITER_WAITING).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// A writer whose stream starts at `pos` (0 on a new connection; tests start elsewhere).
    pub fn starting_at(at: RingAt, pos: u64) -> RingWriter {
        RingWriter {
            at,
            write: pos,
            read_seen: pos,
            published: Arc::new(AtomicU64::new(pos)),
            violated: false,
        }
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
