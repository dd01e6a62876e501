//! Request extensions (PROTOCOL.md §6.2.2): optional fields of a request's header — the
//! caller's remaining time budget, its trace context — in a block of `type, len, value`
//! entries that a receiver walks, keeping the types it knows and skipping the others, so new
//! types need no new protocol version. Sent only to a server whose preamble announced the
//! `EXTENSIONS` feature (§4.4).

use bytes::{BufMut, BytesMut};

use super::ProtocolError;

/// Request flag: an extension block follows the method name.
pub const FLAG_EXTENSIONS: u8 = 0x02;
/// Preamble feature: the sender (a server) accepts request extensions.
pub const FEATURE_EXTENSIONS: u8 = 0x01;

/// Entry type: the caller's remaining budget, u32 microseconds.
pub const EXT_DEADLINE: u8 = 0x01;
/// Entry type: W3C trace context, 26 bytes (version, trace-id, parent-id, flags).
pub const EXT_TRACEPARENT: u8 = 0x02;
/// Entry type: the schema fingerprints of the method's request and reply types as the caller
/// declares them, two u64 (0: none).
pub const EXT_FINGERPRINT: u8 = 0x03;
/// Preamble feature: the sender (a server) checks schema fingerprints (PROTOCOL.md §15.6).
pub const FEATURE_FINGERPRINTS: u8 = 0x04;

/// The extensions of one request, as far as this implementation knows them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extensions {
    /// The caller's remaining time budget when it sent the request, in microseconds.
    pub deadline_micros: Option<u32>,
    /// The caller's trace context: the server's span for the request is a child of it.
    /// Boxed, as the fingerprints below: both are rare, and inline they would make every
    /// decoded message too large to move without a call to `memcpy`.
    pub trace_parent: Option<Box<TraceParent>>,
    /// The schema fingerprints of the method's types as the caller declares them (a
    /// connection carries them once per method).
    pub fingerprints: Option<Box<Fingerprints>>,
}

/// The schema fingerprints of a method's request and reply types
/// ([`Wire::fingerprint`](crate::Wire::fingerprint)); 0 for a type that has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fingerprints {
    pub request: u64,
    pub reply: u64,
}

impl Fingerprints {
    fn from_bytes(b: &[u8]) -> Option<Fingerprints> {
        let b: &[u8; 16] = b.try_into().ok()?;
        let (req, rep) = b.split_at(8);
        Some(Fingerprints {
            request: u64::from_le_bytes(req.try_into().ok()?),
            reply: u64::from_le_bytes(rep.try_into().ok()?),
        })
    }
}

/// A W3C `traceparent` (version 00): which trace a request belongs to, and the caller's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    /// Bit 0: the caller samples (records) this trace.
    pub flags: u8,
}

const TRACEPARENT_LEN: usize = 26;

impl TraceParent {
    /// From the binary form; `None` if invalid (another version, an all-zero id).
    pub fn from_bytes(b: &[u8]) -> Option<TraceParent> {
        if b.len() != TRACEPARENT_LEN || b[0] != 0 {
            return None;
        }
        let tp = TraceParent {
            trace_id: b[1..17].try_into().ok()?,
            parent_id: b[17..25].try_into().ok()?,
            flags: b[25],
        };
        tp.is_valid().then_some(tp)
    }

    /// From the text form of the `traceparent` header: `00-<32 hex>-<16 hex>-<2 hex>`.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let mut parts = s.trim().split('-');
        let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" {
            return None;
        }
        let tp = TraceParent { trace_id: hex(trace)?, parent_id: hex(parent)?, flags: hex::<1>(flags)?[0] };
        tp.is_valid().then_some(tp)
    }

    fn is_valid(&self) -> bool {
        self.trace_id != [0; 16] && self.parent_id != [0; 8]
    }

    fn write(&self, b: &mut BytesMut) {
        b.put_u8(0);
        b.put_slice(&self.trace_id);
        b.put_slice(&self.parent_id);
        b.put_u8(self.flags);
    }
}

