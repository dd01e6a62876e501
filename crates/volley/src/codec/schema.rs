//! How `volley::wire!` finds a JSON Schema for a type when it has one, without asking every
//! type for one: a method call that resolves to [`ViaSchema`] when the type derives
//! `schemars::JsonSchema` (and the feature `schema` is on) and to [`NoSchema`] otherwise. The
//! choice is made where `wire!` expands, for one concrete type, so types without a schema
//! cost nothing and users who do not turn the feature on do not build `schemars`.

use std::marker::PhantomData;

pub use serde_json::Value;

/// Stands for the type `T` in the method call that picks its schema.
pub struct Probe<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> Probe<T> {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Probe(PhantomData)
    }
}

/// Taken when `T` has a schema: found on `&Probe<T>` without autoref.
pub trait ViaSchema {
    fn volley_schema(&self) -> Option<Value>;
}

/// Taken otherwise: found on `&&Probe<T>`, one autoref later.
pub trait NoSchema {
    fn volley_schema(&self) -> Option<Value> {
        None
    }
}

impl<T: ?Sized> NoSchema for &Probe<T> {}

#[cfg(feature = "schema")]
impl<T: schemars::JsonSchema + ?Sized> ViaSchema for Probe<T> {
    fn volley_schema(&self) -> Option<Value> {
        serde_json::to_value(schemars::schema_for!(T)).ok()
    }
}
