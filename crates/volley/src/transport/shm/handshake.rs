//! Setting up a shm connection over its unix socket (docs/PROTOCOL.md §2.1.1): the client sends a
//! hello with the mapping's memory file and the peer ends of its two wake-up channels attached
//! (`SCM_RIGHTS`; see [`wake`](super::wake) for why they are sockets), the server checks them
//! (among them that the rings fit its own bound) and answers with the peer ends of its own two
//! channels, or refuses with a reason. After that the socket carries nothing more; it stays
//! open so that each side sees the other's end (exit, crash, `SIGKILL`) at once, as the socket
//! closes.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::layout::{Geometry, HEADER_FIELDS_LEN, HEADER_LEN, MAGIC, MIN_RING};
use super::sys::Region;
use super::wake;

/// Version of the set-up messages (the mapping's layout has its own,
/// [`layout::VERSION`](super::layout::VERSION)). Version 1 passed eventfds as wake-up channels,
/// which let a peer block the other side (see [`wake`]); it is refused, with that reason.
pub const SETUP_VERSION: u32 = 2;

/// Most file descriptors the server takes in with a hello, to count them: the kernel's own
/// bound on one `SCM_RIGHTS` message (`SCM_MAX_FD`). A hello with the wrong number is refused
/// with the number it had.
const MAX_PASSED: usize = 253;

/// File descriptors a hello carries: the memory file and two wake-up channels.
const HELLO_FDS: usize = 3;

/// Length of the hello and of the reply's fixed part.
pub const MESSAGE_LEN: usize = 16;

/// Longest refusal reason a server sends (and a client reads).
pub const MAX_REASON: usize = 1024;

/// Reply status: accepted (two eventfds attached) or refused (a reason follows).
pub const ACCEPTED: u32 = 0;
pub const REFUSED: u32 = 1;

/// What a side of a freshly set-up connection holds.
pub struct SetUp {
    pub region: Region,
    pub geometry: Geometry,
    /// Our ends of the wake-up channels, which the peer signals: bytes for us, room for us.
    pub bytes_ready: OwnedFd,
    pub room_ready: OwnedFd,
    /// The peer's ends, which we signal on.
    pub peer_bytes_ready: OwnedFd,
    pub peer_room_ready: OwnedFd,
}

/// The client's hello: magic, version, reserved.
pub fn hello() -> [u8; MESSAGE_LEN] {
    let mut m = [0u8; MESSAGE_LEN];
    m[0..8].copy_from_slice(&MAGIC);
    m[8..12].copy_from_slice(&SETUP_VERSION.to_le_bytes());
    m
}

/// The server's reply: magic, status, length of the reason that follows.
pub fn reply(status: u32, reason: &str) -> Vec<u8> {
    let reason = truncate(reason, MAX_REASON);
    let mut m = Vec::with_capacity(MESSAGE_LEN + reason.len());
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&status.to_le_bytes());
    m.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    m.extend_from_slice(reason.as_bytes());
    m
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub fn check_hello(m: &[u8; MESSAGE_LEN]) -> Result<(), String> {
    if m[0..8] != MAGIC {
        return Err(format!("bad shm hello magic {:02x?} (not a Volley shm client?)", &m[0..8]));
    }
    let version = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
    if version == 1 {
        return Err(format!(
            "shm set-up version 1 is no longer served: its eventfd wake-ups let a peer block the \
             server; upgrade the client (this server speaks {SETUP_VERSION})"
        ));
    }
    if version != SETUP_VERSION {
        return Err(format!("unsupported shm set-up version {version} (this side speaks {SETUP_VERSION})"));
    }
    Ok(())
}

/// The reply's status and the length of its reason.
pub fn parse_reply(m: &[u8; MESSAGE_LEN]) -> Result<(u32, usize), String> {
    if m[0..8] != MAGIC {
        return Err(format!("bad shm reply magic {:02x?} (not a Volley shm server?)", &m[0..8]));
    }
    let status = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(m[12..16].try_into().expect("4 bytes")) as usize;
    if status > REFUSED || len > MAX_REASON {
        return Err(format!("bad shm reply: status {status}, reason of {len} bytes"));
    }
    Ok((status, len))
}

