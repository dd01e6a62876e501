//! The sans-IO wire format: frames built by `FrameBuilder` decode back to the same messages
//! however the byte stream is cut into reads, and every limit and malformation is reported as
//! the right `ProtocolError` (or `BuildError`) at the right moment.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use volley::proto::encode::BuildError;
use volley::proto::{
    Code, Decoder, Extensions, FrameBuilder, ItemResult, Kind, Limits, Message, Names, PREAMBLE,
    PREAMBLE_LEN, ProtocolError, TraceParent, decode_frame,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Appends `m` to `fb` with the builder call for its kind. Payload-carrying kinds go through the
/// closure-writing form or the ready-made `Bytes` form, chosen by `via_bytes`.
fn push(fb: &mut FrameBuilder, m: &Message, via_bytes: bool) {
    let s = |b: &Bytes| std::str::from_utf8(b).unwrap().to_string();
    match m {
        Message::Request { id, flags, names, ext, payload } => {
            if via_bytes {
                fb.request_bytes(*id, *flags, ext, (names.service(), names.method()), payload.clone())
                    .unwrap();
            } else {
                fb.request::<()>(*id, *flags, ext, (names.service(), names.method()), |b| {
                    b.put_slice(payload);
                    Ok(())
                })
                .unwrap();
            }
        }
        Message::Reply { id, payload } => {
            if via_bytes {
                fb.reply_bytes(*id, payload.clone()).unwrap();
            } else {
                fb.reply::<()>(*id, |b| {
                    b.put_slice(payload);
                    Ok(())
                })
                .unwrap();
            }
        }
        Message::Error { id, code, message } => fb.error(*id, *code, &s(message)),
        Message::Cancel { id } => fb.cancel(*id),
        Message::Ping { token } => fb.ping(*token),
        Message::Pong { token } => fb.pong(*token),
        Message::GoAway { code, message } => fb.go_away(*code, &s(message)),
        Message::Auth { token } => fb.auth(token),
        Message::StreamOpen { id, flags, shape, credit, names, ext, payload } => fb
            .stream_open::<()>(*id, *flags, ext, (names.service(), names.method()), (*shape, *credit), |b| {
                b.put_slice(payload);
                Ok(())
            })
            .unwrap(),
        Message::StreamItem { id, payload } => fb
            .stream_item::<()>(*id, |b| {
                b.put_slice(payload);
                Ok(())
            })
            .unwrap(),
        Message::StreamEnd { id } => fb.stream_end(*id),
        Message::StreamCredit { id, credit } => fb.stream_credit(*id, *credit),
        Message::BatchRequest { id, flags, names, ext, items } => {
            let payloads: Vec<Bytes> = items.requests().collect();
            fb.batch_request::<_, ()>(
                *id,
                *flags,
                ext,
                (names.service(), names.method()),
                &payloads,
                |p, b| {
                    b.put_slice(p);
                    Ok(())
                },
            )
            .unwrap();
        }
        Message::BatchReply { id, items } => fb
            .batch_reply(*id, |out| {
                for r in items.replies() {
                    match r {
                        ItemResult::Ok(p) => out.ok::<&str>(|b| {
                            b.put_slice(&p);
                            Ok(())
                        }),
                        ItemResult::Err { code, message } => out.err(code, &s(&message)),
                    }
                }
            })
            .unwrap(),
    }
}

/// Batch messages can only be made by decoding (their items are validated on the way in):
/// build one with the builder and decode it back.
fn built(build: impl FnOnce(&mut FrameBuilder)) -> Message {
    let mut fb = FrameBuilder::new(Limits::default());
    build(&mut fb);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    let mut buf = BytesMut::new();
    for seg in segs {
        buf.extend_from_slice(&seg);
    }
    let body = Decoder::after_preamble(Limits::default()).next_frame(&mut buf).unwrap().unwrap();
    let mut out = Vec::new();
    decode_frame(&body, &Limits::default(), &mut out).unwrap();
    out.pop().unwrap()
}

fn batch_request_strategy() -> impl Strategy<Value = Message> {
    (
        any::<u64>(),
        any::<u8>(),
        name_strategy(),
        name_strategy(),
        prop::collection::vec(payload_strategy(300), 0..8),
        ext_strategy(),
    )
        .prop_map(|(id, flags, service, method, payloads, ext)| {
            built(|fb| {
                let (service, method) = (
                    String::from_utf8(service.to_vec()).unwrap(),
                    String::from_utf8(method.to_vec()).unwrap(),
                );
                fb.batch_request::<_, ()>(id, flags, &ext, (&service, &method), &payloads, |p, b| {
                    b.put_slice(p);
                    Ok(())
                })
                .unwrap()
            })
        })
}

fn batch_reply_strategy() -> impl Strategy<Value = Message> {
    let item =
        prop_oneof![payload_strategy(300).prop_map(Ok), (code_strategy(), text_strategy()).prop_map(Err),];
    (any::<u64>(), prop::collection::vec(item, 0..8)).prop_map(|(id, items)| {
        built(|fb| {
            fb.batch_reply(id, |out| {
                for item in &items {
                    match item {
                        Ok(p) => out.ok::<&str>(|b| {
                            b.put_slice(p);
                            Ok(())
                        }),
                        Err((code, text)) => out.err(*code, std::str::from_utf8(text).unwrap()),
                    }
                }
            })
            .unwrap()
        })
    })
}

/// The whole byte stream a peer would send: preamble, then every message, framed under
/// `limits`. Also returns the builder's (frames, messages) counts.
fn encode_stream(msgs: &[(Message, bool)], limits: Limits) -> (Vec<u8>, (u64, u64)) {
    let mut fb = FrameBuilder::new(limits);
    for (m, via_bytes) in msgs {
        push(&mut fb, m, *via_bytes);
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert!(fb.is_empty(), "take_into leaves nothing queued");
    let mut stream = PREAMBLE.to_vec();
    for s in &segs {
        stream.extend_from_slice(s);
    }
    (stream, fb.counts())
}

/// Feeds `chunks` one after the other into one receive buffer, decoding every complete frame
/// after each chunk, the way the transport reader does.
fn decode_chunks<'a>(
    chunks: impl IntoIterator<Item = &'a [u8]>,
    limits: Limits,
) -> Result<(Vec<Message>, usize), ProtocolError> {
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut frames = 0;
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Some(body) = dec.next_frame(&mut buf)? {
            decode_frame(&body, &limits, &mut out)?;
            frames += 1;
        }
        // Whatever is left is an incomplete preamble or frame, and the decoder must ask for
        // more of it.
        assert!(dec.missing(&buf) > 0, "next_frame returned None but missing() says nothing is missing");
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok((out, frames))
}

/// Splits the frames of a stream that starts *after* the preamble: the total length (prefix
/// included) of each frame, in order.
fn frame_sizes(mut body: &[u8]) -> Vec<usize> {
    let mut sizes = Vec::new();
    while !body.is_empty() {
        let len = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
        sizes.push(4 + len);
        body = &body[4 + len..];
    }
    sizes
}

fn name_strategy() -> impl Strategy<Value = Bytes> {
    // Up to 40 characters of any script: at most 160 bytes, under the 255-byte name limit.
    prop_oneof![
        "[a-z][a-z0-9_.]{0,20}".prop_map(|s| Bytes::from(s.into_bytes())),
        "\\PC{0,40}".prop_map(|s| Bytes::from(s.into_bytes())),
    ]
}

fn text_strategy() -> impl Strategy<Value = Bytes> {
    "\\PC{0,60}".prop_map(|s| Bytes::from(s.into_bytes()))
}

fn payload_strategy(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

/// Request extensions: none, a deadline, a trace context, or both.
fn ext_strategy() -> impl Strategy<Value = Extensions> {
    let trace =
        (any::<[u8; 16]>(), any::<[u8; 8]>(), any::<u8>()).prop_filter_map("valid ids", |(t, p, f)| {
            (t != [0; 16] && p != [0; 8]).then_some(TraceParent { trace_id: t, parent_id: p, flags: f })
        });
    (prop::option::of(any::<u32>()), prop::option::of(trace)).prop_map(|(deadline_micros, trace_parent)| {
        Extensions { deadline_micros, trace_parent: trace_parent.map(Box::new), ..Extensions::NONE }
    })
}

fn code_strategy() -> impl Strategy<Value = Code> {
    // Through from_u16 so that `Other` never carries a number that has a name.
    prop_oneof![1u16..=13, any::<u16>()].prop_map(Code::from_u16)
}

/// Any message, plus whether payloads go through the `Bytes` form of the builder.
fn message_strategy(max_payload: usize) -> impl Strategy<Value = (Message, bool)> {
    let msg = prop_oneof![
        (
            any::<u64>(),
            any::<u8>(),
            name_strategy(),
            name_strategy(),
            ext_strategy(),
            payload_strategy(max_payload)
        )
            .prop_map(|(id, flags, service, method, ext, payload)| Message::Request {
                id,
                // The builder sets the extensions flag exactly when there are extensions.
                flags: if ext.is_empty() { flags & !0x02 } else { flags | 0x02 },
                names: Names::new(
                    std::str::from_utf8(&service).unwrap(),
                    std::str::from_utf8(&method).unwrap()
                ),
                ext,
                payload,
            }),
        (any::<u64>(), payload_strategy(max_payload))
            .prop_map(|(id, payload)| Message::Reply { id, payload }),
        (any::<u64>(), code_strategy(), text_strategy()).prop_map(|(id, code, message)| Message::Error {
            id,
            code,
            message
        }),
        any::<u64>().prop_map(|id| Message::Cancel { id }),
        any::<u64>().prop_map(|token| Message::Ping { token }),
        any::<u64>().prop_map(|token| Message::Pong { token }),
        (code_strategy(), text_strategy()).prop_map(|(code, message)| Message::GoAway { code, message }),
        payload_strategy(max_payload.min(4096)).prop_map(|token| Message::Auth { token }),
        (
            (any::<u64>(), any::<u8>(), any::<u8>(), any::<u32>()),
            name_strategy(),
            name_strategy(),
            ext_strategy(),
            payload_strategy(max_payload)
        )
            .prop_map(|((id, flags, shape, credit), service, method, ext, payload)| {
                Message::StreamOpen {
                    id,
                    flags: if ext.is_empty() { flags & !0x02 } else { flags | 0x02 },
                    shape,
                    credit,
                    names: Names::new(
                        std::str::from_utf8(&service).unwrap(),
                        std::str::from_utf8(&method).unwrap(),
                    ),
                    ext,
                    payload,
                }
            }),
        (any::<u64>(), payload_strategy(max_payload))
            .prop_map(|(id, payload)| Message::StreamItem { id, payload }),
        any::<u64>().prop_map(|id| Message::StreamEnd { id }),
        (any::<u64>(), any::<u32>()).prop_map(|(id, credit)| Message::StreamCredit { id, credit }),
        batch_request_strategy(),
        batch_reply_strategy(),
    ];
    (msg, any::<bool>())
}

/// Default limits, or small ones that force the builder to cut many frames (by message count
/// and by size). Every generated message (payload < 2000 bytes, names < 170 bytes) still fits
/// one frame.
fn limits_strategy() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        (1usize..=6, 2600usize..=8000).prop_map(|(max_messages_per_frame, max_frame_len)| {
            Limits::default().max_frame_len(max_frame_len).max_messages_per_frame(max_messages_per_frame)
        }),
    ]
}

