//! The method descriptors (`XMethods`) and the typed client (`XClient`).
//!
//! The client wraps anything that implements `volley::service::Caller` — a `Client` (one
//! server) or a `ServiceClient` (by name, through the registry) — and its methods require
//! `Caller<Req, Resp>` of the wrapped value per method, so a `ServiceClient`'s extra needs
//! (requests it can clone for failover) are asked only of the methods it is used for.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::parse::{Kind, MethodDef, ServiceDef};

pub fn expand(def: &ServiceDef) -> TokenStream {
    let mut out = methods(def);
    out.extend(client(def));
    out
}

/// `XMethods`: one `Method` const per method, and the service's name.
fn methods(def: &ServiceDef) -> TokenStream {
    let vis = &def.item.vis;
    let trait_ident = &def.item.ident;
    let ident = def.methods_ident();
    let service = &def.name;
    let params = def.type_params();
    let (impl_generics, ty_generics, where_clause) = def.item.generics.split_for_impl();
    let consts = def.methods.iter().map(|m| {
        let (c, req, resp, wire) = (&m.const_ident, &m.req, &m.resp, &m.wire_name);
        let doc = format!("`{service}/{wire}`: [`{trait_ident}::{}`].", m.ident);
        let ty = match m.kind {
            Kind::Stream => quote!(StreamMethod),
            Kind::ClientStream => quote!(ClientStreamMethod),
            Kind::BidiStream => quote!(BidiStreamMethod),
            Kind::Async | Kind::Batch | Kind::Sync => quote!(Method),
        };
        quote! {
            #[doc = #doc]
            pub const #c: ::volley::#ty<#req, #resp> = ::volley::#ty::new(#service, #wire);
        }
    });
    let doc = format!(
        "The method descriptors of the service `{service}` ([`{trait_ident}`]), for calls at the \
         level below the typed client: `client.call(&{ident}::{}, request)`.",
        def.methods[0].const_ident
    );
    let def_struct = if params.is_empty() {
        quote!(#vis struct #ident;)
    } else {
        quote!(#vis struct #ident<#(#params),*>(::core::marker::PhantomData<fn() -> (#(#params,)*)>);)
    };
    quote! {
        #[doc = #doc]
        #def_struct
        impl #impl_generics #ident #ty_generics #where_clause {
            /// The service's name, as registered and as sent with every call.
            pub const SERVICE: &'static str = #service;
            #(#consts)*
        }
    }
}

fn client(def: &ServiceDef) -> TokenStream {
    let vis = &def.item.vis;
    let trait_ident = &def.item.ident;
    let ident = def.client_ident();
    let t = def.fresh_param("T");
    let params = def.type_params();
    let mut generics = def.item.generics.clone();
    generics.params.push(syn::parse_quote!(#t));
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let doc = format!(
        "A typed client of the service `{}` ([`{trait_ident}`]) over a [`volley::Client`] (one \
         server) or a [`volley::ServiceClient`] (by name through the registry; adds the `_keyed` \
         and `_scatter` forms). `{ident}::new(client)`; cheap to clone if the client is.",
        def.name
    );
    let calls = def.methods.iter().map(|m| client_methods(def, m, &t));
    quote! {
        #[doc = #doc]
        #vis struct #ident<#(#params,)* #t = ::volley::Client> {
            inner: #t,
            _types: ::core::marker::PhantomData<fn() -> (#(#params,)*)>,
        }

        impl<#(#params,)* #t: ::core::clone::Clone> ::core::clone::Clone for #ident<#(#params,)* #t> {
            fn clone(&self) -> Self {
                Self { inner: ::core::clone::Clone::clone(&self.inner), _types: ::core::marker::PhantomData }
            }
        }

        impl<#(#params,)* #t> #ident<#(#params,)* #t> {
            /// Wraps a [`volley::Client`] or a [`volley::ServiceClient`].
            pub fn new(inner: #t) -> Self {
                Self { inner, _types: ::core::marker::PhantomData }
            }

            /// The wrapped client, for calls at the level below (with the method descriptors).
            pub fn inner(&self) -> &#t {
                &self.inner
            }

            pub fn into_inner(self) -> #t {
                self.inner
            }
        }

        impl #impl_generics #ident<#(#params,)* #t> #where_clause {
            #(#calls)*
        }
    }
}

