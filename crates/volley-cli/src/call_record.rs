//! `serve-echo --record-calls FILE`: which requests the echo handler ran, so that `volley bench
//! rolling` can count calls run twice at the handler, not guess them at the caller.
//!
//! A request whose payload starts with a non-zero little-endian `u64` has that id stored in
//! FILE as its handler runs. The file is mapped shared: a stored id is in the kernel's page
//! cache at once, so the record survives its process however it ends — SIGKILL included —
//! at the cost of an atomic add and a store per call, no system call.
//!
//! Layout: a `u64` count of the slots taken, then one `u64` id per slot. A slot taken by a
//! process killed before it stored its id stays 0.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Ids one file holds: 256 MiB of sparse file, of which only what was written takes room
/// (8 bytes a call). Calls past it are counted, not stored.
const SLOTS: usize = 1 << 25;

/// The mapped record of one serving process.
pub struct CallRecord {
    /// The count, then the slots: `SLOTS + 1` words, page-aligned (mmap).
    base: *mut AtomicU64,
}

// SAFETY: the mapping is only reached through atomics, and lives until the record is dropped.
unsafe impl Send for CallRecord {}
unsafe impl Sync for CallRecord {}

impl CallRecord {
    /// Creates (or empties) `path` and maps it.
    pub fn create(path: &Path) -> Result<CallRecord, String> {
        let why = |e: std::io::Error| format!("--record-calls {}: {e}", path.display());
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(why)?;
        file.set_len(Self::bytes() as u64).map_err(why)?;
        // SAFETY: a fresh shared mapping of a file of exactly this length; the file may be
        // closed afterwards (the mapping keeps it).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(why(std::io::Error::last_os_error()));
        }
        Ok(CallRecord { base: ptr.cast() })
    }

    fn bytes() -> usize {
        (SLOTS + 1) * 8
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i <= SLOTS);
        // SAFETY: `i` is within the mapping, which is aligned and outlives `&self`.
        unsafe { &*self.base.add(i) }
    }

    /// Records that the handler ran the request with this payload.
    pub fn ran(&self, payload: &[u8]) {
        let Some(head) = payload.first_chunk::<8>() else { return };
        let id = u64::from_le_bytes(*head);
        if id == 0 {
            return;
        }
        let slot = self.word(0).fetch_add(1, Relaxed) as usize;
        if slot < SLOTS {
            self.word(1 + slot).store(id, Relaxed);
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, no longer reachable.
        unsafe { libc::munmap(self.base.cast(), Self::bytes()) };
    }
}

/// What one record file holds.
#[derive(Debug, Default)]
pub struct Recorded {
    /// The ids stored, in the order their slots were taken.
    pub ids: Vec<u64>,
    /// Slots taken whose id was never stored (the process was killed in between).
    pub unwritten: u64,
    /// Calls run past the file's capacity (not stored).
    pub overflow: u64,
}

/// Reads a record written by [`CallRecord`] (only the slots taken, not the whole sparse file).
pub fn read(path: &Path) -> Result<Recorded, String> {
    let why = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::open(path).map_err(why)?;
    let mut head = [0u8; 8];
    f.read_exact(&mut head).map_err(why)?;
    let taken = u64::from_le_bytes(head);
    let stored = (taken as usize).min(SLOTS);
    let mut raw = vec![0u8; stored * 8];
    f.read_exact(&mut raw).map_err(why)?;
    let mut out = Recorded { overflow: taken - stored as u64, ..Recorded::default() };
    for w in raw.chunks_exact(8) {
        match u64::from_le_bytes(w.try_into().expect("8 bytes")) {
            0 => out.unwritten += 1,
            id => out.ids.push(id),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_handler_ran_is_read_back_without_a_flush_or_a_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls");
        let record = CallRecord::create(&path).unwrap();
        for id in [7u64, 9, 7] {
            let mut payload = id.to_le_bytes().to_vec();
            payload.extend_from_slice(b"rest of the payload");
            record.ran(&payload);
        }
        record.ran(&0u64.to_le_bytes()); // no id
        record.ran(b"short"); // too short for one
        // Read while the mapping is still live, as after a SIGKILL (no unmap, no flush).
        let got = read(&path).unwrap();
        assert_eq!(got.ids, vec![7, 9, 7]);
        assert_eq!((got.unwritten, got.overflow), (0, 0));
        drop(record);
        assert_eq!(read(&path).unwrap().ids, vec![7, 9, 7]);
    }
}
