//! Protobuf payloads from JSON and back, for `volley call`: the message is found in the
//! descriptor set that reflection hands out with a protobuf type (docs/PROTOCOL.md, §15.4), and
//! built or read as a dynamic message in protobuf's canonical JSON mapping (the one grpcurl and
//! every protobuf library speak: `lowerCamelCase` or `.proto` field names in, `lowerCamelCase`
//! out, 64-bit integers as strings, fields at their default left out).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost_reflect::prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};
use serde_json::Value;
use volley::reflect::TypeInfo;

/// The descriptor of the message of type `t`, from what reflection says of it.
pub fn message(t: &TypeInfo) -> Result<MessageDescriptor, String> {
    let info = t.protobuf.as_ref();
    let set = info.and_then(|p| p.descriptor_set.as_deref()).ok_or_else(|| {
        format!(
            "{} is protobuf, but the server hands out no descriptor for it: declare it with \
             wire!(proto(DESCRIPTOR_SET): …) (prost-build's file_descriptor_set_path), or give \
             the payload as base64 with --base64",
            t.name
        )
    })?;
    let bytes =
        BASE64.decode(set).map_err(|e| format!("{}: the descriptor set is not base64: {e}", t.name))?;
    let pool = DescriptorPool::decode(bytes.as_slice())
        .map_err(|e| format!("{}: the descriptor set does not read: {e}", t.name))?;
    match info.and_then(|p| p.message.as_deref()) {
        Some(name) => pool
            .get_message_by_name(name)
            .ok_or_else(|| format!("{}: the descriptor set has no message {name}", t.name)),
        // Without the full name (the type has no `prost::Name`), the Rust type's own name
        // finds it, if exactly one message of the set is called that.
        None => {
            let short = t.name.rsplit("::").next().unwrap_or(&t.name);
            let mut found = pool.all_messages().filter(|m| m.name() == short);
            match (found.next(), found.next()) {
                (Some(m), None) => Ok(m),
                _ => Err(format!(
                    "{}: the server names no protobuf message for it and its descriptor set has not \
                     exactly one message {short:?} (prost-build's enable_type_names names it)",
                    t.name
                )),
            }
        }
    }
}

/// The payload of the message `m` written as JSON `v`. A field the message does not have is
/// refused, as a misspelt name would otherwise be dropped without a word.
pub fn encode(m: &MessageDescriptor, v: &Value) -> Result<Vec<u8>, String> {
    let msg = DynamicMessage::deserialize_with_options(m.clone(), v, &DeserializeOptions::new())
        .map_err(|e| format!("not a {}: {e}", m.full_name()))?;
    Ok(msg.encode_to_vec())
}

/// The JSON of a payload of the message `m`.
pub fn decode(m: &MessageDescriptor, payload: &[u8]) -> Result<Value, String> {
    let msg = DynamicMessage::decode(m.clone(), payload)
        .map_err(|e| format!("the reply is not a {}: {e}", m.full_name()))?;
    serde_json::to_value(&msg).map_err(|e| format!("the reply {} as JSON: {e}", m.full_name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_reflect::prost_types::field_descriptor_proto::Type;
    use prost_reflect::prost_types::{
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    };
    use serde_json::json;
    use volley::reflect::ProtobufInfo;

    /// A descriptor set of one file: package `t`, messages `Item {uint64 n = 1; string s = 2}`
    /// and `Other {}`.
    fn set() -> String {
        let field = |name: &str, number, kind: Type| FieldDescriptorProto {
            name: Some(name.into()),
            number: Some(number),
            r#type: Some(kind as i32),
            json_name: None,
            ..Default::default()
        };
        let file = FileDescriptorProto {
            name: Some("t.proto".into()),
            package: Some("t".into()),
            syntax: Some("proto3".into()),
            message_type: vec![
                DescriptorProto {
                    name: Some("Item".into()),
                    field: vec![field("n", 1, Type::Uint64), field("s", 2, Type::String)],
                    ..Default::default()
                },
                DescriptorProto { name: Some("Other".into()), ..Default::default() },
            ],
            ..Default::default()
        };
        BASE64.encode(FileDescriptorSet { file: vec![file] }.encode_to_vec())
    }

    fn info(name: &str, message: Option<&str>, descriptor_set: Option<String>) -> TypeInfo {
        TypeInfo {
            name: name.into(),
            tier: "general".into(),
            format: "protobuf".into(),
            protobuf: Some(ProtobufInfo { message: message.map(Into::into), descriptor_set }),
            ..TypeInfo::default()
        }
    }

    #[test]
    fn a_message_from_its_descriptor_set_round_trips_through_json() {
        let m = message(&info("app::Item", Some("t.Item"), Some(set()))).unwrap();
        let bytes = encode(&m, &json!({"n": "300", "s": "hi"})).unwrap();
        assert_eq!(bytes, [0x08, 0xac, 0x02, 0x12, 0x02, b'h', b'i']);
        assert_eq!(decode(&m, &bytes).unwrap(), json!({"n": "300", "s": "hi"}));
        assert!(encode(&m, &json!({"size": 1})).unwrap_err().contains("not a t.Item"));
        assert!(decode(&m, &[0x12, 0x09]).unwrap_err().contains("not a t.Item"));
    }

    #[test]
    fn without_a_full_name_the_rust_name_finds_the_message() {
        let m = message(&info("app::pb::Item", None, Some(set()))).unwrap();
        assert_eq!(m.full_name(), "t.Item");
        let e = message(&info("app::Missing", None, Some(set()))).unwrap_err();
        assert!(e.contains("\"Missing\""), "{e}");
        let e = message(&info("app::Item", None, None)).unwrap_err();
        assert!(e.contains("no descriptor") && e.contains("--base64"), "{e}");
        let e = message(&info("app::Item", Some("t.Gone"), Some(set()))).unwrap_err();
        assert!(e.contains("no message t.Gone"), "{e}");
    }
}