fn only_messages(msgs: &[(Message, bool)]) -> Vec<Message> {
    msgs.iter().map(|(m, _)| m.clone()).collect()
}

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// (a) A small stream split in two at every byte position decodes to the same messages.
    #[test]
    fn split_at_every_byte_boundary(
        msgs in prop::collection::vec(message_strategy(2000), 1..5),
        limits in limits_strategy(),
    ) {
        let (stream, _) = encode_stream(&msgs, limits);
        let expected = only_messages(&msgs);
        for at in 0..=stream.len() {
            let (head, tail) = stream.split_at(at);
            let (got, _) = decode_chunks([head, tail], limits)
                .map_err(|e| TestCaseError::fail(format!("split at {at}: {e}")))?;
            prop_assert_eq!(&got, &expected, "split at {}", at);
        }
    }

    /// (b) A larger stream cut into random chunk sizes (1 byte up to several frames) decodes to
    /// the same messages.
    #[test]
    fn random_chunk_sizes(
        msgs in prop::collection::vec(message_strategy(2000), 1..40),
        limits in limits_strategy(),
        sizes in prop::collection::vec(1usize..3000, 1..64),
    ) {
        let (stream, _) = encode_stream(&msgs, limits);
        let mut chunks = Vec::new();
        let (mut pos, mut i) = (0, 0);
        while pos < stream.len() {
            let n = sizes[i % sizes.len()].min(stream.len() - pos);
            chunks.push(&stream[pos..pos + n]);
            pos += n;
            i += 1;
        }
        let (got, _) = decode_chunks(chunks.iter().copied(), limits)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(got, only_messages(&msgs));
    }

    /// (c) The whole stream in one read: many frames come out of one buffer, and the number
    /// of frames decoded is the number the builder says it cut.
    #[test]
    fn all_at_once(
        msgs in prop::collection::vec(message_strategy(2000), 1..60),
        limits in limits_strategy(),
    ) {
        let (stream, (frames, messages)) = encode_stream(&msgs, limits);
        prop_assert_eq!(messages as usize, msgs.len());
        let (got, decoded_frames) = decode_chunks([&stream[..]], limits)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(got, only_messages(&msgs));
        prop_assert_eq!(decoded_frames as u64, frames);
        // No frame breaks the limits the builder was given.
        let sizes = frame_sizes(&stream[PREAMBLE_LEN..]);
        prop_assert_eq!(sizes.len() as u64, frames);
        for s in sizes {
            prop_assert!(s - 4 <= limits.max_frame_len);
        }
    }

    /// (d) A reader that reads exactly `missing()` bytes each time gets a frame every time the
    /// frame's length prefix was already known (`missing` is exact then), and is never asked
    /// for bytes past the end of the frame it is completing (a lower bound before that).
    #[test]
    fn reading_exactly_missing_bytes(
        msgs in prop::collection::vec(message_strategy(2000), 1..20),
        limits in limits_strategy(),
    ) {
        let (stream, (frames, _)) = encode_stream(&msgs, limits);
        // Where each frame ends in the stream.
        let ends: Vec<usize> = frame_sizes(&stream[PREAMBLE_LEN..])
            .iter()
            .scan(PREAMBLE_LEN, |end, size| {
                *end += size;
                Some(*end)
            })
            .collect();
        let mut dec = Decoder::new(limits);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let (mut pos, mut got_frames) = (0, 0u64);
        // The preamble first (and at most the first frame's length prefix with it).
        prop_assert!((1..=PREAMBLE_LEN + 4).contains(&dec.missing(&buf)));
        while pos < stream.len() {
            let want = dec.missing(&buf);
            prop_assert!(want > 0);
            let frame_end = *ends.iter().find(|&&e| e > pos).unwrap();
            prop_assert!(
                pos + want <= frame_end,
                "at {}: missing() asks for {} bytes, the frame ends at {}", pos, want, frame_end
            );
            let knew_length = pos >= PREAMBLE_LEN && buf.len() >= 4;
            buf.extend_from_slice(&stream[pos..pos + want]);
            pos += want;
            match dec.next_frame(&mut buf).map_err(|e| TestCaseError::fail(e.to_string()))? {
                Some(body) => {
                    decode_frame(&body, &limits, &mut out)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    got_frames += 1;
                    prop_assert!(buf.is_empty());
                }
                None => prop_assert!(
                    !knew_length,
                    "fed exactly missing() bytes of a frame of known length, still no frame"
                ),
            }
        }
        prop_assert_eq!(got_frames, frames);
        prop_assert_eq!(out, only_messages(&msgs));
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic tests: limits and malformations
// ---------------------------------------------------------------------------------------------

fn small_limits() -> Limits {
    Limits::default().max_frame_len(1000).max_messages_per_frame(4)
}

/// A frame (length prefix + body) holding exactly `body`.
fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn oversized_frame_is_rejected_as_soon_as_the_prefix_arrives() {
    let limits = small_limits();
    let too_long = (limits.max_frame_len as u32 + 1).to_le_bytes();

    // Three bytes of the prefix: nothing to say yet.
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&PREAMBLE[..]);
    buf.extend_from_slice(&too_long[..3]);
    assert_eq!(dec.next_frame(&mut buf), Ok(None));
    // The fourth byte: rejected at once, not a byte of the body needed.
    buf.extend_from_slice(&too_long[3..]);
    assert_eq!(
        dec.next_frame(&mut buf),
        Err(ProtocolError::FrameTooLarge { len: limits.max_frame_len + 1, max: limits.max_frame_len })
    );

    // Also straight after the preamble in the same buffer, and for a huge prefix.
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&PREAMBLE[..]);
    buf.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        dec.next_frame(&mut buf),
        Err(ProtocolError::FrameTooLarge { len: u32::MAX as usize, max: limits.max_frame_len })
    );

    // Exactly at the limit is allowed: the decoder waits for the body.
    let mut dec = Decoder::after_preamble(limits);
    let mut buf = BytesMut::from(&(limits.max_frame_len as u32).to_le_bytes()[..]);
    assert_eq!(dec.next_frame(&mut buf), Ok(None));
    assert_eq!(dec.missing(&buf), limits.max_frame_len);
}

