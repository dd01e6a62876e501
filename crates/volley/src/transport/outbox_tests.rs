//! The outbox's two ways to the stream (the writer task, and a producer writing directly) and
//! the order, completeness and counts of what arrives.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::task::JoinHandle;

use super::*;
use crate::proto::{Extensions, Message};
use crate::transport::reader::FrameReader;
use crate::transport::stream::ReadHalf;

/// Reads every message until the stream ends cleanly.
async fn read_all(rd: impl ReadHalf, counters: &Counters) -> Vec<Message> {
    let mut reader = FrameReader::new(rd, Limits::default());
    assert!(reader.preamble().await.unwrap(), "the preamble comes first");
    let (mut all, mut batch) = (Vec::new(), Vec::new());
    loop {
        let more = reader.read_batch(&mut batch, usize::MAX, counters).await.unwrap();
        all.append(&mut batch);
        if !more {
            return all;
        }
    }
}

fn tokens(messages: &[Message]) -> Vec<u64> {
    messages
        .iter()
        .map(|m| match m {
            Message::Ping { token } => *token,
            other => panic!("not a ping: {other:?}"),
        })
        .collect()
}

/// Producer `p`'s `seq`-th message, and back.
fn token(p: u64, seq: u64) -> u64 {
    p << 32 | seq
}

/// Each producer's tokens, in the order they arrived.
fn by_producer(tokens: &[u64]) -> HashMap<u64, Vec<u64>> {
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    tokens.iter().for_each(|t| seen.entry(t >> 32).or_default().push(t & 0xffff_ffff));
    seen
}

/// Starts the writer task on one end of a socket pair; returns the other end's read half.
fn start(outbox: &Arc<Outbox>, counters: &Arc<Counters>) -> (JoinHandle<io::Result<()>>, OwnedReadHalf) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (_, wr) = ours.into_split();
    let (o, c) = (outbox.clone(), counters.clone());
    (tokio::spawn(async move { o.write_loop(wr, &c, true).await }), theirs.into_split().0)
}

