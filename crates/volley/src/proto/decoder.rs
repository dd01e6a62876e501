//! The incremental decoder: turns a receive buffer into frames, and frames into messages.
//!
//! The reader appends whatever the socket gives it to one [`BytesMut`] and calls
//! [`Decoder::next_frame`] until it returns `None`. A complete frame is split off the front of
//! the buffer and frozen, so its messages' payloads are slices of the received bytes: nothing is
//! copied, and bytes already received are never re-scanned. An incomplete frame stays where it
//! is; [`Decoder::missing`] says how many more bytes it needs, so the reader can reserve room
//! for the whole frame in one step instead of growing the buffer read by read.

use bytes::{Buf, Bytes, BytesMut};

use super::batch::BatchItems;
use super::code::Code;
use super::extensions::{Extensions, FLAG_EXTENSIONS};
use super::message::{Kind, Message, Names};
use super::{Limits, ProtocolError, preamble};

/// Frame decoder for one direction of one connection.
#[derive(Debug, Clone)]
pub struct Decoder {
    limits: Limits,
    expect_preamble: bool,
    /// The features the peer's preamble announced (0 until it arrived).
    peer_features: u8,
}

impl Decoder {
    /// A decoder that first expects the peer's preamble, then frames.
    pub fn new(limits: Limits) -> Self {
        Decoder { limits, expect_preamble: true, peer_features: 0 }
    }

    /// A decoder for a stream whose preamble was already checked (or bytes that hold frames
    /// only).
    pub fn after_preamble(limits: Limits) -> Self {
        Decoder { limits, expect_preamble: false, peer_features: 0 }
    }

