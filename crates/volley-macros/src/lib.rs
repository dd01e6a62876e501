//! `#[volley::service]`: a Rust trait becomes a Volley service.
//!
//! Use it through the `volley` crate (`#[volley::service]`); its documentation there shows
//! the trait you write and everything generated from it. This crate only holds the macro:
//!
//! - [`parse`] reads the trait into a [`parse::ServiceDef`] and reports misuse (a method that
//!   is neither `async` nor `#[sync]`, a batch method without `Vec`s, ...) at the offending
//!   tokens;
//! - [`trait_def`] rewrites the trait itself (`async fn` becomes a `Send` future, so servers
//!   can spawn it) and adds the `Wire` checks;
//! - [`client`] generates the method descriptors and the typed client;
//! - [`server`] generates the adapter that serves an implementation.

use proc_macro::TokenStream;

mod client;
mod parse;
mod server;
mod trait_def;

/// See `volley::service` for the documentation.
#[proc_macro_attribute]
pub fn service(args: TokenStream, input: TokenStream) -> TokenStream {
    let item = syn::parse_macro_input!(input as syn::ItemTrait);
    let def =
        parse::service_name(args.into(), &item).and_then(|name| parse::ServiceDef::new(item.clone(), name));
    match def {
        Ok(def) => {
            let mut out = trait_def::expand(&def);
            out.extend(client::expand(&def));
            out.extend(server::expand(&def));
            out.into()
        }
        Err(e) => {
            let mut item = item;
            trait_def::strip_markers(&mut item);
            let mut out = e.to_compile_error();
            out.extend(quote::quote!(#item));
            out.into()
        }
    }
}
