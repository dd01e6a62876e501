//! The relay's request and reply (docs/PROTOCOL.md §16.4): a small hand-written binary layout,
//! because they carry another call's payload, which a self-describing format would copy (and,
//! for JSON, escape); the relay is on the per-call path of relayed mode.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::codec::{CodecError, Wire};
use crate::error::{Error, Status};
use crate::proto::Code;

/// Which instance a relayed call goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Any, by the controller's balancing policy.
    Any,
    /// By key hash on the controller's hash ring (see [`key_hash`](crate::balance::key_hash)).
    Key(u64),
    /// The instance at this address (scatter-gather sends one relayed call per instance).
    Address(String),
}

/// A call for the controller to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayRequest {
    pub service: String,
    pub method: String,
    /// Safe to retry on another instance if the first one fails.
    pub idempotent: bool,
    pub target: Target,
    /// The forwarded call's deadline, in milliseconds (0: the controller's default).
    pub timeout_ms: u32,
    /// The encoded request of the forwarded call.
    pub payload: Bytes,
}

/// The outcome of a relayed call, carried back whole so the caller gets the same typed error
/// it would get calling directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayReply {
    /// The instance's reply payload.
    Ok(Bytes),
    /// The instance answered with an error reply.
    Remote(Status),
    NoInstances(String),
    UnknownService(String),
    /// The instance could not be reached or its connection failed.
    Connection(String),
    /// The forwarded call timed out (milliseconds).
    Timeout(u64),
    /// Anything else that went wrong in the controller.
    Failed(String),
}

const RELAY_IDEMPOTENT: u8 = 0x01;
const TARGET_ANY: u8 = 0;
const TARGET_KEY: u8 = 1;
const TARGET_ADDRESS: u8 = 2;

impl Wire for RelayRequest {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_u8(if self.idempotent { RELAY_IDEMPOTENT } else { 0 });
        match &self.target {
            Target::Any => out.put_u8(TARGET_ANY),
            Target::Key(k) => {
                out.put_u8(TARGET_KEY);
                out.put_u64_le(*k);
            }
            Target::Address(a) => {
                out.put_u8(TARGET_ADDRESS);
                put_str16(out, a)?;
            }
        }
        out.put_u32_le(self.timeout_ms);
        put_str8(out, &self.service)?;
        put_str8(out, &self.method)?;
        out.put_slice(&self.payload);
        Ok(())
    }

    fn decode(mut b: Bytes) -> Result<Self, CodecError> {
        let flags = get_u8(&mut b)?;
        let target = match get_u8(&mut b)? {
            TARGET_ANY => Target::Any,
            TARGET_KEY => Target::Key(get_u64(&mut b)?),
            TARGET_ADDRESS => {
                let n = get_u16(&mut b)? as usize;
                Target::Address(get_str(&mut b, n)?)
            }
            t => return Err(CodecError(format!("relay request: unknown target kind {t}"))),
        };
        let timeout_ms = get_u32(&mut b)?;
        let n = get_u8(&mut b)? as usize;
        let service = get_str(&mut b, n)?;
        let n = get_u8(&mut b)? as usize;
        let method = get_str(&mut b, n)?;
        Ok(RelayRequest {
            service,
            method,
            idempotent: flags & RELAY_IDEMPOTENT != 0,
            target,
            timeout_ms,
            payload: b,
        })
    }
}

const REPLY_OK: u8 = 0;
const REPLY_REMOTE: u8 = 1;
const REPLY_NO_INSTANCES: u8 = 2;
const REPLY_UNKNOWN_SERVICE: u8 = 3;
const REPLY_CONNECTION: u8 = 4;
const REPLY_TIMEOUT: u8 = 5;
const REPLY_FAILED: u8 = 6;

impl Wire for RelayReply {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        match self {
            RelayReply::Ok(p) => {
                out.put_u8(REPLY_OK);
                out.put_slice(p);
            }
            RelayReply::Remote(s) => {
                out.put_u8(REPLY_REMOTE);
                out.put_u16_le(s.code.to_u16());
                out.put_slice(s.message.as_bytes());
            }
            RelayReply::Timeout(ms) => {
                out.put_u8(REPLY_TIMEOUT);
                out.put_u64_le(*ms);
            }
            RelayReply::NoInstances(t)
            | RelayReply::UnknownService(t)
            | RelayReply::Connection(t)
            | RelayReply::Failed(t) => {
                out.put_u8(match self {
                    RelayReply::NoInstances(_) => REPLY_NO_INSTANCES,
                    RelayReply::UnknownService(_) => REPLY_UNKNOWN_SERVICE,
                    RelayReply::Connection(_) => REPLY_CONNECTION,
                    _ => REPLY_FAILED,
                });
                out.put_slice(t.as_bytes());
            }
        }
        Ok(())
    }

    fn decode(mut b: Bytes) -> Result<Self, CodecError> {
        let text = |b: Bytes| {
            String::from_utf8(b.to_vec()).map_err(|_| CodecError("relay reply: text is not UTF-8".into()))
        };
        Ok(match get_u8(&mut b)? {
            REPLY_OK => RelayReply::Ok(b),
            REPLY_REMOTE => {
                let code = Code::from_u16(get_u16(&mut b)?);
                RelayReply::Remote(Status::new(code, text(b)?))
            }
            REPLY_NO_INSTANCES => RelayReply::NoInstances(text(b)?),
            REPLY_UNKNOWN_SERVICE => RelayReply::UnknownService(text(b)?),
            REPLY_CONNECTION => RelayReply::Connection(text(b)?),
            REPLY_TIMEOUT => RelayReply::Timeout(get_u64(&mut b)?),
            REPLY_FAILED => RelayReply::Failed(text(b)?),
            t => return Err(CodecError(format!("relay reply: unknown outcome {t}"))),
        })
    }
}

