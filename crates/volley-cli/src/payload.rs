//! JSON typed at a shell to a request payload, and a reply payload back to JSON, by the byte
//! format a server's reflection names (`volley.reflect`; docs/PROTOCOL.md, *Reflection*).
//! Formats whose bytes carry no field names (bitcode, plain-data structs, hand-written
//! encodings) cannot be built from JSON: they are refused with the reason, and travel as
//! base64 only when asked (`--base64`). Protobuf is built and read through the message's
//! descriptor, which reflection hands out with the type (`protobuf.rs`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost_reflect::MessageDescriptor;
use serde_json::{Value, json};
use volley::reflect::TypeInfo;

use crate::protobuf;

/// How bytes and unknown formats are read from and written as JSON.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Bytes (and formats that cannot be built from JSON) as base64 strings, not UTF-8 text.
    pub base64: bool,
}

/// A type as reflection names it, made ready once for many payloads: a protobuf message's
/// descriptor is read from its descriptor set here, not per payload.
pub struct Shape {
    t: TypeInfo,
    /// For a protobuf type: its message, or why it cannot be had.
    message: Option<Result<MessageDescriptor, String>>,
}

impl Shape {
    pub fn of(t: &TypeInfo) -> Shape {
        let message = (t.format == "protobuf").then(|| protobuf::message(t));
        Shape { t: t.clone(), message }
    }
}

/// The payload of `v` for a value of type `s`.
pub fn encode(s: &Shape, v: &Value, o: Options) -> Result<Vec<u8>, String> {
    let t = &s.t;
    match &s.message {
        Some(Ok(m)) => return protobuf::encode(m, v),
        // With --base64 the payload is given whole, as for any format JSON cannot describe.
        Some(Err(why)) if !o.base64 => return Err(why.clone()),
        _ => {}
    }
    let format = t.format.as_str();
    match format {
        "json" => Ok(serde_json::to_vec(v).expect("a JSON value always encodes")),
        "msgpack" => rmp_serde::to_vec_named(v).map_err(|e| format!("as MessagePack: {e}")),
        "utf-8" => match v {
            Value::String(s) => Ok(s.clone().into_bytes()),
            other => Err(format!("{} is text: give a JSON string, not {other}", t.name)),
        },
        "unit" => match v {
            Value::Null => Ok(Vec::new()),
            other => Err(format!("{} takes no value: give null (or nothing), not {other}", t.name)),
        },
        "bool" => {
            v.as_bool().map(|b| vec![b as u8]).ok_or_else(|| format!("{} is true or false, not {v}", t.name))
        }
        "bytes" => bytes(&t.name, v, o),
        "array" => match element(&t.name) {
            Some("u8") | Some("i8") if !v.is_array() => bytes(&t.name, v, o),
            Some(elem) => {
                let items = v
                    .as_array()
                    .ok_or_else(|| format!("{} is a list of {elem}: give a JSON array", t.name))?;
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    out.extend(number(elem, item).map_err(|e| format!("item {i}: {e}"))?);
                }
                Ok(out)
            }
            None => opaque(t, v, o),
        },
        n if is_number(n) => number(n, v),
        _ => opaque(t, v, o),
    }
}

/// The JSON of a reply payload of type `s`.
pub fn decode(s: &Shape, payload: &[u8], o: Options) -> Result<Value, String> {
    let t = &s.t;
    if let Some(Ok(m)) = &s.message {
        return protobuf::decode(m, payload);
    }
    let format = t.format.as_str();
    match format {
        "json" => serde_json::from_slice(payload).map_err(|e| format!("the reply is not JSON: {e}")),
        "msgpack" => rmp_serde::from_slice(payload).map_err(|e| format!("the reply is not MessagePack: {e}")),
        "utf-8" => std::str::from_utf8(payload)
            .map(|s| Value::String(s.to_string()))
            .map_err(|e| format!("the reply is not UTF-8: {e}")),
        "unit" if payload.is_empty() => Ok(Value::Null),
        "bool" if payload.len() == 1 && payload[0] <= 1 => Ok(Value::Bool(payload[0] == 1)),
        "bytes" => Ok(shown_bytes(payload, o)),
        "array" => match element(&t.name) {
            Some("u8") => Ok(shown_bytes(payload, o)),
            Some(elem) => {
                let size = width(elem).expect("element() returns number types only");
                if !payload.len().is_multiple_of(size) {
                    return Err(format!("{} bytes is not a whole number of {elem}s", payload.len()));
                }
                payload
                    .chunks(size)
                    .map(|c| from_le(elem, c))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array)
            }
            None => Ok(json!({ "base64": BASE64.encode(payload) })),
        },
        n if is_number(n) => from_le(n, payload),
        // Bytes no JSON could describe: shown as they are.
        _ => Ok(json!({ "base64": BASE64.encode(payload) })),
    }
}

