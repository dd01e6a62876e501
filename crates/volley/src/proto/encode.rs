//! Building outgoing frames: messages are appended to one growing send buffer and cut into
//! frames (bundles) by the limits. The writer of a connection takes everything appended so far
//! in one go, so whatever callers queued while the last write was in progress leaves in the next
//! single write ("smart batching": no timer, a lone message leaves at once).
//!
//! Payloads are written straight into the send buffer by a closure (no intermediate copy).
//! Large `Bytes` payloads are not copied at all: they become their own segment of the
//! outgoing write (see [`FrameBuilder::reply_bytes`]).
//!
//! Fields are appended with `BytesMut::extend_from_slice`, which is inlined (a fixed-size field
//! becomes a capacity check and a store), never with `BufMut::put_slice` or the `put_u32_le`
//! family that calls it: that one is not inlined across crates, and its call and `memcpy` cost
//! ~38 instructions per field — ~100 of a small call's ~4,200 (scripts/callcost.py).

use bytes::{Bytes, BytesMut};

use super::Limits;
use super::code::Code;
use super::extensions::{Extensions, FLAG_EXTENSIONS};
use super::message::{Kind, MAX_NAME_LEN};
use crate::pool::{self, buffer::PoolBuf};

/// Payloads at least this large are sent as their own segment instead of being copied into the
/// send buffer. Below it a copy is cheaper than an extra iovec and refcount.
pub const ZERO_COPY_MIN: usize = 16 * 1024;

/// Frames are closed once their body passes this size, even below the hard limit, so the peer
/// can start decoding the first part of a big bundle while the rest is still in flight.
pub const SOFT_FRAME_LEN: usize = 256 * 1024;

/// The send buffer comes from the buffer pool in this size, and is swapped
/// for a fresh one from the pool when less than [`SEND_LOW`] is left.
const SEND_CHUNK: usize = 64 * 1024;
const SEND_LOW: usize = 4 * 1024;

/// Why a message could not be appended. Nothing was appended in either case.
#[derive(Debug)]
pub enum BuildError<E> {
    /// The payload encoder failed.
    Payload(E),
    /// A batch message with more items than the limit allows.
    TooManyItems { count: usize, max: usize },
    /// The message does not fit in one frame under the limits.
    TooLarge { len: usize, max: usize },
}

/// Finished frames, encoded by one builder to be linked into another's output (replies encoded
/// on the codec pool, say) without a copy.
#[derive(Debug, Default)]
pub struct Frames {
    segments: Vec<Bytes>,
    len: usize,
    frames: u64,
    messages: u64,
}

/// Accumulates messages into frames. Not thread-safe: a connection wraps it in its send lock.
#[derive(Debug)]
pub struct FrameBuilder {
    limits: Limits,
    /// Bytes not yet handed to the writer, starting at a frame boundary. From the
    /// buffer pool (see [`FrameBuilder::release_buffer`]).
    buf: PoolBuf,
    /// Finished segments queued before `buf`: zero-copy payloads, and frames moved out when
    /// `buf` ran out of room while the writer was behind.
    segments: Vec<Bytes>,
    /// Bytes in `segments` (kept, not summed: a peer that does not read can make them many).
    segments_len: usize,
    /// Offset in `buf` of the open frame's length prefix.
    open: Option<usize>,
    /// Messages in the open frame.
    open_count: usize,
    frames: u64,
    messages: u64,
    /// `frames` and `messages` when this builder's output last moved to another builder.
    moved: (u64, u64),
}

impl FrameBuilder {
    pub fn new(limits: Limits) -> Self {
        FrameBuilder {
            limits,
            buf: PoolBuf::default(),
            segments: Vec::new(),
            segments_len: 0,
            open: None,
            open_count: 0,
            frames: 0,
            messages: 0,
            moved: (0, 0),
        }
    }

