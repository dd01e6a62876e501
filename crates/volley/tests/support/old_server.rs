//! A server as one that predates request extensions would behave: its preamble announces no
//! features, and it answers every request it reads with the same value.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use volley::proto::{Decoder, Extensions, FrameBuilder, Limits, Message, PREAMBLE};

/// Serves `n` requests on the accepted connection `s`, answering each with `reply`, and returns
/// the flags and the extensions each request came with.
pub async fn answer_without_features<S>(mut s: S, n: usize, reply: u64) -> Vec<(u8, Extensions)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    s.write_all(&PREAMBLE).await.unwrap(); // features 0
    let (mut dec, mut buf, mut msgs) = (Decoder::new(Limits::default()), BytesMut::new(), Vec::new());
    let mut seen = Vec::new();
    while seen.len() < n {
        assert!(s.read_buf(&mut buf).await.unwrap() > 0, "the client closed early");
        while let Some(frame) = dec.next_frame(&mut buf).unwrap() {
            volley::proto::decode_frame(&frame, &Limits::default(), &mut msgs).unwrap();
        }
        let mut fb = FrameBuilder::new(Limits::default());
        for m in msgs.drain(..) {
            if let Message::Request { id, flags, ext, .. } = m {
                seen.push((flags, ext));
                fb.reply(id, |b| volley::Wire::encode(&reply, b)).unwrap();
            }
        }
        let mut segs = Vec::new();
        fb.take_into(&mut segs);
        s.write_all(&segs.concat()).await.unwrap();
    }
    seen
}
