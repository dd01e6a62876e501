//! The ring's arithmetic, exhaustively over small capacities, and the ring over a real mapping:
//! bytes come out as they went in across every wrap, a full ring takes nothing more, and a
//! peer that writes garbage into the control words is refused with a typed error.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::Ordering;

use bytes::BytesMut;

use super::*;

const CAPS: [u64; 5] = [1, 2, 4, 8, 16];

/// Stream positions to try: the start, a few laps in, and around the `u64` wrap.
fn positions(cap: u64) -> Vec<u64> {
    let mut p: Vec<u64> = (0..3 * cap + 2).collect();
    p.extend((0..2 * cap + 2).map(|i| u64::MAX - i));
    p
}

#[test]
fn spans_cover_exactly_the_bytes_in_ring_order() {
    for cap in CAPS {
        for pos in positions(cap) {
            for len in 0..=cap as usize {
                let [a, b] = spans(cap, pos, len);
                assert_eq!(a.len() + b.len(), len, "cap {cap} pos {pos} len {len}");
                assert_eq!(a.start as u64, pos % cap);
                assert!(a.end as u64 <= cap && b.end as u64 <= cap);
                if !b.is_empty() {
                    assert_eq!((a.end as u64, b.start), (cap, 0), "wraps at the end of the area");
                }
                // The byte at stream position pos + i is at (pos + i) mod cap.
                let cells: Vec<usize> = a.clone().chain(b.clone()).collect();
                for (i, cell) in cells.iter().enumerate() {
                    assert_eq!(*cell as u64, pos.wrapping_add(i as u64) % cap);
                }
            }
        }
    }
}

#[test]
fn ready_accepts_exactly_a_write_position_within_one_ring_ahead() {
    for cap in CAPS {
        for read in positions(cap) {
            for d in 0..=3 * cap {
                let ahead = ready(cap, read, read.wrapping_add(d));
                assert_eq!(ahead.is_ok(), d <= cap, "cap {cap} read {read} +{d}");
                if d <= cap {
                    assert_eq!(ahead, Ok(d));
                }
                let behind = ready(cap, read, read.wrapping_sub(d + 1));
                assert!(matches!(behind, Err(ProtocolError::Ring(_))), "behind by {}", d + 1);
            }
        }
    }
}

#[test]
fn room_accepts_exactly_a_read_position_between_the_last_seen_and_the_write_position() {
    for cap in CAPS {
        for seen in positions(cap) {
            for unread in 0..=cap {
                let write = seen.wrapping_add(unread);
                for d in 0..=unread {
                    let read = seen.wrapping_add(d);
                    assert_eq!(room(cap, write, seen, read), Ok(cap - (unread - d)), "cap {cap} seen {seen}");
                }
                for bad in
                    [seen.wrapping_sub(1), write.wrapping_add(1), write.wrapping_add(cap), seen ^ (1 << 63)]
                {
                    assert!(room(cap, write, seen, bad).is_err(), "cap {cap} seen {seen} read {bad}");
                }
            }
        }
    }
}

fn ring(cap: usize) -> (Region, RingAt) {
    let region = Region::anonymous(4096 + cap).unwrap();
    (region, RingAt { control: 64, data: 4096, cap })
}

/// A writer and a reader at stream position `start` move `total` bytes through a ring in
/// steps of `wsize`/`rsize`: the bytes come out in order, unchanged.
fn pump(cap: usize, start: u64, total: usize, wsize: usize, rsize: usize) {
    let (region, at) = ring(cap);
    region.u64_at(64 + WRITE_POS).store(start, Ordering::Relaxed);
    region.u64_at(64 + READ_POS).store(start, Ordering::Relaxed);
    let (mut w, mut r) = (RingWriter::starting_at(at, start), RingReader::starting_at(at, start));
    let input: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
    let (mut sent, mut out) = (0, BytesMut::new());
    while out.len() < total {
        let room = w.room(&region).unwrap();
        let chunk = &input[sent..(sent + wsize).min(total)];
        // Two slices, to cover the vectored path.
        let (x, y) = chunk.split_at(chunk.len() / 2);
        let written = w.write(&region, &[IoSlice::new(x), IoSlice::new(y)], room);
        assert_eq!(written.n, chunk.len().min(room));
        sent += written.n;
        let before = out.len();
        let read = r.read(&region, &mut out, rsize).unwrap();
        assert_eq!(read.n, out.len() - before);
        assert!(read.n <= rsize && read.n <= cap);
    }
    assert_eq!(&out[..], &input[..]);
}

#[test]
fn bytes_come_out_as_they_went_in_across_every_wrap() {
    for cap in [4096, 8192] {
        for start in [0, 4095, u64::MAX - 10_000] {
            for (w, r) in [(1, 1), (100, 7), (4096, 4096), (5000, 3000), (3000, 9000), (1, 4096)] {
                pump(cap, start, 50_000, w, r);
            }
        }
    }
}

