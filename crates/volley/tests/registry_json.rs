//! The registry's encoding (docs/PROTOCOL.md §16.2, §16.4): every JSON example of the document
//! is the reference implementation's exact bytes, optional fields take their documented
//! defaults, unknown fields are ignored, 64-bit ids survive, the relay's binary layout matches
//! its examples, and a peer that still speaks bitcode is refused with an error that names the
//! change, in both directions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use volley::bytes::{Bytes, BytesMut};
use volley::codec::BitcodeSerde;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::wire::{
    self, ControllerInfo, Instance, InstanceSpec, LeaseRequest, Listing, RegisterRequest, Registered,
    RelayReply, RelayRequest, Renewed, Resolved, Target, WatchRequest,
};
use volley::{Client, Code, Error, Method, Server, Status, Wire};

/// The ```` ```json TYPE ```` blocks of PROTOCOL.md §16: (type name, the JSON text).
fn documented_examples() -> Vec<(String, String)> {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let section = &doc[doc.find("## 16. The registry service").expect("§16 exists")..];
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("```json ") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        out.push((name.trim().to_string(), body.join("\n")));
    }
    out
}

fn encode<T: Wire>(v: &T) -> Vec<u8> {
    let mut b = BytesMut::new();
    v.encode(&mut b).unwrap();
    b.to_vec()
}

fn decode<T: Wire>(json: &str) -> Result<T, volley::CodecError> {
    T::decode(Bytes::copy_from_slice(json.as_bytes()))
}

/// Decodes `json` as `T`, encodes it again, and returns the bytes.
fn again<T: Wire>(json: &str) -> Vec<u8> {
    encode(&decode::<T>(json).unwrap_or_else(|e| panic!("{json}: {e}")))
}

fn reencoded(name: &str, json: &str) -> Vec<u8> {
    match name {
        "InstanceSpec" => again::<InstanceSpec>(json),
        "Instance" => again::<Instance>(json),
        "RegisterRequest" => again::<RegisterRequest>(json),
        "Registered" => again::<Registered>(json),
        "LeaseRequest" => again::<LeaseRequest>(json),
        "Renewed" => again::<Renewed>(json),
        "Resolved" => again::<Resolved>(json),
        "WatchRequest" => again::<WatchRequest>(json),
        "ControllerInfo" => again::<ControllerInfo>(json),
        "Listing" => again::<Listing>(json),
        other => panic!("PROTOCOL.md §16 has an example of an unknown message {other}"),
    }
}

#[test]
fn every_json_example_of_the_protocol_is_what_the_reference_writes() {
    let examples = documented_examples();
    let names: Vec<&str> = examples.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "InstanceSpec",
            "InstanceSpec",
            "Instance",
            "RegisterRequest",
            "Registered",
            "LeaseRequest",
            "Renewed",
            "Resolved",
            "WatchRequest",
            "ControllerInfo",
            "Listing"
        ],
        "one example per JSON message, in the document's order"
    );
    for (name, json) in &examples {
        assert_eq!(String::from_utf8(reencoded(name, json)).unwrap(), json.trim(), "{name}");
    }
}