/// Raw bytes: a JSON string taken as UTF-8 text, or as base64 with `--base64`.
fn bytes(name: &str, v: &Value, o: Options) -> Result<Vec<u8>, String> {
    let s = v.as_str().ok_or_else(|| {
        format!("{name} is bytes: give a JSON string (UTF-8 text, or base64 with --base64), not {v}")
    })?;
    if o.base64 {
        BASE64.decode(s).map_err(|e| format!("--base64: {s:?} is not base64: {e}"))
    } else {
        Ok(s.as_bytes().to_vec())
    }
}

/// Bytes as a JSON string: UTF-8 text where they are (and base64 was not asked for), else
/// `{"base64": …}` so that nothing is lost.
fn shown_bytes(payload: &[u8], o: Options) -> Value {
    match std::str::from_utf8(payload) {
        Ok(s) if !o.base64 => Value::String(s.to_string()),
        _ if o.base64 => Value::String(BASE64.encode(payload)),
        _ => json!({ "base64": BASE64.encode(payload) }),
    }
}

/// A format whose bytes JSON cannot describe: only a base64 payload, and only when asked.
fn opaque(t: &TypeInfo, v: &Value, o: Options) -> Result<Vec<u8>, String> {
    if o.base64 {
        return bytes(&t.name, v, o);
    }
    let why = match t.format.as_str() {
        "bitcode" | "bitcode-serde" => "bitcode (the fast tier) carries no field names",
        "pod" => "a plain-data struct is its memory, with no field names",
        "protobuf" => "the server hands out no descriptor for it",
        _ => "its encoding is hand-written",
    };
    Err(format!(
        "{} ({} tier, format {}) cannot be built from JSON: {why}. Declare it with wire!(json: …) or \
         wire!(msgpack: …) to call it from a shell, or give the payload as base64 with --base64",
        t.name, t.tier, t.format
    ))
}

const NUMBERS: [(&str, usize); 12] = [
    ("u8", 1),
    ("u16", 2),
    ("u32", 4),
    ("u64", 8),
    ("u128", 16),
    ("i8", 1),
    ("i16", 2),
    ("i32", 4),
    ("i64", 8),
    ("i128", 16),
    ("f32", 4),
    ("f64", 8),
];

fn is_number(format: &str) -> bool {
    width(format).is_some()
}

fn width(n: &str) -> Option<usize> {
    NUMBERS.iter().find(|(name, _)| *name == n).map(|(_, w)| *w)
}

/// The number type of an array's elements, from its type name: Rust's `alloc::vec::Vec<u32>`
/// or `volley::codec::pod::PodVec<u32>`, Python's `list[u32]`.
fn element(type_name: &str) -> Option<&'static str> {
    let open = type_name.find(['<', '['])?;
    let inner = type_name[open + 1..].trim_end_matches(['>', ']']).trim();
    NUMBERS.iter().map(|(n, _)| *n).find(|n| *n == inner)
}