/// Checks the two wake-up channel ends the peer passed: bytes-ready, then room-ready.
fn peer_ends(fds: Vec<OwnedFd>) -> Result<[OwnedFd; 2], String> {
    let [bytes, room]: [OwnedFd; 2] =
        fds.try_into().map_err(|v: Vec<_>| format!("expected 2 file descriptors, got {}", v.len()))?;
    wake::check_peer_end(&bytes, "bytes-ready")?;
    wake::check_peer_end(&room, "room-ready")?;
    Ok([bytes, room])
}

/// The client's side: makes the mapping (two rings of `ring` bytes, its file named after
/// `label`) and the eventfds, sends
/// them, waits for the answer. A refusal is an error carrying the server's reason.
pub async fn client(sock: &UnixStream, ring: usize, label: &str) -> io::Result<SetUp> {
    let geometry = Geometry::symmetric(ring).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (region, file) = Region::create(geometry.total_len(), label)?;
    region.copy_in(0, &geometry.header());
    let ((bytes_ready, give_bytes), (room_ready, give_room)) = (wake::pair()?, wake::pair()?);
    send(sock, &hello(), &[file.as_fd(), give_bytes.as_fd(), give_room.as_fd()]).await?;
    // The server holds the file and the ends now; the mapping keeps the memory for us.
    drop((file, give_bytes, give_room));
    let mut head = [0u8; MESSAGE_LEN];
    let fds = recv(sock, &mut head, 2).await?;
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let (status, reason_len) = parse_reply(&head).map_err(bad)?;
    if status == REFUSED {
        let mut reason = vec![0u8; reason_len];
        recv(sock, &mut reason, 0).await?;
        let reason = String::from_utf8_lossy(&reason);
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("shm set-up refused: {reason}"),
        ));
    }
    let [peer_bytes_ready, peer_room_ready] =
        peer_ends(fds).map_err(|e| bad(format!("the server's reply: {e}")))?;
    Ok(SetUp { region, geometry, bytes_ready, room_ready, peer_bytes_ready, peer_room_ready })
}

/// The server's side: receives and checks the hello, the mapping (its rings at most `max_ring`
/// bytes each) and the client's wake-up channels, answers. A refusal is sent to the client
/// with its reason, and returned as an error.
pub async fn server(sock: &UnixStream, max_ring: usize) -> io::Result<SetUp> {
    let mut hello = [0u8; MESSAGE_LEN];
    let checked = match recv(sock, &mut hello, MAX_PASSED).await {
        Ok(fds) => check_hello(&hello).and_then(|()| map_client_files(fds, max_ring)),
        // Too many file descriptors to count: refused like a wrong count.
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(e.to_string()),
        Err(e) => return Err(e),
    };
    let (region, geometry, [peer_bytes_ready, peer_room_ready]) = match checked {
        Ok(v) => v,
        Err(why) => {
            let _ = send(sock, &reply(REFUSED, &why), &[]).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, why));
        }
    };
    let ((bytes_ready, give_bytes), (room_ready, give_room)) = (wake::pair()?, wake::pair()?);
    send(sock, &reply(ACCEPTED, ""), &[give_bytes.as_fd(), give_room.as_fd()]).await?;
    drop((give_bytes, give_room));
    Ok(SetUp { region, geometry, bytes_ready, room_ready, peer_bytes_ready, peer_room_ready })
}

