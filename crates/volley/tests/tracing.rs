//! Trace context across hops: a call's `volley.call` span is the parent of the `volley.serve`
//! span of the server that serves it (over tcp, through the controller's relay, and for the calls
//! a handler makes), by the TRACEPARENT request extension (PROTOCOL §6.2.2). Requests without a
//! trace context, or with a malformed one, are served as roots; a server that does not accept
//! extensions gets none.
//!
//! One subscriber records the spans of every test of this binary (a global one: servers' tasks
//! run on the runtime's threads); each test finds its own by a service name of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::proto::{Decoder, Extensions, FrameBuilder, Limits, Message, PREAMBLE};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::{Mode, ServiceConfig};
use volley::{Client, Method, Server, ServiceClient, TraceParent};

#[path = "support/old_server.rs"]
mod old_server;

/// A span the recorder saw: its name, its fields, and the recorded span it was a child of in
/// this process (the `tracing` parent).
#[derive(Debug, Clone, Default)]
struct Rec {
    name: String,
    fields: HashMap<String, String>,
    parent: Option<usize>,
}

impl Rec {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    fn trace_id(&self) -> &str {
        self.field("trace_id").unwrap_or_else(|| panic!("{self:?} has no trace id"))
    }
    fn span_id(&self) -> &str {
        self.field("span_id").unwrap_or_else(|| panic!("{self:?} has no span id"))
    }
}

/// Everything recorded: spans in creation order, live spans' indexes by id (ids are reused
/// after a span closes), and events (the recorded span they happened in, their fields).
#[derive(Default)]
struct Recorded {
    spans: Vec<Rec>,
    live: HashMap<u64, usize>,
    events: Vec<(Option<usize>, HashMap<String, String>)>,
}

struct Recorder(Arc<Mutex<Recorded>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut rec = Rec { name: attrs.metadata().name().to_string(), ..Rec::default() };
        attrs.record(&mut Fields(&mut rec.fields));
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.id().into_u64());
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        rec.parent = parent.and_then(|p| r.live.get(&p).copied());
        let at = r.spans.len();
        r.spans.push(rec);
        r.live.insert(id.into_u64(), at);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&at) = r.live.get(&id.into_u64()) {
            values.record(&mut Fields(&mut r.spans[at].fields));
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let span = ctx.event_span(event).map(|s| s.id().into_u64());
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let span = span.and_then(|id| r.live.get(&id).copied());
        r.events.push((span, fields));
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).live.remove(&id.into_u64());
    }
}

/// What was recorded so far. A failed assertion never holds the lock (it would poison it for
/// the recorder, whose panic inside the subscriber aborts the process).
fn lock() -> std::sync::MutexGuard<'static, Recorded> {
    static REC: OnceLock<Arc<Mutex<Recorded>>> = OnceLock::new();
    let rec = REC.get_or_init(recorded);
    rec.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the recorder as the global subscriber (once, from [`lock`]).
fn recorded() -> Arc<Mutex<Recorded>> {
    let rec = Arc::new(Mutex::new(Recorded::default()));
    let subscriber = tracing_subscriber::registry().with(Recorder(rec.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    rec
}

/// The recorded span named `name` (`volley.call` or `volley.serve`) for `service`'s `echo`:
/// exactly one.
fn one(name: &str, service: &str) -> (usize, Rec) {
    let found: Vec<_> = lock()
        .spans
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.name == name && s.field("service") == Some(service) && s.field("method") == Some("echo")
        })
        .map(|(i, s)| (i, s.clone()))
        .collect();
    assert_eq!(found.len(), 1, "one {name} span for {service}: {found:?}");
    found.into_iter().next().unwrap()
}

fn span_at(i: usize) -> Rec {
    lock().spans[i].clone()
}

