//! The connection preamble: the first 8 bytes each side sends, before any frame.
//!
//! ```text
//! offset 0..4  magic   "VLLY" (0x56 0x4c 0x4c 0x59)
//! offset 4     version 1
//! offset 5     features the sender understands (bit 0: request extensions, bit 1: streams,
//!              bit 2: schema fingerprints)
//! offset 6..8  reserved, sent as 0, ignored on receipt
//! ```

use super::ProtocolError;

/// The magic bytes that open every Volley connection.
pub const MAGIC: [u8; 4] = *b"VLLY";
/// The protocol version this implementation speaks.
pub const VERSION: u8 = 1;
/// Length of the preamble in bytes.
pub const PREAMBLE_LEN: usize = 8;
/// The preamble this implementation's clients send (they announce no feature).
pub const PREAMBLE: [u8; PREAMBLE_LEN] = preamble(0);
/// The preamble this implementation's servers send: they accept request extensions and
/// streams, and check schema fingerprints.
pub const SERVER_PREAMBLE: [u8; PREAMBLE_LEN] = preamble(
    super::extensions::FEATURE_EXTENSIONS | FEATURE_STREAMS | super::extensions::FEATURE_FINGERPRINTS,
);

/// Preamble feature: the sender (a server) accepts streams (PROTOCOL.md §9.9).
pub const FEATURE_STREAMS: u8 = 0x02;

/// A preamble announcing `features`.
pub const fn preamble(features: u8) -> [u8; PREAMBLE_LEN] {
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, features, 0, 0]
}

/// Checks a peer's preamble and returns the features it announces.
pub fn check(bytes: &[u8; PREAMBLE_LEN]) -> Result<u8, ProtocolError> {
    let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if magic != MAGIC {
        return Err(ProtocolError::BadMagic(magic));
    }
    if bytes[4] != VERSION {
        return Err(ProtocolError::UnsupportedVersion(bytes[4]));
    }
    Ok(bytes[5])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_own_preamble_and_rejects_others() {
        assert_eq!(check(&PREAMBLE), Ok(0));
        assert_eq!(check(&SERVER_PREAMBLE), Ok(7));
        assert_eq!(check(b"GET / HT"), Err(ProtocolError::BadMagic(*b"GET ")));
        let mut v2 = PREAMBLE;
        v2[4] = 2;
        assert_eq!(check(&v2), Err(ProtocolError::UnsupportedVersion(2)));
        let text = ProtocolError::UnsupportedVersion(2).to_string();
        assert!(text.ends_with(&format!("(this side speaks {VERSION})")), "{text}");
        let mut reserved = PREAMBLE;
        reserved[7] = 9;
        assert_eq!(check(&reserved), Ok(0), "reserved bytes are ignored");
    }
}
