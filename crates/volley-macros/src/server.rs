//! The server adapter (`XServer`): holds an implementation of the trait and registers one
//! handler per method with a `ServerBuilder`, each in the form its kind maps to (`handle`,
//! `handle_batch`, `handle_fn`, `handle_stream`, `handle_client_stream`, `handle_bidi_stream`).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use crate::parse::{Kind, MethodDef, ServiceDef};

pub fn expand(def: &ServiceDef) -> TokenStream {
    let vis = &def.item.vis;
    let trait_ident = &def.item.ident;
    let ident = def.server_ident();
    let methods_ident = def.methods_ident();
    let s = def.fresh_param("S");
    let params = def.type_params();
    let (_, trait_ty_generics, trait_where) = def.item.generics.split_for_impl();
    let mut generics = def.item.generics.clone();
    generics.params.push(syn::parse_quote!(#s));
    let (impl_generics, _, _) = generics.split_for_impl();
    let trait_preds = trait_where.map(|w| &w.predicates);
    // `for<'w>` keeps each bound from being checked where the impl is written: a type that is
    // not `Wire` is reported once, at the type in the trait (see `trait_def::wire_checks`),
    // instead of again from inside this impl (a plain bound on a concrete type is checked at
    // once; one under a binder only when the impl is used).
    let wire_bounds = def
        .methods
        .iter()
        .flat_map(|m| [&m.req, &m.resp])
        .map(|ty| quote!(for<'__volley_w> #ty: ::volley::Wire,));
    let handlers = def.methods.iter().map(|m| handler(def, m, &s));
    let doc = format!(
        "Serves an implementation of [`{trait_ident}`] as the service `{}`: \
         `Server::builder().serve({ident}::new(my_impl))`.",
        def.name
    );
    quote! {
        #[doc = #doc]
        #vis struct #ident<#(#params,)* #s> {
            inner: ::std::sync::Arc<#s>,
            _types: ::core::marker::PhantomData<fn() -> (#(#params,)*)>,
        }

        impl<#(#params,)* #s> ::core::clone::Clone for #ident<#(#params,)* #s> {
            fn clone(&self) -> Self {
                Self { inner: ::std::sync::Arc::clone(&self.inner), _types: ::core::marker::PhantomData }
            }
        }

        impl<#(#params,)* #s> #ident<#(#params,)* #s> {
            /// Serves `service`: one value, shared by every connection and request.
            pub fn new(service: #s) -> Self {
                Self::from_arc(::std::sync::Arc::new(service))
            }

            /// Serves an implementation that the application also holds.
            pub fn from_arc(service: ::std::sync::Arc<#s>) -> Self {
                Self { inner: service, _types: ::core::marker::PhantomData }
            }
        }

        impl #impl_generics ::volley::service::Service for #ident<#(#params,)* #s>
        where
            #trait_preds
            #s: #trait_ident #trait_ty_generics,
            #(#params: 'static,)*
            #(#wire_bounds)*
        {
            const NAME: &'static str = <#methods_ident #trait_ty_generics>::SERVICE;

            fn add_handlers(self, builder: ::volley::ServerBuilder) -> ::volley::ServerBuilder {
                #(#handlers)*
                builder
            }
        }
    }
}

/// Registers method `m`: the closure calls the trait method through the trait (never an
/// inherent method of the same name) on the shared implementation.
fn handler(def: &ServiceDef, m: &MethodDef, s: &syn::Ident) -> TokenStream {
    let trait_ident = &def.item.ident;
    let (_, ty_generics, _) = def.item.generics.split_for_impl();
    let methods_ident = def.methods_ident();
    let (c, name) = (&m.const_ident, &m.ident);
    let desc = quote!(&<#methods_ident #ty_generics>::#c);
    let method = quote!(<#s as #trait_ident #ty_generics>::#name);
    let (param, arg) = if m.has_arg { (quote!(req), quote!(, req)) } else { (quote!(_: ()), quote!()) };
    // Spanned at the return type: a reply type that does not match what the handler form
    // expects (`Result<_, Status>`) is reported there.
    let span = m.resp.span();
    let register = match m.kind {
        Kind::Async => quote_spanned! {span=>
            builder.handle(#desc, move |#param| {
                let s = ::std::sync::Arc::clone(&s);
                async move { #method(&*s #arg).await }
            })
        },
        Kind::Batch => quote_spanned! {span=>
            builder.handle_batch(#desc, move |req| {
                let s = ::std::sync::Arc::clone(&s);
                async move { #method(&*s, req).await }
            })
        },
        Kind::Sync => quote_spanned! {span=>
            builder.handle_fn(#desc, move |#param| #method(&*s #arg))
        },
        Kind::Stream => quote_spanned! {span=>
            builder.handle_stream(#desc, move |#param| {
                let s = ::std::sync::Arc::clone(&s);
                async move { #method(&*s #arg).await }
            })
        },
        Kind::ClientStream => quote_spanned! {span=>
            builder.handle_client_stream(#desc, move |req| {
                let s = ::std::sync::Arc::clone(&s);
                async move { #method(&*s, req).await }
            })
        },
        Kind::BidiStream => quote_spanned! {span=>
            builder.handle_bidi_stream(#desc, move |req| {
                let s = ::std::sync::Arc::clone(&s);
                async move { #method(&*s, req).await }
            })
        },
    };
    quote! {
        let builder = {
            let s = ::std::sync::Arc::clone(&self.inner);
            #register
        };
    }
}