impl From<Result<Bytes, Error>> for RelayReply {
    fn from(r: Result<Bytes, Error>) -> RelayReply {
        match r {
            Ok(p) => RelayReply::Ok(p),
            Err(Error::Remote(s)) => RelayReply::Remote(s),
            Err(Error::NoInstances { service }) => RelayReply::NoInstances(service),
            Err(Error::UnknownService(s)) => RelayReply::UnknownService(s),
            Err(Error::Connection(m)) => RelayReply::Connection(m),
            Err(Error::Timeout(d)) => RelayReply::Timeout(d.as_millis() as u64),
            Err(other) => RelayReply::Failed(other.to_string()),
        }
    }
}

impl RelayReply {
    /// The outcome as the caller would have seen it calling the instance directly.
    pub fn into_result(self) -> Result<Bytes, Error> {
        match self {
            RelayReply::Ok(p) => Ok(p),
            RelayReply::Remote(s) => Err(Error::Remote(s)),
            RelayReply::NoInstances(service) => Err(Error::NoInstances { service }),
            RelayReply::UnknownService(s) => Err(Error::UnknownService(s)),
            RelayReply::Connection(m) => Err(Error::Connection(format!("relayed: {m}"))),
            RelayReply::Timeout(ms) => Err(Error::Timeout(std::time::Duration::from_millis(ms))),
            RelayReply::Failed(m) => Err(Error::Remote(Status::new(Code::Internal, format!("relay: {m}")))),
        }
    }
}

fn put_str8(out: &mut BytesMut, s: &str) -> Result<(), CodecError> {
    let n = u8::try_from(s.len()).map_err(|_| CodecError(format!("name of {} bytes (max 255)", s.len())))?;
    out.put_u8(n);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn put_str16(out: &mut BytesMut, s: &str) -> Result<(), CodecError> {
    let n = u16::try_from(s.len())
        .map_err(|_| CodecError(format!("address of {} bytes (max 65535)", s.len())))?;
    out.put_u16_le(n);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn need(b: &Bytes, n: usize) -> Result<(), CodecError> {
    if b.remaining() < n {
        return Err(CodecError("relay message is truncated".into()));
    }
    Ok(())
}

fn get_u8(b: &mut Bytes) -> Result<u8, CodecError> {
    need(b, 1)?;
    Ok(b.get_u8())
}

fn get_u16(b: &mut Bytes) -> Result<u16, CodecError> {
    need(b, 2)?;
    Ok(b.get_u16_le())
}

fn get_u32(b: &mut Bytes) -> Result<u32, CodecError> {
    need(b, 4)?;
    Ok(b.get_u32_le())
}

fn get_u64(b: &mut Bytes) -> Result<u64, CodecError> {
    need(b, 8)?;
    Ok(b.get_u64_le())
}

fn get_str(b: &mut Bytes, n: usize) -> Result<String, CodecError> {
    need(b, n)?;
    String::from_utf8(b.split_to(n).to_vec())
        .map_err(|_| CodecError("relay message: name is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(v: T) {
        let mut b = BytesMut::new();
        v.encode(&mut b).unwrap();
        assert_eq!(T::decode(b.freeze()).unwrap(), v);
    }

    #[test]
    fn relay_messages_round_trip_and_reject_truncation() {
        for target in [Target::Any, Target::Key(u64::MAX - 3), Target::Address("tcp://10.0.0.1:7".into())] {
            let req = RelayRequest {
                service: "search".into(),
                method: "top_k".into(),
                idempotent: true,
                target,
                timeout_ms: 1500,
                payload: Bytes::from_static(b"\x00payload\xff"),
            };
            round_trip(req.clone());
            let mut b = BytesMut::new();
            req.encode(&mut b).unwrap();
            // Every strict prefix that cuts into the header must fail, not misparse.
            let header = b.len() - req.payload.len();
            for cut in 0..header {
                assert!(RelayRequest::decode(b.clone().freeze().slice(..cut)).is_err(), "cut at {cut}");
            }
        }
        for reply in [
            RelayReply::Ok(Bytes::from_static(b"x")),
            RelayReply::Ok(Bytes::new()),
            RelayReply::Remote(Status::new(Code::Other(999), "odd")),
            RelayReply::NoInstances("s".into()),
            RelayReply::UnknownService("s".into()),
            RelayReply::Connection("reset".into()),
            RelayReply::Timeout(250),
            RelayReply::Failed("bug".into()),
        ] {
            round_trip(reply);
        }
        assert!(RelayReply::decode(Bytes::from_static(&[9])).is_err());
    }

    #[test]
    fn relay_outcomes_map_to_the_errors_a_direct_call_gives() {
        let cases = [
            Err(Error::Remote(Status::app("no"))),
            Err(Error::NoInstances { service: "a".into() }),
            Err(Error::UnknownService("b".into())),
            Err(Error::Timeout(std::time::Duration::from_millis(30))),
            Ok(Bytes::from_static(b"ok")),
        ];
        for r in cases {
            assert_eq!(RelayReply::from(r.clone()).into_result(), r);
        }
        let conn = RelayReply::from(Err(Error::Connection("gone".into()))).into_result();
        assert!(matches!(conn, Err(Error::Connection(m)) if m.contains("gone")));
    }
}