/// The client's methods for one service method: `m`, `m_with`, `m_batch`, `m_batch_with`,
/// `m_stream`, `m_keyed`, `m_scatter`.
fn client_methods(def: &ServiceDef, m: &MethodDef, t: &syn::Ident) -> TokenStream {
    if m.kind.is_stream() {
        return stream_methods(def, m, t);
    }
    let (req, resp) = (&m.req, &m.resp);
    let (_, ty_generics, _) = def.item.generics.split_for_impl();
    let methods_ident = def.methods_ident();
    let c = &m.const_ident;
    let desc = quote!(&<#methods_ident #ty_generics>::#c);
    let name = &m.ident;
    let [with, batch, batch_with, stream, keyed, scatter] =
        ["with", "batch", "batch_with", "stream", "keyed", "scatter"].map(|s| format_ident!("{name}_{s}"));
    // A method without a request value takes none on the client either.
    let (arg, val) = if m.has_arg { (quote!(req: #req,), quote!(req)) } else { (quote!(), quote!(())) };
    let caller = quote!(::volley::service::Caller<#req, #resp>);
    let routed = quote!(::volley::service::ServiceCaller<#req, #resp>);
    let wire = format!("`{}/{}`", def.name, m.wire_name);
    let doc = |what: &str| format!("{what} {wire}.");
    let [d_call, d_with, d_batch, d_batch_with, d_stream, d_keyed, d_scatter] = [
        doc("Calls"),
        doc("Calls, with per-call options (deadline, idempotent), "),
        doc("Calls once per request (the batch API: chunks of 128, one result per request, in order)"),
        doc("The batch API with options (chunk size, deadline),"),
        doc("Streams a batch of any size (a window of chunks in flight, results in order) through"),
        doc("Calls the instance that owns `key` on the service's hash ring (a `ServiceClient`):"),
        doc("Scatter-gather (a `ServiceClient`): every instance at once, each one's result, for"),
    ];
    quote! {
        #[doc = #d_call]
        pub async fn #name(&self, #arg) -> ::volley::Result<#resp> where #t: #caller {
            <#t as #caller>::call(&self.inner, #desc, #val, ::core::default::Default::default()).await
        }

        #[doc = #d_with]
        pub async fn #with(&self, #arg opts: ::volley::CallOptions) -> ::volley::Result<#resp>
        where #t: #caller {
            <#t as #caller>::call(&self.inner, #desc, #val, opts).await
        }

        #[doc = #d_batch]
        pub async fn #batch(
            &self,
            reqs: impl ::core::iter::IntoIterator<Item = #req>,
        ) -> ::std::vec::Vec<::volley::Result<#resp>> where #t: #caller {
            let reqs = ::core::iter::Iterator::collect(::core::iter::IntoIterator::into_iter(reqs));
            <#t as #caller>::call_batch(&self.inner, #desc, reqs, ::core::default::Default::default()).await
        }

        #[doc = #d_batch_with]
        pub async fn #batch_with(
            &self,
            reqs: impl ::core::iter::IntoIterator<Item = #req>,
            opts: ::volley::BatchOptions,
        ) -> ::std::vec::Vec<::volley::Result<#resp>> where #t: #caller {
            let reqs = ::core::iter::Iterator::collect(::core::iter::IntoIterator::into_iter(reqs));
            <#t as #caller>::call_batch(&self.inner, #desc, reqs, opts).await
        }

        #[doc = #d_stream]
        pub fn #stream<'a, I>(
            &'a self,
            reqs: I,
            opts: ::volley::BatchOptions,
        ) -> impl ::volley::service::Stream<Item = ::volley::Result<#resp>> + ::core::marker::Send + 'a
        where
            #t: #caller,
            I: ::core::iter::IntoIterator<Item = #req>,
            I::IntoIter: ::core::marker::Send + 'a,
        {
            <#t as #caller>::call_stream(&self.inner, #desc, reqs, opts)
        }

        #[doc = #d_keyed]
        pub async fn #keyed<K>(&self, key: &K, #arg) -> ::volley::Result<#resp>
        where
            #t: #routed,
            K: ::volley::StableHash + ::core::marker::Sync + ?::core::marker::Sized,
        {
            <#t as #routed>::call_keyed(&self.inner, #desc, key, #val, ::core::default::Default::default()).await
        }

        #[doc = #d_scatter]
        pub async fn #scatter(
            &self,
            #arg
        ) -> ::volley::Result<::std::vec::Vec<::volley::service_client::Gathered<#resp>>> where #t: #routed {
            <#t as #routed>::scatter(&self.inner, #desc, #val, ::core::default::Default::default()).await
        }
    }
}

