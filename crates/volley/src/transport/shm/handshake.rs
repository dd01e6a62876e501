//! Setting up a shm connection over its unix socket (docs/PROTOCOL.md §2.1.1): the client sends a
//! hello with the mapping's memory file and its two wake-up eventfds attached (`SCM_RIGHTS`),
//! the server checks them and answers with its own two eventfds, or refuses with a reason.
//! After that the socket carries nothing more; it stays open so that each side sees the
//! other's end (exit, crash, `SIGKILL`) at once, as the socket closes.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::layout::{Geometry, HEADER_FIELDS_LEN, HEADER_LEN, MAGIC, MAX_RING, MIN_RING, VERSION};
use super::sys::Region;

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
    /// Ours, which the peer signals: bytes for us, room for us.
    pub bytes_ready: OwnedFd,
    pub room_ready: OwnedFd,
    /// The peer's, which we signal.
    pub peer_bytes_ready: OwnedFd,
    pub peer_room_ready: OwnedFd,
}

/// The client's hello: magic, version, reserved.
pub fn hello() -> [u8; MESSAGE_LEN] {
    let mut m = [0u8; MESSAGE_LEN];
    m[0..8].copy_from_slice(&MAGIC);
    m[8..12].copy_from_slice(&VERSION.to_le_bytes());
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
    if version != VERSION {
        return Err(format!("unsupported shm set-up version {version} (this side speaks {VERSION})"));
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

fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?)
}

/// A peer's eventfd is written to from the event loop, so it must never block, whatever the
/// peer passed.
fn nonblocking(fd: OwnedFd) -> io::Result<OwnedFd> {
    let flags = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(fd)
}

/// The client's side: makes the mapping (two rings of `ring` bytes, its file named after
/// `label`) and the eventfds, sends
/// them, waits for the answer. A refusal is an error carrying the server's reason.
pub async fn client(sock: &UnixStream, ring: usize, label: &str) -> io::Result<SetUp> {
    let geometry = Geometry::symmetric(ring).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (region, file) = Region::create(geometry.total_len(), label)?;
    region.copy_in(0, &geometry.header());
    let (bytes_ready, room_ready) = (eventfd()?, eventfd()?);
    send(sock, &hello(), &[file.as_fd(), bytes_ready.as_fd(), room_ready.as_fd()]).await?;
    // The server holds the file now; the mapping keeps the memory for us.
    drop(file);
    let mut head = [0u8; MESSAGE_LEN];
    let mut fds = recv(sock, &mut head, 2).await?;
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
    if fds.len() != 2 {
        return Err(bad(format!("the server passed {} file descriptors, expected 2", fds.len())));
    }
    let peer_room_ready = nonblocking(fds.pop().expect("two"))?;
    let peer_bytes_ready = nonblocking(fds.pop().expect("two"))?;
    Ok(SetUp { region, geometry, bytes_ready, room_ready, peer_bytes_ready, peer_room_ready })
}

/// The server's side: receives and checks the hello, the mapping and the client's eventfds,
/// answers. A refusal is sent to the client with its reason, and returned as an error.
pub async fn server(sock: &UnixStream) -> io::Result<SetUp> {
    let mut hello = [0u8; MESSAGE_LEN];
    let fds = recv(sock, &mut hello, 3).await?;
    let checked = check_hello(&hello).and_then(|()| map_client_files(fds));
    let (region, geometry, [peer_bytes_ready, peer_room_ready]) = match checked {
        Ok(v) => v,
        Err(why) => {
            let _ = send(sock, &reply(REFUSED, &why), &[]).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, why));
        }
    };
    let (bytes_ready, room_ready) = (eventfd()?, eventfd()?);
    send(sock, &reply(ACCEPTED, ""), &[bytes_ready.as_fd(), room_ready.as_fd()]).await?;
    Ok(SetUp { region, geometry, bytes_ready, room_ready, peer_bytes_ready, peer_room_ready })
}

/// Maps the client's memory file and checks its header; makes its eventfds non-blocking.
fn map_client_files(fds: Vec<OwnedFd>) -> Result<(Region, Geometry, [OwnedFd; 2]), String> {
    let [file, bytes, room]: [OwnedFd; 3] =
        fds.try_into().map_err(|v: Vec<_>| format!("expected 3 file descriptors, got {}", v.len()))?;
    let size = rustix::fs::fstat(&file).map_err(|e| format!("fstat of the memory file: {e}"))?.st_size;
    let size = usize::try_from(size).unwrap_or(0);
    if !(HEADER_LEN + 2 * MIN_RING..=HEADER_LEN + 2 * MAX_RING).contains(&size) {
        return Err(format!("a mapping of {size} bytes is outside the bounds of two rings"));
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
    let fix = |fd| nonblocking(fd).map_err(|e| format!("an eventfd of the client: {e}"));
    Ok((region, geometry, [fix(bytes)?, fix(room)?]))
}

/// Sends all of `bytes`, with `fds` attached to the first part.
async fn send(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut sent = 0;
    while sent < bytes.len() {
        sock.writable().await?;
        let r = sock.try_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if sent == 0 && !fds.is_empty() {
                assert!(control.push(SendAncillaryMessage::ScmRights(fds)), "room for 3 fds");
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

/// Fills `buf`, collecting up to `max_fds` file descriptors passed with the bytes (more is an
/// error: the kernel drops what does not fit, and says so).
async fn recv(sock: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
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
                return Err(io::Error::new(io::ErrorKind::InvalidData, "too many file descriptors passed"));
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
    use super::*;

    #[test]
    fn the_messages_hold_the_documented_bytes() {
        assert_eq!(&hello(), b"VLLYSHM\0\x01\0\0\0\0\0\0\0");
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
        h[8] = 2;
        assert!(check_hello(&h).unwrap_err().contains("version 2"));
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
    async fn client_and_server_agree_on_the_mapping_and_swap_eventfds() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, s) = tokio::join!(client(&a, 8192, "test"), server(&b));
        let (c, s) = (c.unwrap(), s.unwrap());
        assert_eq!(c.geometry, Geometry { a: 8192, b: 8192 });
        assert_eq!(s.geometry, c.geometry);
        c.region.copy_in(5000, b"shared");
        let mut out = bytes::BytesMut::new();
        s.region.copy_out(5000, 6, &mut out);
        assert_eq!(&out[..], b"shared");
        // The client's eventfd reached the server: a signal through it wakes the client's.
        rustix::io::write(&s.peer_bytes_ready, &1u64.to_ne_bytes()).unwrap();
        let mut v = [0u8; 8];
        assert_eq!(rustix::io::read(&c.bytes_ready, &mut v).unwrap(), 8);
        assert_eq!(u64::from_ne_bytes(v), 1);
    }

    #[tokio::test]
    async fn a_client_without_a_mapping_is_refused_with_the_reason() {
        let (a, b) = UnixStream::pair().unwrap();
        let h = hello();
        let (sent, refused) = tokio::join!(send(&a, &h, &[]), server(&b));
        sent.unwrap();
        assert!(refused.err().unwrap().to_string().contains("expected 3 file descriptors, got 0"));
        let mut head = [0u8; 16];
        recv(&a, &mut head, 0).await.unwrap();
        let (status, len) = parse_reply(&head).unwrap();
        let mut reason = vec![0; len];
        recv(&a, &mut reason, 0).await.unwrap();
        assert_eq!((status, &reason[..]), (REFUSED, &b"expected 3 file descriptors, got 0"[..]));
    }
}