    /// Takes the next complete frame's body off the front of `buf`.
    ///
    /// Returns `Ok(None)` when more bytes are needed. Errors are final for the connection: a
    /// bad preamble, or a length prefix over the limit (reported as soon as the prefix arrives,
    /// before the peer can make us buffer the body).
    pub fn next_frame(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, ProtocolError> {
        self.take_preamble(buf)?;
        if self.expect_preamble {
            return Ok(None);
        }
        let Some(len) = self.frame_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < 4 + len {
            return Ok(None);
        }
        buf.advance(4);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// The features the peer's preamble announced (§4.4 of PROTOCOL.md).
    pub fn peer_features(&self) -> u8 {
        self.peer_features
    }

    /// Whether the peer's preamble is still to come.
    pub fn expects_preamble(&self) -> bool {
        self.expect_preamble
    }

    /// Checks and removes the peer's preamble from the front of `buf` once all of it is there
    /// (nothing to do after that).
    pub fn take_preamble(&mut self, buf: &mut BytesMut) -> Result<(), ProtocolError> {
        if !self.expect_preamble || buf.len() < preamble::PREAMBLE_LEN {
            return Ok(());
        }
        let mut p = [0u8; preamble::PREAMBLE_LEN];
        p.copy_from_slice(&buf[..preamble::PREAMBLE_LEN]);
        self.peer_features = preamble::check(&p)?;
        buf.advance(preamble::PREAMBLE_LEN);
        self.expect_preamble = false;
        Ok(())
    }

    /// How many more bytes must arrive before `next_frame` can return a frame: exact once the
    /// frame's length prefix is buffered, a lower bound before that, 0 if it can return one
    /// now. Errors are not reported here; `next_frame` reports them.
    pub fn missing(&self, buf: &[u8]) -> usize {
        let rest = if self.expect_preamble {
            match buf.get(preamble::PREAMBLE_LEN..) {
                Some(rest) => rest,
                None => return preamble::PREAMBLE_LEN - buf.len() + 4,
            }
        } else {
            buf
        };
        match self.frame_len(rest) {
            Ok(Some(len)) => (4 + len).saturating_sub(rest.len()),
            Ok(None) => 4 - rest.len(),
            Err(_) => 0,
        }
    }

    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > self.limits.max_frame_len {
            return Err(ProtocolError::FrameTooLarge { len, max: self.limits.max_frame_len });
        }
        if len == 0 {
            return Err(ProtocolError::EmptyFrame);
        }
        Ok(Some(len))
    }
}

/// Decodes every message of a frame body and appends them to `out`.
///
/// The whole frame is validated: on error nothing is appended. Payloads and strings are slices
/// of `body`.
pub fn decode_frame(body: &Bytes, limits: &Limits, out: &mut Vec<Message>) -> Result<(), ProtocolError> {
    let start = out.len();
    let result = decode_frame_inner(body, limits, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn decode_frame_inner(body: &Bytes, limits: &Limits, out: &mut Vec<Message>) -> Result<(), ProtocolError> {
    if body.is_empty() {
        return Err(ProtocolError::EmptyFrame);
    }
    let mut c = Cursor { body, pos: 0 };
    let mut count = 0usize;
    while c.pos < body.len() {
        count += 1;
        if count > limits.max_messages_per_frame {
            return Err(ProtocolError::TooManyMessages { max: limits.max_messages_per_frame });
        }
        let kind_byte = c.u8()?;
        let kind = Kind::from_u8(kind_byte).ok_or(ProtocolError::UnknownKind(kind_byte))?;
        let msg = match kind {
            Kind::Request => {
                let (flags, id, names, ext) = c.addressed_header()?;
                let n = c.u32()? as usize;
                let payload = c.take(n)?;
                Message::Request { id, flags, names, ext, payload }
            }
            Kind::Reply => {
                let id = c.u64()?;
                let n = c.u32()? as usize;
                Message::Reply { id, payload: c.take(n)? }
            }
            Kind::Error => {
                let id = c.u64()?;
                let code = Code::from_u16(c.u16()?);
                let n = c.u32()? as usize;
                let message = c.utf8(n, "error message is not UTF-8")?;
                Message::Error { id, code, message }
            }
            Kind::Cancel => Message::Cancel { id: c.u64()? },
            Kind::Ping => Message::Ping { token: c.u64()? },
            Kind::Pong => Message::Pong { token: c.u64()? },
            Kind::GoAway => {
                let code = Code::from_u16(c.u16()?);
                let n = c.u32()? as usize;
                let message = c.utf8(n, "go-away message is not UTF-8")?;
                Message::GoAway { code, message }
            }
            Kind::BatchRequest => {
                let (flags, id, names, ext) = c.addressed_header()?;
                let count = c.u32()?;
                let rest = body.slice(c.pos..);
                let (items, used) = BatchItems::parse_requests(count, &rest, limits.max_batch_items)?;
                c.pos += used;
                Message::BatchRequest { id, flags, names, ext, items }
            }
            Kind::BatchReply => {
                let id = c.u64()?;
                let count = c.u32()?;
                let rest = body.slice(c.pos..);
                let (items, used) = BatchItems::parse_replies(count, &rest, limits.max_batch_items)?;
                c.pos += used;
                Message::BatchReply { id, items }
            }
            Kind::Auth => {
                let n = c.u16()? as usize;
                if n > super::message::MAX_TOKEN_LEN {
                    return Err(ProtocolError::Malformed("auth token longer than 4096 bytes"));
                }
                Message::Auth { token: c.take(n)? }
            }
            Kind::StreamOpen => {
                let (flags, id, names, ext) = c.addressed_header()?;
                let shape = c.u8()?;
                let credit = c.u32()?;
                let n = c.u32()? as usize;
                let payload = c.take(n)?;
                Message::StreamOpen { id, flags, shape, credit, names, ext, payload }
            }
            Kind::StreamItem => {
                let id = c.u64()?;
                let n = c.u32()? as usize;
                Message::StreamItem { id, payload: c.take(n)? }
            }
            Kind::StreamEnd => Message::StreamEnd { id: c.u64()? },
            Kind::StreamCredit => Message::StreamCredit { id: c.u64()?, credit: c.u32()? },
        };
        out.push(msg);
    }
    Ok(())
}

/// Bounds-checked reads over a frame body.
///
/// The reads of a request's header are forced inline (`#[inline(always)]`): out of line, each
/// passed its large `Result` through memory, and inlining them took ~130 instructions off every
/// request (scripts/callcost.py).
struct Cursor<'a> {
    body: &'a Bytes,
    pos: usize,
}

const TRUNCATED: ProtocolError = ProtocolError::Malformed("message runs past the end of its frame");

impl Cursor<'_> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let end = self.pos.checked_add(N).filter(|&e| e <= self.body.len()).ok_or(TRUNCATED)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&self.body[self.pos..end]);
        self.pos = end;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<Bytes, ProtocolError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.body.len()).ok_or(TRUNCATED)?;
        let b = self.body.slice(self.pos..end);
        self.pos = end;
        Ok(b)
    }
    /// The next `n` bytes, borrowed: for a field read in place, which as a `Bytes` would cost a
    /// reference count taken and dropped.
    #[inline(always)]
    fn slice(&mut self, n: usize) -> Result<&[u8], ProtocolError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.body.len()).ok_or(TRUNCATED)?;
        let b = &self.body[self.pos..end];
        self.pos = end;
        Ok(b)
    }
    /// Flags, id, names and extensions of a Request or BatchRequest.
    #[inline(always)]
    fn addressed_header(&mut self) -> Result<(u8, u64, Names, Extensions), ProtocolError> {
        let flags = self.u8()?;
        let id = self.u64()?;
        let service_len = self.u8()?;
        let start = self.pos;
        self.skip_utf8(service_len as usize, "service name is not UTF-8")?;
        let n = self.u8()? as usize;
        self.skip_utf8(n, "method name is not UTF-8")?;
        let names = Names::from_wire(self.body.slice(start..self.pos), service_len);
        let ext = if flags & FLAG_EXTENSIONS != 0 {
            let n = self.u16()? as usize;
            Extensions::parse(self.slice(n)?)?
        } else {
            Extensions::NONE
        };
        Ok((flags, id, names, ext))
    }

    /// The next `n` bytes, checked to be UTF-8.
    #[inline(always)]
    fn utf8(&mut self, n: usize, what: &'static str) -> Result<Bytes, ProtocolError> {
        let start = self.pos;
        self.skip_utf8(n, what)?;
        Ok(self.body.slice(start..self.pos))
    }

    /// Skips the next `n` bytes after checking they are UTF-8.
    #[inline(always)]
    fn skip_utf8(&mut self, n: usize, what: &'static str) -> Result<(), ProtocolError> {
        let b = self.slice(n)?;
        // Names are short and nearly always ASCII: checking that first skips `from_utf8`'s
        // set-up, which cost more than the rest of a request's header (scripts/callcost.py).
        if !b.is_ascii() {
            std::str::from_utf8(b).map_err(|_| ProtocolError::Malformed(what))?;
        }
        Ok(())
    }
}
