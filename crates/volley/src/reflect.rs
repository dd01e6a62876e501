//! Reflection: what a server serves, as data a tool can read. Every server answers the
//! built-in service `volley.reflect` (unless [`ServerConfig::reflection`](crate::ServerConfig)
//! is off) with a [`Catalog`]: its services, their methods, each method's handler kind, and
//! the name, codec tier, byte format and (where there is one) JSON Schema of its request and
//! reply types. The reply is JSON, so any language can read it; `volley describe` prints it
//! and `volley call` uses it to turn JSON typed at a shell into a request.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> volley::Result<()> {
//! use volley::{Client, Method, Server};
//! const SAY: Method<String, String> = Method::new("echo", "say");
//!
//! let server = Server::builder().handle_fn(&SAY, Ok).build();
//! let addr = server.listen("tcp://127.0.0.1:0").await?;
//! let client = Client::connect(&addr.to_string()).await?;
//! let catalog = client.call(&volley::reflect::LIST, ()).await?.into_inner();
//! let say = catalog.method("echo", "say").unwrap();
//! assert_eq!(say.request.format, "utf-8");
//! # server.shutdown().await;
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};

use crate::codec::{Json, Wire};
use crate::method::Method;

/// The built-in reflection service's name.
pub const SERVICE: &str = "volley.reflect";

/// The server's [`Catalog`], for an empty request.
pub const LIST: Method<(), Json<Catalog>> = Method::new(SERVICE, "list");

/// Whether `service` is one the server adds by itself (not the application's: it is not
/// registered in a registry, nor listed as one of the server's services).
pub(crate) fn is_built_in(service: &str) -> bool {
    service == SERVICE || service == crate::health::SERVICE
}

/// Everything a server serves, services and methods sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    pub services: Vec<ServiceInfo>,
}

/// One service and its methods.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceInfo {
    pub name: String,
    pub methods: Vec<MethodInfo>,
}

/// One method: how it is served and what travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodInfo {
    pub name: String,
    pub kind: HandlerKind,
    pub request: TypeInfo,
    pub reply: TypeInfo,
}

/// How a method's handler takes its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HandlerKind {
    /// One request at a time (`handle`, `handle_fn`; Python's `handle`).
    Single,
    /// The requests that arrived together, as one list (`handle_batch`).
    Batch,
    /// A kind this build does not know (a newer peer's).
    #[serde(other)]
    Other,
}

impl HandlerKind {
    pub fn name(self) -> &'static str {
        match self {
            HandlerKind::Single => "single",
            HandlerKind::Batch => "batch",
            HandlerKind::Other => "other",
        }
    }
}

/// A request or reply type as a tool sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TypeInfo {
    /// The type's name in its language (Rust: `std::any::type_name`).
    pub name: String,
    /// The codec tier: `custom`, `pod`, `fast`, `general`.
    pub tier: String,
    /// The byte format ([`Wire::FORMAT`]): `utf-8`, `bytes`, `json`, `msgpack`, `u32`, ….
    pub format: String,
    /// A JSON Schema, where the type has one ([`Wire::schema`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// The schema fingerprint of a fast-tier type ([`Wire::fingerprint`]), 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// A protobuf type's message name and descriptor set ([`Wire::protobuf`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protobuf: Option<ProtobufInfo>,
}

/// What reflection says of a protobuf type: what a tool needs to build and read its payloads
/// without the generated code.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProtobufInfo {
    /// The message's full name (`package.Message`), when the type implements `prost::Name`
    /// (prost-build's `enable_type_names`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The descriptor set (`google.protobuf.FileDescriptorSet`, binary) of the type's `.proto`
    /// files, in standard base64, when the type was declared with one
    /// (`wire!(proto(DESCRIPTOR_SET): T)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor_set: Option<String>,
}

impl TypeInfo {
    /// What reflection says of `T`.
    pub fn of<T: Wire>() -> TypeInfo {
        TypeInfo {
            name: std::any::type_name::<T>().to_string(),
            tier: T::TIER.name().to_string(),
            format: T::FORMAT.to_string(),
            schema: T::schema(),
            fingerprint: T::fingerprint().map(|f| format!("{f:016x}")),
            protobuf: T::protobuf().map(|p| ProtobufInfo {
                message: p.message,
                descriptor_set: p.descriptor_set.map(crate::codec::general::base64),
            }),
        }
    }
}

impl Catalog {
    /// Adds a method (kept sorted by service, then method).
    pub(crate) fn add(&mut self, service: &str, info: MethodInfo) {
        let at = match self.services.binary_search_by(|s| s.name.as_str().cmp(service)) {
            Ok(i) => i,
            Err(i) => {
                self.services.insert(i, ServiceInfo { name: service.to_string(), methods: Vec::new() });
                i
            }
        };
        let methods = &mut self.services[at].methods;
        let i = methods.binary_search_by(|m| m.name.cmp(&info.name)).unwrap_or_else(|i| i);
        methods.insert(i, info);
    }

    /// The service named `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceInfo> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The method `service/method`.
    pub fn method(&self, service: &str, method: &str) -> Option<&MethodInfo> {
        self.service(service)?.methods.iter().find(|m| m.name == method)
    }
}

impl MethodInfo {
    /// What reflection says of `m`, served by a handler of `kind`.
    pub(crate) fn of<Req: Wire, Resp: Wire>(m: &Method<Req, Resp>, kind: HandlerKind) -> MethodInfo {
        MethodInfo {
            name: m.name().to_string(),
            kind,
            request: TypeInfo::of::<Req>(),
            reply: TypeInfo::of::<Resp>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_stays_sorted_and_finds_methods() {
        let mut c = Catalog::default();
        let b: Method<String, u32> = Method::new("b", "y");
        let a: Method<Vec<u16>, ()> = Method::new("a", "z");
        let a2: Method<bool, crate::codec::Json<Vec<String>>> = Method::new("a", "x");
        for (s, info) in [
            ("b", MethodInfo::of(&b, HandlerKind::Single)),
            ("a", MethodInfo::of(&a, HandlerKind::Batch)),
            ("a", MethodInfo::of(&a2, HandlerKind::Single)),
        ] {
            c.add(s, info);
        }
        let names: Vec<_> = c
            .services
            .iter()
            .flat_map(|s| s.methods.iter().map(move |m| format!("{}/{}", s.name, m.name)))
            .collect();
        assert_eq!(names, ["a/x", "a/z", "b/y"]);
        let z = c.method("a", "z").unwrap();
        assert_eq!(
            (z.kind, z.request.format.as_str(), z.reply.format.as_str()),
            (HandlerKind::Batch, "array", "unit")
        );
        assert_eq!(z.request.name, "alloc::vec::Vec<u16>");
        let y = c.method("b", "y").unwrap();
        assert_eq!((y.request.tier.as_str(), y.reply.format.as_str()), ("custom", "u32"));
        assert_eq!(c.method("a", "x").unwrap().reply.format, "json");
        assert!(c.method("b", "x").is_none());
        // What a newer peer may send: an unknown kind reads as `Other`, a missing schema as none.
        let text = r#"{"services":[{"name":"s","methods":[{"name":"m","kind":"stream",
            "request":{"name":"R","tier":"general","format":"json"},
            "reply":{"name":"P","tier":"general","format":"json","schema":{"type":"object"}}}]}]}"#;
        let back: Catalog = serde_json::from_str(text).unwrap();
        let m = back.method("s", "m").unwrap();
        assert_eq!(
            (m.kind, m.request.schema.is_none(), m.reply.schema.is_some()),
            (HandlerKind::Other, true, true)
        );
    }
}
