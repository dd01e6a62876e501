//! What the shm transport asks of the OS that Rust cannot check — the only `unsafe` code of
//! the transport: creating, sealing and mapping the memory file and touching the mapped bytes
//! ([`Region`]), and registering our ends of the wake-up channels with tokio ([`register`]).
//!
//! The other process may write anything anywhere in the mapping at any moment. So nothing here
//! hands out a `&[u8]` into it (its bytes could change under a shared reference): bytes cross
//! only by copies into or out of private memory, and the control words are atomics, for which
//! every bit pattern is a valid value. What the copied bytes mean is checked by the callers
//! (the ring validates positions, the frame decoder everything else).

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use bytes::BytesMut;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Longest name of a memory file (the kernel takes 249 bytes).
const MAX_NAME: usize = 200;

/// A mapping of `len` bytes, read and written by this process and (unless it is
/// [`anonymous`](Region::anonymous)) by the peer.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("len", &self.len).finish()
    }
}

// SAFETY: a `Region` is a pointer to memory it owns (it unmaps it on drop). Every access
// through it is an atomic operation or a copy between the mapping and private memory; none
// relies on the bytes staying put, so using it from several threads at once is sound.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: shared access is atomics and copies only.
unsafe impl Sync for Region {}

impl Region {
    /// A new memory file of `len` bytes (zeroed), sealed so that neither side can shrink or
    /// grow it — a peer that shrank it would make our next access past its end a `SIGBUS` —
    /// and mapped. Returns the mapping and the file, to be passed to the peer.
    /// The file is named `volley-shm ` and `label` (as `/proc/PID/maps` and `/proc/PID/fd`
    /// show it), so that an operator can tell which connection holds which mapping.
    pub fn create(len: usize, label: &str) -> std::io::Result<(Region, OwnedFd)> {
        let mut name: String = format!("volley-shm {label}").chars().filter(|c| *c != '\0').collect();
        while name.len() > MAX_NAME {
            name.pop();
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let region = Region::map_fd(&fd, len)?;
        Ok((region, fd))
    }

    /// Maps a memory file received from a peer, after checking what the peer cannot be trusted
    /// with: that it is sealed against shrinking, and that it is exactly `len` bytes long.
    pub fn map_peer_file(fd: &OwnedFd, len: usize) -> Result<Region, String> {
        let seals = rustix::fs::fcntl_get_seals(fd)
            .map_err(|e| format!("the mapping is not a sealable memory file ({e})"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err("the memory file is not sealed against shrinking".into());
        }
        let size = rustix::fs::fstat(fd).map_err(|e| format!("fstat of the memory file: {e}"))?.st_size;
        if u64::try_from(size).ok() != Some(len as u64) {
            return Err(format!("the memory file holds {size} bytes, its header describes {len}"));
        }
        Region::map_fd(fd, len).map_err(|e| format!("mapping the memory file: {e}"))
    }

    /// Private memory laid out like a shared mapping: for tests and fuzzing of the ring.
    #[cfg(any(test, feature = "internals"))]
    pub fn anonymous(len: usize) -> std::io::Result<Region> {
        assert!(len > 0, "an empty region");
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses: it overlaps no
        // memory Rust knows about.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
            )?
        };
        Ok(Region { ptr: NonNull::new(ptr.cast()).expect("mmap returns no null pointer"), len })
    }

    fn map_fd(fd: impl AsFd, len: usize) -> std::io::Result<Region> {
        assert!(len > 0, "an empty region");
        // SAFETY: a new shared mapping of a memory file at an address the kernel chooses: it
        // overlaps no memory Rust knows about. The file is sealed against shrinking (checked
        // by the callers), so every byte of the mapping stays backed by the file.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        Ok(Region { ptr: NonNull::new(ptr.cast()).expect("mmap returns no null pointer"), len })
    }

    /// The 64-bit word at `offset` (a multiple of 8).
    pub fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len, "u64 at {offset} of {}", self.len);
        // SAFETY: in bounds and 8-aligned (the mapping starts on a page); the memory lives as
        // long as `self`, which the reference borrows. Every access from this process is
        // atomic; the peer's writes are of the same words, and any value is a valid `u64`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    /// The 32-bit word at `offset` (a multiple of 4).
    pub fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= self.len, "u32 at {offset} of {}", self.len);
        // SAFETY: as in `u64_at`, for a 4-aligned 32-bit word.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    /// Appends the `len` bytes at `offset` to `out`.
    pub fn copy_out(&self, offset: usize, len: usize, out: &mut BytesMut) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "copy_out past the end");
        out.reserve(len);
        let spare = out.spare_capacity_mut();
        // SAFETY: the source is inside the mapping (checked above) and the destination is
        // `len` bytes of `out`'s spare capacity (reserved above); private memory never
        // overlaps the mapping. The peer may change the source during the copy: the copy then
        // holds some mix of old and new bytes, all initialized, which the caller validates.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), spare.as_mut_ptr().cast(), len)
        };
        // SAFETY: the `len` bytes after the current length were just initialized.
        unsafe { out.set_len(out.len() + len) };
    }

    /// Copies `src` to `offset`.
    pub fn copy_in(&self, offset: usize, src: &[u8]) {
        assert!(offset.checked_add(src.len()).is_some_and(|end| end <= self.len), "copy_in past the end");
        // SAFETY: the destination is inside the mapping (checked above), the source is private
        // memory, so they do not overlap; writing any bytes into the mapping is sound (nothing
        // in this process holds a reference to them).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
    }
}

/// Registers our end of a wake-up channel with tokio's event loop, to wait for it to be
/// signalled.
pub fn register(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` takes ownership of the `OwnedFd`, which stays open, and refers to
    // the same file description, until the `AsyncFd` drops it.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into())
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the mapping made in the constructor, unmapped only here;
        // no reference into it outlives `self` (they all borrow it).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_file_is_sealed_and_maps_in_a_second_view_of_the_same_bytes() {
        let (ours, fd) = Region::create(8192, "test").unwrap();
        let theirs = Region::map_peer_file(&fd, 8192).unwrap();
        ours.copy_in(4096, b"hello");
        ours.u64_at(8).store(7, std::sync::atomic::Ordering::Relaxed);
        let mut out = BytesMut::new();
        theirs.copy_out(4096, 5, &mut out);
        assert_eq!(&out[..], b"hello");
        assert_eq!(theirs.u64_at(8).load(std::sync::atomic::Ordering::Relaxed), 7);
        // The seals hold: the file can be neither shrunk nor grown.
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err());
        assert!(rustix::fs::ftruncate(&fd, 16384).is_err());
    }

    #[test]
    fn a_peer_file_that_is_unsealed_or_of_another_size_is_refused() {
        let (_, fd) = Region::create(8192, "test").unwrap();
        assert!(Region::map_peer_file(&fd, 4096).unwrap_err().contains("8192"));
        let unsealed = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 8192).unwrap();
        assert!(Region::map_peer_file(&unsealed, 8192).is_err());
        let pipe: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        assert!(Region::map_peer_file(&pipe, 8192).unwrap_err().contains("sealable"));
    }

    #[test]
    #[should_panic(expected = "past the end")]
    fn copies_past_the_end_are_refused() {
        let r = Region::anonymous(4096).unwrap();
        r.copy_in(4090, &[0; 7]);
    }
}
