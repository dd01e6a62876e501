//! Batch messages: one message carrying many items (what the MF report calls an "MF-level
//! batch": one request id, one reply, for a chunk of calls).
//!
//! A chunk of a `call_batch` travels as one `BatchRequest` and comes back as one `BatchReply`,
//! so it costs one request id, one pending entry and one wake-up however many items it holds.
//!
//! ```text
//! BatchRequest items:  count u32, then count × (len u32, bytes[len])
//! BatchReply items:    count u32, then count × one of
//!                        0x00, len u32, bytes[len]                     an item's reply
//!                        0x01, code u16, len u32, utf8[len]            an item's error
//! ```

use bytes::Bytes;

use super::ProtocolError;
use super::code::Code;

/// The items of a batch message, validated when the message was decoded. `body` holds the
/// items after the count; iterating slices it without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItems {
    count: u32,
    body: Bytes,
}

/// Status byte of an item in a batch reply.
pub const ITEM_OK: u8 = 0x00;
pub const ITEM_ERROR: u8 = 0x01;

/// One item's result in a batch reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemResult {
    Ok(Bytes),
    Err { code: Code, message: Bytes },
}

impl BatchItems {
    pub fn len(&self) -> usize {
        self.count as usize
    }

    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of all items together, with their length prefixes.
    pub fn body_len(&self) -> usize {
        self.body.len()
    }

    /// The items of a batch request: each item's payload.
    pub fn requests(&self) -> impl Iterator<Item = Bytes> + '_ {
        let mut c = Reader { b: &self.body, pos: 0 };
        (0..self.count).map_while(move |_| {
            let n = c.u32().ok()? as usize;
            c.take(n).ok()
        })
    }

    /// The items of a batch reply: each item's result.
    pub fn replies(&self) -> impl Iterator<Item = ItemResult> + '_ {
        let mut c = Reader { b: &self.body, pos: 0 };
        (0..self.count).map_while(move |_| c.reply_item().ok())
    }

    /// Validates the `count` items of a batch request at the start of `rest` (just after the
    /// count) and returns them with the number of bytes they occupy.
    pub(crate) fn parse_requests(
        count: u32,
        rest: &Bytes,
        max_items: usize,
    ) -> Result<(Self, usize), ProtocolError> {
        check_count(count, max_items)?;
        let mut c = Reader { b: rest, pos: 0 };
        for _ in 0..count {
            let n = c.u32()? as usize;
            c.skip(n)?;
        }
        Ok((BatchItems { count, body: rest.slice(..c.pos) }, c.pos))
    }

    /// Validates the `count` items of a batch reply at the start of `rest` and returns them with
    /// the number of bytes they occupy.
    pub(crate) fn parse_replies(
        count: u32,
        rest: &Bytes,
        max_items: usize,
    ) -> Result<(Self, usize), ProtocolError> {
        check_count(count, max_items)?;
        let mut c = Reader { b: rest, pos: 0 };
        for _ in 0..count {
            c.skip_reply_item()?;
        }
        Ok((BatchItems { count, body: rest.slice(..c.pos) }, c.pos))
    }
}

fn check_count(count: u32, max: usize) -> Result<(), ProtocolError> {
    if count as usize > max {
        return Err(ProtocolError::TooManyItems { max });
    }
    Ok(())
}

const TRUNCATED: ProtocolError = ProtocolError::Malformed("batch item runs past the end of its message");

fn read_u32(b: &[u8], pos: usize) -> Result<u32, ProtocolError> {
    let s = b.get(pos..pos + 4).ok_or(TRUNCATED)?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

struct Reader<'a> {
    b: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        let v = read_u32(self.b, self.pos)?;
        self.pos += 4;
        Ok(v)
    }

    fn skip(&mut self, n: usize) -> Result<(), ProtocolError> {
        self.pos = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(TRUNCATED)?;
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<Bytes, ProtocolError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(TRUNCATED)?;
        let out = self.b.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }

    /// Validates one reply item without taking slices (no reference counting).
    fn skip_reply_item(&mut self) -> Result<(), ProtocolError> {
        let status = *self.b.get(self.pos).ok_or(TRUNCATED)?;
        self.pos += 1;
        match status {
            ITEM_OK => {
                let n = self.u32()? as usize;
                self.skip(n)
            }
            ITEM_ERROR => {
                self.skip(2)?;
                let n = self.u32()? as usize;
                let start = self.pos;
                self.skip(n)?;
                std::str::from_utf8(&self.b[start..self.pos])
                    .map_err(|_| ProtocolError::Malformed("batch item error message is not UTF-8"))?;
                Ok(())
            }
            _ => Err(ProtocolError::Malformed("unknown batch item status")),
        }
    }

    /// Reads one reply item (already validated).
    fn reply_item(&mut self) -> Result<ItemResult, ProtocolError> {
        let status = *self.b.get(self.pos).ok_or(TRUNCATED)?;
        self.pos += 1;
        match status {
            ITEM_OK => {
                let n = self.u32()? as usize;
                Ok(ItemResult::Ok(self.take(n)?))
            }
            ITEM_ERROR => {
                let code = self.b.get(self.pos..self.pos + 2).ok_or(TRUNCATED)?;
                let code = Code::from_u16(u16::from_le_bytes([code[0], code[1]]));
                self.pos += 2;
                let n = self.u32()? as usize;
                Ok(ItemResult::Err { code, message: self.take(n)? })
            }
            _ => Err(ProtocolError::Malformed("unknown batch item status")),
        }
    }
}