#[test]
fn empty_frame_is_rejected() {
    let mut dec = Decoder::after_preamble(small_limits());
    let mut buf = BytesMut::from(&0u32.to_le_bytes()[..]);
    assert_eq!(dec.next_frame(&mut buf), Err(ProtocolError::EmptyFrame));
    let mut out = Vec::new();
    assert_eq!(decode_frame(&Bytes::new(), &small_limits(), &mut out), Err(ProtocolError::EmptyFrame));
}

#[test]
fn too_many_messages_in_one_frame() {
    // Five pings bundled into one frame by a builder with roomier limits.
    let mut fb = FrameBuilder::new(Limits::default());
    for t in 0..5 {
        fb.ping(t);
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (1, 5));
    let frame: Vec<u8> = segs.concat();

    let strict = Limits::default().max_messages_per_frame(4);
    let mut dec = Decoder::after_preamble(strict);
    let mut buf = BytesMut::from(&frame[..]);
    let body = dec.next_frame(&mut buf).unwrap().expect("a whole frame");
    // Something decoded earlier stays; nothing of the bad frame is appended.
    let mut out = vec![Message::Ping { token: 99 }];
    assert_eq!(decode_frame(&body, &strict, &mut out), Err(ProtocolError::TooManyMessages { max: 4 }));
    assert_eq!(out, vec![Message::Ping { token: 99 }]);

    // Five is fine when the limit is five.
    let five = Limits::default().max_messages_per_frame(5);
    let mut out = Vec::new();
    decode_frame(&body, &five, &mut out).unwrap();
    assert_eq!(out, (0..5).map(|token| Message::Ping { token }).collect::<Vec<_>>());
}

