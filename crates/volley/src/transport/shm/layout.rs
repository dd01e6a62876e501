//! Where everything sits in a shm connection's mapping (docs/PROTOCOL.md §2.1.2), and the
//! header that describes it: pure functions over bytes.
//!
//! ```text
//! 0      64    header: magic, version, header length, the two rings' capacities
//! 64     256   control block of ring A (client -> server)
//! 320    256   control block of ring B (server -> client)
//! 4096   capA  data of ring A
//! ...    capB  data of ring B
//! ```

/// The first 8 bytes of the mapping (and of the set-up messages).
pub const MAGIC: [u8; 8] = *b"VLLYSHM\0";

/// Version of the mapping's layout and of the set-up messages.
pub const VERSION: u32 = 1;

/// Bytes before the first ring's data: the header and both control blocks, rounded to a page
/// so that the data starts page-aligned.
pub const HEADER_LEN: usize = 4096;

/// Bytes of the header proper.
pub const HEADER_FIELDS_LEN: usize = 64;

/// Where each ring's control block starts.
pub const CONTROL_A: usize = 64;
pub const CONTROL_B: usize = 320;

/// Smallest and largest ring capacity (bytes, per direction); capacities are powers of two.
pub const MIN_RING: usize = 4096;
pub const MAX_RING: usize = 64 << 20;

/// The capacities of the two rings of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Ring A: client to server.
    pub a: usize,
    /// Ring B: server to client.
    pub b: usize,
}

impl Geometry {
    /// Both rings of `ring` bytes, if that is a valid capacity.
    pub fn symmetric(ring: usize) -> Result<Geometry, String> {
        check_capacity(ring as u64)?;
        Ok(Geometry { a: ring, b: ring })
    }

    /// Length of the whole mapping.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.a + self.b
    }

    pub fn data_a(&self) -> usize {
        HEADER_LEN
    }

    pub fn data_b(&self) -> usize {
        HEADER_LEN + self.a
    }

    /// The header's bytes: what the client writes at offset 0 of a new mapping.
    pub fn header(&self) -> [u8; HEADER_FIELDS_LEN] {
        let mut h = [0u8; HEADER_FIELDS_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(self.a as u64).to_le_bytes());
        h[24..32].copy_from_slice(&(self.b as u64).to_le_bytes());
        h
    }

    /// Reads a header written by the peer, checking every field.
    pub fn parse(h: &[u8; HEADER_FIELDS_LEN]) -> Result<Geometry, String> {
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        if h[0..8] != MAGIC {
            return Err(format!("bad mapping magic {:02x?}", &h[0..8]));
        }
        if u32_at(8) != VERSION {
            return Err(format!("unsupported mapping version {} (this side speaks {VERSION})", u32_at(8)));
        }
        if u32_at(12) as usize != HEADER_LEN {
            return Err(format!("header length {} (expected {HEADER_LEN})", u32_at(12)));
        }
        let (a, b) = (u64_at(16), u64_at(24));
        check_capacity(a)?;
        check_capacity(b)?;
        Ok(Geometry { a: a as usize, b: b as usize })
    }
}

fn check_capacity(cap: u64) -> Result<(), String> {
    if cap.is_power_of_two() && (MIN_RING as u64..=MAX_RING as u64).contains(&cap) {
        Ok(())
    } else {
        Err(format!("ring capacity {cap} is not a power of two from {MIN_RING} to {MAX_RING} bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written_and_holds_the_documented_bytes() {
        let g = Geometry { a: 1 << 20, b: 4096 };
        let h = g.header();
        assert_eq!(Geometry::parse(&h), Ok(g));
        assert_eq!(&h[..16], b"VLLYSHM\0\x01\0\0\0\x00\x10\0\0");
        assert_eq!(&h[16..32], &[0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert!(h[32..].iter().all(|&b| b == 0));
        assert_eq!(g.total_len(), 4096 + (1 << 20) + 4096);
        assert_eq!((g.data_a(), g.data_b()), (4096, 4096 + (1 << 20)));
    }

    #[test]
    fn every_bad_field_is_refused_with_its_reason() {
        let good = Geometry { a: 4096, b: 8192 }.header();
        let bad = |i: usize, bytes: &[u8]| {
            let mut h = good;
            h[i..i + bytes.len()].copy_from_slice(bytes);
            Geometry::parse(&h).unwrap_err()
        };
        assert!(bad(0, b"X").contains("magic"));
        assert!(bad(8, &2u32.to_le_bytes()).contains("version 2"));
        assert!(bad(12, &64u32.to_le_bytes()).contains("header length 64"));
        for cap in [0u64, 1, 2048, 4097, 6144, (MAX_RING as u64) * 2, u64::MAX] {
            assert!(bad(16, &cap.to_le_bytes()).contains("capacity"), "{cap}");
            assert!(bad(24, &cap.to_le_bytes()).contains("capacity"), "{cap}");
        }
        assert_eq!(Geometry::symmetric(MIN_RING).unwrap().a, MIN_RING);
        assert_eq!(Geometry::symmetric(MAX_RING).unwrap().b, MAX_RING);
        assert!(Geometry::symmetric(3 << 20).is_err());
    }
}
