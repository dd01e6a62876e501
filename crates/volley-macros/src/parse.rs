//! Reads a service trait into a [`ServiceDef`]: the service's name, and for every method its
//! kind, request and reply types. Everything the generated code relies on is checked here, so
//! that misuse is reported at the user's own tokens with a message that says what to write.

use heck::{ToShoutySnakeCase, ToSnakeCase};
use proc_macro2::{Span, TokenStream};
use quote::format_ident;
use syn::spanned::Spanned;
use syn::{
    Attribute, FnArg, GenericArgument, GenericParam, Ident, ItemTrait, LitStr, PathArguments, ReturnType,
    TraitItem, TraitItemFn, Type,
};

/// Longest service or method name the wire format carries (PROTOCOL.md: one length byte).
const MAX_NAME_LEN: usize = 255;

/// How a method's handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `async fn`: one future per request (`ServerBuilder::handle`).
    Async,
    /// `#[batch] async fn`: one future per batch of requests (`ServerBuilder::handle_batch`).
    Batch,
    /// `#[sync] fn`: a plain call per request, no future (`ServerBuilder::handle_fn`).
    Sync,
    /// `async fn` returning `Result<ItemStream<Item>, Status>`: a server stream, one request
    /// and a sequence of items (`ServerBuilder::handle_stream`).
    Stream,
    /// `async fn` taking a `RequestStream<Req>`: a client stream, a sequence of requests and
    /// one reply (`ServerBuilder::handle_client_stream`).
    ClientStream,
    /// `async fn` taking a `RequestStream<Req>` and returning `Result<ItemStream<Item>, Status>`:
    /// both ways at once (`ServerBuilder::handle_bidi_stream`).
    BidiStream,
}

impl Kind {
    /// Whether the method is one of the stream shapes (its client opens a stream).
    pub fn is_stream(self) -> bool {
        matches!(self, Kind::Stream | Kind::ClientStream | Kind::BidiStream)
    }
}

/// One method of the service.
pub struct MethodDef {
    /// The Rust name (also the name on the wire, without any `r#`).
    pub ident: Ident,
    pub wire_name: String,
    /// The descriptor's name in `XMethods`: `SEARCH` for `search`.
    pub const_ident: Ident,
    pub kind: Kind,
    /// The request type of one call (for a batch method, the item type of its `Vec`; for a
    /// client or both-way stream, the type of the client's items).
    pub req: Type,
    /// The reply type of one call (the `Ok` type); for a stream, the type of its items.
    pub resp: Type,
    /// Whether the method takes a request value (a method without one takes `()`).
    pub has_arg: bool,
}

/// The whole service, and the trait it came from.
pub struct ServiceDef {
    pub item: ItemTrait,
    pub name: String,
    pub methods: Vec<MethodDef>,
}

/// Parses the attribute's arguments (`name = "..."`); the name defaults to the trait's name in
/// snake_case.
pub fn service_name(args: TokenStream, item: &ItemTrait) -> syn::Result<String> {
    let mut name: Option<LitStr> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("name") {
            name = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error("unknown argument: `#[volley::service]` takes only `name = \"...\"`"))
        }
    });
    syn::parse::Parser::parse2(parser, args)?;
    let (value, span) = match &name {
        Some(lit) => (lit.value(), lit.span()),
        None => (unraw(&item.ident).to_snake_case(), item.ident.span()),
    };
    check_name(&value, span, "service")?;
    Ok(value)
}