/// Asserts that `child`, a `volley.serve` span, was served for the call of span `caller`: same
/// trace, remote parent = the caller's span id, and no parent in this process's span tree.
fn served_for(child: &Rec, caller: &Rec) {
    assert_eq!(child.name, "volley.serve");
    assert_eq!(caller.name, "volley.call");
    assert_eq!(child.trace_id(), caller.trace_id(), "one trace");
    assert_eq!(child.field("parent_id"), Some(caller.span_id()), "the caller's span is the parent");
    assert_eq!(child.parent, None, "a served request's span has no local parent");
    assert_ne!(child.span_id(), caller.span_id());
}

fn unique(tag: &str) -> String {
    format!("trace-{tag}-{}-{}", std::process::id(), fastrand::u32(..))
}

/// A server whose `echo` method of `service` answers its request.
fn echo_server(service: &'static str) -> (Server, Method<u64, u64>) {
    let m = Method::new(service, "echo");
    (Server::builder().handle(&m, |x: u64| async move { Ok(x) }).build(), m)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The call is the first on a new connection: it waits for the server's preamble to announce
/// extensions, rather than going without its trace context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_tcp_is_the_parent_of_the_span_that_serves_it() {
    let (server, service, addr) = echo_on_tcp("tcp").await;
    let echo: Method<u64, u64> = Method::new(service, "echo");
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&echo, 5).await.unwrap(), 5);

    let (_, call) = one("volley.call", service);
    let (_, serve) = one("volley.serve", service);
    served_for(&serve, &call);
    assert_eq!(call.trace_id().len(), 32);
    assert_eq!(call.span_id().len(), 16);
    assert_eq!(serve.field("method"), Some("echo"));
    server.shutdown().await;
}

/// A handler's calls are children of the span it serves in, also after it waited: client →
/// front → back is one trace of four spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_a_handler_makes_is_a_child_of_the_request_it_serves() {
    handler_chain("tcp").await;
}

/// The same chain in process: no request is encoded, but every call has a serve span linked
/// to it by the same context, and a handler that waits still serves inside its span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inproc_handler_chain_is_one_trace_of_four_spans() {
    handler_chain("inproc").await;
}

/// A server's address on `transport`, for a service of its own.
fn listen_on(transport: &str, service: &str) -> String {
    match transport {
        "tcp" => "tcp://127.0.0.1:0".into(),
        _ => format!("inproc://{service}"),
    }
}

/// Client → front (a handler that waits, then calls back) → back, on `transport`.
async fn handler_chain(transport: &str) {
    drop(lock());
    let (back_service, front_service) =
        (leak(unique(&format!("{transport}-back"))), leak(unique(&format!("{transport}-front"))));
    let (back, back_echo) = echo_server(back_service);
    let back_addr = back.listen(&listen_on(transport, back_service)).await.unwrap().to_string();
    let to_back = Client::connect(&back_addr).await.unwrap();
    let front_m: Method<u64, u64> = Method::new(front_service, "echo");
    let front = Server::builder()
        .handle(&front_m, move |x: u64| {
            let to_back = to_back.clone();
            async move {
                tokio::task::yield_now().await;
                to_back
                    .call(&back_echo, x + 1)
                    .await
                    .map_err(|e| volley::Status::new(volley::Code::Internal, e.to_string()))
            }
        })
        .build();
    let front_addr = front.listen(&listen_on(transport, front_service)).await.unwrap().to_string();
    let client = Client::connect(&front_addr).await.unwrap();
    assert_eq!(client.call(&front_m, 1).await.unwrap(), 2);

    let (_, call_front) = one("volley.call", front_service);
    let (serve_front_at, serve_front) = one("volley.serve", front_service);
    let (_, call_back) = one("volley.call", back_service);
    let (_, serve_back) = one("volley.serve", back_service);
    served_for(&serve_front, &call_front);
    assert_eq!(call_back.parent, Some(serve_front_at), "the handler's call is a child of its span");
    assert_eq!(call_back.trace_id(), serve_front.trace_id());
    served_for(&serve_back, &call_back);
    front.shutdown().await;
    back.shutdown().await;
}