#[test]
fn truncated_message_inside_a_frame_is_malformed() {
    let limits = Limits::default();
    // A complete cancel, then a reply whose payload length says 10 but carries 5 bytes.
    let mut body = vec![Kind::Cancel as u8];
    body.extend_from_slice(&7u64.to_le_bytes());
    body.push(Kind::Reply as u8);
    body.extend_from_slice(&8u64.to_le_bytes());
    body.extend_from_slice(&10u32.to_le_bytes());
    body.extend_from_slice(b"12345");
    let mut out = Vec::new();
    let err = decode_frame(&Bytes::from(body), &limits, &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::Malformed(_)), "{err:?}");
    assert!(out.is_empty(), "a bad frame appends nothing: {out:?}");

    // Cut inside a fixed-size field: a ping with 3 of its 8 token bytes.
    let body = Bytes::from(vec![Kind::Ping as u8, 1, 2, 3]);
    let err = decode_frame(&body, &limits, &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::Malformed(_)), "{err:?}");

    // A request whose service-name length runs past the end.
    let mut body = vec![Kind::Request as u8, 0];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(200);
    body.extend_from_slice(b"svc");
    let err = decode_frame(&Bytes::from(body), &limits, &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::Malformed(_)), "{err:?}");

    // A go-away whose message is not UTF-8.
    let mut body = vec![Kind::GoAway as u8];
    body.extend_from_slice(&12u16.to_le_bytes());
    body.extend_from_slice(&2u32.to_le_bytes());
    body.extend_from_slice(&[0xff, 0xfe]);
    let err = decode_frame(&Bytes::from(body), &limits, &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::Malformed(_)), "{err:?}");
    assert!(out.is_empty());
}