    /// True when nothing is waiting to be written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.segments.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn queued_len(&self) -> usize {
        self.buf.len() + self.segments_len
    }

    /// Frames and messages completed or opened since the builder was created.
    pub fn counts(&self) -> (u64, u64) {
        (self.frames, self.messages)
    }

    /// Appends a request whose payload `write` encodes into the buffer. With extensions that
    /// are not empty, the request carries them (PROTOCOL.md §6.2.2): only for a peer that
    /// announced the feature.
    pub fn request<E>(
        &mut self,
        id: u64,
        flags: u8,
        ext: &Extensions,
        (service, method): (&str, &str),
        write: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    ) -> Result<(), BuildError<E>> {
        check_name(service)?;
        check_name(method)?;
        self.message(
            |b| addressed_header(b, Kind::Request, flags, id, (service, method), ext),
            Payload::Write(write),
        )
    }

    /// Appends a request with a ready-made payload; large payloads are queued without a copy.
    pub fn request_bytes(
        &mut self,
        id: u64,
        flags: u8,
        ext: &Extensions,
        (service, method): (&str, &str),
        payload: Bytes,
    ) -> Result<(), BuildError<std::convert::Infallible>> {
        check_name(service)?;
        check_name(method)?;
        self.message(
            |b| addressed_header(b, Kind::Request, flags, id, (service, method), ext),
            Payload::<fn(&mut BytesMut) -> Result<(), _>>::Bytes(payload),
        )
    }

    /// Appends a reply whose payload `write` encodes into the buffer.
    pub fn reply<E>(
        &mut self,
        id: u64,
        write: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    ) -> Result<(), BuildError<E>> {
        self.message(|b| reply_header(b, id), Payload::Write(write))
    }

    /// Appends a reply with a ready-made payload; large payloads are queued without a copy.
    pub fn reply_bytes(
        &mut self,
        id: u64,
        payload: Bytes,
    ) -> Result<(), BuildError<std::convert::Infallible>> {
        self.message(|b| reply_header(b, id), Payload::<fn(&mut BytesMut) -> Result<(), _>>::Bytes(payload))
    }

    /// Appends a batch request: one message carrying every item of `items`, each encoded by
    /// `encode`. If any item fails to encode, nothing is appended.
    pub fn batch_request<T, E>(
        &mut self,
        id: u64,
        flags: u8,
        ext: &Extensions,
        (service, method): (&str, &str),
        items: &[T],
        mut encode: impl FnMut(&T, &mut BytesMut) -> Result<(), E>,
    ) -> Result<(), BuildError<E>> {
        check_name(service)?;
        check_name(method)?;
        if items.len() > self.limits.max_batch_items {
            return Err(BuildError::TooManyItems { count: items.len(), max: self.limits.max_batch_items });
        }
        self.message(
            |b| addressed_header(b, Kind::BatchRequest, flags, id, (service, method), ext),
            Payload::Raw(|b: &mut BytesMut| {
                b.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for item in items {
                    let at = b.len();
                    b.extend_from_slice(&0u32.to_le_bytes());
                    encode(item, b)?;
                    let n = (b.len() - at - 4) as u32;
                    b[at..at + 4].copy_from_slice(&n.to_le_bytes());
                }
                Ok(())
            }),
        )
    }

    /// Appends a batch reply: `fill` adds one result per item, in item order, through
    /// [`BatchReplyItems`].
    pub fn batch_reply(
        &mut self,
        id: u64,
        fill: impl FnOnce(&mut BatchReplyItems<'_>),
    ) -> Result<(), BuildError<std::convert::Infallible>> {
        self.message(
            |b| {
                b.extend_from_slice(&[Kind::BatchReply as u8]);
                b.extend_from_slice(&id.to_le_bytes());
            },
            Payload::Raw(|b: &mut BytesMut| {
                let at = b.len();
                b.extend_from_slice(&0u32.to_le_bytes());
                let mut items = BatchReplyItems { buf: b, count: 0 };
                fill(&mut items);
                let count = items.count;
                b[at..at + 4].copy_from_slice(&count.to_le_bytes());
                Ok(())
            }),
        )
    }

    /// Appends a stream's open (PROTOCOL.md §6.12): `shape`, the `credit` granted to the
    /// server, and for a server stream the request, encoded by `write`.
    #[allow(clippy::too_many_arguments)]
    pub fn stream_open<E>(
        &mut self,
        id: u64,
        flags: u8,
        ext: &Extensions,
        (service, method): (&str, &str),
        (shape, credit): (u8, u32),
        write: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    ) -> Result<(), BuildError<E>> {
        check_name(service)?;
        check_name(method)?;
        self.message(
            |b| {
                addressed_header(b, Kind::StreamOpen, flags, id, (service, method), ext);
                b.extend_from_slice(&[shape]);
                b.extend_from_slice(&credit.to_le_bytes());
            },
            Payload::Write(write),
        )
    }

    /// Appends one item of stream `id`, encoded by `write` (§6.13).
    pub fn stream_item<E>(
        &mut self,
        id: u64,
        write: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    ) -> Result<(), BuildError<E>> {
        self.message(|b| id_header(b, Kind::StreamItem, id), Payload::Write(write))
    }

    /// Appends the end of the sender's side of stream `id` (§6.14).
    pub fn stream_end(&mut self, id: u64) {
        self.fixed(|b| id_header(b, Kind::StreamEnd, id));
    }

    /// Appends `credit` more items granted on stream `id` (§6.15).
    pub fn stream_credit(&mut self, id: u64, credit: u32) {
        self.fixed(|b| {
            id_header(b, Kind::StreamCredit, id);
            b.extend_from_slice(&credit.to_le_bytes());
        });
    }

    /// Appends an error reply. Over-long messages are cut (at a character boundary) to fit.
    pub fn error(&mut self, id: u64, code: Code, message: &str) {
        let message = truncate_str(message, self.text_room(1 + 8 + 2 + 4));
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::Error as u8]);
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&code.to_u16().to_le_bytes());
            b.extend_from_slice(&(message.len() as u32).to_le_bytes());
            b.extend_from_slice(message.as_bytes());
        });
    }

    /// Appends a cancel for request `id`.
    pub fn cancel(&mut self, id: u64) {
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::Cancel as u8]);
            b.extend_from_slice(&id.to_le_bytes());
        });
    }

    /// Appends a ping carrying `token`, to be echoed in a pong.
    pub fn ping(&mut self, token: u64) {
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::Ping as u8]);
            b.extend_from_slice(&token.to_le_bytes());
        });
    }

    /// Appends a pong echoing `token`.
    pub fn pong(&mut self, token: u64) {
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::Pong as u8]);
            b.extend_from_slice(&token.to_le_bytes());
        });
    }

    /// Appends a go-away: the sender is about to close the connection, and says why.
    pub fn go_away(&mut self, code: Code, message: &str) {
        let message = truncate_str(message, self.text_room(1 + 2 + 4));
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::GoAway as u8]);
            b.extend_from_slice(&code.to_u16().to_le_bytes());
            b.extend_from_slice(&(message.len() as u32).to_le_bytes());
            b.extend_from_slice(message.as_bytes());
        });
    }

    /// Queues an auth message carrying `token` (at most
    /// [`MAX_TOKEN_LEN`](super::message::MAX_TOKEN_LEN) bytes; longer tokens are refused by
    /// the receiver, so callers check).
    pub fn auth(&mut self, token: &[u8]) {
        self.fixed(|b| {
            b.extend_from_slice(&[Kind::Auth as u8]);
            b.extend_from_slice(&(token.len() as u16).to_le_bytes());
            b.extend_from_slice(token);
        });
    }

    /// Sets the limits of the frames to come (a builder shared by connections with other
    /// settings, between uses). Only while nothing is queued.
    pub fn set_limits(&mut self, limits: Limits) {
        debug_assert!(self.is_empty(), "limits change under queued messages");
        self.limits = limits;
    }

    /// Takes everything queued as finished frames.
    pub fn take_frames(&mut self) -> Frames {
        self.close_frame();
        let (frames, messages) = self.unmoved();
        let mut segments = Vec::new();
        self.take_into(&mut segments);
        let len = segments.iter().map(Bytes::len).sum();
        Frames { segments, len, frames, messages }
    }

    /// Appends frames finished elsewhere, after everything queued (whose open frame closes).
    pub fn append_frames(&mut self, f: Frames) {
        self.set_aside();
        self.segments_len += f.len;
        self.segments.extend(f.segments);
        self.frames += f.frames;
        self.messages += f.messages;
    }

    /// Moves everything `other` holds to the end of this builder's output, as finished
    /// frames: its bytes are linked, not copied, and both keep their vectors' capacity.
    pub fn append_from(&mut self, other: &mut FrameBuilder) {
        other.close_frame();
        let (frames, messages) = other.unmoved();
        if other.is_empty() {
            return;
        }
        self.set_aside();
        self.segments_len += other.queued_len();
        self.segments.append(&mut other.segments);
        other.segments_len = 0;
        if !other.buf.is_empty() {
            self.segments.push(other.buf.split().freeze());
        }
        self.frames += frames;
        self.messages += messages;
    }

    /// Frames and messages completed since they were last moved to another builder (and
    /// marks them moved). The open frame must be closed.
    fn unmoved(&mut self) -> (u64, u64) {
        let delta = (self.frames - self.moved.0, self.messages - self.moved.1);
        self.moved = (self.frames, self.messages);
        delta
    }

    /// Closes the open frame and sets what `buf` holds aside as a finished segment, so that what
    /// comes next starts a new one.
    fn set_aside(&mut self) {
        self.close_frame();
        if !self.buf.is_empty() {
            let done = self.buf.split().freeze();
            self.segments_len += done.len();
            self.segments.push(done);
        }
    }

    /// Closes the open frame and moves everything queued into `out`, in write order.
    /// The builder keeps its buffer's spare capacity for the next messages.
    pub fn take_into(&mut self, out: &mut Vec<Bytes>) {
        self.close_frame();
        out.append(&mut self.segments);
        self.segments_len = 0;
        if !self.buf.is_empty() {
            out.push(self.buf.split().freeze());
        }
    }

    /// Gives the send buffer back to the buffer pool if nothing is queued, so an idle
    /// connection holds no send buffer; the next message takes one again.
    pub fn release_buffer(&mut self) {
        if self.is_empty() && self.buf.capacity() > 0 {
            pool::buffer::put(std::mem::take(&mut self.buf));
        }
    }

    /// A send buffer with little room left is swapped for one from the pool
    /// and given back: the writer may still be writing from it, and the pool reuses it once
    /// that is done (`reserve` would allocate from the system instead). What it holds is never
    /// copied: the open frame is closed and everything moves to `segments` as one frozen slice.
    /// Copying it instead made the work per message grow with the queue: with a peer that does
    /// not read, the queue reaches megabytes and each 4 KiB of new messages copied all of it
    /// (a profile of 160,000 pipelined requests spent most of its time in that memmove).
    #[inline(always)]
    fn ensure_room(&mut self) {
        if self.buf.capacity() - self.buf.len() >= SEND_LOW {
            return;
        }
        self.set_aside();
        pool::buffer::put(std::mem::replace(&mut self.buf, pool::buffer::get(SEND_CHUNK)));
    }

    /// Room for the text of an error or go-away whose fixed part is `header` bytes: at most
    /// 64 KiB, and never more than fits in one frame.
    fn text_room(&self, header: usize) -> usize {
        self.limits.max_frame_len.saturating_sub(header).min(64 * 1024)
    }

    /// A message without payload (its text, if any, already cut to fit a frame).
    fn fixed(&mut self, header: impl FnOnce(&mut BytesMut)) {
        let sent =
            self.message(header, Payload::<fn(&mut BytesMut) -> Result<(), std::convert::Infallible>>::None);
        if sent.is_err() {
            // Only with a frame limit below the ~20 bytes of a bare control message.
            tracing::error!(
                max_frame_len = self.limits.max_frame_len,
                "control message does not fit in a frame"
            );
        }
    }

    #[inline]
    fn message<E, F: FnOnce(&mut BytesMut) -> Result<(), E>>(
        &mut self,
        header: impl FnOnce(&mut BytesMut),
        payload: Payload<F>,
    ) -> Result<(), BuildError<E>> {
        self.ensure_room();
        if self.open.is_none() {
            self.open_frame();
        }
        let start = self.buf.len();
        header(&mut self.buf);
        let len_at = self.buf.len();
        match payload {
            Payload::None => {}
            Payload::Write(write) => {
                self.buf.extend_from_slice(&0u32.to_le_bytes());
                if let Err(e) = write(&mut self.buf) {
                    self.unwind(start);
                    return Err(BuildError::Payload(e));
                }
                let n = self.buf.len() - len_at - 4;
                if n > u32::MAX as usize {
                    self.unwind(start);
                    return Err(BuildError::TooLarge { len: n, max: u32::MAX as usize });
                }
                self.buf[len_at..len_at + 4].copy_from_slice(&(n as u32).to_le_bytes());
            }
            Payload::Raw(write) => {
                if let Err(e) = write(&mut self.buf) {
                    self.unwind(start);
                    return Err(BuildError::Payload(e));
                }
            }
            Payload::Bytes(bytes) => {
                let msg_len = len_at - start + 4 + bytes.len();
                if msg_len > self.limits.max_frame_len {
                    self.unwind(start);
                    return Err(BuildError::TooLarge { len: msg_len, max: self.limits.max_frame_len });
                }
                self.buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                if bytes.len() >= ZERO_COPY_MIN {
                    self.zero_copy_tail(start, bytes);
                    return Ok(());
                }
                self.buf.extend_from_slice(&bytes);
            }
        }
        self.finish_message(start)
    }

    /// The message starting at `start` is complete in `buf`: enforce the frame limit, count it,
    /// and close the frame if it is full. Inlined into every message (with `ensure_room`, ~60
    /// instructions less per call, scripts/callcost.py).
    #[inline(always)]
    fn finish_message<E>(&mut self, start: usize) -> Result<(), BuildError<E>> {
        let open = self.open.expect("message() opened a frame");
        let msg_len = self.buf.len() - start;
        if msg_len > self.limits.max_frame_len {
            self.unwind(start);
            return Err(BuildError::TooLarge { len: msg_len, max: self.limits.max_frame_len });
        }
        if self.buf.len() - open - 4 > self.limits.max_frame_len {
            // Fits alone but not with the frame's earlier messages: move it into a frame of its
            // own. Rare (only near the hard limit), so a memmove of the message is fine.
            let tail = self.buf.split_off(start);
            self.close_frame();
            self.open_frame();
            self.buf.unsplit(tail);
        }
        self.open_count += 1;
        self.messages += 1;
        let body = self.buf.len() - self.open.expect("frame is open") - 4;
        if self.open_count >= self.limits.max_messages_per_frame || body >= SOFT_FRAME_LEN {
            self.close_frame();
        }
        Ok(())
    }

    /// Queues a message whose header (from `start`) is in `buf` and whose large payload is
    /// `bytes`, without copying the payload: the message gets a frame of its own whose first
    /// segment is the header and second the payload.
    fn zero_copy_tail(&mut self, start: usize, bytes: Bytes) {
        let header = self.buf.split_off(start);
        self.close_frame();
        let frame_len = header.len() + bytes.len();
        self.buf.extend_from_slice(&(frame_len as u32).to_le_bytes());
        self.buf.unsplit(header);
        let head = self.buf.split().freeze();
        self.segments_len += head.len() + bytes.len();
        self.segments.push(head);
        self.segments.push(bytes);
        self.frames += 1;
        self.messages += 1;
    }

    fn unwind(&mut self, start: usize) {
        self.buf.truncate(start);
        if self.open_count == 0 {
            // The frame was opened for this message: drop its header too.
            let open = self.open.take().expect("frame is open");
            self.buf.truncate(open);
        }
    }

    fn open_frame(&mut self) {
        self.open = Some(self.buf.len());
        self.open_count = 0;
        self.buf.extend_from_slice(&0u32.to_le_bytes());
    }

    fn close_frame(&mut self) {
        if let Some(open) = self.open.take() {
            if self.open_count == 0 {
                self.buf.truncate(open);
                return;
            }
            let body = (self.buf.len() - open - 4) as u32;
            self.buf[open..open + 4].copy_from_slice(&body.to_le_bytes());
            self.frames += 1;
            self.open_count = 0;
        }
    }
}