/// A synchronous handler called in process runs inside its serve span, the call's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inproc_call_to_a_synchronous_handler_is_served_in_a_child_span() {
    drop(lock());
    let service = leak(unique("inproc-sync"));
    let echo: Method<u64, u64> = Method::new(service, "echo");
    let server = Server::builder()
        .handle_fn(&echo, |x: u64| {
            tracing::info!(x, "in the handler");
            Ok(x)
        })
        .build();
    let addr = server.listen(&listen_on("inproc", service)).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&echo, 3).await.unwrap(), 3);

    let (_, call) = one("volley.call", service);
    let (serve_at, serve) = one("volley.serve", service);
    served_for(&serve, &call);
    let in_handler = lock().events.iter().filter(|(span, _)| *span == Some(serve_at)).count();
    assert_eq!(in_handler, 1, "the handler's event is in the serve span");
    server.shutdown().await;
}

/// Through the controller: client → relay (its serve span, its forwarding call) → instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_call_keeps_the_chain_through_the_controller() {
    drop(lock());
    let service = leak(unique("relayed"));
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let reg_addr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let (server, echo) = echo_server(service);
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let _lease = registry
        .register(&server, vec![InstanceSpec::new(service, &addr)], LeaseConfig::default())
        .await
        .unwrap();
    let client =
        ServiceClient::connect_with(&reg_addr, ServiceConfig::default().mode(Mode::Relayed)).await.unwrap();
    let root = tracing::info_span!("relay_root", test = service);
    assert_eq!(tracing::Instrument::instrument(client.call(&echo, 9), root).await.unwrap(), 9);

    let (_, serve) = one("volley.serve", service);
    let (_, forward) = one("volley.call", service);
    let relay_serve = span_at(forward.parent.expect("the relay's call has a local parent"));
    assert_eq!(relay_serve.field("method"), Some("relay"));
    let relay_call = lock()
        .spans
        .iter()
        .find(|s| s.name == "volley.call" && s.field("span_id") == relay_serve.field("parent_id"))
        .cloned()
        .expect("the client's relay call");
    served_for(&serve, &forward);
    served_for(&relay_serve, &relay_call);
    assert_eq!(span_at(relay_call.parent.expect("in the test's span")).field("test"), Some(service));
    server.shutdown().await;
    controller.shutdown().await;
}

/// An [`echo_server`] of a service of its own, listening on tcp: (server, service, address).
async fn echo_on_tcp(tag: &str) -> (Server, &'static str, String) {
    drop(lock());
    let service = leak(unique(tag));
    let (server, _) = echo_server(service);
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    (server, service, addr)
}