/// Maps the client's memory file and checks its header, and that each ring holds at most
/// `max_ring` bytes (the server's bound on the memory one connection shares with it: the
/// server fills the reply ring itself, so a larger one would be its own memory spent at the
/// peer's word); checks its wake-up channels.
fn map_client_files(fds: Vec<OwnedFd>, max_ring: usize) -> Result<(Region, Geometry, [OwnedFd; 2]), String> {
    if fds.len() != HELLO_FDS {
        return Err(format!("expected {HELLO_FDS} file descriptors, got {}", fds.len()));
    }
    let mut fds = fds.into_iter();
    let file = fds.next().expect("counted");
    let [bytes, room] = peer_ends(fds.collect())?;
    let size = rustix::fs::fstat(&file).map_err(|e| format!("fstat of the memory file: {e}"))?.st_size;
    let size = usize::try_from(size).unwrap_or(0);
    if !(HEADER_LEN + 2 * MIN_RING..=HEADER_LEN + 2 * max_ring).contains(&size) {
        return Err(format!(
            "a mapping of {size} bytes is outside the bounds of two rings of {MIN_RING} to {max_ring} \
             bytes (this server takes at most {max_ring} bytes per ring)"
        ));
    }
    let region = Region::map_peer_file(&file, size)?;
    let mut header = bytes::BytesMut::new();
    region.copy_out(0, HEADER_FIELDS_LEN, &mut header);
    let geometry = Geometry::parse(&header[..].try_into().expect("64 bytes"))?;
    if geometry.total_len() != size {
        return Err(format!(
            "the header describes {} bytes, the memory file holds {size}",
            geometry.total_len()
        ));
    }
    for (name, cap) in [("A", geometry.a), ("B", geometry.b)] {
        if cap > max_ring {
            return Err(format!(
                "ring {name} of {cap} bytes is larger than this server takes (at most {max_ring} bytes per ring)"
            ));
        }
    }
    Ok((region, geometry, [bytes, room]))
}

