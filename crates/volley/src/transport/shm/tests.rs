//! The halves of a shm connection over a socket pair: bytes flow both ways, a full ring holds
//! the writer until the reader frees room, the peer's end is seen at once, and a broken ring
//! or a byte on the set-up socket is a typed protocol error.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::*;
use crate::proto::ProtocolError;
use crate::transport::stream::{ByteStream, ReadHalf};

/// A client and a server stream set up over a socket pair, with rings of `ring` bytes.
async fn pair(ring: usize) -> (ShmStream, ShmStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let (c, s) = tokio::join!(handshake::client(&a, ring, "test"), handshake::server(&b, layout::MAX_RING));
    let client = ShmStream::new(c.unwrap(), a, Side::Client, "client".into()).unwrap();
    let server = ShmStream::new(s.unwrap(), b, Side::Server, "server".into()).unwrap();
    (client, server)
}

/// Reads until `n` bytes arrived (or the end, or an error).
async fn read_n(rd: &mut ShmRead, n: usize) -> io::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while buf.len() < n {
        rd.readable().await?;
        match rd.try_read_buf(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if buf.capacity() == buf.len() {
            buf.reserve(64 * 1024);
        }
    }
    Ok(buf)
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
}

#[tokio::test]
async fn bytes_cross_both_ways_including_streams_far_larger_than_the_ring() {
    let (c, s) = pair(4096).await;
    let ((mut c_rd, mut c_wr), (mut s_rd, mut s_wr)) = (c.into_halves(), s.into_halves());
    for n in [1, 4095, 4096, 4097, 100_000] {
        let data = pattern(n);
        let (wrote, got) = tokio::join!(c_wr.write_all(&data), read_n(&mut s_rd, n));
        wrote.unwrap();
        assert_eq!(&got.unwrap()[..], &data[..], "client to server, {n} bytes");
        let (wrote, got) = tokio::join!(s_wr.write_all(&data), read_n(&mut c_rd, n));
        wrote.unwrap();
        assert_eq!(&got.unwrap()[..], &data[..], "server to client, {n} bytes");
    }
}

#[tokio::test]
async fn a_full_ring_holds_the_writer_until_the_reader_frees_room() {
    let (c, s) = pair(4096).await;
    let ((_c_rd, mut c_wr), (mut s_rd, _s_wr)) = (c.into_halves(), s.into_halves());
    let data = pattern(4096 + 1000);
    // Exactly the ring's capacity goes in; the rest waits.
    assert_eq!(c_wr.write(&data).await.unwrap(), 4096);
    let mut rest = Box::pin(c_wr.write_all(&data[4096..]));
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut rest).await.is_err(), "no room, no write");
    // The reader takes everything: the writer is woken and finishes.
    let (done, got) = tokio::join!(rest, read_n(&mut s_rd, data.len()));
    done.unwrap();
    assert_eq!(&got.unwrap()[..], &data[..]);
}

#[tokio::test]
async fn shutting_down_ends_the_stream_after_the_bytes_written_before() {
    let (c, s) = pair(4096).await;
    let ((_c_rd, mut c_wr), (mut s_rd, _s_wr)) = (c.into_halves(), s.into_halves());
    c_wr.write_all(b"last words").await.unwrap();
    c_wr.shutdown().await.unwrap();
    assert_eq!(&read_n(&mut s_rd, 1000).await.unwrap()[..], b"last words");
    let mut buf = BytesMut::with_capacity(16);
    assert_eq!(s_rd.try_read_buf(&mut buf).unwrap(), 0, "the end, as on a socket");
}

