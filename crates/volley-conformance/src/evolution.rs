//! Two releases of one type, in each tier that another language reads (JSON, MessagePack,
//! protobuf): the Rust side of the cross-language evolution tests (PROTOCOL.md §15.5;
//! clients/python/tests/test_evolution.py). The new release adds a field with a default
//! (`tag`); the old one does not know it. `volley conformance evolution-serve` serves one
//! release, `volley conformance evolution-call` calls with one, so an old build of either side
//! meets a new build of the other.
//!
//! Each method takes an item and answers it with its name in capitals and, in the new release,
//! the `tag` it read (`none` for the default) — so the caller sees what the server decoded.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use volley::codec::{Json, MsgPack};
use volley::{Client, Method, Server, Status};

/// Which release of the types a side is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// `{id, name}`.
    Old,
    /// `{id, name, tag}`: `tag` added, with a default (`""`).
    New,
}

impl std::str::FromStr for Release {
    type Err = String;
    fn from_str(s: &str) -> Result<Release, String> {
        match s {
            "old" => Ok(Release::Old),
            "new" => Ok(Release::New),
            _ => Err(format!("{s:?}: expected old or new")),
        }
    }
}

/// The old release's item.
#[derive(Clone, PartialEq, Serialize, Deserialize, prost::Message)]
pub struct OldItem {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(string, tag = "2")]
    pub name: String,
}

/// The new release's item: a field added, with a default, under a new tag.
#[derive(Clone, PartialEq, Serialize, Deserialize, prost::Message)]
pub struct NewItem {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[serde(default)]
    #[prost(string, tag = "3")]
    pub tag: String,
}

// The same struct in the protobuf tier (its prost derive); JSON and MessagePack through the
// wrappers, so that one struct stands for the type in every tier.
volley::wire!(proto: OldItem, NewItem);

/// The service; its methods are named for their tier: `json`, `msgpack`, `proto`.
pub const SERVICE: &str = "evolve";

const OLD_JSON: Method<Json<OldItem>, Json<OldItem>> = Method::new(SERVICE, "json");
const OLD_PACK: Method<MsgPack<OldItem>, MsgPack<OldItem>> = Method::new(SERVICE, "msgpack");
const OLD_PROTO: Method<OldItem, OldItem> = Method::new(SERVICE, "proto");
const NEW_JSON: Method<Json<NewItem>, Json<NewItem>> = Method::new(SERVICE, "json");
const NEW_PACK: Method<MsgPack<NewItem>, MsgPack<NewItem>> = Method::new(SERVICE, "msgpack");
const NEW_PROTO: Method<NewItem, NewItem> = Method::new(SERVICE, "proto");

fn old_reply(i: OldItem) -> OldItem {
    OldItem { id: i.id, name: i.name.to_uppercase() }
}

/// The new release answers the tag it read, or `none` for the default (what an old caller's
/// item reads as): never the default itself, so an old caller is always sent a field it does
/// not know.
fn new_reply(i: NewItem) -> NewItem {
    let tag = if i.tag.is_empty() { "none".into() } else { i.tag };
    NewItem { id: i.id, name: i.name.to_uppercase(), tag }
}

/// A server of `release`: `evolve/json`, `evolve/msgpack` and `evolve/proto`.
pub fn server(release: Release) -> Server {
    let b = Server::builder();
    match release {
        Release::Old => b
            .handle_fn(&OLD_JSON, |i: Json<OldItem>| Ok::<_, Status>(Json(old_reply(i.0))))
            .handle_fn(&OLD_PACK, |i: MsgPack<OldItem>| Ok::<_, Status>(MsgPack(old_reply(i.0))))
            .handle_fn(&OLD_PROTO, |i: OldItem| Ok::<_, Status>(old_reply(i))),
        Release::New => b
            .handle_fn(&NEW_JSON, |i: Json<NewItem>| Ok::<_, Status>(Json(new_reply(i.0))))
            .handle_fn(&NEW_PACK, |i: MsgPack<NewItem>| Ok::<_, Status>(MsgPack(new_reply(i.0))))
            .handle_fn(&NEW_PROTO, |i: NewItem| Ok::<_, Status>(new_reply(i))),
    }
    .build()
}

/// Calls each method of the server at `addr` once with an item of `release` (`id` 7, `name`
/// "tea", and in the new release `tag` "gift"), and returns what each reply decoded to as
/// this release reads it, by tier: `{"json": {...}, "msgpack": {...}, "proto": {...}}`, or
/// the first call's error.
pub async fn call(addr: &str, release: Release) -> Result<Value, String> {
    let client = Client::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
    let (old, new) =
        (OldItem { id: 7, name: "tea".into() }, NewItem { id: 7, name: "tea".into(), tag: "gift".into() });
    Ok(match release {
        Release::Old => json!({
            "json": shown(&client.call(&OLD_JSON, Json(old.clone())).await.map_err(failed("json"))?.into_inner()),
            "msgpack": shown(&client.call(&OLD_PACK, MsgPack(old.clone())).await.map_err(failed("msgpack"))?.into_inner()),
            "proto": shown(&client.call(&OLD_PROTO, old).await.map_err(failed("proto"))?),
        }),
        Release::New => json!({
            "json": shown(&client.call(&NEW_JSON, Json(new.clone())).await.map_err(failed("json"))?.into_inner()),
            "msgpack": shown(&client.call(&NEW_PACK, MsgPack(new.clone())).await.map_err(failed("msgpack"))?.into_inner()),
            "proto": shown(&client.call(&NEW_PROTO, new).await.map_err(failed("proto"))?),
        }),
    })
}

/// A failed call of the method of `tier`, as the error to report.
fn failed(tier: &'static str) -> impl Fn(volley::Error) -> String {
    move |e| format!("{SERVICE}/{tier}: {e}")
}

/// A decoded item as JSON, whichever release it is.
fn shown<T: Serialize>(item: &T) -> Value {
    serde_json::to_value(item).expect("an item always serializes")
}
