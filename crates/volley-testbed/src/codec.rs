//! The codec tier of a configuration, chosen at compile time per run: every message type is
//! wrapped in `C::W<T>` — [`volley::codec::Json`] for the general tier (the seed's "boost
//! serialization"), [`volley::codec::Bitcode`] (bitcode's derive) for the fast tier. The roles
//! are generic over `C`, so one code path serves both and a run picks its tier once.

use serde::Serialize;
use serde::de::DeserializeOwned;
use volley::Wire;
use volley::codec::{Bitcode, Json};

/// What a testbed message type implements: serde for the general tier, bitcode's derive for
/// the fast tier.
pub trait Msg:
    Serialize + DeserializeOwned + bitcode::Encode + bitcode::DecodeOwned + Clone + Send + Sync + 'static
{
}
impl<T> Msg for T where
    T: Serialize + DeserializeOwned + bitcode::Encode + bitcode::DecodeOwned + Clone + Send + Sync + 'static
{
}

/// A codec tier for every message of a run.
pub trait Codec: Send + Sync + 'static {
    /// The tier's name in the report.
    const NAME: &'static str;
    /// `T` as it goes on the wire in this tier.
    type W<T: Msg>: Wire + Clone + From<T>;
    fn unwrap<T: Msg>(w: Self::W<T>) -> T;
}

/// The general tier: JSON.
pub struct General;
/// The fast tier: bitcode (derive).
pub struct Fast;

impl Codec for General {
    const NAME: &'static str = "general";
    type W<T: Msg> = Json<T>;
    fn unwrap<T: Msg>(w: Json<T>) -> T {
        w.0
    }
}

impl Codec for Fast {
    const NAME: &'static str = "fast";
    type W<T: Msg> = Bitcode<T>;
    fn unwrap<T: Msg>(w: Bitcode<T>) -> T {
        w.0
    }
}

/// A tier chosen at run time (from a flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecKind {
    General,
    Fast,
}

impl CodecKind {
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::General => General::NAME,
            CodecKind::Fast => Fast::NAME,
        }
    }

    pub fn parse(s: &str) -> Option<CodecKind> {
        match s {
            "general" | "json" => Some(CodecKind::General),
            "fast" | "bitcode" => Some(CodecKind::Fast),
            _ => None,
        }
    }
}