#[test]
fn unknown_kind_byte() {
    let limits = Limits::default();
    for kind in [0x00u8, 0x0b, 0x63, 0xff] {
        // Through the decoder, after a valid preamble, with a valid message before it.
        let mut body = vec![Kind::Ping as u8];
        body.extend_from_slice(&1u64.to_le_bytes());
        body.push(kind);
        body.extend_from_slice(&[0; 16]);
        let mut stream = PREAMBLE.to_vec();
        stream.extend_from_slice(&raw_frame(&body));
        let mut dec = Decoder::new(limits);
        let mut buf = BytesMut::from(&stream[..]);
        let frame = dec.next_frame(&mut buf).unwrap().unwrap();
        let mut out = Vec::new();
        assert_eq!(decode_frame(&frame, &limits, &mut out), Err(ProtocolError::UnknownKind(kind)));
        assert!(out.is_empty());
    }
}

#[test]
fn bad_magic_and_bad_version() {
    let limits = Limits::default();
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
    assert_eq!(dec.next_frame(&mut buf), Err(ProtocolError::BadMagic(*b"GET ")));

    // Seven bytes of a bad preamble: not judged before the eighth.
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&b"GET / H"[..]);
    assert_eq!(dec.next_frame(&mut buf), Ok(None));
    // At least the last preamble byte; at most that and a frame's length prefix.
    assert!((1..=5).contains(&dec.missing(&buf)), "{}", dec.missing(&buf));
    buf.put_u8(b'T');
    assert_eq!(dec.next_frame(&mut buf), Err(ProtocolError::BadMagic(*b"GET ")));

    for version in [0u8, 2, 255] {
        let mut p = PREAMBLE;
        p[4] = version;
        let mut dec = Decoder::new(limits);
        let mut buf = BytesMut::from(&p[..]);
        assert_eq!(dec.next_frame(&mut buf), Err(ProtocolError::UnsupportedVersion(version)));
    }

    // Reserved bytes are ignored; the preamble is consumed and a frame follows.
    let mut p = PREAMBLE.to_vec();
    p[5..8].copy_from_slice(&[1, 2, 3]);
    let mut body = vec![Kind::Pong as u8];
    body.extend_from_slice(&42u64.to_le_bytes());
    p.extend_from_slice(&raw_frame(&body));
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&p[..]);
    let frame = dec.next_frame(&mut buf).unwrap().unwrap();
    let mut out = Vec::new();
    decode_frame(&frame, &limits, &mut out).unwrap();
    assert_eq!(out, vec![Message::Pong { token: 42 }]);
}