/// The client's methods for a stream method `m`: `m(..)` and `m_with(.., StreamOptions)`.
/// A server stream takes the request and returns a `volley::Streaming` of the items; a client
/// stream takes a `Stream` of requests and returns the one reply; a both-way stream takes a
/// `Stream` of requests and returns a `volley::Streaming` of the server's items.
fn stream_methods(def: &ServiceDef, m: &MethodDef, t: &syn::Ident) -> TokenStream {
    let (req, item) = (&m.req, &m.resp);
    let (_, ty_generics, _) = def.item.generics.split_for_impl();
    let methods_ident = def.methods_ident();
    let c = &m.const_ident;
    let desc = quote!(&<#methods_ident #ty_generics>::#c);
    let name = &m.ident;
    let with = format_ident!("{name}_with");
    let wire = format!("`{}/{}`", def.name, m.wire_name);
    let default = quote!(::core::default::Default::default());
    match m.kind {
        Kind::ClientStream => {
            let caller = quote!(::volley::service::ClientStreamCaller<#req, #item>);
            let d_open = format!(
                "Opens the client stream {wire}, sends every item of `items` (as the server grants \
                 room) and returns the server's one reply."
            );
            let d_with = format!(
                "Sends `items` through the client stream {wire}, with options (a timeout over the whole stream)."
            );
            quote! {
                #[doc = #d_open]
                pub async fn #name(
                    &self,
                    items: impl ::volley::service::Stream<Item = #req> + ::core::marker::Send,
                ) -> ::volley::Result<#item> where #t: #caller {
                    self.#with(items, #default).await
                }

                #[doc = #d_with]
                pub async fn #with(
                    &self,
                    items: impl ::volley::service::Stream<Item = #req> + ::core::marker::Send,
                    opts: ::volley::StreamOptions,
                ) -> ::volley::Result<#item> where #t: #caller {
                    <#t as #caller>::open_client(&self.inner, #desc, opts).await?.send_all(items).await
                }
            }
        }
        Kind::BidiStream => {
            let caller = quote!(::volley::service::BidiStreamCaller<#req, #item>);
            let d_open = format!(
                "Opens the both-way stream {wire}: `items` are sent as the server grants room, \
                 and the server's items come back as they come (dropping the `Streaming` cancels \
                 the stream)."
            );
            let d_with = format!(
                "Opens the both-way stream {wire} with options (a timeout over the whole stream, the credit window)."
            );
            quote! {
                #[doc = #d_open]
                pub async fn #name(
                    &self,
                    items: impl ::volley::service::Stream<Item = #req> + ::core::marker::Send + 'static,
                ) -> ::volley::Result<::volley::Streaming<#item>> where #t: #caller {
                    self.#with(items, #default).await
                }

                #[doc = #d_with]
                pub async fn #with(
                    &self,
                    items: impl ::volley::service::Stream<Item = #req> + ::core::marker::Send + 'static,
                    opts: ::volley::StreamOptions,
                ) -> ::volley::Result<::volley::Streaming<#item>> where #t: #caller {
                    let (sender, streaming) = <#t as #caller>::open_bidi(&self.inner, #desc, opts).await?;
                    ::core::result::Result::Ok(streaming.fed_by(sender, items))
                }
            }
        }
        _ => {
            let (arg, val) =
                if m.has_arg { (quote!(req: #req,), quote!(req)) } else { (quote!(), quote!(())) };
            let caller = quote!(::volley::service::StreamCaller<#req, #item>);
            let d_open = format!(
                "Opens the server stream {wire}: its items as they come (dropping it cancels the stream)."
            );
            let d_with = format!(
                "Opens the server stream {wire} with options (a timeout over the whole stream, the credit window)."
            );
            quote! {
                #[doc = #d_open]
                pub async fn #name(&self, #arg) -> ::volley::Result<::volley::Streaming<#item>> where #t: #caller {
                    <#t as #caller>::open(&self.inner, #desc, #val, #default).await
                }

                #[doc = #d_with]
                pub async fn #with(&self, #arg opts: ::volley::StreamOptions) -> ::volley::Result<::volley::Streaming<#item>>
                where #t: #caller {
                    <#t as #caller>::open(&self.inner, #desc, #val, opts).await
                }
            }
        }
    }
}
