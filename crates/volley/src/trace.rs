//! Spans of calls and of the requests a server serves, linked across processes by the
//! TRACEPARENT request extension (PROTOCOL.md §6.2.2).
//!
//! A call made through a [`Client`](crate::Client) has a `volley.call` span for as long as it
//! runs (held, not entered: see `Client::call_with`), a request a server serves runs inside a
//! `volley.serve` span (target `volley::trace`, level INFO, fields
//! `service`, `method`, `trace_id`, `span_id`, and `parent_id` for a served request that came
//! with a trace context). The client sends its call span's W3C trace context with the request;
//! the server's span takes it as its remote parent, so the two share a trace id and the serve
//! span's `parent_id` is the call span's `span_id`. Calls a handler makes run inside the serve
//! span (the handler's start and its future are in it), so they are its children.
//!
//! Trace and span ids: with the feature `otel` and an OpenTelemetry layer installed, they are
//! OpenTelemetry's (see [`crate::otel`]). Otherwise Volley makes its own — a random span id per
//! span, a random trace id at the root — and keeps them in the span's extensions in
//! `tracing-subscriber`'s [`Registry`] (what `tracing_subscriber::fmt()` and
//! `tracing_subscriber::registry()` are built on). Under a subscriber without that registry the
//! spans still carry ids, but a call cannot find its parent's and starts a new trace.
//!
//! Cost: when no subscriber wants these spans, creating one is a level check that yields a
//! disabled span (no allocation), nothing else is computed, and requests carry no trace
//! context. Ids are made, looked up and formatted only for enabled spans.

use std::fmt;

use tracing::Span;
use tracing::field::{Empty, display};
use tracing_subscriber::Registry;
use tracing_subscriber::registry::LookupSpan;

use crate::proto::{Names, TraceParent};

/// W3C trace flags: the trace is sampled (recorded).
const SAMPLED: u8 = 0x01;

/// The trace context Volley keeps for one of its spans, in the span's registry extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl SpanContext {
    /// The context to send with a request made inside this span.
    fn traceparent(&self) -> TraceParent {
        TraceParent { trace_id: self.trace_id, parent_id: self.span_id, flags: self.flags }
    }
}

/// The span of a call to `service`/`method`, a child of the current span, and the trace context
/// to send with its request (`None` when no subscriber wants the span).
///
/// The level check is inlined, so that it is all a call pays without a subscriber that wants
/// INFO; the rest of the span's check and the work of an enabled one are out of line.
#[inline(always)]
pub(crate) fn call_span(service: &str, method: &str) -> Option<Box<CallTrace>> {
    if !info_wanted() {
        return None;
    }
    call_span_checked(service, method)
}

/// Whether any subscriber may record an INFO span: the span macros' first check, which alone
/// decides when there is no subscriber or none wants INFO. Made inline before the call, it
/// saves each request the rest of the macro's check, out of line (~20 instructions a request,
/// scripts/callcost.py).
#[inline(always)]
fn info_wanted() -> bool {
    tracing::level_enabled!(tracing::Level::INFO)
}

fn call_span_checked(service: &str, method: &str) -> Option<Box<CallTrace>> {
    let span = tracing::info_span!("volley.call", service, method, trace_id = Empty, span_id = Empty);
    if span.is_disabled() {
        return None;
    }
    let parent = link_call(&span);
    Some(Box::new(CallTrace { _span: span, parent }))
}

/// A traced call's span, held for as long as the call runs, and the trace context its request
/// carries. Boxed: an untraced call's future then holds one null pointer across its wait, where
/// the span and the context inline made it large enough to be moved by `memcpy` on every call
/// (8-12% more instructions per inproc call, scripts/callcost.py).
pub(crate) struct CallTrace {
    _span: Span,
    pub parent: TraceParent,
}

/// Gives an enabled call span its ids: in the trace of its nearest traced ancestor, if any.
fn link_call(span: &Span) -> TraceParent {
    let parent = ancestor_context(span);
    let cx = own_context(span, parent.map(|p| (p.trace_id, p.flags)));
    keep(span, cx);
    cx.traceparent()
}

/// The span of a request a server serves (`None` when no subscriber wants it): a root of this
/// process's span tree, and the child of the caller's span (`remote`) when the request carried
/// its trace context. The names are the request's (checked UTF-8 off the wire), read only for
/// an enabled span; inlined for the same reason as [`call_span`].
///
/// An inproc call has a serve span too, the child of its call span by the same context: the
/// call's span is not entered while it waits (see `Client::call_with`), so it cannot be a local
/// parent, and the served span links the same way whichever transport carried the request.
#[inline(always)]
pub(crate) fn serve_span(names: &Names, remote: Option<TraceParent>) -> Option<Span> {
    if !info_wanted() {
        return None;
    }
    serve_span_checked(names.service(), names.method(), remote)
}

