//! The registry protocol: the methods of the service `volley.registry` and their message types.
//!
//! The registry is served over Volley itself, so these are ordinary [`Method`]s. The structured
//! messages are JSON (the general tier), so that a client or server in any language can
//! register, resolve and watch: the field names below are the wire's names, fields marked
//! `#[serde(default)]` may be left out, and unknown fields are ignored, so a later version can
//! add fields without breaking older peers. Plain numbers, booleans, strings and `()` use their
//! built-in encodings. The relay's request and reply have a small hand-written binary layout
//! instead, because they carry another call's payload and any self-describing format would
//! copy (and, for JSON, escape) it (the relay is on the per-call path).
//! `docs/PROTOCOL.md` §16 specifies every message, with an example each.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::codec::{CodecError, Tier, Wire, general};
use crate::error::{Error, Status};
use crate::method::Method;
use crate::proto::Code;

/// The service name the controller serves the registry protocol under.
pub const SERVICE: &str = "volley.registry";

/// Register instances under a lease (a new one if `lease` is 0).
pub const REGISTER: Method<RegisterRequest, Registered> = Method::new(SERVICE, "register");
/// Renew a lease: its instances stay listed for another lease time.
pub const RENEW: Method<LeaseRequest, Renewed> = Method::new(SERVICE, "renew");
/// Revoke a lease: its instances are removed at once (graceful shutdown). Replies with the
/// number of instances removed.
pub const DEREGISTER: Method<LeaseRequest, u32> = Method::new(SERVICE, "deregister");
/// The instances of a service, now.
pub const RESOLVE: Method<String, Resolved> = Method::new(SERVICE, "resolve");
/// Long poll: replies as soon as the service changed after `from_revision`, or at the timeout
/// with the unchanged state. Clients re-issue it in a loop; that is how changes are pushed.
pub const WATCH: Method<WatchRequest, Resolved> = Method::new(SERVICE, "watch");
/// A client id unique among the clients of this registry.
pub const ALLOC_CLIENT_ID: Method<(), u32> = Method::new(SERVICE, "alloc_client_id");
/// Gives a client id back (a client that closes). Replies whether the id was allocated.
pub const RELEASE_CLIENT_ID: Method<u32, bool> = Method::new(SERVICE, "release_client_id");
/// Holds a client id for the calling connection too: a client that reconnected, or moved from
/// its first-contact connection to its own, keeps its id while that connection is open.
pub const CLAIM_CLIENT_ID: Method<u32, ()> = Method::new(SERVICE, "claim_client_id");
/// What the controller requires of its callers (`volley ls` warns when anyone may register).
pub const INFO: Method<(), ControllerInfo> = Method::new(SERVICE, "info");
/// Every service and instance, with lease times (what `volley ls` prints).
pub const LIST: Method<(), Listing> = Method::new(SERVICE, "list");
/// Relayed ("normal") mode: the controller forwards the call to an instance and relays the
/// reply.
pub const RELAY: Method<RelayRequest, RelayReply> = Method::new(SERVICE, "relay");

/// What a server registers: one service it offers at one address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSpec {
    pub service: String,
    /// Where clients reach the instance: `tcp://HOST:PORT`, `unix:///PATH` or `inproc://NAME`.
    pub address: String,
    /// Relative capacity (1 = the default). Round-robin and the hash ring give an instance
    /// traffic in proportion to its weight. 0 is invalid.
    #[serde(default = "one")]
    pub weight: u32,
    /// Free-form labels (zone, version, shard ...); the registry stores and returns them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

fn default_ttl_ms() -> u64 {
    super::DEFAULT_TTL.as_millis() as u64
}

impl InstanceSpec {
    pub fn new(service: impl Into<String>, address: impl Into<String>) -> InstanceSpec {
        InstanceSpec {
            service: service.into(),
            address: address.into(),
            weight: 1,
            metadata: BTreeMap::new(),
        }
    }

    pub fn weight(mut self, weight: u32) -> InstanceSpec {
        self.weight = weight;
        self
    }

    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> InstanceSpec {
        self.metadata.insert(key.into(), value.into());
        self
    }
}