#[test]
fn a_full_ring_takes_nothing_until_the_reader_frees_room_and_then_wakes_the_writer() {
    let (region, at) = ring(4096);
    let (mut w, mut r) = (RingWriter::new(at), RingReader::new(at));
    let big = vec![9u8; 10_000];
    let room = w.room(&region).unwrap();
    assert_eq!(w.write(&region, &[IoSlice::new(&big)], room).n, 4096);
    assert_eq!(w.room(&region).unwrap(), 0);
    assert_eq!(w.write(&region, &[IoSlice::new(&big)], 0).n, 0);
    w.announce_wait(&region);
    let mut out = BytesMut::new();
    let read = r.read(&region, &mut out, 1000).unwrap();
    assert_eq!(read, Read { n: 1000, wake_writer: true });
    assert_eq!(w.room(&region).unwrap(), 1000);
    // The flag was taken: the next read wakes no one.
    assert!(!r.read(&region, &mut out, 10).unwrap().wake_writer);
}

#[test]
fn the_writer_wakes_the_reader_only_when_it_said_it_sleeps() {
    let (region, at) = ring(4096);
    let (mut w, r) = (RingWriter::new(at), RingReader::new(at));
    let room = w.room(&region).unwrap();
    assert!(!w.write(&region, &[IoSlice::new(b"a")], room).wake_reader);
    r.announce_sleep(&region);
    assert!(w.write(&region, &[IoSlice::new(b"b")], room - 1).wake_reader);
    assert!(!w.write(&region, &[IoSlice::new(b"c")], room - 2).wake_reader, "one wake-up per sleep");
    r.announce_sleep(&region);
    r.cancel_sleep(&region);
    assert!(!w.write(&region, &[IoSlice::new(b"d")], room - 3).wake_reader);
    r.announce_sleep(&region);
    assert!(!r.closed(&region));
    assert!(w.close(&region), "closing wakes a sleeping reader too");
    assert!(r.closed(&region));
}

#[test]
fn garbage_in_the_control_words_is_a_typed_error_and_reads_nothing() {
    let (region, at) = ring(4096);
    let (mut w, mut r) = (RingWriter::new(at), RingReader::new(at));
    let room = w.room(&region).unwrap();
    w.write(&region, &[IoSlice::new(&[1; 100])], room);
    let mut out = BytesMut::new();
    for bad in [4097, u64::MAX, 1 << 40] {
        region.u64_at(64 + WRITE_POS).store(bad, Ordering::Relaxed);
        assert!(matches!(r.ready(&region), Err(ProtocolError::Ring(_))), "{bad}");
        assert!(matches!(r.read(&region, &mut out, 1 << 20), Err(ProtocolError::Ring(_))));
        assert!(out.is_empty());
    }
    region.u64_at(64 + WRITE_POS).store(100, Ordering::Relaxed);
    assert_eq!(r.read(&region, &mut out, 1 << 20).unwrap().n, 100);
    assert_eq!(w.room(&region).unwrap(), 4096, "the writer saw the reader at 100");
    for bad in [99, 101, u64::MAX] {
        let mut w = RingWriter::starting_at(at, 100);
        region.u64_at(64 + READ_POS).store(bad, Ordering::Relaxed);
        assert!(!w.violated());
        assert!(matches!(w.room(&region), Err(ProtocolError::Ring(_))), "{bad}");
        // From then on the position is not trusted: the room is what the last valid one left,
        // whatever the peer writes there now.
        assert!(w.violated());
        region.u64_at(64 + READ_POS).store(100 + 4096, Ordering::Relaxed);
        assert_eq!(w.room(&region), Ok(4096), "{bad}");
        w.write(&region, &[IoSlice::new(&[2; 96])], 96);
        assert_eq!(w.room(&region), Ok(4000), "room only shrinks after a violation");
    }
}

#[test]
fn a_read_position_is_checked_against_the_write_positions_around_its_load() {
    for cap in CAPS {
        for before in positions(cap) {
            for ahead in 0..=cap {
                let after = before.wrapping_add(ahead);
                // Anything from a ring behind `before` up to `after` is possible...
                for d in 0..=cap + ahead {
                    let read = before.wrapping_sub(cap).wrapping_add(d);
                    assert_eq!(check_read_pos(cap, before, read, after), Ok(()), "cap {cap} {before} {d}");
                }
                // ...and nothing else: past the write position, or more than a ring behind.
                for bad in [after.wrapping_add(1), before.wrapping_sub(cap + 1), after ^ (1 << 63)] {
                    assert!(check_read_pos(cap, before, bad, after).is_err(), "cap {cap} {before} {bad}");
                }
            }
        }
    }
}