#[test]
fn missing_reports_exactly_what_a_partial_frame_needs() {
    let limits = Limits::default();
    let mut fb = FrameBuilder::new(limits);
    fb.reply_bytes(5, Bytes::from(vec![7u8; 300])).unwrap();
    fb.ping(1);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    let frame: Vec<u8> = segs.concat();
    assert_eq!(frame_sizes(&frame), vec![frame.len()], "one frame");
    let total = frame.len();

    for have in 0..total {
        let mut dec = Decoder::after_preamble(limits);
        let mut buf = BytesMut::from(&frame[..have]);
        assert_eq!(dec.next_frame(&mut buf), Ok(None), "{have} bytes");
        let expected = if have < 4 { 4 - have } else { total - have };
        assert_eq!(dec.missing(&buf), expected, "{have} of {total} bytes");
        assert_eq!(buf.len(), have, "a partial frame is left in place");
    }
    let mut dec = Decoder::after_preamble(limits);
    let mut buf = BytesMut::from(&frame[..]);
    assert_eq!(dec.missing(&buf), 0);
    assert!(dec.next_frame(&mut buf).unwrap().is_some());

    // A fresh decoder, preamble and frame in one buffer (next_frame not called yet). Before
    // the length prefix is complete: a lower bound, never 0 and never past the prefix. After:
    // exact.
    let mut stream = PREAMBLE.to_vec();
    stream.extend_from_slice(&frame);
    for have in 0..stream.len() {
        let dec = Decoder::new(limits);
        let buf = BytesMut::from(&stream[..have]);
        let m = dec.missing(&buf);
        if have < PREAMBLE_LEN + 4 {
            assert!(m >= 1 && m <= PREAMBLE_LEN + 4 - have, "{have} bytes: missing {m}");
        } else {
            assert_eq!(m, stream.len() - have, "{have} bytes");
        }
    }
    let dec = Decoder::new(limits);
    assert_eq!(dec.missing(&BytesMut::from(&stream[..])), 0);
}

/// `missing` answers 0 only if `next_frame` can return a frame now: also on a fresh decoder
/// whose buffer holds the whole preamble plus part of a frame (at the start of this work it
/// answered 0 there, though `next_frame` then returned `None`).
#[test]
fn missing_is_not_zero_while_the_preamble_is_still_buffered() {
    let limits = Limits::default();
    let mut stream = PREAMBLE.to_vec();
    let mut body = vec![Kind::Ping as u8];
    body.extend_from_slice(&1u64.to_le_bytes());
    stream.extend_from_slice(&raw_frame(&body));
    // Preamble + the length prefix + 2 of the 9 body bytes: 7 bytes short.
    let cut = PREAMBLE_LEN + 4 + 2;
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&stream[..cut]);
    let reported = dec.missing(&buf);
    assert_eq!(dec.next_frame(&mut buf), Ok(None));
    assert_eq!(reported, 7, "missing() before next_frame");
}

// ---------------------------------------------------------------------------------------------
// Deterministic tests: the builder
// ---------------------------------------------------------------------------------------------

#[test]
fn builder_rejects_oversized_payload_and_queues_nothing() {
    let limits = small_limits(); // max_frame_len 1000
    let big = vec![1u8; 2000];

    // Closure-written payload, on an empty builder.
    let mut fb = FrameBuilder::new(limits);
    let r = fb.reply::<()>(1, |b| {
        b.put_slice(&big);
        Ok(())
    });
    // kind (1) + id (8) + payload length (4) + payload.
    assert!(matches!(r, Err(BuildError::TooLarge { len: 2013, max: 1000 })), "{r:?}");
    assert!(fb.is_empty());
    assert_eq!(fb.queued_len(), 0);
    assert_eq!(fb.counts(), (0, 0));
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert!(segs.is_empty(), "nothing queued: {segs:?}");

    // Ready-made payloads (copied and zero-copy sizes), and a request.
    let mut fb = FrameBuilder::new(limits);
    let r = fb.reply_bytes(1, Bytes::from(big.clone()));
    assert!(matches!(r, Err(BuildError::TooLarge { len: 2013, max: 1000 })), "{r:?}");
    let r = fb.reply_bytes(1, Bytes::from(vec![0u8; 20_000]));
    assert!(matches!(r, Err(BuildError::TooLarge { max: 1000, .. })), "{r:?}");
    let r = fb.request::<()>(2, 0, &Extensions::NONE, ("svc", "m"), |b| {
        b.put_slice(&big);
        Ok(())
    });
    assert!(matches!(r, Err(BuildError::TooLarge { max: 1000, .. })), "{r:?}");
    assert!(fb.is_empty());
    assert_eq!(fb.queued_len(), 0);

    // With messages already queued in the open frame: they stay, intact and alone.
    let mut fb = FrameBuilder::new(limits);
    fb.ping(1);
    fb.reply_bytes(2, Bytes::from_static(b"ok")).unwrap();
    let before = fb.queued_len();
    let r = fb.request_bytes(3, 0, &volley::proto::Extensions::NONE, ("svc", "m"), Bytes::from(big.clone()));
    assert!(matches!(r, Err(BuildError::TooLarge { .. })), "{r:?}");
    let r = fb.reply::<()>(4, |b| {
        b.put_slice(&big);
        Ok(())
    });
    assert!(matches!(r, Err(BuildError::TooLarge { .. })), "{r:?}");
    assert_eq!(fb.queued_len(), before);
    fb.pong(5);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (1, 3));
    let mut stream = PREAMBLE.to_vec();
    stream.extend_from_slice(&segs.concat());
    let (msgs, frames) = decode_chunks([&stream[..]], limits).unwrap();
    assert_eq!(frames, 1);
    assert_eq!(
        msgs,
        vec![
            Message::Ping { token: 1 },
            Message::Reply { id: 2, payload: Bytes::from_static(b"ok") },
            Message::Pong { token: 5 },
        ]
    );

    // Names over 255 bytes.
    let long = "x".repeat(256);
    let mut fb = FrameBuilder::new(Limits::default());
    let r = fb.request_bytes(1, 0, &volley::proto::Extensions::NONE, (&long, "m"), Bytes::new());
    assert!(matches!(r, Err(BuildError::TooLarge { len: 256, max: 255 })), "{r:?}");
    let r = fb.request_bytes(1, 0, &volley::proto::Extensions::NONE, ("s", &long), Bytes::new());
    assert!(matches!(r, Err(BuildError::TooLarge { .. })), "{r:?}");
    assert!(fb.is_empty());
}

