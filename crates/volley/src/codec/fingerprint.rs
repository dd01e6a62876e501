//! Schema fingerprints of fast-tier types: what lets two builds tell, before a fast-tier
//! payload is decoded, whether they declare the same type (docs/PROTOCOL.md, *Schema
//! fingerprints*).
//!
//! bitcode's bytes carry no field names, tags or lengths per field, so a type that changed
//! between two builds can decode into a wrong value instead of failing. The fingerprint of a
//! type is a 64-bit hash of its **shape** in serde's data model: its fields' names and
//! formats in order, its enum variants' names, indices and contents, its sequences, maps,
//! options and tuples, nested types resolved (a recursive type refers back by depth). Type
//! names are left out, so renaming a type (or moving it to another module) keeps its
//! fingerprint; adding, removing, renaming, reordering or retyping a field changes it.
//!
//! The shape is read from the type's `Deserialize` implementation by
//! [serde-reflection](https://docs.rs/serde-reflection), which the compiler derived from the
//! type's definition: the same definition gives the same fingerprint in every build, on every
//! machine. It is worked out once per type, on first use, and kept. A type whose shape cannot
//! be traced (a hand-written `Deserialize` that refuses the tracer's values, two different
//! types of one serde name inside it) has no fingerprint, and its methods are not checked.

use std::any::TypeId;
use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::OnceLock;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde_reflection::{
    ContainerFormat, Format, FormatHolder, Named, Registry, Samples, Tracer, TracerConfig, VariantFormat,
};

/// The most tracing passes of one attempt: a pass visits one more variant of each enum, so a
/// type with an enum of more variants than this is left without a fingerprint.
const MAX_PASSES: usize = 256;

/// The fingerprint of `T`'s shape, or `None` if its shape cannot be traced. Never 0 (0 stands
/// for "no fingerprint" on the wire).
pub fn of_serde<T: DeserializeOwned + 'static>() -> Option<u64> {
    static KNOWN: OnceLock<RwLock<FxHashMap<TypeId, Option<u64>>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    let id = TypeId::of::<T>();
    if let Some(fp) = known.read().get(&id) {
        return *fp;
    }
    let fp = shape_of::<T>().map(|s| hash(&s));
    known.write().insert(id, fp);
    fp
}

/// The canonical description of `T`'s shape that the fingerprint hashes (for people and
/// tests: it shows what the fingerprint covers).
pub fn shape_of<T: DeserializeOwned>() -> Option<String> {
    let (root, registry) = trace::<T>()?;
    let mut out = String::new();
    write_format(&root, &registry, &mut Vec::new(), &mut out);
    Some(out)
}

/// Picks [`of_serde`] in `wire!(bitcode: T)` when `T` also derives serde's `Deserialize`, and
/// no fingerprint otherwise (bitcode's own derive shows nothing of the type's shape): found on
/// `&Probe<T>` without autoref.
pub trait ViaSerde {
    fn volley_fingerprint(&self) -> Option<u64>;
}

/// Taken when `T` is not `Deserialize`: found on `&&Probe<T>`, one autoref later.
pub trait NoSerde {
    fn volley_fingerprint(&self) -> Option<u64> {
        None
    }
}

impl<T: ?Sized> NoSerde for &super::schema::Probe<T> {}

impl<T: DeserializeOwned + 'static> ViaSerde for super::schema::Probe<T> {
    fn volley_fingerprint(&self) -> Option<u64> {
        of_serde::<T>()
    }
}

/// xxh3-64 of the description, 0 mapped to 1.
fn hash(shape: &str) -> u64 {
    super::hash::xxh3_64(shape.as_bytes()).max(1)
}

/// The root format and the containers it names. A pass of the tracer visits one more variant
/// of each enum it meets, but only once the enum is unmarked as incomplete, which the tracer
/// does by itself for the root type alone; the names of nested enums show only in the error of
/// a finished trace. So each attempt starts afresh, unmarks the enums the attempts before
/// found incomplete between its passes, and makes twice as many passes, until the registry is
/// complete.
fn trace<T: DeserializeOwned>() -> Option<(Format, Registry)> {
    let samples = Samples::new();
    let mut enums: BTreeSet<String> = BTreeSet::new();
    let mut passes = 1;
    loop {
        let mut tracer = Tracer::new(TracerConfig::default());
        let mut root = None;
        for pass in 0..passes {
            if pass > 0 {
                for name in &enums {
                    let _ = tracer.check_incomplete_enum(name);
                }
            }
            match tracer.trace_type_once::<T>(&samples) {
                Ok((format, _)) => root = Some(format),
                Err(e) => return untraceable::<T>(e),
            }
        }
        match tracer.registry() {
            Ok(registry) => {
                let mut root = root?;
                root.normalize().ok()?;
                return Some((root, registry));
            }
            Err(serde_reflection::Error::MissingVariants(names)) => {
                let before = enums.len();
                enums.extend(names);
                if passes >= MAX_PASSES && enums.len() == before {
                    return None;
                }
                passes = (passes * 2).min(MAX_PASSES);
            }
            Err(e) => return untraceable::<T>(e),
        }
    }
}

#[cold]
fn untraceable<T>(e: serde_reflection::Error) -> Option<(Format, Registry)> {
    tracing::debug!(ty = std::any::type_name::<T>(), %e, "no fingerprint: its shape cannot be traced");
    None
}