/// Sends one raw `echo` request to `service` at `addr` (tcp), its extension block as given
/// (patched by `patch` after encoding), and returns the answer.
async fn raw_echo(addr: &str, service: &str, ext: Extensions, patch: impl FnOnce(&mut Vec<u8>)) -> u64 {
    let mut s = tokio::net::TcpStream::connect(addr.strip_prefix("tcp://").unwrap()).await.unwrap();
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request(1, 0, &ext, (service, "echo"), |b| volley::Wire::encode(&77u64, b)).unwrap();
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    let mut bytes = segs.concat();
    patch(&mut bytes);
    s.write_all(&PREAMBLE).await.unwrap();
    s.write_all(&bytes).await.unwrap();
    let (mut dec, mut buf, mut out) = (Decoder::new(Limits::default()), BytesMut::new(), Vec::new());
    loop {
        while let Some(frame) = dec.next_frame(&mut buf).unwrap() {
            volley::proto::decode_frame(&frame, &Limits::default(), &mut out).unwrap();
        }
        if let Some(m) = out.pop() {
            match m {
                Message::Reply { id: 1, payload } => return <u64 as volley::Wire>::decode(payload).unwrap(),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(s.read_buf(&mut buf).await.unwrap() > 0, "the server closed the connection");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_trace_context_is_served_in_a_root_span() {
    let (server, service, addr) = echo_on_tcp("plain").await;
    assert_eq!(raw_echo(&addr, service, Extensions::NONE, |_| {}).await, 77);
    let (_, serve) = one("volley.serve", service);
    assert_eq!(serve.field("parent_id"), None);
    assert_eq!(serve.parent, None);
    assert_eq!(serve.trace_id().len(), 32, "a new trace starts here");
    server.shutdown().await;
}

/// A raw request's trace context is taken as given (what another implementation sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_traceparent_becomes_the_served_span_s_parent() {
    let (server, service, addr) = echo_on_tcp("raw").await;
    let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let ext = Extensions { trace_parent: Some(Box::new(tp)), ..Extensions::NONE };
    assert_eq!(raw_echo(&addr, service, ext, |_| {}).await, 77);
    let (_, serve) = one("volley.serve", service);
    assert_eq!(serve.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(serve.field("parent_id"), Some("00f067aa0ba902b7"));
    server.shutdown().await;
}

/// A traceparent of an unknown version is ignored (logged at debug): the request is served, in
/// a root span of a new trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_is_ignored_and_the_call_succeeds() {
    let (server, service, addr) = echo_on_tcp("malformed").await;
    // A trace id of this test's own, so that the debug event can be told apart.
    let trace_id: [u8; 16] = std::array::from_fn(|_| fastrand::u8(1..));
    let tp = TraceParent { trace_id, parent_id: [3; 8], flags: 1 };
    let ext = Extensions { trace_parent: Some(Box::new(tp)), ..Extensions::NONE };
    let mut value = vec![0u8];
    value.extend_from_slice(&trace_id);
    let bad_version = |bytes: &mut Vec<u8>| {
        let at = bytes.windows(value.len()).position(|w| w == value).expect("the encoded traceparent");
        bytes[at] = 0x07;
    };
    assert_eq!(raw_echo(&addr, service, ext, bad_version).await, 77);

    let (_, serve) = one("volley.serve", service);
    assert_eq!(serve.field("parent_id"), None, "the malformed context is not the parent");
    assert_ne!(serve.trace_id(), trace_id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let mut sent = vec![7u8];
    sent.extend_from_slice(&trace_id);
    sent.extend_from_slice(&[3; 8]);
    sent.push(1);
    let logged = lock().events.iter().any(|(_, e)| {
        e.get("message").is_some_and(|m| m.contains("invalid traceparent"))
            && e.get("value") == Some(&format!("{sent:?}"))
    });
    assert!(logged, "the ignored traceparent is logged");
    server.shutdown().await;
}

/// A server whose preamble does not announce extensions gets requests without any, also when
/// the call is traced, and answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_extensions_gets_no_trace_context() {
    drop(lock());
    let service = leak(unique("old"));
    let m: Method<u64, u64> = Method::new(service, "echo");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let old_server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        old_server::answer_without_features(s, 2, 7).await
    });
    let client = Client::connect(&addr).await.unwrap();
    // The second call is made after the preamble arrived (no extensions announced).
    for _ in 0..2 {
        assert_eq!(client.call(&m, 1).await.unwrap(), 7);
    }
    for (flags, ext) in old_server.await.unwrap() {
        assert_eq!(flags & 0x02, 0, "the extensions flag was set");
        assert_eq!(ext, Extensions::NONE);
    }
    let calls = lock().spans.iter().filter(|s| s.field("service") == Some(service)).count();
    assert_eq!(calls, 2, "the calls were traced");
}

/// A chunk of a batch call is one request: its span is the parent of the span serving it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_chunk_is_the_parent_of_the_span_that_serves_it() {
    let (server, service, addr) = echo_on_tcp("batch").await;
    let echo: Method<u64, u64> = Method::new(service, "echo");
    let client = Client::connect(&addr).await.unwrap();
    let results = client.call_batch(&echo, vec![1, 2, 3]).await;
    assert_eq!(results.into_iter().map(Result::unwrap).collect::<Vec<_>>(), vec![1, 2, 3]);
    let (_, call) = one("volley.call", service);
    let (_, serve) = one("volley.serve", service);
    served_for(&serve, &call);
    server.shutdown().await;
}
