//! With the feature `otel`: Volley's spans exported as OpenTelemetry spans keep their
//! parent/child relations across the wire (client → server → a call the handler makes → the
//! server it calls), and the ids the TRACEPARENT extension carries are OpenTelemetry's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::SpanId;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt;
use volley::{Client, Code, Method, Server, Status};

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collect {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend(batch);
        Ok(())
    }
}

impl Collect {
    /// The exported span named `name` for `service`'s `echo`, once it was exported (a span is
    /// exported when it ends; a served request's span may end just after its reply left).
    async fn wait_for(&self, name: &str, service: &str) -> SpanData {
        let mut found = None;
        wait_until(Duration::from_secs(20), &format!("a {name} span for {service} to be exported"), || {
            found = self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .find(|s| {
                    s.name == name
                        && attr(s, "service").as_deref() == Some(service)
                        && attr(s, "method").as_deref() == Some("echo")
                })
                .cloned();
            found.is_some()
        })
        .await;
        found.unwrap()
    }
}

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until;

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.as_str().into_owned())
}

/// A server of `service`'s `echo` (answering with `f`) and `warm` methods.
fn server<F, Fut>(service: &'static str, f: F) -> Server
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<u64, Status>> + Send + 'static,
{
    Server::builder()
        .handle(&Method::new(service, "echo"), f)
        .handle(&Method::<u64, u64>::new(service, "warm"), |x: u64| async move { Ok(x) })
        .build()
}

/// Connects, and makes a first call so that the connection knows the server accepts extensions.
async fn connect(addr: &str, service: &'static str) -> Client {
    let client = Client::connect(addr).await.unwrap();
    client.call(&Method::<u64, u64>::new(service, "warm"), 0).await.unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_spans_link_client_server_and_nested_call() {
    let collect = Collect::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(collect.clone()).build();
    let subscriber = tracing_subscriber::registry().with(volley::otel::layer(&provider));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let back = server("otel-back", |x| async move { Ok(x) });
    let back_addr = back.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let to_back = connect(&back_addr, "otel-back").await;
    let front = server("otel-front", move |x| {
        let to_back = to_back.clone();
        async move {
            let echo = Method::<u64, u64>::new("otel-back", "echo");
            to_back.call(&echo, x).await.map_err(|e| Status::new(Code::Internal, e.to_string()))
        }
    });
    let front_addr = front.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let client = connect(&front_addr, "otel-front").await;
    assert_eq!(client.call(&Method::<u64, u64>::new("otel-front", "echo"), 3).await.unwrap(), 3);

    let call = collect.wait_for("volley.call", "otel-front").await;
    let serve = collect.wait_for("volley.serve", "otel-front").await;
    let nested = collect.wait_for("volley.call", "otel-back").await;
    let back_serve = collect.wait_for("volley.serve", "otel-back").await;
    let trace = call.span_context.trace_id();
    for s in [&serve, &nested, &back_serve] {
        assert_eq!(s.span_context.trace_id(), trace, "{} is in the client's trace", s.name);
    }
    assert_eq!(call.parent_span_id, SpanId::INVALID, "the client's call is the root");
    assert_eq!(serve.parent_span_id, call.span_context.span_id());
    assert!(serve.parent_span_is_remote);
    assert_eq!(nested.parent_span_id, serve.span_context.span_id());
    assert!(!nested.parent_span_is_remote);
    assert_eq!(back_serve.parent_span_id, nested.span_context.span_id());
    // The ids Volley records as fields are OpenTelemetry's.
    assert_eq!(attr(&serve, "span_id"), Some(serve.span_context.span_id().to_string()));
    assert_eq!(attr(&serve, "trace_id"), Some(trace.to_string()));
    front.shutdown().await;
    back.shutdown().await;
    provider.shutdown().unwrap();
}
