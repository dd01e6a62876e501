//! The registry protocol: the methods of the service `volley.registry` and their message types.
//!
//! The registry is served over Volley itself, so these are ordinary [`Method`]s. The structured
//! messages are JSON (the general tier), so that a client or server in any language can
//! register, resolve and watch: the field names below are the wire's names, fields marked
//! `#[serde(default)]` may be left out, and unknown fields are ignored, so a later version can
//! add fields without breaking older peers. Plain numbers, booleans, strings and `()` use their
//! built-in encodings. The relay's request and reply have a small hand-written binary layout
//! instead (`relay.rs`), because they carry another call's payload and any self-describing
//! format would copy (and, for JSON, escape) it (the relay is on the per-call path).
//! `docs/PROTOCOL.md` §16 specifies every message, with an example each.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::codec::{CodecError, Tier, Wire, general};
use crate::method::Method;

mod relay;

pub use relay::{RelayReply, RelayRequest, Target};

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
    /// It names the instance (one instance per service and address) and places it on the hash
    /// ring, whichever address a caller connects through.
    pub address: String,
    /// Relative capacity (1 = the default). Round-robin and the hash ring give an instance
    /// traffic in proportion to its weight. 0 is invalid.
    #[serde(default = "one")]
    pub weight: u32,
    /// Free-form labels (zone, version, shard ...); the registry stores and returns them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The host the instance runs on ([`host_id`](super::host_id)); required with
    /// `local_addresses`, which only callers with the same host id use. Empty: not said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_id: String,
    /// More addresses of the same instance that only a caller on its host can open
    /// (`shm://…`, `unix://…`), in the server's order of preference. A
    /// [`ServiceClient`](crate::ServiceClient) with
    /// [`prefer_local`](crate::service_client::ServiceConfig::prefer_local) on that host connects through the
    /// first one it can open; every other caller uses `address`. At most
    /// [`MAX_LOCAL_ADDRESSES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_addresses: Vec<String>,
}

/// Most same-host addresses one instance may carry.
pub const MAX_LOCAL_ADDRESSES: usize = 8;

/// Longest host id the registry takes, in bytes.
pub const MAX_HOST_ID: usize = 255;

/// Longest service name the registry takes, in bytes (names are 1–255 bytes).
pub const MAX_SERVICE_NAME: usize = 255;

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
            host_id: String::new(),
            local_addresses: Vec::new(),
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

    /// Adds an address of the instance that only callers on this host can open (a `shm://` or
    /// `unix://` address the server also listens on), and sets the host id to this process's
    /// ([`host_id`](super::host_id)) unless one is set. Where the host id is unknown,
    /// registering the spec fails with [`Error::Usage`](crate::Error::Usage).
    pub fn local_address(mut self, address: impl Into<String>) -> InstanceSpec {
        self.local_addresses.push(address.into());
        if self.host_id.is_empty() {
            self.host_id = super::host_id().unwrap_or_default().to_string();
        }
        self
    }

    /// Sets the host id the instance is registered with (see [`host_id`](super::host_id)).
    pub fn host_id(mut self, id: impl Into<String>) -> InstanceSpec {
        self.host_id = id.into();
        self
    }

    /// What the registry refuses in a registration (`BadRequest`): an empty service or
    /// address, a service name over [`MAX_SERVICE_NAME`] bytes, weight 0, more than
    /// [`MAX_LOCAL_ADDRESSES`] same-host addresses, an empty one, or same-host addresses
    /// without a host id (no caller could tell it shares the host).
    pub fn check(&self) -> Result<(), String> {
        if self.service.len() > MAX_SERVICE_NAME {
            // The name itself is not repeated: it may be the whole of a flood.
            return Err(format!(
                "a service name of {} bytes (at most {MAX_SERVICE_NAME})",
                self.service.len()
            ));
        }
        let at = || format!("{}@{}", self.service, self.address);
        if self.service.is_empty() || self.address.is_empty() || self.weight == 0 {
            return Err(format!(
                "{} weight {}: service and address must be non-empty, weight at least 1",
                at(),
                self.weight
            ));
        }
        if self.local_addresses.len() > MAX_LOCAL_ADDRESSES
            || self.local_addresses.iter().any(String::is_empty)
        {
            return Err(format!("{}: at most {MAX_LOCAL_ADDRESSES} local addresses, none empty", at()));
        }
        if !self.local_addresses.is_empty() && self.host_id.is_empty() {
            return Err(format!("{}: local addresses need a host_id, or no caller can use them", at()));
        }
        if self.host_id.len() > MAX_HOST_ID {
            return Err(format!(
                "{}: a host_id of {} bytes (at most {MAX_HOST_ID})",
                at(),
                self.host_id.len()
            ));
        }
        Ok(())
    }

    /// The instance the registry lists for this spec, under `lease` with id `id`.
    pub fn instance(&self, id: u64, lease: u64) -> Instance {
        Instance {
            id,
            lease,
            service: self.service.clone(),
            address: self.address.clone(),
            weight: self.weight,
            metadata: self.metadata.clone(),
            host_id: self.host_id.clone(),
            local_addresses: self.local_addresses.clone(),
        }
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
    /// As registered (see [`InstanceSpec::host_id`](InstanceSpec#structfield.host_id)).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_id: String,
    /// As registered (see
    /// [`InstanceSpec::local_addresses`](InstanceSpec#structfield.local_addresses)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_addresses: Vec<String>,
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
    /// Services left out (the last ones by name) because listing them too would have passed
    /// the controller's bound on a reply. 0: the list is whole.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