#[test]
fn payload_encoder_error_queues_nothing() {
    let mut fb = FrameBuilder::new(Limits::default());
    fb.ping(1);
    let before = fb.queued_len();
    let r = fb.request(9, 0, &volley::proto::Extensions::NONE, ("svc", "m"), |b| {
        b.put_slice(b"half written");
        Err("encoder failed")
    });
    assert!(matches!(r, Err(BuildError::Payload("encoder failed"))));
    assert_eq!(fb.queued_len(), before);

    let mut fb = FrameBuilder::new(Limits::default());
    let r = fb.reply(9, |b| {
        b.put_slice(b"half written");
        Err(())
    });
    assert!(matches!(r, Err(BuildError::Payload(()))));
    assert!(fb.is_empty());
}

#[test]
fn builder_cuts_frames_by_message_count() {
    let limits = Limits::default().max_messages_per_frame(3);
    let mut fb = FrameBuilder::new(limits);
    for t in 0..10 {
        fb.ping(t);
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (4, 10));
    let bytes = segs.concat();
    let sizes = frame_sizes(&bytes);
    // 3 + 3 + 3 + 1 pings of 9 bytes each.
    assert_eq!(sizes, vec![4 + 27, 4 + 27, 4 + 27, 4 + 9]);

    let mut stream = PREAMBLE.to_vec();
    stream.extend_from_slice(&bytes);
    let (msgs, frames) = decode_chunks([&stream[..]], limits).unwrap();
    assert_eq!(frames, 4);
    assert_eq!(msgs, (0..10).map(|token| Message::Ping { token }).collect::<Vec<_>>());

    // A second batch continues the counts and starts a fresh frame.
    fb.pong(1);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (5, 11));
    assert_eq!(frame_sizes(&segs.concat()), vec![4 + 9]);
}

