//! Volley's spans as OpenTelemetry spans (feature `otel`).
//!
//! Install [`layer`] in a `tracing-subscriber` registry and every `volley.call` and
//! `volley.serve` span becomes an OpenTelemetry span of the provider's tracer. Their trace and
//! span ids are then OpenTelemetry's, and the TRACEPARENT extension carries them: a server's
//! span is the child of the remote caller's span in the exported traces.
//!
//! ```
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! // Any exporter: stdout, OTLP, or an in-memory one in tests.
//! let provider = SdkTracerProvider::builder().build();
//! let subscriber = tracing_subscriber::registry().with(volley::otel::layer(&provider));
//! tracing::subscriber::set_global_default(subscriber).unwrap();
//! ```

use opentelemetry::trace::{
    SpanContext as OtelContext, TraceContextExt, TraceFlags, TraceState, TracerProvider,
};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::registry::LookupSpan;

use crate::proto::TraceParent;

/// A `tracing` layer that records spans (Volley's and the application's) with `provider`'s
/// tracer, named `volley`.
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("volley"))
}

/// Makes the caller's span (`tp`) the OpenTelemetry parent of `span`. Without the layer,
/// nothing happens (Volley's own ids then link the spans).
pub(crate) fn set_remote_parent(span: &Span, tp: TraceParent) {
    let remote = OtelContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.parent_id),
        TraceFlags::new(tp.flags),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

/// The trace context a request made inside `span` carries (OpenTelemetry's trace id and the
/// span's id), if the layer records the span.
pub(crate) fn outgoing(span: &Span) -> Option<TraceParent> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        parent_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    })
}