#[tokio::test]
async fn the_peers_end_is_seen_at_once_by_a_sleeping_reader_and_a_waiting_writer() {
    let (c, s) = pair(4096).await;
    let ((mut c_rd, mut c_wr), (s_rd, s_wr)) = (c.into_halves(), s.into_halves());
    c_wr.write_all(&pattern(4096)).await.unwrap();
    let reader = tokio::spawn(async move { read_n(&mut c_rd, 1).await.map(|b| b.len()) });
    let writer = tokio::spawn(async move { c_wr.write_all(b"more").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!reader.is_finished() && !writer.is_finished());
    // The server goes away without a word (as a killed process does: its socket closes).
    drop((s_rd, s_wr));
    let ended = tokio::time::timeout(Duration::from_secs(10), async { (reader.await, writer.await) });
    let (read, wrote) = ended.await.expect("both halves noticed the end");
    assert_eq!(read.unwrap().unwrap(), 0, "the reader reads the end of the stream");
    assert_eq!(wrote.unwrap().unwrap_err().kind(), io::ErrorKind::BrokenPipe);
}

fn protocol_error(e: io::Error) -> ProtocolError {
    e.get_ref().and_then(|i| i.downcast_ref::<ProtocolError>()).cloned().unwrap_or_else(|| panic!("{e}"))
}

#[tokio::test]
async fn a_write_position_out_of_range_is_a_typed_protocol_error() {
    let (c, s) = pair(4096).await;
    let region_of_server = s.link.clone();
    let (mut s_rd, _s_wr) = s.into_halves();
    let (_c_rd, mut c_wr) = c.into_halves();
    c_wr.write_all(b"fine").await.unwrap();
    assert_eq!(&read_n(&mut s_rd, 4).await.unwrap()[..], b"fine");
    // Ring A's write position, 10,000 bytes ahead of a ring of 4,096.
    region_of_server
        .region
        .u64_at(layout::CONTROL_A + ring::WRITE_POS)
        .store(10_004, std::sync::atomic::Ordering::Release);
    s_rd.readable().await.unwrap();
    let err = s_rd.try_read_buf(&mut BytesMut::with_capacity(64)).unwrap_err();
    assert!(matches!(protocol_error(err), ProtocolError::Ring(_)));
    // And it stays broken: no later read returns bytes.
    assert!(s_rd.try_read_buf(&mut BytesMut::with_capacity(64)).is_err());
}

#[tokio::test]
async fn a_byte_on_the_set_up_socket_after_the_set_up_is_a_protocol_error() {
    let (a, b) = UnixStream::pair().unwrap();
    let (c, s) = tokio::join!(handshake::client(&a, 4096, "test"), handshake::server(&b, layout::MAX_RING));
    let server = ShmStream::new(s.unwrap(), b, Side::Server, "server".into()).unwrap();
    let _client = c.unwrap();
    a.try_write(b"x").unwrap();
    let (mut rd, _wr) = server.into_halves();
    tokio::time::timeout(Duration::from_secs(10), rd.readable()).await.unwrap().unwrap();
    let err = rd.try_read_buf(&mut BytesMut::with_capacity(64)).unwrap_err();
    assert!(matches!(protocol_error(err), ProtocolError::Ring(m) if m.contains("set-up socket")));
}

#[tokio::test]
async fn a_ring_size_that_is_not_a_power_of_two_is_a_usage_error() {
    let dir = tempfile_dir();
    let path = format!("{}/s.sock", dir.display());
    let _listener = tokio::net::UnixListener::bind(&path).unwrap();
    let err = connect(&path, 3 << 20).await.err().unwrap();
    assert!(matches!(&err, Error::Usage(m) if m.contains("power of two")), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("volley-shm-unit-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The halves' own sleeping and waking (eventfds through tokio, the spin, the flags) across two
/// worker threads: 8 MiB in random chunks through 4 KiB rings, each side pausing at random so
/// that both sleep and both wait for room many times. A lost wake-up hangs a side, and the
/// deadline fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_traffic_between_two_threads_never_loses_a_wake_up() {
    const TOTAL: usize = 8 << 20;
    let (c, s) = pair(4096).await;
    let ((_c_rd, mut c_wr), (mut s_rd, _s_wr)) = (c.into_halves(), s.into_halves());
    let writer = tokio::spawn(async move {
        let (mut rng, mut sent) = (fastrand::Rng::with_seed(3), 0);
        while sent < TOTAL {
            let n = rng.usize(1..6000).min(TOTAL - sent);
            let chunk: Vec<u8> = (sent..sent + n).map(|i| (i * 13 + i / 4093) as u8).collect();
            c_wr.write_all(&chunk).await.unwrap();
            sent += n;
            if rng.usize(0..8) == 0 {
                tokio::time::sleep(Duration::from_micros(rng.u64(0..300))).await;
            }
        }
    });
    let reader = tokio::spawn(async move {
        let (mut rng, mut got) = (fastrand::Rng::with_seed(4), 0);
        while got < TOTAL {
            s_rd.readable().await.unwrap();
            let mut buf = BytesMut::with_capacity(rng.usize(1..9000));
            match s_rd.try_read_buf(&mut buf) {
                Ok(n) => assert!(n > 0 || got == TOTAL, "the end before {TOTAL} bytes"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            }
            assert!(buf.iter().enumerate().all(|(i, b)| *b == ((got + i) * 13 + (got + i) / 4093) as u8));
            got += buf.len();
            if rng.usize(0..8) == 0 {
                tokio::time::sleep(Duration::from_micros(rng.u64(0..300))).await;
            }
        }
        got
    });
    let done = tokio::time::timeout(Duration::from_secs(120), async { (writer.await, reader.await) });
    let (wrote, read) = done.await.expect("a side slept and was never woken");
    wrote.unwrap();
    assert_eq!(read.unwrap(), TOTAL);
}