fn write_format(f: &Format, registry: &Registry, open: &mut Vec<String>, out: &mut String) {
    let simple = match f {
        Format::Variable(_) => "?",
        Format::Unit => "unit",
        Format::Bool => "bool",
        Format::I8 => "i8",
        Format::I16 => "i16",
        Format::I32 => "i32",
        Format::I64 => "i64",
        Format::I128 => "i128",
        Format::U8 => "u8",
        Format::U16 => "u16",
        Format::U32 => "u32",
        Format::U64 => "u64",
        Format::U128 => "u128",
        Format::F32 => "f32",
        Format::F64 => "f64",
        Format::Char => "char",
        Format::Str => "str",
        Format::Bytes => "bytes",
        Format::TypeName(name) => {
            // A type inside itself refers back by how many containers up it opened.
            if let Some(at) = open.iter().rposition(|n| n == name) {
                let _ = write!(out, "^{}", open.len() - at);
                return;
            }
            let Some(container) = registry.get(name) else {
                out.push('?');
                return;
            };
            open.push(name.clone());
            write_container(container, registry, open, out);
            open.pop();
            return;
        }
        Format::Option(inner) => return wrap(out, "option<", inner, ">", registry, open),
        Format::Seq(inner) => return wrap(out, "seq<", inner, ">", registry, open),
        Format::Map { key, value } => {
            out.push_str("map<");
            write_format(key, registry, open, out);
            out.push(',');
            write_format(value, registry, open, out);
            out.push('>');
            return;
        }
        Format::Tuple(items) => return write_list(out, "(", items, ")", registry, open),
        Format::TupleArray { content, size } => {
            out.push('[');
            write_format(content, registry, open, out);
            let _ = write!(out, ";{size}]");
            return;
        }
    };
    out.push_str(simple);
}

fn wrap(
    out: &mut String,
    open_with: &str,
    inner: &Format,
    close: &str,
    registry: &Registry,
    open: &mut Vec<String>,
) {
    out.push_str(open_with);
    write_format(inner, registry, open, out);
    out.push_str(close);
}

fn write_list(
    out: &mut String,
    start: &str,
    items: &[Format],
    end: &str,
    registry: &Registry,
    open: &mut Vec<String>,
) {
    out.push_str(start);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_format(item, registry, open, out);
    }
    out.push_str(end);
}

fn write_fields(out: &mut String, fields: &[Named<Format>], registry: &Registry, open: &mut Vec<String>) {
    out.push('{');
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&field.name);
        out.push(':');
        write_format(&field.value, registry, open, out);
    }
    out.push('}');
}

fn write_container(c: &ContainerFormat, registry: &Registry, open: &mut Vec<String>, out: &mut String) {
    match c {
        ContainerFormat::UnitStruct => out.push_str("unit_struct"),
        ContainerFormat::NewTypeStruct(inner) => wrap(out, "newtype(", inner, ")", registry, open),
        ContainerFormat::TupleStruct(items) => write_list(out, "tuple_struct(", items, ")", registry, open),
        ContainerFormat::Struct(fields) => write_fields(out, fields, registry, open),
        ContainerFormat::Enum(variants) => {
            out.push_str("enum{");
            for (i, (index, variant)) in variants.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{index}:{}", variant.name);
                match &variant.value {
                    VariantFormat::Unit => {}
                    VariantFormat::Variable(_) => out.push('?'),
                    VariantFormat::NewType(inner) => wrap(out, "(", inner, ")", registry, open),
                    VariantFormat::Tuple(items) => write_list(out, "(", items, ")", registry, open),
                    VariantFormat::Struct(fields) => write_fields(out, fields, registry, open),
                }
            }
            out.push('}');
        }
    }
}

/// The fingerprints of the method `Req` → `Resp`, or `None` when neither type has one.
pub(crate) fn of_method<Req: crate::Wire, Resp: crate::Wire>() -> Option<crate::proto::Fingerprints> {
    let (request, reply) = (Req::fingerprint(), Resp::fingerprint());
    (request.is_some() || reply.is_some())
        .then(|| crate::proto::Fingerprints { request: request.unwrap_or(0), reply: reply.unwrap_or(0) })
}

/// Whether methods of these types may carry fingerprints at all: only fast-tier types have
/// one, so every other method skips the work at compile time.
pub(crate) const fn may_have<Req: crate::Wire, Resp: crate::Wire>() -> bool {
    matches!(Req::TIER, super::Tier::Fast) || matches!(Resp::TIER, super::Tier::Fast)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Order {
        id: u64,
        items: Vec<Item>,
        note: Option<String>,
        state: State,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Item {
        sku: String,
        qty: u32,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum State {
        New,
        Paid { at: u64 },
        Gone(String),
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum Tree {
        Leaf(u32),
        Node(Vec<Tree>),
    }

    #[test]
    fn the_shape_names_every_field_variant_and_nested_type() {
        assert_eq!(
            shape_of::<Order>().unwrap(),
            "{id:u64,items:seq<{sku:str,qty:u32}>,note:option<str>,state:enum{0:New,1:Paid{at:u64},2:Gone(str)}}"
        );
        assert_eq!(shape_of::<Tree>().unwrap(), "enum{0:Leaf(u32),1:Node(seq<^1>)}");
    }

    #[test]
    fn fingerprints_are_stable_and_tell_shapes_apart() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Swapped {
            b: u32,
            a: u32,
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Plain {
            a: u32,
            b: u32,
        }
        let plain = of_serde::<Plain>().unwrap();
        assert_eq!(of_serde::<Plain>(), Some(plain), "kept, and the same");
        assert_eq!(plain, hash("{a:u32,b:u32}"), "a hash of the shape alone, not of the type's name");
        assert_ne!(of_serde::<Swapped>().unwrap(), plain);
        assert_ne!(of_serde::<Order>().unwrap(), of_serde::<Tree>().unwrap());
    }
}