enum Payload<F> {
    None,
    /// Written by the closure after a u32 length, which is patched afterwards.
    Write(F),
    /// Written by the closure right after the header, without a length.
    Raw(F),
    Bytes(Bytes),
}

/// Adds item results to a batch reply under construction.
pub struct BatchReplyItems<'a> {
    buf: &'a mut BytesMut,
    count: u32,
}

impl BatchReplyItems<'_> {
    /// Adds a successful item whose reply `write` encodes. If it fails, the item becomes an
    /// error item with code [`Code::Internal`] carrying the encoder's message.
    ///
    /// Inline: once per reply item; left to itself the compiler stopped inlining it into the
    /// batch reply's loop when the files around it moved (`scripts/callcost.py`, tcp-batch:
    /// 800 instructions per item without the hint, 775 with it, 777 before the move).
    #[inline]
    pub fn ok<E: std::fmt::Display>(&mut self, write: impl FnOnce(&mut BytesMut) -> Result<(), E>) {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[super::batch::ITEM_OK]);
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        match write(self.buf) {
            Ok(()) => {
                let n = (self.buf.len() - at - 5) as u32;
                self.buf[at + 1..at + 5].copy_from_slice(&n.to_le_bytes());
                self.count += 1;
            }
            Err(e) => {
                self.buf.truncate(at);
                self.err(Code::Internal, &format!("reply could not be encoded: {e}"));
            }
        }
    }

    /// Adds a failed item.
    pub fn err(&mut self, code: Code, message: &str) {
        let message = truncate_str(message, 64 * 1024);
        self.buf.extend_from_slice(&[super::batch::ITEM_ERROR]);
        self.buf.extend_from_slice(&code.to_u16().to_le_bytes());
        self.buf.extend_from_slice(&(message.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(message.as_bytes());
        self.count += 1;
    }
}

/// The header shared by Request and BatchRequest: kind, flags, id, service and method names,
/// and the extension block if there are extensions.
fn addressed_header(
    b: &mut BytesMut,
    kind: Kind,
    flags: u8,
    id: u64,
    (service, method): (&str, &str),
    ext: &Extensions,
) {
    let flags = if ext.is_empty() { flags & !FLAG_EXTENSIONS } else { flags | FLAG_EXTENSIONS };
    // The fixed-size fields go in one append: every append is a capacity check.
    let mut head = [0u8; 11];
    head[0] = kind as u8;
    head[1] = flags;
    head[2..10].copy_from_slice(&id.to_le_bytes());
    head[10] = service.len() as u8;
    b.extend_from_slice(&head);
    b.extend_from_slice(service.as_bytes());
    b.extend_from_slice(&[method.len() as u8]);
    b.extend_from_slice(method.as_bytes());
    if !ext.is_empty() {
        ext.write(b);
    }
}

/// A kind byte and an id: the head of the messages about one request or stream.
fn id_header(b: &mut BytesMut, kind: Kind, id: u64) {
    let mut head = [0u8; 9];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&head);
}

