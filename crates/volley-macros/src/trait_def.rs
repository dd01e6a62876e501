//! The trait as the implementor sees it, and the compile-time checks of its types.
//!
//! An `async fn` in the trait becomes `fn ... -> impl Future<Output = ...> + Send` (what the
//! `trait-variant` crate does): the server runs handlers as tasks, so their futures must be
//! `Send`, and an implementor still writes a plain `async fn`. `#[sync]` methods stay as they
//! are. The trait gains `Send + Sync + 'static`: one value serves every connection.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ItemTrait, ReturnType, TraitItem, TraitItemFn};

use crate::parse::{ServiceDef, is_marker};

pub fn expand(def: &ServiceDef) -> TokenStream {
    let mut item = def.item.clone();
    strip_markers(&mut item);
    item.supertraits.push(syn::parse_quote!(::core::marker::Send));
    item.supertraits.push(syn::parse_quote!(::core::marker::Sync));
    item.supertraits.push(syn::parse_quote!('static));
    for trait_item in &mut item.items {
        if let TraitItem::Fn(f) = trait_item
            && f.sig.asyncness.is_some()
        {
            into_send_future(f);
        }
    }
    let checks = wire_checks(def);
    quote! {
        #item
        #checks
    }
}

/// The trait as written, without the `#[batch]` and `#[sync]` markers (which are not real
/// attributes). Emitted unchanged beside the errors when the trait has mistakes, so that code
/// using it reports nothing more than those.
pub fn strip_markers(item: &mut ItemTrait) {
    for trait_item in &mut item.items {
        if let TraitItem::Fn(f) = trait_item {
            f.attrs.retain(|a| !is_marker(a));
        }
    }
}

/// `async fn f(&self, x: X) -> R` → `fn f(&self, x: X) -> impl Future<Output = R> + Send`; a
/// default body becomes an `async move` block.
fn into_send_future(f: &mut TraitItemFn) {
    let output = match &f.sig.output {
        ReturnType::Type(_, ty) => quote!(#ty),
        ReturnType::Default => quote!(()),
    };
    let span = f.sig.output.span();
    f.sig.asyncness = None;
    f.sig.output = syn::parse_quote_spanned! {span=>
        -> impl ::core::future::Future<Output = #output> + ::core::marker::Send
    };
    if let Some(body) = f.default.take() {
        f.default = Some(syn::parse_quote!({ async move #body }));
    }
}

/// Every request and reply type must implement `volley::Wire` (its codec tier comes from its
/// declaration). One assertion per type, spanned at the type in the trait, gives one clear
/// error there; the generated client and server only require `Wire` through bounds that are
/// checked where they are used, so a missing declaration is not reported again from inside
/// generated code.
///
/// The assertion goes through a local trait whose only impl is `#[do_not_recommend]`: the
/// error then carries the message below and no list of every type that is `Wire` (a list that
/// would change whenever any crate declares a new wire type).
fn wire_checks(def: &ServiceDef) -> TokenStream {
    let mut seen = Vec::new();
    let mut asserts = Vec::new();
    for m in &def.methods {
        for ty in [&m.req, &m.resp] {
            let key = quote!(#ty).to_string();
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            asserts.push(quote_spanned! {ty.span()=> __volley_assert_wire::<#ty>(); });
        }
    }
    let (impl_generics, _, where_clause) = def.item.generics.split_for_impl();
    quote! {
        const _: () = {
            #[diagnostic::on_unimplemented(
                message = "`{Self}` is not a Volley wire type, so it cannot be a request or a reply",
                label = "not a wire type",
                note = "declare its codec tier with `volley::wire!({Self})` (serde, encoded with bitcode), or \
                        `wire!(bitcode: …)`, `wire!(pod: …)`, `wire!(json: …)`, `wire!(msgpack: …)`; or \
                        wrap it (`volley::codec::Json<…>`)"
            )]
            trait Wire {}
            #[diagnostic::do_not_recommend]
            impl<W: ::volley::Wire> Wire for W {}
            fn __volley_assert_wire<W: Wire>() {}
            #[allow(dead_code)]
            fn __volley_check #impl_generics () #where_clause {
                #(#asserts)*
            }
        };
    }
}
