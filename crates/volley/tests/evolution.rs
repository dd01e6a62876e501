//! The evolution rules of docs/PROTOCOL.md §15.5: every "compatible" cell of the table, proven
//! across two versions of a type (two Rust types standing for the old and the new build,
//! encoded by one and decoded by the other, and through a real server for the general tiers),
//! and every "never" cell shown failing with a clear error rather than a value.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use volley::{Client, Code, Error, Method, Server, Status, Wire};

fn bytes_of<T: Wire>(v: &T) -> Bytes {
    let mut b = BytesMut::new();
    v.encode(&mut b).unwrap();
    b.freeze()
}

/// `v` encoded as `A` and decoded as `B`.
fn cross<A: Wire, B: Wire>(v: &A) -> Result<B, volley::CodecError> {
    B::decode(bytes_of(v))
}

/// The same change in both general tiers: `$tier` is `json` or `msgpack`.
macro_rules! general_tier {
    ($m:ident, $tier:ident) => {
        mod $m {
            use super::*;

            // Add a field with a default.
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct AddOld {
                pub id: u32,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct AddNew {
                pub id: u32,
                #[serde(default)]
                pub note: String,
            }
            // Remove a field (the old one had no default).
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct RemoveOld {
                pub id: u32,
                pub gone: String,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct RemoveNew {
                pub id: u32,
            }
            // Rename a field: with an alias on the reader, and without.
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct RenameOld {
                pub name: String,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct RenameNew {
                #[serde(alias = "name")]
                pub title: String,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct RenameBare {
                pub title: String,
            }
            // Reorder fields.
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct OrderOld {
                pub a: u32,
                pub b: u32,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct OrderNew {
                pub b: u32,
                pub a: u32,
            }
            // Widen an integer.
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct NarrowInt {
                pub n: u32,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct WideInt {
                pub n: u64,
            }
            // Add an enum variant.
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub enum ColourOld {
                Red,
                Green,
            }
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub enum ColourNew {
                Red,
                Green,
                Blue,
            }
            volley::wire!($tier: AddOld, AddNew, RemoveOld, RemoveNew, RenameOld, RenameNew, RenameBare);
            volley::wire!($tier: OrderOld, OrderNew, NarrowInt, WideInt, ColourOld, ColourNew);

            #[test]
            fn add_a_field_with_a_default_both_ways() {
                let new: AddNew = cross(&AddOld { id: 1 }).unwrap();
                assert_eq!(new, AddNew { id: 1, note: String::new() });
                let old: AddOld = cross(&AddNew { id: 2, note: "x".into() }).unwrap();
                assert_eq!(old, AddOld { id: 2 });
            }

            #[test]
            fn remove_a_field_one_way_and_the_other_way_a_clear_error() {
                let new: RemoveNew = cross(&RemoveOld { id: 1, gone: "x".into() }).unwrap();
                assert_eq!(new, RemoveNew { id: 1 });
                let e = cross::<RemoveNew, RemoveOld>(&RemoveNew { id: 1 }).unwrap_err();
                assert!(e.0.contains("missing field `gone`") && e.0.contains("RemoveOld"), "{e}");
            }

            #[test]
            fn rename_one_way_with_an_alias_never_without() {
                let new: RenameNew = cross(&RenameOld { name: "n".into() }).unwrap();
                assert_eq!(new.title, "n");
                let e = cross::<RenameNew, RenameOld>(&RenameNew { title: "t".into() }).unwrap_err();
                assert!(e.0.contains("missing field `name`"), "{e}");
                let e = cross::<RenameOld, RenameBare>(&RenameOld { name: "n".into() }).unwrap_err();
                assert!(e.0.contains("missing field `title`"), "{e}");
            }

            #[test]
            fn reorder_both_ways() {
                let new: OrderNew = cross(&OrderOld { a: 1, b: 2 }).unwrap();
                assert_eq!(new, OrderNew { a: 1, b: 2 });
                let old: OrderOld = cross(&OrderNew { a: 3, b: 4 }).unwrap();
                assert_eq!(old, OrderOld { a: 3, b: 4 });
            }

            #[test]
            fn widen_an_integer_both_ways_while_the_value_fits() {
                let wide: WideInt = cross(&NarrowInt { n: u32::MAX }).unwrap();
                assert_eq!(wide.n, u64::from(u32::MAX));
                let narrow: NarrowInt = cross(&WideInt { n: 7 }).unwrap();
                assert_eq!(narrow.n, 7);
                let e = cross::<WideInt, NarrowInt>(&WideInt { n: 1 << 40 }).unwrap_err();
                assert!(e.0.contains("NarrowInt"), "{e}");
            }

            #[test]
            fn add_an_enum_variant_one_way_and_the_new_variant_a_clear_error() {
                let new: ColourNew = cross(&ColourOld::Green).unwrap();
                assert_eq!(new, ColourNew::Green);
                let old: ColourOld = cross(&ColourNew::Red).unwrap();
                assert_eq!(old, ColourOld::Red);
                let e = cross::<ColourNew, ColourOld>(&ColourNew::Blue).unwrap_err();
                assert!(e.0.contains("unknown variant `Blue`"), "{e}");
            }

            /// Through a real server: an old client of a new server and a new client of an
            /// old one, for the field added with a default.
            #[tokio::test]
            async fn add_a_field_across_a_server_both_ways() {
                const NEW: Method<AddNew, AddNew> = Method::new(concat!("evo-", stringify!($tier)), "m");
                const OLD: Method<AddOld, AddOld> = Method::new(concat!("evo-", stringify!($tier)), "m");
                let new_server = Server::builder()
                    .handle_fn(&NEW, |mut a: AddNew| {
                        a.note.push('!');
                        Ok(a)
                    })
                    .build();
                let addr = new_server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
                let old_client = Client::connect(&addr).await.unwrap();
                assert_eq!(old_client.call(&OLD, AddOld { id: 9 }).await.unwrap(), AddOld { id: 9 });
                new_server.shutdown().await;

                let old_server = Server::builder().handle_fn(&OLD, |a: AddOld| Ok(AddOld { id: a.id + 1 })).build();
                let addr = old_server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
                let new_client = Client::connect(&addr).await.unwrap();
                let got = new_client.call(&NEW, AddNew { id: 1, note: "dropped".into() }).await.unwrap();
                assert_eq!(got, AddNew { id: 2, note: String::new() });
                // The other way round, the "never" cell through the server: a request the old
                // type cannot read is BadRequest, naming the missing field.
                const REMOVED: Method<RemoveNew, RemoveNew> = Method::new(concat!("evo-r-", stringify!($tier)), "m");
                const KEPT: Method<RemoveOld, RemoveOld> = Method::new(concat!("evo-r-", stringify!($tier)), "m");
                let keeps = Server::builder().handle_fn(&KEPT, Ok).build();
                let addr = keeps.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
                let c = Client::connect(&addr).await.unwrap();
                match c.call(&REMOVED, RemoveNew { id: 1 }).await {
                    Err(Error::Remote(s)) => {
                        assert_eq!(s.code, Code::BadRequest);
                        assert!(s.message.contains("missing field `gone`"), "{s:?}");
                    }
                    other => panic!("expected BadRequest, got {other:?}"),
                }
                keeps.shutdown().await;
                old_server.shutdown().await;
            }
        }
    };
}

general_tier!(json, json);
general_tier!(msgpack, msgpack);

/// The fast tier: no field names and no tags, so only what leaves the bytes alone evolves.
mod fast {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Old {
        pub id: u32,
        pub name: String,
    }
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Renamed {
        pub key: u32,
        pub title: String,
    }
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Added {
        pub id: u32,
        pub name: String,
        #[serde(default)]
        pub extra: u64,
    }
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Widened {
        pub id: u64,
        pub name: String,
    }
    volley::wire!(Old, Renamed, Added, Widened);

    #[test]
    fn rename_both_ways() {
        let r: Renamed = cross(&Old { id: 1, name: "a".into() }).unwrap();
        assert_eq!(r, Renamed { key: 1, title: "a".into() });
        let o: Old = cross(&Renamed { key: 2, title: "b".into() }).unwrap();
        assert_eq!(o, Old { id: 2, name: "b".into() });
    }

    #[test]
    fn adding_a_field_or_widening_fails_to_decode_here_but_is_never_safe() {
        // These values happen to fail; the table says "never" because other values of other
        // types need not (the fingerprint is what catches every case).
        assert!(cross::<Old, Added>(&Old { id: 1, name: "a".into() }).is_err());
        assert!(cross::<Added, Old>(&Added { id: 1, name: "a".into(), extra: 5 }).is_err());
        assert!(cross::<Old, Widened>(&Old { id: 1, name: "a".into() }).is_err());
    }
}

/// Plain data: the value's memory, so only a rename (same layout) evolves.
mod pod {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    pub struct Old {
        pub x: u32,
        pub y: u32,
    }
    #[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    pub struct Renamed {
        pub left: u32,
        pub right: u32,
    }
    #[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    pub struct Added {
        pub x: u32,
        pub y: u32,
        pub z: u32,
    }
    volley::wire!(pod: Old, Renamed, Added);

    #[test]
    fn rename_both_ways_and_a_new_field_is_a_length_error() {
        let r: Renamed = cross(&Old { x: 1, y: 2 }).unwrap();
        assert_eq!(r, Renamed { left: 1, right: 2 });
        let o: Old = cross(&Renamed { left: 3, right: 4 }).unwrap();
        assert_eq!(o, Old { x: 3, y: 4 });
        let e = cross::<Old, Added>(&Old { x: 1, y: 2 }).unwrap_err();
        assert!(e.0.contains("Added"), "{e}");
        assert!(cross::<Added, Old>(&Added { x: 1, y: 2, z: 3 }).is_err());
    }
}

/// A method added to a service: old clients never call it, and a new client of an old server
/// gets `UnknownMethod`, whatever the tier.
#[tokio::test]
async fn add_a_method_both_ways() {
    const KEPT: Method<String, String> = Method::new("evo-methods", "kept");
    const ADDED: Method<String, String> = Method::new("evo-methods", "added");
    let old = Server::builder().handle_fn(&KEPT, Ok).build();
    let addr = old.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let new_client = Client::connect(&addr).await.unwrap();
    assert_eq!(new_client.call(&KEPT, "k".to_string()).await.unwrap(), "k");
    match new_client.call(&ADDED, "a".to_string()).await {
        Err(Error::Remote(s)) => assert_eq!(s.code, Code::UnknownMethod, "{s:?}"),
        other => panic!("expected UnknownMethod, got {other:?}"),
    }
    old.shutdown().await;
    let new = Server::builder()
        .handle_fn(&KEPT, Ok)
        .handle_fn(&ADDED, |s: String| Ok::<_, Status>(s + "!"))
        .build();
    let addr = new.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let old_client = Client::connect(&addr).await.unwrap();
    assert_eq!(old_client.call(&KEPT, "k".to_string()).await.unwrap(), "k");
    new.shutdown().await;
}