/// Sends all of `bytes`, with `fds` attached to the first part.
pub(super) async fn send(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
    let mut sent = 0;
    while sent < bytes.len() {
        sock.writable().await?;
        let r = sock.try_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if sent == 0 && !fds.is_empty() {
                assert!(control.push(SendAncillaryMessage::ScmRights(fds)), "room for the fds");
            }
            let iov = [IoSlice::new(&bytes[sent..])];
            Ok(rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL)?)
        });
        match r {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf`, collecting up to `max_fds` (at most [`MAX_PASSED`]) file descriptors passed
/// with the bytes (more is an error of kind `InvalidData`: the kernel drops what does not fit,
/// and says so).
pub(super) async fn recv(sock: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        sock.readable().await?;
        let r = sock.try_io(Interest::READABLE, || {
            let mut control = RecvAncillaryBuffer::new(&mut space[..rustix::cmsg_space!(ScmRights(max_fds))]);
            let mut iov = [IoSliceMut::new(&mut buf[got..])];
            let msg = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(passed) = m {
                    fds.extend(passed);
                }
            }
            Ok(msg)
        });
        match r {
            Ok(msg) if msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() > max_fds => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("more than {max_fds} file descriptors passed"),
                ));
            }
            Ok(msg) if msg.bytes == 0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(msg) => got += msg.bytes,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::super::layout::MAX_RING;
    use super::*;

    #[test]
    fn the_messages_hold_the_documented_bytes() {
        assert_eq!(&hello(), b"VLLYSHM\0\x02\0\0\0\0\0\0\0");
        assert_eq!(check_hello(&hello()), Ok(()));
        assert_eq!(reply(ACCEPTED, ""), b"VLLYSHM\0\0\0\0\0\0\0\0\0");
        let refused = reply(REFUSED, "no");
        assert_eq!(&refused[..], b"VLLYSHM\0\x01\0\0\0\x02\0\0\0no");
        assert_eq!(parse_reply(refused[..16].try_into().unwrap()), Ok((REFUSED, 2)));
        assert_eq!(reply(REFUSED, &"é".repeat(2000)).len(), 16 + MAX_REASON);
    }

    #[test]
    fn bad_messages_are_refused_with_their_reason() {
        let mut h = hello();
        h[8] = 3;
        assert!(check_hello(&h).unwrap_err().contains("version 3"));
        h[8] = 1;
        assert!(check_hello(&h).unwrap_err().contains("version 1 is no longer served"));
        assert!(check_hello(b"GET / HTTP/1.1\r\n").unwrap_err().contains("magic"));
        let mut r: [u8; 16] = reply(ACCEPTED, "")[..].try_into().unwrap();
        r[8] = 7;
        assert!(parse_reply(&r).is_err());
        r[8] = 1;
        r[12..16].copy_from_slice(&(MAX_REASON as u32 + 1).to_le_bytes());
        assert!(parse_reply(&r).is_err());
    }

    /// A pair of set-up sides over a socket pair: what the connection tests build on.
    #[tokio::test]
    async fn client_and_server_agree_on_the_mapping_and_swap_wake_up_channels() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, s) = tokio::join!(client(&a, 8192, "test"), server(&b, MAX_RING));
        let (c, s) = (c.unwrap(), s.unwrap());
        assert_eq!(c.geometry, Geometry { a: 8192, b: 8192 });
        assert_eq!(s.geometry, c.geometry);
        c.region.copy_in(5000, b"shared");
        let mut out = bytes::BytesMut::new();
        s.region.copy_out(5000, 6, &mut out);
        assert_eq!(&out[..], b"shared");
        // Each side's end reached the other: a signal by one is read by the other.
        for (from, to) in [(&s.peer_bytes_ready, &c.bytes_ready), (&s.peer_room_ready, &c.room_ready)]
            .into_iter()
            .chain([(&c.peer_bytes_ready, &s.bytes_ready), (&c.peer_room_ready, &s.room_ready)])
        {
            wake::signal(from);
            let mut v = [0u8; 8];
            let got = rustix::net::recv(to, &mut v, rustix::net::RecvFlags::DONTWAIT).unwrap();
            assert_eq!(got.0, 1);
        }
    }

    /// Reads the server's refusal: its reason.
    async fn refusal(sock: &UnixStream) -> String {
        let mut head = [0u8; 16];
        recv(sock, &mut head, 0).await.unwrap();
        let (status, len) = parse_reply(&head).unwrap();
        assert_eq!(status, REFUSED);
        let mut reason = vec![0; len];
        recv(sock, &mut reason, 0).await.unwrap();
        String::from_utf8(reason).unwrap()
    }

    #[tokio::test]
    async fn a_client_without_a_mapping_is_refused_with_the_reason() {
        let (a, b) = UnixStream::pair().unwrap();
        let h = hello();
        let (sent, refused) = tokio::join!(send(&a, &h, &[]), server(&b, MAX_RING));
        sent.unwrap();
        assert!(refused.err().unwrap().to_string().contains("expected 3 file descriptors, got 0"));
        assert_eq!(refusal(&a).await, "expected 3 file descriptors, got 0");
    }

    #[tokio::test]
    async fn rings_larger_than_the_server_takes_are_refused_with_its_limit() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, s) = tokio::join!(client(&a, 1 << 20, "test"), server(&b, 256 << 10));
        let err = c.err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        assert!(err.to_string().contains("262144 bytes"), "{err}");
        assert!(s.err().unwrap().to_string().contains("this server takes at most 262144 bytes per ring"));
        // At the limit it is taken.
        let (a, b) = UnixStream::pair().unwrap();
        let (c, s) = tokio::join!(client(&a, 256 << 10, "test"), server(&b, 256 << 10));
        assert!(c.is_ok() && s.is_ok());
    }

    /// A hello whose wake-up channels are eventfds, as version 1 passed them (and a peer that
    /// could clear their `O_NONBLOCK` could block the server on): refused.
    #[tokio::test]
    async fn eventfds_for_wake_up_channels_are_refused_with_the_reason() {
        let (a, b) = UnixStream::pair().unwrap();
        let g = Geometry::symmetric(4096).unwrap();
        let (region, file) = Region::create(g.total_len(), "test").unwrap();
        region.copy_in(0, &g.header());
        let efd = || rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        let (e1, e2) = (efd(), efd());
        let (h, fds) = (hello(), [file.as_fd(), e1.as_fd(), e2.as_fd()]);
        let (sent, refused) = tokio::join!(send(&a, &h, &fds), server(&b, MAX_RING));
        sent.unwrap();
        assert!(refused.is_err());
        assert!(refusal(&a).await.contains("bytes-ready channel is not a unix stream socket"));
    }
}