fn reply_header(b: &mut BytesMut, id: u64) {
    let mut head = [0u8; 9];
    head[0] = Kind::Reply as u8;
    head[1..].copy_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&head);
}

fn check_name<E>(name: &str) -> Result<(), BuildError<E>> {
    if name.len() > MAX_NAME_LEN {
        return Err(BuildError::TooLarge { len: name.len(), max: MAX_NAME_LEN });
    }
    Ok(())
}

fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Message, decode_frame};

    /// A writer that does not run (its peer does not read) lets megabytes queue up; appending
    /// must still cost the same per message: what is queued is never copied again, so the
    /// open buffer stays one chunk while the rest waits as frozen segments, in order.
    #[test]
    fn a_deep_queue_is_never_copied_and_keeps_its_order() {
        let limits = Limits::default();
        let mut fb = FrameBuilder::new(limits);
        let payload = [7u8; 100];
        let n = 200_000u64; // about 23 MB queued, none of it taken
        for id in 0..n {
            fb.reply_bytes(id, Bytes::copy_from_slice(&payload)).unwrap();
            assert!(fb.buf.len() <= SEND_CHUNK, "the open buffer grew to {} bytes", fb.buf.len());
        }
        assert_eq!(fb.queued_len(), fb.buf.len() + fb.segments.iter().map(Bytes::len).sum::<usize>());
        let mut segs = Vec::new();
        fb.take_into(&mut segs);
        assert_eq!(fb.queued_len(), 0);
        let mut wire = BytesMut::new();
        segs.iter().for_each(|s| wire.extend_from_slice(s));
        let mut decoder = crate::proto::Decoder::after_preamble(limits);
        let (mut msgs, mut next) = (Vec::new(), 0u64);
        while let Some(frame) = decoder.next_frame(&mut wire).unwrap() {
            decode_frame(&frame, &limits, &mut msgs).unwrap();
            for m in msgs.drain(..) {
                let Message::Reply { id, payload: p } = m else { panic!("{m:?}") };
                assert_eq!((id, &p[..]), (next, &payload[..]));
                next += 1;
            }
        }
        assert_eq!(next, n);
        assert!(wire.is_empty());
    }
}