#[test]
fn builder_cuts_frames_by_size() {
    // Replies of 1 + 8 + 4 + 400 = 413 bytes: two fit in 1000, a third does not.
    let limits = small_limits();
    let limits = limits.max_messages_per_frame(100);
    let mut fb = FrameBuilder::new(limits);
    for id in 0..5 {
        fb.reply_bytes(id, Bytes::from(vec![id as u8; 400])).unwrap();
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    let bytes = segs.concat();
    assert_eq!(frame_sizes(&bytes), vec![4 + 826, 4 + 826, 4 + 413]);
    assert_eq!(fb.counts(), (3, 5));
    let mut stream = PREAMBLE.to_vec();
    stream.extend_from_slice(&bytes);
    let (msgs, _) = decode_chunks([&stream[..]], limits).unwrap();
    let ids: Vec<u64> = msgs
        .iter()
        .map(|m| match m {
            Message::Reply { id, payload } => {
                assert_eq!(payload.len(), 400);
                assert!(payload.iter().all(|&b| b == *id as u8));
                *id
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

#[test]
fn zero_copy_payloads_keep_stream_order() {
    // Large `Bytes` payloads become their own segments; the concatenated segments must still
    // be the messages in the order they were appended, whatever the read boundaries.
    let limits = Limits::default();
    let big_a = Bytes::from((0..40_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let big_b = Bytes::from(vec![0xabu8; 16 * 1024]);
    let msgs = vec![
        (Message::Ping { token: 1 }, false),
        (Message::Reply { id: 2, payload: big_a.clone() }, true),
        (Message::Cancel { id: 3 }, false),
        (
            Message::Request {
                id: 4,
                flags: 1,
                names: Names::new("svc", "put"),
                ext: Extensions::NONE,
                payload: big_b.clone(),
            },
            true,
        ),
        (Message::Reply { id: 5, payload: Bytes::from_static(b"small") }, true),
    ];
    let (stream, (frames, messages)) = encode_stream(&msgs, limits);
    assert_eq!(messages, 5);
    // ping | big_a | cancel | big_b | small reply
    assert_eq!(frames, 5);
    let expected = only_messages(&msgs);
    let (got, decoded_frames) = decode_chunks([&stream[..]], limits).unwrap();
    assert_eq!(got, expected);
    assert_eq!(decoded_frames, 5);
    for chunk in [1usize, 7, 4096, 16_389] {
        let (got, _) = decode_chunks(stream.chunks(chunk), limits).unwrap();
        assert_eq!(got, expected, "chunks of {chunk}");
    }
}

/// The preamble's features byte reaches the decoder, and a request with extensions, as
/// PROTOCOL.md §6.2.2 spells it out byte by byte, decodes to those extensions.
#[test]
fn preamble_features_and_the_documented_extension_example_decode() {
    let limits = Limits::default();
    let mut d = Decoder::new(limits);
    let mut buf = BytesMut::from(&volley::proto::SERVER_PREAMBLE[..]);
    assert_eq!(d.next_frame(&mut buf).unwrap(), None);
    assert_eq!(d.peer_features(), 7, "the server announces request extensions, streams and fingerprints");

    let body: Vec<u8> = [
        &[0x01, 0x02][..],
        &1u64.to_le_bytes(),
        b"\x04echo\x04echo",
        &[0x06, 0x00, 0x01, 0x04, 0x90, 0xd0, 0x03, 0x00],
        &[0x02, 0x00, 0x00, 0x00, b'h', b'i'],
    ]
    .concat();
    let mut msgs = Vec::new();
    decode_frame(&Bytes::from(body), &limits, &mut msgs).unwrap();
    let Message::Request { ext, payload, flags, .. } = &msgs[0] else { panic!("{msgs:?}") };
    assert_eq!((ext.deadline_micros, ext.trace_parent.as_deref(), *flags), (Some(250_000), None, 0x02));
    assert_eq!(&payload[..], b"hi");
}

/// The server stream of PROTOCOL.md §12.5, byte for byte: what `FrameBuilder` writes for it,
/// and what it decodes to.
#[test]
fn the_documented_stream_example_decodes() {
    let id = 0x0000_0001_0000_0000u64;
    let unhex = |s: &str| -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    };
    let put = |p: &'static [u8]| {
        move |b: &mut BytesMut| {
            b.put_slice(p);
            Ok::<(), ()>(())
        }
    };
    let frames = |fill: &dyn Fn(&mut FrameBuilder)| {
        let mut fb = FrameBuilder::new(Limits::default());
        fill(&mut fb);
        let mut segments = Vec::new();
        fb.take_into(&mut segments);
        segments.concat()
    };
    let open = frames(&|fb| {
        fb.stream_open(id, 0, &Extensions::NONE, ("log", "tail"), (1, 2), put(b"q")).unwrap();
    });
    assert_eq!(open, unhex("1d000000 10 00 0000000001000000 036c6f67 047461696c 01 02000000 01000000 71"));
    let items = frames(&|fb| {
        fb.stream_item(id, put(b"a")).unwrap();
        fb.stream_item(id, put(b"b")).unwrap();
    });
    assert_eq!(items, unhex("1c000000 11 0000000001000000 01000000 61 11 0000000001000000 01000000 62"));
    assert_eq!(frames(&|fb| fb.stream_credit(id, 2)), unhex("0d000000 13 0000000001000000 02000000"));
    assert_eq!(frames(&|fb| fb.stream_end(id)), unhex("09000000 12 0000000001000000"));
    let preamble = volley::proto::SERVER_PREAMBLE;
    assert_eq!(preamble.to_vec(), unhex("564c4c59 01 07 0000"));

    let mut all = BytesMut::new();
    for part in [open, items] {
        all.extend_from_slice(&part);
    }
    let mut d = Decoder::after_preamble(Limits::default());
    let mut out = Vec::new();
    while let Some(body) = d.next_frame(&mut all).unwrap() {
        decode_frame(&body, &Limits::default(), &mut out).unwrap();
    }
    assert_eq!(
        out,
        vec![
            Message::StreamOpen {
                id,
                flags: 0,
                shape: 1,
                credit: 2,
                names: Names::new("log", "tail"),
                ext: Extensions::NONE,
                payload: Bytes::from_static(b"q"),
            },
            Message::StreamItem { id, payload: Bytes::from_static(b"a") },
            Message::StreamItem { id, payload: Bytes::from_static(b"b") },
        ]
    );
}