/// Waits until the writer task has sent the preamble and parked the write half, so producers
/// may write directly.
async fn until_direct(outbox: &Outbox) {
    for _ in 0..100_000 {
        if outbox.state.lock().sink.is_some() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the writer task never parked the write half");
}

/// Starts the writer task on one end of a socket pair and waits until producers may write
/// directly; returns the other end as a plain non-blocking socket, the preamble read, so a test
/// can read without awaiting (nothing but a producer can write meanwhile).
async fn started_with_peer_in_hand()
-> (Arc<Outbox>, Arc<Counters>, JoinHandle<io::Result<()>>, std::os::unix::net::UnixStream) {
    let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let (_, wr) = UnixStream::from_std(ours).unwrap().into_split();
    let outbox = Arc::new(Outbox::new(Limits::default()));
    let counters = Arc::new(Counters::default());
    let writer = {
        let (o, c) = (outbox.clone(), counters.clone());
        tokio::spawn(async move { o.write_loop(wr, &c, true).await })
    };
    until_direct(&outbox).await;
    let mut buf = [0; 1024];
    assert_eq!(theirs.read(&mut buf).unwrap(), PREAMBLE.len(), "the preamble alone");
    (outbox, counters, writer, theirs)
}

/// Many producers on a multi-threaded runtime, writing directly, writing bundles early and
/// queueing in turn: each
/// producer's messages arrive exactly once and in its order, and the counters match what
/// arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_keep_their_order_through_both_paths() {
    const PRODUCERS: u64 = 8;
    const EACH: u64 = 3000;
    let outbox = Arc::new(Outbox::new(Limits::default()));
    let sent = Arc::new(Counters::default());
    let (writer, theirs) = start(&outbox, &sent);
    let received = Counters::default();
    let reader = async { read_all(theirs, &received).await };
    let producers = async {
        until_direct(&outbox).await;
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (outbox, sent) = (outbox.clone(), sent.clone());
                tokio::spawn(async move {
                    for seq in 0..EACH {
                        let t = token(p, seq);
                        match seq % 4 {
                            0 => outbox.push(|fb| fb.ping(t)).unwrap(),
                            // Early bundles: a producer may take the write half between the
                            // writer task seeing work and taking it.
                            1 => outbox.push_and_flush_at(&sent, 4, |fb| fb.ping(t)).unwrap(),
                            _ => outbox.push_and_write(&sent, |fb| fb.ping(t)).unwrap(),
                        }
                        if seq % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        outbox.close();
    };
    let (messages, ()) = tokio::join!(reader, producers);
    writer.await.unwrap().unwrap();
    let seen = by_producer(&tokens(&messages));
    for p in 0..PRODUCERS {
        assert_eq!(seen[&p], (0..EACH).collect::<Vec<_>>(), "producer {p}'s messages, in order, once each");
    }
    assert!(outbox.direct.load(Ordering::Relaxed) > 0, "no producer wrote directly");
    let (s, r) = (sent.snapshot(), received.snapshot());
    assert_eq!(s.messages_sent, PRODUCERS * EACH);
    assert_eq!((s.frames_sent, s.messages_sent), (r.frames_received, r.messages_received));
    assert_eq!(s.bytes_sent, outbox.bytes_written());
}

/// With nothing queued and the stream free, a producer's message is on the stream when its
/// push returns (the writer task has not run); with something queued, it waits its turn.
#[tokio::test]
async fn a_lone_message_is_written_by_its_producer_and_a_queued_one_by_the_writer() {
    let (outbox, counters, writer, mut theirs) = started_with_peer_in_hand().await;
    let mut buf = vec![0; 1024];
    let one = ping_bytes(&[1]);

    // No await between the push and the read: only the producer can have written.
    outbox.push_and_write(&counters, |fb| fb.ping(1)).unwrap();
    let n = theirs.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], &one[..]);
    assert_eq!((counters.snapshot().frames_sent, counters.snapshot().messages_sent), (1, 1));

    // Something queued: the next push joins the queue instead of overtaking it.
    outbox.push(|fb| fb.ping(2)).unwrap();
    outbox.push_and_write(&counters, |fb| fb.ping(3)).unwrap();
    assert_eq!(theirs.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    outbox.close();
    writer.await.unwrap().unwrap();
    let rest = theirs.read(&mut buf).unwrap();
    assert_eq!(&buf[..rest], &ping_bytes(&[2, 3])[..], "one frame, in push order");
    assert_eq!(counters.snapshot().messages_sent, 3);
}

/// Below the threshold a push only queues; the push that brings the queue to it writes the
/// whole bundle (what was queued before it too) as one frame, before the writer task runs.
#[tokio::test]
async fn a_bundle_is_written_early_when_it_reaches_the_threshold() {
    let (outbox, counters, writer, mut theirs) = started_with_peer_in_hand().await;
    let mut buf = vec![0; 1024];

    // No await from here to the reads: only a producer can have written.
    outbox.push(|fb| fb.ping(1)).unwrap();
    for t in 2..=3 {
        outbox.push_and_flush_at(&counters, 4, |fb| fb.ping(t)).unwrap();
    }
    assert_eq!(theirs.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock, "3 of 4: queued");
    outbox.push_and_flush_at(&counters, 4, |fb| fb.ping(4)).unwrap();
    let n = theirs.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], &ping_bytes(&[1, 2, 3, 4])[..], "the whole bundle, in push order");
    assert_eq!(counters.snapshot().messages_sent, 4);

    // The count starts again from what is queued now.
    outbox.push_and_flush_at(&counters, 4, |fb| fb.ping(5)).unwrap();
    assert_eq!(theirs.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    outbox.close();
    writer.await.unwrap().unwrap();
    let rest = theirs.read(&mut buf).unwrap();
    assert_eq!(&buf[..rest], &ping_bytes(&[5])[..], "the rest, by the writer task");
    assert_eq!(outbox.direct.load(Ordering::Relaxed), 1);
}

/// The bytes of one frame holding pings with these tokens.
fn ping_bytes(tokens: &[u64]) -> Vec<u8> {
    let mut fb = FrameBuilder::new(Limits::default());
    tokens.iter().for_each(|&t| fb.ping(t));
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    segs.concat()
}

/// A direct write the socket takes only part of: the writer task sends the rest, then what
/// was queued meanwhile, then ends the stream (the outbox was closed while the rest was
/// still unwritten).
#[tokio::test]
async fn a_partial_direct_write_is_finished_by_the_writer_before_the_queue() {
    let outbox = Arc::new(Outbox::new(Limits::default()));
    let counters = Arc::new(Counters::default());
    let (writer, theirs) = start(&outbox, &counters);
    until_direct(&outbox).await;
    // Far more than a unix socket's buffer, which nobody reads yet.
    let payload: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let request = |fb: &mut FrameBuilder| {
        fb.request(9, 0, &Extensions::NONE, ("s", "m"), |buf| {
            buf.extend_from_slice(&payload);
            Ok::<(), std::convert::Infallible>(())
        })
    };
    outbox.push_and_write(&counters, request).unwrap().unwrap();
    let direct = outbox.bytes_written();
    let total = counters.snapshot().bytes_sent;
    assert!(direct > 0 && direct < total, "a partial direct write: {direct} of {total} bytes");
    outbox.push_and_write(&counters, |fb| fb.ping(1)).unwrap();
    outbox.push(|fb| fb.ping(2)).unwrap();
    outbox.close();
    assert_eq!(outbox.push(|fb| fb.ping(3)), Err(Closed));

    let messages = read_all(theirs, &Counters::default()).await;
    writer.await.unwrap().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    match &messages[0] {
        Message::Request { id: 9, payload: p, .. } => {
            assert!(p[..] == payload[..], "the payload arrives intact")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tokens(&messages[1..]), [1, 2]);
    assert_eq!(counters.snapshot().bytes_sent, outbox.bytes_written());
}

/// Producers writing directly while the outbox is closed under them: every message whose push
/// was accepted arrives, in order, none that was refused, and the stream then ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_during_direct_writes_loses_nothing_accepted() {
    const PRODUCERS: u64 = 4;
    let outbox = Arc::new(Outbox::new(Limits::default()));
    let sent = Arc::new(Counters::default());
    let (writer, theirs) = start(&outbox, &sent);
    let reader = tokio::spawn(async move { read_all(theirs, &Counters::default()).await });
    until_direct(&outbox).await;
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (outbox, sent) = (outbox.clone(), sent.clone());
            tokio::spawn(async move {
                let mut seq = 0;
                while outbox.push_and_write(&sent, |fb| fb.ping(token(p, seq))).is_ok() {
                    seq += 1;
                    if seq % 8 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                seq
            })
        })
        .collect();
    // Close once some messages went out, while the producers keep writing.
    while sent.snapshot().messages_sent < 2000 {
        tokio::task::yield_now().await;
    }
    outbox.close();
    let mut accepted = Vec::new();
    for t in tasks {
        accepted.push(t.await.unwrap());
    }
    writer.await.unwrap().unwrap();
    let seen = by_producer(&tokens(&reader.await.unwrap()));
    for (p, &n) in accepted.iter().enumerate() {
        let got = seen.get(&(p as u64)).cloned().unwrap_or_default();
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "producer {p}: its {n} accepted messages, in order");
    }
    assert_eq!(sent.snapshot().messages_sent, accepted.iter().sum::<u64>());
}

/// A writer task that is dropped (a server gives up on a peer that reads nothing) ends the
/// stream and the outbox, though its write half was parked for direct writes.
#[tokio::test]
async fn dropping_the_writer_ends_the_stream() {
    let outbox = Arc::new(Outbox::new(Limits::default()));
    let counters = Arc::new(Counters::default());
    let (writer, theirs) = start(&outbox, &counters);
    until_direct(&outbox).await;
    outbox.push_and_write(&counters, |fb| fb.ping(1)).unwrap();
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    assert_eq!(outbox.push_and_write(&counters, |fb| fb.ping(2)), Err(Closed));
    let messages = read_all(theirs, &Counters::default()).await;
    assert_eq!(tokens(&messages), [1], "the stream ends after what was written");
}