/// [`serve_span`] for a call that has its names as text (in process).
pub(crate) fn serve_span_named(service: &str, method: &str, remote: Option<TraceParent>) -> Option<Span> {
    if !info_wanted() {
        return None;
    }
    serve_span_checked(service, method, remote)
}

fn serve_span_checked(service: &str, method: &str, remote: Option<TraceParent>) -> Option<Span> {
    let span = tracing::info_span!(
        parent: None,
        "volley.serve",
        service,
        method,
        trace_id = Empty,
        span_id = Empty,
        parent_id = Empty
    );
    if span.is_disabled() {
        return None;
    }
    link_served(&span, remote);
    Some(span)
}

/// Gives an enabled serve span its ids and its remote parent.
fn link_served(span: &Span, remote: Option<TraceParent>) {
    if let Some(tp) = remote {
        #[cfg(feature = "otel")]
        crate::otel::set_remote_parent(span, tp);
        span.record("parent_id", display(Hex(&tp.parent_id)));
    }
    let cx = own_context(span, remote.map(|tp| (tp.trace_id, tp.flags)));
    keep(span, cx);
}

/// The ids of a new span: OpenTelemetry's when its layer is there; otherwise a random span id,
/// in the trace of `parent` (trace id, flags) or, without one, in a new trace.
fn own_context(span: &Span, parent: Option<([u8; 16], u8)>) -> SpanContext {
    #[cfg(feature = "otel")]
    if let Some(tp) = crate::otel::outgoing(span) {
        return SpanContext { trace_id: tp.trace_id, span_id: tp.parent_id, flags: tp.flags };
    }
    let _ = span;
    let (trace_id, flags) = parent.unwrap_or_else(|| (nonzero_u128().to_be_bytes(), SAMPLED));
    SpanContext { trace_id, span_id: nonzero_u64().to_be_bytes(), flags }
}

/// The context of the nearest ancestor of `span` that has one (a Volley span up the tree: user
/// spans in between are passed through).
fn ancestor_context(span: &Span) -> Option<SpanContext> {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        let data = registry.span(id)?;
        data.scope().skip(1).find_map(|s| s.extensions().get::<SpanContext>().copied())
    })
    .flatten()
}

/// Stores `cx` with `span` (for its descendants to find) and records its ids as fields.
fn keep(span: &Span, cx: SpanContext) {
    span.with_subscriber(|(id, dispatch)| {
        if let Some(data) = dispatch.downcast_ref::<Registry>().and_then(|r| r.span(id)) {
            data.extensions_mut().replace(cx);
        }
    });
    span.record("trace_id", display(Hex(&cx.trace_id)));
    span.record("span_id", display(Hex(&cx.span_id)));
}

fn nonzero_u64() -> u64 {
    loop {
        let v = fastrand::u64(..);
        if v != 0 {
            return v;
        }
    }
}

fn nonzero_u128() -> u128 {
    loop {
        let v = fastrand::u128(..);
        if v != 0 {
            return v;
        }
    }
}

/// Lower-case hex of bytes, as the ids appear in `traceparent`.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn spans_no_subscriber_wants_are_disabled_and_send_nothing() {
        let subscriber = tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::WARN);
        tracing::subscriber::with_default(subscriber, || {
            assert!(call_span("s", "m").is_none());
            assert!(serve_span(&Names::new("s", "m"), None).is_none());
        });
    }

    #[test]
    fn a_call_inside_a_served_request_continues_its_trace() {
        let subscriber = tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO);
        tracing::subscriber::with_default(subscriber, || {
            let remote = TraceParent { trace_id: [7; 16], parent_id: [9; 8], flags: 0 };
            let serve = serve_span(&Names::new("s", "m"), Some(remote)).expect("enabled");
            let _in = serve.enter();
            // A user's span in between is passed through.
            let _user = tracing::info_span!("user").entered();
            let call = call_span("t", "n").expect("an enabled span sends its context");
            assert!(!call._span.is_disabled());
            let tp = call.parent;
            assert_eq!(tp.trace_id, [7; 16]);
            assert_eq!(tp.flags, 0, "the caller's sampling decision travels on");
            assert_ne!(tp.parent_id, [9; 8], "the call has a span id of its own");
            let root = tracing::info_span!(parent: None, "other").in_scope(|| call_span("t", "n"));
            let root = root.expect("enabled").parent;
            assert_ne!(root.trace_id, [7; 16], "a call outside any trace starts one");
            assert_eq!(root.flags, SAMPLED);
        });
    }

    #[test]
    fn ids_print_as_traceparent_does() {
        assert_eq!(Hex(&[0x00, 0xf0, 0x67, 0xaa]).to_string(), "00f067aa");
    }
}