/// A model check: random writes and reads against a queue, with the capacities and sizes of
/// a seeded generator.
#[test]
fn random_traffic_matches_a_queue() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..200 {
        let cap = 4096 << rng.usize(0..3);
        let (region, at) = ring(cap);
        let (mut w, mut r) = (RingWriter::new(at), RingReader::new(at));
        let mut model = VecDeque::new();
        let mut out = BytesMut::new();
        for _ in 0..200 {
            if rng.bool() {
                let data: Vec<u8> = (0..rng.usize(0..cap * 2)).map(|_| rng.u8(..)).collect();
                let room = w.room(&region).unwrap();
                assert_eq!(room, cap - model.len());
                let n = w.write(&region, &[IoSlice::new(&data)], room).n;
                model.extend(&data[..n]);
            } else {
                out.clear();
                let n = r.read(&region, &mut out, rng.usize(0..cap * 2)).unwrap().n;
                let expected: Vec<u8> = model.drain(..n).collect();
                assert_eq!(&out[..], &expected[..]);
            }
        }
    }
}

/// Blocks on one of the stress test's eventfds until the other side signals it.
fn wait(fd: &std::os::fd::OwnedFd) {
    let mut count = [0u8; 8];
    rustix::io::read(fd, &mut count).expect("eventfd read");
}

fn signal(fd: &std::os::fd::OwnedFd) {
    rustix::io::write(fd, &1u64.to_ne_bytes()).expect("eventfd write");
}

/// The byte at stream position `pos` of the stress test.
fn byte_at(pos: usize) -> u8 {
    (pos * 7 + (pos >> 12)) as u8
}

/// The wake-up protocol across two threads, the way two processes use it: each side sleeps on
/// a blocking eventfd only after announcing it and looking once more, and is woken only if the
/// other side took its flag. Random chunk sizes and pauses make each side in turn the slow
/// one, so both wait thousands of times; a lost wake-up leaves a side asleep for good and the
/// test fails at its deadline instead of passing.
#[test]
fn no_wake_up_is_lost_between_announcing_sleep_and_the_peers_publish() {
    const TOTAL: usize = 16 << 20;
    let (region, at) = ring(4096);
    let region = std::sync::Arc::new(region);
    let blocking = || rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let (bytes_ready, room_ready) = (std::sync::Arc::new(blocking()), std::sync::Arc::new(blocking()));
    let pause = |rng: &mut fastrand::Rng, phase: usize| {
        // In odd phases of 64 KiB the writer dawdles, in even ones the reader.
        if rng.usize(0..4) == 0 {
            (0..rng.usize(0..200)).for_each(|_| std::hint::spin_loop());
            if phase.is_multiple_of(7) {
                std::thread::yield_now();
            }
        }
    };
    let writer = {
        let (region, bytes_ready, room_ready) = (region.clone(), bytes_ready.clone(), room_ready.clone());
        std::thread::spawn(move || {
            let (mut w, mut rng, mut sent, mut waits) =
                (RingWriter::new(at), fastrand::Rng::with_seed(1), 0, 0);
            while sent < TOTAL {
                let room = w.room(&region).unwrap();
                if room == 0 {
                    w.announce_wait(&region);
                    if w.room(&region).unwrap() == 0 {
                        waits += 1;
                        wait(&room_ready);
                    }
                    continue;
                }
                let chunk: Vec<u8> = (sent..(sent + rng.usize(1..3000)).min(TOTAL)).map(byte_at).collect();
                let written = w.write(&region, &[IoSlice::new(&chunk)], room);
                sent += written.n;
                if written.wake_reader {
                    signal(&bytes_ready);
                }
                if !(sent >> 16).is_multiple_of(2) {
                    pause(&mut rng, sent >> 16);
                }
            }
            if w.close(&region) {
                signal(&bytes_ready);
            }
            waits
        })
    };
    let reader = {
        let region = region.clone();
        std::thread::spawn(move || {
            let (mut r, mut rng, mut got, mut sleeps) =
                (RingReader::new(at), fastrand::Rng::with_seed(2), 0, 0);
            let mut out = BytesMut::new();
            loop {
                out.clear();
                let read = r.read(&region, &mut out, rng.usize(1..5000)).unwrap();
                if read.wake_writer {
                    signal(&room_ready);
                }
                if read.n == 0 {
                    if r.closed(&region) && r.ready(&region).unwrap() == 0 {
                        return (got, sleeps);
                    }
                    r.announce_sleep(&region);
                    if r.ready(&region).unwrap() == 0 && !r.closed(&region) {
                        sleeps += 1;
                        wait(&bytes_ready);
                    } else {
                        r.cancel_sleep(&region);
                    }
                    continue;
                }
                assert!(out.iter().enumerate().all(|(i, b)| *b == byte_at(got + i)), "bytes at {got}");
                got += read.n;
                if (got >> 16).is_multiple_of(2) {
                    pause(&mut rng, got >> 16);
                }
            }
        })
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send((writer.join(), reader.join()));
    });
    let (waits, read) = done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a side slept and was never woken: a lost wake-up");
    let (waits, (got, sleeps)) = (waits.unwrap(), read.unwrap());
    assert_eq!(got, TOTAL);
    assert!(waits > 100 && sleeps > 100, "both sides slept many times: writer {waits}, reader {sleeps}");
}