#[test]
fn unknown_fields_are_ignored() {
    for (name, json) in documented_examples() {
        let extended = format!(r#"{{"added_later":{{"x":[1,2]}},{}"#, &json.trim()[1..]);
        assert_eq!(reencoded(&name, &extended), reencoded(&name, &json), "{name}");
    }
}

#[test]
fn optional_fields_take_their_documented_defaults() {
    let r: RegisterRequest =
        decode(r#"{"instances":[{"service":"search","address":"tcp://10.0.0.5:7000"}]}"#).unwrap();
    assert_eq!(
        r,
        RegisterRequest {
            lease: 0,
            ttl_ms: 10_000,
            instances: vec![InstanceSpec::new("search", "tcp://10.0.0.5:7000")],
            credential: String::new(),
        }
    );
    assert_eq!(r.instances[0].weight, 1);
    assert_eq!(decode::<LeaseRequest>(r#"{"lease":5}"#).unwrap().credential, "");
    let w: WatchRequest = decode(r#"{"service":"s","timeout_ms":250}"#).unwrap();
    assert_eq!((w.epoch, w.from_revision, w.client_id, w.timeout_ms), (0, 0, 0, 250));
    let i: Instance = decode(r#"{"id":1,"lease":2,"service":"s","address":"tcp://h:1"}"#).unwrap();
    assert_eq!((i.weight, &i.metadata), (1, &BTreeMap::new()));
    // Revision 2's fields: empty when left out, and left out when empty (revision 1's bytes).
    assert_eq!((i.host_id.as_str(), i.local_addresses.len()), ("", 0));
    let text = String::from_utf8(encode(&i)).unwrap();
    assert_eq!(text, r#"{"id":1,"lease":2,"service":"s","address":"tcp://h:1","weight":1,"metadata":{}}"#);
}

#[test]
fn same_host_addresses_round_trip_with_their_host_id() {
    let spec = InstanceSpec::new("s", "tcp://h:1").host_id("boot/net:[1]").local_address("shm://s");
    let text = String::from_utf8(encode(&spec)).unwrap();
    assert!(text.ends_with(r#""host_id":"boot/net:[1]","local_addresses":["shm://s"]}"#), "{text}");
    assert_eq!(decode::<InstanceSpec>(&text).unwrap(), spec);
    let i = spec.instance(1, 2);
    assert_eq!(decode::<Instance>(&String::from_utf8(encode(&i)).unwrap()).unwrap(), i);
    assert!(decode::<InstanceSpec>(r#"{"service":"s","address":"a","local_addresses":"shm://s"}"#).is_err());
}

#[test]
fn a_missing_required_field_or_a_wrong_type_is_refused() {
    for bad in [r#"{"lease":0}"#, r#"{"instances":[{"service":"s"}]}"#, r#"{"instances":{}}"#] {
        assert!(decode::<RegisterRequest>(bad).is_err(), "{bad}");
    }
    assert!(decode::<WatchRequest>(r#"{"service":"s"}"#).is_err(), "timeout_ms is required");
    assert!(decode::<LeaseRequest>(r#"{"lease":-1}"#).is_err(), "ids are unsigned");
    assert!(decode::<LeaseRequest>(r#"{"lease":1.5}"#).is_err(), "ids are integers");
    assert!(decode::<Renewed>(r#"{"known":1,"ttl_ms":3}"#).is_err(), "booleans are booleans");
}

#[test]
fn ids_keep_all_64_bits() {
    let r = Registered { lease: u64::MAX, ttl_ms: 1, instance_ids: vec![(1 << 53) + 1], epoch: u64::MAX - 1 };
    let text = String::from_utf8(encode(&r)).unwrap();
    assert!(text.contains("18446744073709551615") && text.contains("9007199254740993"), "{text}");
    assert_eq!(decode::<Registered>(&text).unwrap(), r);
}

#[test]
fn the_relay_layout_matches_its_examples() {
    let req = RelayRequest {
        service: "echo".into(),
        method: "echo".into(),
        idempotent: true,
        target: Target::Key(volley::balance::key_hash(b"izenesoft")),
        timeout_ms: 1500,
        payload: Bytes::from_static(b"hi"),
    };
    let want = "01 01 dc997edaa023a10c dc050000 04 6563686f 04 6563686f 6869";
    assert_eq!(encode(&req), hex(want));
    assert_eq!(RelayRequest::decode(Bytes::from(hex(want))).unwrap(), req);
    let by_address = RelayRequest { target: Target::Address("unix:///s".into()), idempotent: false, ..req };
    assert_eq!(
        encode(&by_address),
        hex("00 02 0900 756e69783a2f2f2f73 dc050000 04 6563686f 04 6563686f 6869")
    );
    for (reply, want) in [
        (RelayReply::Ok(Bytes::from_static(b"hi")), "00 6869"),
        (RelayReply::Remote(Status::app("no")), "01 0400 6e6f"),
        (RelayReply::Timeout(250), "05 fa00000000000000"),
        (RelayReply::UnknownService("x".into()), "03 78"),
    ] {
        assert_eq!(encode(&reply), hex(want));
        assert_eq!(RelayReply::decode(Bytes::from(hex(want))).unwrap(), reply);
    }
    assert!(RelayRequest::decode(Bytes::from(hex("00 03 dc050000"))).is_err(), "unknown target kind");
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// `RegisterRequest` as a peer of the bitcode revision encodes it.
#[derive(Serialize, Deserialize)]
struct OldRegisterRequest {
    lease: u64,
    ttl_ms: u64,
    instances: Vec<OldInstanceSpec>,
    credential: String,
}

#[derive(Serialize, Deserialize)]
struct OldInstanceSpec {
    service: String,
    address: String,
    weight: u32,
    metadata: BTreeMap<String, String>,
}

fn socket(tag: &str) -> String {
    format!(
        "unix://{}/volley-registry-json-{tag}-{}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    )
}

#[tokio::test]
async fn a_bitcode_request_is_answered_bad_request_naming_the_json_encoding() {
    let controller = Controller::new(ControllerConfig::default());
    let addr = controller.listen(&socket("old-client")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    // Sent as bytes: a peer of that era sends no schema fingerprint (PROTOCOL §15.6 came
    // later), so the controller's decoding is what answers it.
    let old: Method<Bytes, Bytes> = Method::new(wire::SERVICE, "register");
    let req = OldRegisterRequest {
        lease: 0,
        ttl_ms: 1000,
        instances: vec![OldInstanceSpec {
            service: "s".into(),
            address: "tcp://127.0.0.1:1".into(),
            weight: 1,
            metadata: BTreeMap::new(),
        }],
        credential: String::new(),
    };
    let bytes = Bytes::from(bitcode::serialize(&req).unwrap());
    let err = client.call(&old, bytes).await.unwrap_err();
    let Error::Remote(status) = err else { panic!("expected an error reply, got {err:?}") };
    assert_eq!(status.code, Code::BadRequest);
    assert!(status.message.contains("the registry speaks JSON (docs/PROTOCOL.md §16)"), "{}", status.message);
    assert!(status.message.contains("bitcode"), "{}", status.message);
    // Nothing was registered.
    assert!(client.call(&wire::LIST, ()).await.unwrap().services.is_empty());
    controller.shutdown().await;
}

/// What a bitcode-era controller's `resolve` answered: service, epoch, revision, known,
/// settling and the instances (left empty here).
type OldResolved = BitcodeSerde<(String, u64, u64, bool, bool, Vec<u8>)>;

#[tokio::test]
async fn a_bitcode_reply_from_an_old_controller_is_a_decode_error_naming_the_json_encoding() {
    let old_resolve: Method<String, OldResolved> = Method::new(wire::SERVICE, "resolve");
    let server = Server::builder()
        .handle_fn(&old_resolve, |s: String| Ok(BitcodeSerde((s, 7, 3, true, false, Vec::new()))))
        .build();
    let addr = server.listen(&socket("old-controller")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    match client.call(&wire::RESOLVE, "search".to_string()).await {
        Err(Error::Decode(m)) => assert!(m.contains("the registry speaks JSON"), "{m}"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    server.shutdown().await;
}