fn check_name(name: &str, span: Span, what: &str) -> syn::Result<()> {
    if name.is_empty() {
        return Err(syn::Error::new(span, format!("the {what} name is empty")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(syn::Error::new(
            span,
            format!(
                "the {what} name `{name}` is {} bytes; the wire format allows {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    Ok(())
}

fn unraw(ident: &Ident) -> String {
    let s = ident.to_string();
    s.strip_prefix("r#").map(str::to_string).unwrap_or(s)
}

impl ServiceDef {
    /// Checks the trait and reads its methods. Every problem found is reported, not only the
    /// first.
    pub fn new(item: ItemTrait, name: String) -> syn::Result<ServiceDef> {
        let mut errors = Errors::default();
        for param in &item.generics.params {
            if !matches!(param, GenericParam::Type(_)) {
                errors.push(syn::Error::new_spanned(
                    param,
                    "a service trait may be generic over types only: requests and replies are \
                     `'static` values, and method descriptors need no const parameters",
                ));
            }
        }
        let mut methods = Vec::new();
        for trait_item in &item.items {
            match trait_item {
                TraitItem::Fn(f) => match method(f) {
                    Ok(m) => methods.push(m),
                    Err(e) => errors.push(e),
                },
                other => errors.push(syn::Error::new_spanned(
                    other,
                    "a service trait holds only methods (`async fn`, `#[batch] async fn`, `#[sync] fn`)",
                )),
            }
        }
        if methods.is_empty() && errors.0.is_none() {
            errors.push(syn::Error::new_spanned(&item.ident, "a service needs at least one method"));
        }
        check_generated_names(&methods, &mut errors);
        errors.finish()?;
        Ok(ServiceDef { item, name, methods })
    }

    pub fn methods_ident(&self) -> Ident {
        format_ident!("{}Methods", self.item.ident)
    }

    pub fn client_ident(&self) -> Ident {
        format_ident!("{}Client", self.item.ident)
    }

    pub fn server_ident(&self) -> Ident {
        format_ident!("{}Server", self.item.ident)
    }

    /// The trait's type parameters, without their bounds.
    pub fn type_params(&self) -> Vec<&Ident> {
        self.item.generics.type_params().map(|p| &p.ident).collect()
    }

    /// A name for an extra type parameter that none of the trait's own parameters uses.
    pub fn fresh_param(&self, preferred: &str) -> Ident {
        let taken = |s: &str| self.type_params().iter().any(|p| *p == s);
        let name = if taken(preferred) { format!("{preferred}Volley") } else { preferred.to_string() };
        Ident::new(&name, Span::call_site())
    }
}

/// The suffixes the typed client adds to each method's name.
pub const CLIENT_SUFFIXES: [&str; 6] = ["_with", "_batch", "_batch_with", "_stream", "_keyed", "_scatter"];

/// What the typed client has besides the service's methods.
const CLIENT_OWN: [&str; 4] = ["new", "inner", "into_inner", "clone"];

/// A method `search` and a method `search_batch` would both generate `search_batch` on the
/// client: say so here rather than let the compiler report a duplicate in generated code.
fn check_generated_names(methods: &[MethodDef], errors: &mut Errors) {
    for (i, m) in methods.iter().enumerate() {
        if CLIENT_OWN.contains(&m.wire_name.as_str()) {
            errors.push(syn::Error::new_spanned(
                &m.ident,
                format!("`{}` is a method of every generated client; rename this one", m.ident),
            ));
        }
        if methods[..i].iter().any(|earlier| earlier.ident == m.ident) {
            errors.push(syn::Error::new_spanned(&m.ident, "two methods with the same name"));
        }
        for suffix in CLIENT_SUFFIXES {
            let generated = format!("{}{suffix}", m.ident);
            if let Some(clash) = methods.iter().find(|o| o.ident == generated) {
                errors.push(syn::Error::new_spanned(
                    &clash.ident,
                    format!(
                        "`{generated}` clashes with the client method generated for `{}`; rename one of them",
                        m.ident
                    ),
                ));
            }
        }
    }
}

/// The `#[batch]` and `#[sync]` markers of a method.
struct Markers {
    batch: Option<Span>,
    sync: Option<Span>,
}

fn markers(attrs: &[Attribute]) -> syn::Result<Markers> {
    let mut m = Markers { batch: None, sync: None };
    for attr in attrs {
        let slot = if attr.path().is_ident("batch") {
            &mut m.batch
        } else if attr.path().is_ident("sync") {
            &mut m.sync
        } else {
            continue;
        };
        attr.meta.require_path_only()?;
        *slot = Some(attr.span());
    }
    Ok(m)
}

/// Whether `attr` is one of the markers the macro consumes.
pub fn is_marker(attr: &Attribute) -> bool {
    attr.path().is_ident("batch") || attr.path().is_ident("sync")
}

fn method(f: &TraitItemFn) -> syn::Result<MethodDef> {
    let sig = &f.sig;
    let name = &sig.ident;
    let marks = markers(&f.attrs)?;
    let is_async = sig.asyncness.is_some();
    let kind = match (is_async, marks.batch, marks.sync) {
        (_, Some(_), Some(span)) => {
            return Err(syn::Error::new(span, "a method is `#[batch]` or `#[sync]`, not both"));
        }
        (true, None, Some(span)) => {
            return Err(syn::Error::new(
                span,
                format!(
                    "`#[sync] fn {name}` runs inline and never waits, so it cannot be `async`: drop `async` or `#[sync]`"
                ),
            ));
        }
        (false, Some(_), None) => {
            return Err(syn::Error::new_spanned(
                sig.fn_token,
                format!(
                    "`#[batch]` method `{name}` must be `async fn` (the handler gets the batch as one future)"
                ),
            ));
        }
        (false, None, None) => {
            return Err(syn::Error::new_spanned(
                sig.fn_token,
                format!(
                    "service method `{name}` must be `async fn` (its handler runs as a future), or be \
                     marked `#[sync]` (it runs inline on the connection's task and never waits)"
                ),
            ));
        }
        (true, Some(_), None) => Kind::Batch,
        (true, None, None) => Kind::Async,
        (false, None, Some(_)) => Kind::Sync,
    };
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "service methods cannot be generic: each method has one request type and one reply type",
        ));
    }
    if let Some(v) = &sig.variadic {
        return Err(syn::Error::new_spanned(v, "service methods cannot be variadic"));
    }
    let arg = request_arg(sig)?;
    // `RequestStream<Req>` (or `Incoming<Req>`, the type it names): the client's items.
    let streamed = arg.and_then(|a| {
        generic_args(a, "RequestStream", 1)
            .or_else(|| generic_args(a, "Incoming", 1))
            .map(|mut t| t.swap_remove(0))
    });
    let wire_name = unraw(name);
    check_name(&wire_name, name.span(), "method")?;
    let const_ident = Ident::new(&wire_name.to_shouty_snake_case(), name.span());
    let (req, resp) = match kind {
        Kind::Batch => batch_types(name, arg, &sig.output)?,
        _ => {
            let req = streamed.clone().or_else(|| arg.cloned()).unwrap_or_else(|| syn::parse_quote!(()));
            (req, result_ok_type(name, &sig.output)?)
        }
    };
    // `Result<ItemStream<Item>, Status>`: a server stream of `Item`s.
    let (kind, resp) = match (kind, generic_args(&resp, "ItemStream", 1), streamed.is_some()) {
        (Kind::Async, Some(mut item), false) => (Kind::Stream, item.swap_remove(0)),
        (Kind::Async, Some(mut item), true) => (Kind::BidiStream, item.swap_remove(0)),
        (Kind::Async, None, true) => (Kind::ClientStream, resp),
        (Kind::Sync, _, true) => {
            return Err(syn::Error::new_spanned(
                arg,
                format!("stream method `{name}` must be `async fn` (it is served as a task), not `#[sync]`"),
            ));
        }
        (Kind::Sync, Some(_), _) => {
            return Err(syn::Error::new_spanned(
                &resp,
                format!("stream method `{name}` must be `async fn` (it is served as a task), not `#[sync]`"),
            ));
        }
        (kind, _, _) => (kind, resp),
    };
    Ok(MethodDef { ident: name.clone(), wire_name, const_ident, kind, req, resp, has_arg: arg.is_some() })
}

/// Checks the receiver (`&self`) and returns the request argument's type, if any.
fn request_arg(sig: &syn::Signature) -> syn::Result<Option<&Type>> {
    let name = &sig.ident;
    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(r))
            if r.reference.is_some() && r.mutability.is_none() && r.colon_token.is_none() => {}
        Some(FnArg::Receiver(r)) => {
            return Err(syn::Error::new_spanned(
                r,
                format!("service method `{name}` must take `&self` (one value serves many requests at once)"),
            ));
        }
        _ => {
            return Err(syn::Error::new_spanned(
                sig,
                format!("service method `{name}` must take `&self` as its first argument"),
            ));
        }
    }
    let arg = match inputs.next() {
        None => None,
        Some(FnArg::Typed(t)) => Some(&*t.ty),
        Some(other) => return Err(syn::Error::new_spanned(other, "unexpected receiver")),
    };
    if let Some(extra) = inputs.next() {
        return Err(syn::Error::new_spanned(
            extra,
            format!(
                "service method `{name}` takes one request value; put several values in a struct (or a tuple)"
            ),
        ));
    }
    if let Some(Type::ImplTrait(t)) = arg {
        return Err(syn::Error::new_spanned(t, "a request type must be a concrete type, not `impl Trait`"));
    }
    Ok(arg)
}

/// `Result<Reply, Status>` → `Reply`.
fn result_ok_type(name: &Ident, output: &ReturnType) -> syn::Result<Type> {
    let err = || {
        at_return(
            name,
            output,
            format!(
                "service method `{name}` must return `Result<Reply, Status>` (errors travel as \
                 `volley::Status`: a code and a message)"
            ),
        )
    };
    match output {
        ReturnType::Type(_, ty) => reply_of_result(ty).ok_or_else(err),
        ReturnType::Default => Err(err()),
    }
}

/// `Result<Reply, Status>` → `Reply`. The error type is checked by name: it is what travels
/// on the wire, and a mismatch found later would be reported from inside generated code.
fn reply_of_result(ty: &Type) -> Option<Type> {
    let mut args = generic_args(ty, "Result", 2)?;
    let is_status =
        matches!(&args[1], Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Status"));
    is_status.then(|| args.swap_remove(0))
}

/// `(Vec<Request>) -> Vec<Result<Reply, Status>>` → `(Request, Reply)`.
fn batch_types(name: &Ident, arg: Option<&Type>, output: &ReturnType) -> syn::Result<(Type, Type)> {
    let req = arg.and_then(|a| generic_args(a, "Vec", 1)).map(|mut a| a.swap_remove(0)).ok_or_else(|| {
        let msg = format!(
            "`#[batch]` method `{name}` must take its requests as one `Vec<Request>` (every request \
             that arrived together)"
        );
        match arg {
            Some(a) => syn::Error::new_spanned(a, msg),
            None => syn::Error::new(name.span(), msg),
        }
    })?;
    let resp = match output {
        ReturnType::Type(_, ty) => generic_args(ty, "Vec", 1).and_then(|a| reply_of_result(&a[0])),
        ReturnType::Default => None,
    };
    let resp = resp.ok_or_else(|| {
        at_return(
            name,
            output,
            format!(
                "`#[batch]` method `{name}` must return `Vec<Result<Reply, Status>>`: one result per \
                 request, in order"
            ),
        )
    })?;
    Ok((req, resp))
}

/// An error at the return type, or at the method's name if it has none.
fn at_return(name: &Ident, output: &ReturnType, msg: String) -> syn::Error {
    match output {
        ReturnType::Type(_, ty) => syn::Error::new_spanned(ty, msg),
        ReturnType::Default => syn::Error::new(name.span(), msg),
    }
}

/// The `n` type arguments of `ty` if it is a path ending in `last<...>` with exactly `n`.
fn generic_args(ty: &Type, last: &str, n: usize) -> Option<Vec<Type>> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != last {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &seg.arguments else { return None };
    let types: Vec<Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            GenericArgument::Type(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    (types.len() == n && args.args.len() == n).then_some(types)
}

/// Collects errors so that one expansion reports all of them.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}