impl std::fmt::Display for TraceParent {
    /// The text form of the `traceparent` header.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("00-")?;
        self.trace_id.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("-")?;
        self.parent_id.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, "-{:02x}", self.flags)
    }
}

/// Lower-case or upper-case hex of exactly `N` bytes.
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Extensions {
    /// No extensions.
    pub const NONE: Extensions = Extensions { deadline_micros: None, trace_parent: None, fingerprints: None };

    pub fn is_empty(&self) -> bool {
        self.deadline_micros.is_none() && self.trace_parent.is_none() && self.fingerprints.is_none()
    }

    /// Writes the block: its u16 length, then the entries.
    pub(crate) fn write(&self, b: &mut BytesMut) {
        if let (Some(us), None, None) = (self.deadline_micros, &self.trace_parent, &self.fingerprints) {
            // The common block, a budget alone, in one append (inlined: see `encode`).
            let mut block = [6, 0, EXT_DEADLINE, 4, 0, 0, 0, 0];
            block[4..].copy_from_slice(&us.to_le_bytes());
            b.extend_from_slice(&block);
            return;
        }
        let at = b.len();
        b.put_u16_le(0);
        if let Some(us) = self.deadline_micros {
            b.put_slice(&[EXT_DEADLINE, 4]);
            b.put_u32_le(us);
        }
        if let Some(tp) = &self.trace_parent {
            b.put_slice(&[EXT_TRACEPARENT, TRACEPARENT_LEN as u8]);
            tp.write(b);
        }
        if let Some(fp) = &self.fingerprints {
            b.put_slice(&[EXT_FINGERPRINT, 16]);
            b.put_u64_le(fp.request);
            b.put_u64_le(fp.reply);
        }
        let len = (b.len() - at - 2) as u16;
        b[at..at + 2].copy_from_slice(&len.to_le_bytes());
    }

    /// Reads a block's entries. An entry that runs past the block is a protocol error; an
    /// unknown type is skipped; a known type with a bad value is ignored (logged).
    ///
    /// The common block, a budget alone (what `write` sends for a call with a deadline), is
    /// read inline and at once: walking it out of line cost ~75 instructions a request
    /// (scripts/callcost.py).
    #[inline(always)]
    pub(crate) fn parse(block: &[u8]) -> Result<Extensions, ProtocolError> {
        if let [EXT_DEADLINE, 4, a, b, c, d] = *block {
            return Ok(Extensions {
                deadline_micros: Some(u32::from_le_bytes([a, b, c, d])),
                trace_parent: None,
                fingerprints: None,
            });
        }
        Self::walk(block)
    }

    fn walk(mut block: &[u8]) -> Result<Extensions, ProtocolError> {
        let mut ext = Extensions::default();
        while !block.is_empty() {
            let [kind, len, rest @ ..] = block else {
                return Err(ProtocolError::Malformed("request extension entry cut short"));
            };
            let len = *len as usize;
            if rest.len() < len {
                return Err(ProtocolError::Malformed("request extension entry runs past its block"));
            }
            let (value, next) = rest.split_at(len);
            match *kind {
                EXT_DEADLINE => match <[u8; 4]>::try_from(value) {
                    Ok(v) => ext.deadline_micros = Some(u32::from_le_bytes(v)),
                    Err(_) => tracing::debug!(len, "ignoring a deadline extension of the wrong length"),
                },
                EXT_TRACEPARENT => match TraceParent::from_bytes(value) {
                    Some(tp) => ext.trace_parent = Some(Box::new(tp)),
                    None => tracing::debug!(?value, "ignoring an invalid traceparent extension"),
                },
                EXT_FINGERPRINT => match Fingerprints::from_bytes(value) {
                    Some(fp) => ext.fingerprints = Some(Box::new(fp)),
                    None => tracing::debug!(len, "ignoring a fingerprint extension of the wrong length"),
                },
                _ => {}
            }
            block = next;
        }
        Ok(ext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TraceParent {
        TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap()
    }

    /// The one-put path for a budget alone writes what the general path writes (PROTOCOL.md
    /// §6.2.2: the block's u16 length, then DEADLINE, its length 4, the u32 budget).
    #[test]
    fn a_budget_alone_is_written_as_the_general_block() {
        let ext = Extensions { deadline_micros: Some(0x0403_0201), ..Extensions::NONE };
        let mut b = BytesMut::new();
        ext.write(&mut b);
        assert_eq!(&b[..], &[6, 0, EXT_DEADLINE, 4, 1, 2, 3, 4]);
        assert_eq!(Extensions::parse(&b[2..]).unwrap(), ext);
        // Read at once, it is what the walk of the general block reads.
        assert_eq!(Extensions::walk(&b[2..]).unwrap(), ext);
        let both =
            Extensions { deadline_micros: Some(7), trace_parent: Some(Box::new(tp())), ..Extensions::NONE };
        let mut b = BytesMut::new();
        both.write(&mut b);
        assert_eq!(usize::from(u16::from_le_bytes([b[0], b[1]])), b.len() - 2);
        assert_eq!(&b[2..8], &[EXT_DEADLINE, 4, 7, 0, 0, 0]);
        assert_eq!(Extensions::parse(&b[2..]).unwrap(), both);
    }

    #[test]
    fn the_text_form_round_trips_and_bad_forms_are_refused() {
        let tp = tp();
        assert_eq!(tp.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(tp.flags, 1);
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn blocks_round_trip_and_unknown_entries_are_skipped() {
        let ext = Extensions {
            deadline_micros: Some(250_000),
            trace_parent: Some(Box::new(tp())),
            ..Extensions::NONE
        };
        let mut b = BytesMut::new();
        ext.write(&mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]) as usize, b.len() - 2);
        assert_eq!(&b[2..8], &[EXT_DEADLINE, 4, 0x90, 0xd0, 0x03, 0x00], "the example of PROTOCOL.md");
        assert_eq!(Extensions::parse(&b[2..]).unwrap(), ext);
        // An unknown type in front, and a deadline of the wrong length, change nothing else.
        let mut block = vec![0x7f, 3, 1, 2, 3, EXT_DEADLINE, 2, 9, 9];
        block.extend_from_slice(&b[8..]);
        let parsed = Extensions::parse(&block).unwrap();
        assert_eq!(parsed, Extensions { trace_parent: Some(Box::new(tp())), ..Extensions::NONE });
    }

    #[test]
    fn fingerprints_round_trip_and_a_bad_length_is_ignored() {
        let fp = Fingerprints { request: 0x0102_0304_0506_0708, reply: 9 };
        let ext =
            Extensions { deadline_micros: Some(5), fingerprints: Some(Box::new(fp)), ..Extensions::NONE };
        let mut b = BytesMut::new();
        ext.write(&mut b);
        assert_eq!(&b[8..10], &[EXT_FINGERPRINT, 16]);
        assert_eq!(&b[10..18], &[8, 7, 6, 5, 4, 3, 2, 1], "request fingerprint, little-endian");
        assert_eq!(Extensions::parse(&b[2..]).unwrap(), ext);
        let short = [EXT_FINGERPRINT, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(Extensions::parse(&short).unwrap(), Extensions::NONE);
    }

    #[test]
    fn an_entry_past_its_block_is_a_protocol_error() {
        assert!(Extensions::parse(&[EXT_DEADLINE, 4, 1, 2]).is_err());
        assert!(Extensions::parse(&[EXT_DEADLINE]).is_err());
        assert_eq!(Extensions::parse(&[]).unwrap(), Extensions::default());
    }
}