/// A JSON number (or, for 128-bit integers, a string of digits) as `n`, little-endian.
fn number(n: &str, v: &Value) -> Result<Vec<u8>, String> {
    let bad = || format!("{v} is not a {n}");
    let int = || -> Result<i128, String> {
        match v {
            Value::Number(x) => {
                x.as_i64().map(i128::from).or_else(|| x.as_u64().map(i128::from)).ok_or_else(bad)
            }
            Value::String(s) => s.parse::<i128>().map_err(|_| bad()),
            _ => Err(bad()),
        }
    };
    macro_rules! fit {
        ($t:ty) => {
            <$t>::try_from(int()?).map_err(|_| bad())?.to_le_bytes().to_vec()
        };
    }
    Ok(match n {
        "u8" => fit!(u8),
        "u16" => fit!(u16),
        "u32" => fit!(u32),
        "u64" => fit!(u64),
        "i8" => fit!(i8),
        "i16" => fit!(i16),
        "i32" => fit!(i32),
        "i64" => fit!(i64),
        "i128" => int()?.to_le_bytes().to_vec(),
        "u128" => match v {
            Value::String(s) => s.parse::<u128>().map_err(|_| bad())?.to_le_bytes().to_vec(),
            _ => u128::try_from(int()?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        },
        "f32" => (v.as_f64().ok_or_else(bad)? as f32).to_le_bytes().to_vec(),
        "f64" => v.as_f64().ok_or_else(bad)?.to_le_bytes().to_vec(),
        _ => return Err(bad()),
    })
}

/// A little-endian `n` as JSON (128-bit integers as strings: JSON numbers lose their digits).
fn from_le(n: &str, b: &[u8]) -> Result<Value, String> {
    let expected = width(n).ok_or_else(|| format!("{n} is not a number type"))?;
    if b.len() != expected {
        return Err(format!("a {n} is {expected} bytes, the reply has {}", b.len()));
    }
    macro_rules! le {
        ($t:ty) => {
            <$t>::from_le_bytes(b.try_into().expect("length checked"))
        };
    }
    Ok(match n {
        "u8" => json!(le!(u8)),
        "u16" => json!(le!(u16)),
        "u32" => json!(le!(u32)),
        "u64" => json!(le!(u64)),
        "i8" => json!(le!(i8)),
        "i16" => json!(le!(i16)),
        "i32" => json!(le!(i32)),
        "i64" => json!(le!(i64)),
        "u128" => json!(le!(u128).to_string()),
        "i128" => json!(le!(i128).to_string()),
        "f32" => json!(le!(f32)),
        _ => json!(le!(f64)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(format: &str, name: &str) -> Shape {
        Shape::of(&TypeInfo {
            name: name.into(),
            tier: "x".into(),
            format: format.into(),
            ..TypeInfo::default()
        })
    }

    fn round(ty: &Shape, v: Value, o: Options) -> Value {
        decode(ty, &encode(ty, &v, o).unwrap(), o).unwrap()
    }

    #[test]
    fn every_format_json_can_describe_round_trips() {
        let o = Options::default();
        let doc = json!({"item": "tea", "count": 3, "tags": ["a"]});
        assert_eq!(round(&t("json", "Order"), doc.clone(), o), doc);
        assert_eq!(round(&t("msgpack", "Order"), doc.clone(), o), doc);
        assert_eq!(encode(&t("utf-8", "String"), &json!("hé"), o).unwrap(), "hé".as_bytes());
        assert_eq!(round(&t("unit", "()"), Value::Null, o), Value::Null);
        assert_eq!(round(&t("bool", "bool"), json!(true), o), json!(true));
        assert_eq!(encode(&t("u32", "u32"), &json!(258), o).unwrap(), [2, 1, 0, 0]);
        assert_eq!(round(&t("i64", "i64"), json!(-5), o), json!(-5));
        assert_eq!(round(&t("f64", "f64"), json!(1.5), o), json!(1.5));
        assert_eq!(round(&t("u128", "u128"), json!(u128::MAX.to_string()), o), json!(u128::MAX.to_string()));
        assert_eq!(round(&t("array", "alloc::vec::Vec<u16>"), json!([1, 65535]), o), json!([1, 65535]));
        assert_eq!(round(&t("array", "list[i32]"), json!([-1]), o), json!([-1]));
        assert_eq!(round(&t("bytes", "bytes::bytes::Bytes"), json!("text"), o), json!("text"));
        let b64 = Options { base64: true };
        assert_eq!(encode(&t("bytes", "Bytes"), &json!("AAH/"), b64).unwrap(), [0, 1, 255]);
        assert_eq!(round(&t("bytes", "Bytes"), json!("AAH/"), b64), json!("AAH/"));
        assert_eq!(decode(&t("bytes", "Bytes"), &[0xff], o).unwrap(), json!({"base64": "/w=="}));
        assert_eq!(encode(&t("array", "alloc::vec::Vec<u8>"), &json!("ab"), o).unwrap(), b"ab");
    }

    #[test]
    fn what_json_cannot_describe_is_refused_with_the_reason() {
        let o = Options::default();
        let e = encode(&t("bitcode-serde", "app::Query"), &json!({"k": 1}), o).unwrap_err();
        assert!(e.contains("app::Query") && e.contains("no field names") && e.contains("--base64"), "{e}");
        assert!(encode(&t("pod", "app::Point"), &json!([1]), o).unwrap_err().contains("plain-data"));
        assert!(encode(&t("u8", "u8"), &json!(256), o).unwrap_err().contains("not a u8"));
        assert!(encode(&t("utf-8", "String"), &json!(5), o).unwrap_err().contains("JSON string"));
        assert!(encode(&t("unit", "()"), &json!(1), o).unwrap_err().contains("no value"));
        assert!(decode(&t("u32", "u32"), &[1, 2], o).unwrap_err().contains("4 bytes"));
        // With --base64 an opaque payload travels as given.
        assert_eq!(encode(&t("bitcode", "Q"), &json!("AQI="), Options { base64: true }).unwrap(), [1, 2]);
    }
}
