//! Replies on their way to a connection: one collection of results (request id, and the value
//! or the error), written into a connection's frames by one function. Encoding them elsewhere
//! first — on the codec pool, for large payloads — is a step that turns them into finished
//! [`Frames`], not a second kind of reply.

use bytes::Bytes;

use super::host::Host;
use crate::codec::Wire;
use crate::error::Status;
use crate::proto::Code;
use crate::proto::encode::{BuildError, FrameBuilder, Frames};

/// Replies ready to be written into a connection's outgoing frames.
pub(crate) trait Replies: Send {
    fn write(self: Box<Self>, out: &mut FrameBuilder);
}

/// Whom the results answer: one request each, or the items of one batch request.
pub(crate) enum ReplyTo {
    Each(Vec<u64>),
    Batch(u64),
}

/// The results of one handler call, in request order.
pub(crate) struct Results<Resp> {
    pub to: ReplyTo,
    pub results: Vec<Result<Resp, Status>>,
}

impl<Resp: Wire> Replies for Results<Resp> {
    fn write(self: Box<Self>, out: &mut FrameBuilder) {
        match self.to {
            ReplyTo::Each(ids) => {
                for (id, result) in ids.into_iter().zip(self.results) {
                    write_result(out, id, result);
                }
            }
            ReplyTo::Batch(id) => write_batch(out, id, self.results),
        }
    }
}

/// Replies already encoded into frames (on the codec pool): linked in, not copied.
impl Replies for Frames {
    fn write(self: Box<Self>, out: &mut FrameBuilder) {
        out.append_frames(*self);
    }
}

/// Appends one result: the reply, or the error reply (also when the reply cannot be encoded or
/// does not fit in a frame).
pub(crate) fn write_result<Resp: Wire>(out: &mut FrameBuilder, id: u64, result: Result<Resp, Status>) {
    let resp = match result {
        Ok(resp) => resp,
        Err(status) => return out.error(id, status.code, &status.message),
    };
    // A payload that is bytes already is written with its length known (large ones linked, not
    // copied): no length to patch afterwards.
    let written = match resp.as_bytes() {
        Some(b) => out.reply_bytes(id, b).map_err(widen),
        None => out.reply(id, |buf| resp.encode(buf)),
    };
    match written {
        Ok(()) => {}
        Err(BuildError::Payload(e)) => {
            out.error(id, Code::Internal, &format!("reply could not be encoded: {e}"))
        }
        Err(BuildError::TooLarge { len, max }) => {
            out.error(id, Code::TooLarge, &format!("reply of {len} bytes exceeds the frame limit of {max}"))
        }
        Err(BuildError::TooManyItems { .. }) => unreachable!("a single reply has no items"),
    }
}

/// Appends the batch reply to batch request `id`, one item per result; if it cannot be built
/// (too large for a frame), an error reply for the whole batch says why.
fn write_batch<Resp: Wire>(out: &mut FrameBuilder, id: u64, results: Vec<Result<Resp, Status>>) {
    let written = out.batch_reply(id, |items| {
        for result in results {
            match result {
                Ok(resp) => items.ok(|buf| resp.encode(buf)),
                Err(status) => items.err(status.code, &status.message),
            }
        }
    });
    if let Err(e) = written {
        let why = match e {
            BuildError::TooLarge { len, max } => {
                format!("batch reply of {len} bytes exceeds the frame limit of {max}")
            }
            BuildError::TooManyItems { count, max } => {
                format!("batch reply of {count} items exceeds the limit of {max}")
            }
            BuildError::Payload(_) => "batch reply could not be built".to_string(),
        };
        out.error(id, Code::TooLarge, &why);
    }
}

/// A build error of a ready-made payload (which cannot fail to encode) as any payload's.
fn widen<E>(e: BuildError<std::convert::Infallible>) -> BuildError<E> {
    match e {
        BuildError::TooLarge { len, max } => BuildError::TooLarge { len, max },
        BuildError::TooManyItems { count, max } => BuildError::TooManyItems { count, max },
    }
}

/// One reply payload encoded on its own (an inproc call forwarded as bytes).
pub(crate) fn encode_payload<Resp: Wire>(resp: &Resp) -> Result<Bytes, Status> {
    if let Some(b) = resp.as_bytes() {
        return Ok(b);
    }
    let mut buf = bytes::BytesMut::new();
    resp.encode(&mut buf)
        .map(|()| buf.freeze())
        .map_err(|e| Status::new(Code::Internal, format!("reply could not be encoded: {e}")))
}

/// The error of a request whose caller's time budget ran out before its handler answered.
const EXPIRED: &str = "the caller's deadline passed before the server answered (its time budget ran out)";

/// Answers `ids` `DeadlineExceeded`, and counts them.
pub(super) fn expire(host: &Host, out: &mut FrameBuilder, ids: &[u64]) {
    host.expired.fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
    ids.iter().for_each(|&id| out.error(id, Code::DeadlineExceeded, EXPIRED));
}
