//! The wake-up channels of a shm connection (docs/PROTOCOL.md §2.1.4): unix stream socket
//! pairs. A side is woken by one byte sent on the end its peer holds, and drains its own end
//! when it wakes.
//!
//! Why sockets and not eventfds: whatever is passed with `SCM_RIGHTS` shares its *open file
//! description* with the sender, and with it the `O_NONBLOCK` flag. A peer that clears that flag
//! on an eventfd and fills its counter (or drains it first) turns our next `write(2)` (or
//! `read(2)`) on it into one that blocks — a runtime thread, and with it every connection of the
//! process, held for as long as the peer likes. Nothing makes a single eventfd call
//! non-blocking regardless of the flag (`pwritev2(RWF_NOWAIT)` answers `EOPNOTSUPP` for an
//! eventfd), checking or re-setting the flag before each call races with the peer, and owning
//! the eventfd does not help, since the peer needs the same file description to wait on it.
//! A socket call takes `MSG_DONTWAIT`, which makes *that call* non-blocking whatever the file's
//! flags: so every `send` and `recv` here is non-blocking by construction, whoever made the
//! socket and whatever the peer did to it since.
//!
//! What the peer can still do costs only itself: leave its end unread until the buffer is
//! full (our send then answers `EAGAIN`, which means a wake-up is already pending there —
//! nothing is lost), shut its end (our send fails: it is not woken), or steal or forge
//! wake-ups (a side that is woken looks at the ring again; one that is not sleeps until the
//! set-up socket or the keepalive says otherwise).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// A new channel: the end this side keeps (to wait on and drain) and the end to pass to the
/// peer (which it sends its wake-ups on). Both non-blocking and close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Checks that a file descriptor the peer passed is the end of a unix stream socket, as a
/// wake-up channel must be.
pub fn check_peer_end(fd: &OwnedFd, what: &str) -> Result<(), String> {
    let not = |why: String| format!("the {what} channel is not a unix stream socket ({why})");
    let domain = rustix::net::sockopt::socket_domain(fd).map_err(|e| not(e.to_string()))?;
    let kind = rustix::net::sockopt::socket_type(fd).map_err(|e| not(e.to_string()))?;
    if domain != AddressFamily::UNIX || kind != SocketType::STREAM {
        return Err(not(format!("domain {domain:?}, type {kind:?}")));
    }
    Ok(())
}

/// Wakes the peer through the end it gave us. Never blocks (`MSG_DONTWAIT`). `EAGAIN` means
/// the peer has not yet read earlier wake-ups, so one is pending already; any other failure
/// (it shut or closed its end) costs the peer its wake-up and nothing else.
pub fn signal(fd: impl AsFd) {
    let _ = rustix::net::send(fd, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// What draining our end found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Nothing left to read now: wait for the next wake-up.
    Empty,
    /// More may be left (the peer sent many): look again before waiting.
    More,
    /// The peer closed its end: it will never wake us again.
    Closed,
}

/// Reads the wake-ups waiting on our end, without blocking (`MSG_DONTWAIT`). Bounded, so a
/// peer that floods its end cannot hold us here.
pub fn drain(fd: impl AsFd) -> Drained {
    let mut buf = [0u8; 256];
    for _ in 0..16 {
        match rustix::net::recv(fd.as_fd(), &mut buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Drained::Closed,
            Ok((n, _)) if n < buf.len() => return Drained::Empty,
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return Drained::Empty,
            Err(_) => return Drained::Closed,
        }
    }
    Drained::More
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clear_nonblock(fd: &OwnedFd) {
        let flags = rustix::fs::fcntl_getfl(fd).unwrap();
        rustix::fs::fcntl_setfl(fd, flags - rustix::fs::OFlags::NONBLOCK).unwrap();
    }

    /// The attack that eventfds cannot survive: the peer clears `O_NONBLOCK` on the shared
    /// file description and fills the channel. A signal still returns at once (the test would
    /// hang otherwise), and the pending wake-ups are still there to be read.
    #[test]
    fn a_signal_never_blocks_even_on_a_full_channel_made_blocking_by_the_peer() {
        let (keep, give) = pair().unwrap();
        clear_nonblock(&give);
        clear_nonblock(&keep);
        // Fill it as a hostile peer would (with MSG_DONTWAIT, so that filling does not block).
        let mut sent = 0usize;
        while rustix::net::send(&give, &[0u8; 4096], SendFlags::DONTWAIT).is_ok() {
            sent += 1;
            assert!(sent < 100_000, "the channel never filled");
        }
        let (done_tx, done) = std::sync::mpsc::channel();
        let signaller = std::thread::spawn(move || {
            for _ in 0..1000 {
                signal(&give);
            }
            let _ = done_tx.send(());
            give
        });
        done.recv_timeout(std::time::Duration::from_secs(30)).expect("a signal blocked");
        let _give = signaller.join().unwrap();
        assert_eq!(drain(&keep), Drained::More, "a full channel is drained in bounded steps");
    }

    #[test]
    fn drain_tells_empty_from_closed_and_never_blocks() {
        let (keep, give) = pair().unwrap();
        clear_nonblock(&keep);
        assert_eq!(drain(&keep), Drained::Empty);
        signal(&give);
        signal(&give);
        assert_eq!(drain(&keep), Drained::Empty);
        assert_eq!(drain(&keep), Drained::Empty, "nothing left, and no block");
        drop(give);
        assert_eq!(drain(&keep), Drained::Closed);
    }

    #[test]
    fn only_unix_stream_sockets_pass_as_a_peer_end() {
        let (_, give) = pair().unwrap();
        assert_eq!(check_peer_end(&give, "test"), Ok(()));
        let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert!(check_peer_end(&efd, "bytes-ready").unwrap_err().contains("bytes-ready"));
        let (d, _) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
                .unwrap();
        assert!(check_peer_end(&d, "room-ready").unwrap_err().contains("room-ready channel is not"));
    }
}