/// A registered instance, as the registry lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Assigned by the registry; a re-registration gets a new id.
    pub id: u64,
    /// The lease the instance lives under.
    pub lease: u64,
    pub service: String,
    pub address: String,
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// An existing lease to add the instances to, or 0 for a new lease.
    #[serde(default)]
    pub lease: u64,
    /// Lease time for a new lease, in milliseconds (the controller clamps it to its bounds).
    #[serde(default = "default_ttl_ms")]
    pub ttl_ms: u64,
    pub instances: Vec<InstanceSpec>,
    /// The registration credential, when the controller requires one (empty: none).
    #[serde(default)]
    pub credential: String,
}

/// A lease to renew or revoke, with the registration credential (empty: none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub lease: u64,
    #[serde(default)]
    pub credential: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub lease: u64,
    /// The lease time granted, in milliseconds.
    pub ttl_ms: u64,
    /// One id per registered instance, in request order.
    pub instance_ids: Vec<u64>,
    /// The controller's epoch (changes when a controller with a non-durable store restarts).
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// False when the registry does not know the lease (it lapsed, or the controller
    /// restarted): the server must register again.
    pub known: bool,
    pub ttl_ms: u64,
}

/// The instances of one service at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub service: String,
    /// Identifies the controller's store; a new epoch means revisions started over.
    pub epoch: u64,
    /// Store revision of the service's last change (0: never changed).
    pub revision: u64,
    /// Whether any instance of the service ever registered (this epoch).
    pub known: bool,
    /// The controller started less than one lease time ago: servers are still registering
    /// again after a restart, so this list may be incomplete. Clients merge it with what they
    /// have instead of replacing.
    pub settling: bool,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    pub service: String,
    /// The epoch the client's revision belongs to (0: none yet). Another epoch answers at once.
    #[serde(default)]
    pub epoch: u64,
    #[serde(default)]
    pub from_revision: u64,
    /// How long the controller may hold the call, in milliseconds (it caps this).
    pub timeout_ms: u64,
    /// The caller's client id (0: none): a controller that restarted reserves it again, so it
    /// is not handed to a new client.
    #[serde(default)]
    pub client_id: u32,
}

/// What a controller requires of its callers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerInfo {
    /// `register`, `renew` and `deregister` need the registration credential. False: anyone who
    /// can connect may register an instance under any service name.
    pub registration_credential: bool,
    /// Connections must present a token (§6.11).
    pub token: bool,
    /// The store outlives the controller (etcd).
    pub durable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub epoch: u64,
    pub revision: u64,
    pub settling: bool,
    pub services: Vec<ServiceListing>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceListing {
    pub name: String,
    pub revision: u64,
    pub instances: Vec<ListedInstance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedInstance {
    pub instance: Instance,
    pub lease_ttl_ms: u64,
    /// Milliseconds until the lease lapses unless renewed.
    pub expires_in_ms: u64,
}

/// JSON, as `volley::wire!(json: T)` writes and reads it, with one difference: a payload that
/// is not the JSON expected is refused with an error that says the registry speaks JSON, so a
/// peer built when the registry spoke bitcode learns why it is refused (the server answers it
/// `BadRequest` with this message; a client reading an old controller's reply reports it).
macro_rules! registry_json {
    ($($t:ty),+ $(,)?) => {$(
        impl Wire for $t {
            const TIER: Tier = Tier::General;
            fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
                general::json_encode(self, out)
            }
            fn decode(bytes: Bytes) -> Result<Self, CodecError> {
                general::json_decode(&bytes).map_err(not_registry_json)
            }
        }
    )+};
}

fn not_registry_json(e: CodecError) -> CodecError {
    CodecError(format!(
        "{e}: the registry speaks JSON (docs/PROTOCOL.md §16); a peer that sends bitcode predates \
         that encoding and must be upgraded"
    ))
}

registry_json!(
    InstanceSpec,
    Instance,
    RegisterRequest,
    LeaseRequest,
    Registered,
    Renewed,
    Resolved,
    WatchRequest,
    Listing,
    ControllerInfo
);

/// Which instance a relayed call goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Any, by the controller's balancing policy.
    Any,
    /// By key hash on the controller's hash ring (see [`key_hash`](super::key_hash)).
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
