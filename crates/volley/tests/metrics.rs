//! Metrics and the admin endpoint: what the counters and histograms say after a known number
//! of calls, errors and batches; `/metrics` as Prometheus text; `/vars.json`; the status page;
//! unknown paths; the switch that turns metrics off; a controller's registry.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::controller::{Controller, ControllerConfig};
use volley::registry::{LeaseConfig, Registry};
use volley::{Client, ClientConfig, Code, Error, Method, Server, Status};

/// Sends `request` as it is and returns the status code and the body.
#[path = "support/wait.rs"]
mod wait;
use wait::wait_for;

async fn http_raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await.unwrap().unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_raw(addr, format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes()).await
}

async fn vars(addr: SocketAddr) -> Value {
    let (code, body) = get(addr, "/vars.json").await;
    assert_eq!(code, 200);
    serde_json::from_str(&body).unwrap()
}

fn find<'a>(methods: &'a Value, service: &str, method: &str) -> &'a Value {
    methods
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["service"] == service && m["method"] == method)
        .unwrap_or_else(|| panic!("no {service}/{method} in {methods}"))
}

/// A server on tcp with its admin endpoint on an ephemeral loopback port.
async fn serve(builder: volley::ServerBuilder) -> (Server, String, SocketAddr) {
    let server = builder.admin("127.0.0.1:0").build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let admin = server.admin_address().expect("the admin endpoint started with listen");
    assert!(admin.ip().is_loopback());
    (server, addr, admin)
}

const SAY: Method<u32, u32> = Method::new("metrics-test", "say");
const SUM: Method<u32, u32> = Method::new("metrics-test", "sum");
/// For the tests that do not count (client metrics are per process, and tests run together).
const OTHER: Method<u32, u32> = Method::new("metrics-other", "say");

/// Odd numbers are refused with an application error.
fn say(n: u32) -> Result<u32, Status> {
    if n % 2 == 1 { Err(Status::new(Code::Application, "odd")) } else { Ok(n) }
}

#[tokio::test]
async fn server_counters_match_the_calls_errors_and_batches_made() {
    let builder = Server::builder()
        .handle_fn(&SAY, say)
        .handle_batch(&SUM, |reqs: Vec<u32>| async move { reqs.into_iter().map(Ok).collect() });
    let (server, addr, admin) = serve(builder).await;
    let client = Client::connect(&addr).await.unwrap();
    // 20 calls one at a time, 7 of them odd: 7 application errors.
    let mut odd = 0;
    for n in 0..20u32 {
        let n = if n < 7 { 2 * n + 1 } else { 2 * n };
        odd += (n % 2) as u64;
        let r = client.call(&SAY, n).await;
        assert_eq!(r.is_err(), n % 2 == 1);
    }
    // One batch request of 50: one handler batch of 50.
    let results = client.call_batch(&SUM, (0..50u32).collect::<Vec<_>>()).await;
    assert!(results.len() == 50 && results.iter().all(Result::is_ok));

    let v = vars(admin).await;
    let say_m = find(&v["server"]["methods"], "metrics-test", "say");
    assert_eq!(say_m["calls"], 20);
    assert_eq!(say_m["errors"]["application"], odd);
    assert_eq!(say_m["error_total"], 7);
    assert_eq!(say_m["in_flight"], 0);
    assert_eq!(say_m["latency_us"]["count"], 20);
    assert_eq!(say_m["batch"]["count"], 20, "each call came alone: 20 batches of one");
    assert_eq!(say_m["batch"]["p99"], 1);
    let sum_m = find(&v["server"]["methods"], "metrics-test", "sum");
    assert_eq!(sum_m["calls"], 50);
    assert_eq!(sum_m["error_total"], 0);
    assert_eq!(sum_m["batch"]["count"], 1);
    assert_eq!(sum_m["batch"]["mean"], 50.0, "one handler batch of 50");
    assert_eq!(sum_m["latency_us"]["count"], 50);
    // The client side of the same calls, kept for the process.
    let client_say = find(&v["client"]["methods"], "metrics-test", "say");
    assert_eq!(client_say["calls"], 20);
    assert_eq!(client_say["errors"]["application"], 7);
    let client_sum = find(&v["client"]["methods"], "metrics-test", "sum");
    assert_eq!((client_sum["calls"].as_u64(), client_sum["batch"]["mean"].as_f64()), (Some(50), Some(50.0)));
    // Transport: 21 requests read (20 requests and one batch request), in at least one frame.
    let t = &v["server"]["transport"];
    assert_eq!(t["messages_received"], 21);
    assert_eq!(v["server"]["connections"]["accepted"], 1);
    assert_eq!(v["server"]["connections"]["open"], 1);
    server.shutdown().await;
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_with_the_methods_labels() {
    const ECHO: Method<u32, u32> = Method::new("prom-test", "echo");
    let (server, addr, admin) = serve(
        Server::builder()
            .handle_fn(&ECHO, |n| if n == 0 { Err(Status::new(Code::BadRequest, "zero")) } else { Ok(n) }),
    )
    .await;
    let client = Client::connect(&addr).await.unwrap();
    for n in 0..12u32 {
        let _ = client.call(&ECHO, n).await;
    }
    let (code, body) = get(admin, "/metrics").await;
    assert_eq!(code, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    let sample = |name: &str, labels: &[(&str, &str)]| -> Option<prometheus_parse::Value> {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| s.value.clone())
    };
    let method = [("service", "prom-test"), ("method", "echo")];
    match sample("volley_server_calls_total", &method) {
        Some(prometheus_parse::Value::Counter(v)) => assert_eq!(v, 12.0),
        other => panic!("calls: {other:?}"),
    }
    let errors = [("service", "prom-test"), ("method", "echo"), ("code", "bad_request")];
    match sample("volley_server_errors_total", &errors) {
        Some(prometheus_parse::Value::Counter(v)) => assert_eq!(v, 1.0),
        other => panic!("errors: {other:?}"),
    }
    match sample("volley_server_latency_seconds", &method) {
        Some(prometheus_parse::Value::Histogram(buckets)) => {
            assert_eq!(buckets.last().unwrap().count, 12.0, "the +Inf bucket holds every call");
            assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count), "buckets are cumulative");
        }
        other => panic!("latency: {other:?}"),
    }
    match sample("volley_client_calls_total", &method) {
        Some(prometheus_parse::Value::Counter(v)) => assert_eq!(v, 12.0),
        other => panic!("client calls: {other:?}"),
    }
    assert!(sample("volley_server_connections_open", &[]).is_some());
    assert!(sample("volley_server_messages_per_frame_read", &[]).is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn the_admin_endpoint_answers_only_its_pages() {
    let (server, addr, admin) = serve(Server::builder().handle_fn(&OTHER, say)).await;
    assert_eq!(get(admin, "/nope").await.0, 404);
    assert_eq!(get(admin, "/metrics/extra").await.0, 404);
    assert_eq!(http_raw(admin, b"POST /metrics HTTP/1.1\r\n\r\n").await.0, 405);
    assert_eq!(http_raw(admin, b"this is not http\r\n\r\n").await.0, 400);
    let (code, page) = get(admin, "/").await;
    assert_eq!(code, 200);
    assert!(page.contains("<script>") && page.contains("vars.json"));
    assert!(!page.contains("http://") && !page.contains("https://"), "the page loads nothing from elsewhere");
    // The admin port never serves RPC: a Volley client cannot call through it.
    let c = ClientConfig::default().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(5));
    let via_admin = match Client::connect_with(&format!("tcp://{admin}"), c).await {
        Ok(client) => client.call(&OTHER, 2).await.map(drop),
        Err(e) => Err(e),
    };
    assert!(via_admin.is_err(), "an RPC call through the admin port must fail");
    // RPC on the real port still works.
    assert_eq!(Client::connect(&addr).await.unwrap().call(&OTHER, 4).await.unwrap(), 4);
    server.shutdown().await;
}

#[tokio::test]
async fn a_silent_or_oversized_http_client_does_not_hold_up_the_endpoint_or_rpc() {
    let (server, addr, admin) = serve(Server::builder().handle_fn(&OTHER, say)).await;
    // A client that connects and never sends anything, and one that sends a head without end.
    let _silent = TcpStream::connect(admin).await.unwrap();
    let mut flood = TcpStream::connect(admin).await.unwrap();
    let junk = vec![b'a'; 64 << 10];
    let _ = flood.write_all(b"GET /").await;
    let _ = flood.write_all(&junk).await; // over the head limit: closed, not buffered forever
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), flood.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "an oversized request head gets its connection closed");
    // Others are served meanwhile, and RPC is untouched.
    assert_eq!(get(admin, "/vars.json").await.0, 200);
    assert_eq!(Client::connect(&addr).await.unwrap().call(&OTHER, 6).await.unwrap(), 6);
    server.shutdown().await;
}

#[tokio::test]
async fn with_metrics_off_no_method_is_counted() {
    const OFF: Method<u32, u32> = Method::new("metrics-off-test", "say");
    let (server, addr, admin) = serve(Server::builder().metrics(false).handle_fn(&OFF, say)).await;
    let client = Client::connect_with(&addr, ClientConfig::default().metrics(false)).await.unwrap();
    for n in 0..5u32 {
        let _ = client.call(&OFF, n * 2).await.unwrap();
    }
    let v = vars(admin).await;
    assert_eq!(v["server"]["metrics"], false);
    assert_eq!(v["server"]["methods"].as_array().unwrap().len(), 0);
    let client_methods = v["client"]["methods"].as_array().unwrap();
    assert!(!client_methods.iter().any(|m| m["service"] == "metrics-off-test"));
    // The transport counters are kept either way.
    assert_eq!(v["server"]["transport"]["messages_received"], 5);
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_counts_a_timed_out_call_as_a_timeout() {
    const SLOW: Method<u32, u32> = Method::new("metrics-timeout-test", "slow");
    let (server, addr, admin) = serve(Server::builder().handle(&SLOW, |n: u32| async move {
        std::future::pending::<()>().await;
        Ok(n)
    }))
    .await;
    let client = Client::connect(&addr).await.unwrap();
    let opts = volley::CallOptions::default().timeout(Duration::from_millis(50));
    let r = client.call_with(&SLOW, 1, opts).await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    let v = vars(admin).await;
    let m = find(&v["client"]["methods"], "metrics-timeout-test", "slow");
    assert_eq!((m["calls"].as_u64(), m["errors"]["timeout"].as_u64()), (Some(1), Some(1)));
    // The client cancelled the call when it gave up, so the server stopped its handler: the
    // call ends there too, while the handler would never end by itself.
    wait_for(Duration::from_secs(20), "the handler to be stopped", async || {
        let v = vars(admin).await;
        let m = find(&v["server"]["methods"], "metrics-timeout-test", "slow");
        m["calls"] == 1 && m["in_flight"] == 0
    })
    .await;
    server.shutdown().await;
}

/// The endpoint names its process (the status page's header): role, services, every address
/// listened on as bound, the crate's version and the process id.
#[tokio::test]
async fn the_endpoint_names_the_process_it_belongs_to() {
    let (server, addr, admin) = serve(Server::builder().handle_fn(&SAY, say).handle_fn(&OTHER, say)).await;
    let p = vars(admin).await["process"].clone();
    assert_eq!(p["role"], "server");
    assert_eq!(p["services"], serde_json::json!(["metrics-other", "metrics-test"]));
    assert_eq!(p["addresses"], serde_json::json!([addr]));
    assert_eq!(p["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(p["pid"], std::process::id());
    // A later listen adds its address, as bound (the real port, not 0).
    let second = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    assert!(!second.ends_with(":0"), "{second}");
    assert_eq!(vars(admin).await["process"]["addresses"], serde_json::json!([addr, second]));
    server.shutdown().await;
}

#[tokio::test]
async fn a_controllers_endpoint_shows_its_services_instances_and_leases() {
    let mut config = ControllerConfig::default();
    config.settle = Duration::ZERO;
    config.admin = Some("127.0.0.1:0".into());
    let controller = Controller::new(config);
    let caddr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let admin = controller.admin_address().unwrap();
    let registry = Registry::connect(&caddr).await.unwrap();
    const PING: Method<u32, u32> = Method::new("registry-shown", "ping");
    let server = Server::builder().handle_fn(&PING, Ok).build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let lease = LeaseConfig::default();
    let spec = volley::discovery::InstanceSpec::new("registry-shown", addr.to_string());
    let _registration = registry.register(&server, vec![spec], lease).await.unwrap();

    let v = vars(admin).await;
    assert_eq!(v["process"]["role"], "controller");
    assert_eq!(v["process"]["addresses"][0], caddr);
    let reg = &v["registry"];
    let svc = reg["services"].as_array().unwrap().iter().find(|s| s["name"] == "registry-shown").unwrap();
    let inst = &svc["instances"][0];
    assert_eq!(inst["instance"]["address"], addr.to_string());
    assert!(inst["lease_ttl_ms"].as_u64().unwrap() > 0);
    // Ids are random 64-bit numbers: strings, so that JavaScript does not round them.
    assert!(inst["instance"]["lease"].as_str().unwrap().parse::<u64>().is_ok());
    assert!(reg["stats"]["client_ids_held"].as_u64().unwrap() >= 1);
    // The controller's own methods are on its status: one register call at least.
    let register = find(&v["server"]["methods"], "volley.registry", "register");
    assert!(register["calls"].as_u64().unwrap() >= 1);
    let (_, text) = get(admin, "/metrics").await;
    assert!(text.contains("volley_registry_instances{service=\"registry-shown\"} 1"), "{text}");
    server.shutdown().await;
    controller.shutdown().await;
}

/// Waits (up to 20 s) until the server's `/vars.json` satisfies `cond`; returns that answer.
async fn vars_when(admin: SocketAddr, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_for(Duration::from_secs(20), what, async || {
        last = vars(admin).await;
        cond(&last)
    })
    .await;
    last
}

/// The value of the sample `name` with `labels` in Prometheus text.
fn prom_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<prometheus_parse::Value> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    scrape
        .samples
        .into_iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| s.value)
}

/// Request `id` for method `m` (payload 7) in a frame of its own, with extensions `ext`: what
/// another implementation would send, over the frame layer.
fn request_frame(m: &Method<u32, u32>, id: u64, ext: &volley::proto::Extensions) -> Vec<u8> {
    let mut fb = volley::proto::FrameBuilder::new(volley::proto::Limits::default());
    fb.request(id, 0, ext, (m.service(), m.name()), |b| volley::Wire::encode(&7u32, b)).unwrap();
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    segs.concat()
}

/// A raw connection: the server's preamble and answers decoded as they come.
struct Raw {
    s: TcpStream,
    buf: bytes::BytesMut,
    dec: volley::proto::Decoder,
}

impl Raw {
    /// Connects and sends the preamble followed by `first`.
    async fn connect(addr: &str, first: &[u8]) -> Raw {
        let mut s = TcpStream::connect(addr.strip_prefix("tcp://").unwrap()).await.unwrap();
        let mut bytes = volley::proto::PREAMBLE.to_vec();
        bytes.extend_from_slice(first);
        s.write_all(&bytes).await.unwrap();
        Raw { s, buf: bytes::BytesMut::new(), dec: volley::proto::Decoder::new(Default::default()) }
    }

    /// Reads until `n` answers arrived; returns their codes (`None` for a reply).
    async fn answers(&mut self, n: usize) -> Vec<Option<Code>> {
        let (limits, mut out, mut seen) = (volley::proto::Limits::default(), Vec::new(), Vec::new());
        while seen.len() < n {
            while let Some(frame) = self.dec.next_frame(&mut self.buf).unwrap() {
                volley::proto::decode_frame(&frame, &limits, &mut out).unwrap();
            }
            for m in out.drain(..) {
                match m {
                    volley::proto::Message::Reply { .. } => seen.push(None),
                    volley::proto::Message::Error { code, .. } => seen.push(Some(code)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            if seen.len() < n {
                assert!(
                    self.s.read_buf(&mut self.buf).await.unwrap() > 0,
                    "the server closed the connection"
                );
            }
        }
        seen
    }
}

/// Requests answered `DeadlineExceeded` are counted by when their budget ran out — before the
/// handler ran, or while it ran — beside the requests whose client cancelled them while their
/// handler ran, and the requests queued in unfinished handlers.
#[tokio::test]
async fn deadline_expiries_cancellations_and_queued_requests_are_counted() {
    const ADD: Method<u32, u32> = Method::new("metrics-deadline-test", "add");
    const HANG: Method<u32, u32> = Method::new("metrics-deadline-test", "hang");
    let builder = Server::builder()
        .handle_fn(&ADD, |n: u32| Ok(n + 1))
        .handle(&HANG, |_: u32| std::future::pending::<Result<u32, Status>>());
    let (server, addr, admin) = serve(builder).await;
    let client = Client::connect(&addr).await.unwrap();
    // The first reply brings the server's preamble: from then on, the client sends budgets.
    assert_eq!(client.call(&ADD, 1).await.unwrap(), 2);
    let v = vars(admin).await;
    assert_eq!(v["server"]["deadline_expired"], serde_json::json!({"before_handler": 0, "in_handler": 0}));

    // Three calls whose budget is spent when they arrive: never run.
    for _ in 0..3 {
        let zero = volley::CallOptions::default().timeout(Duration::ZERO);
        assert!(client.call_with(&ADD, 1, zero).await.is_err());
    }
    // One whose handler is still waiting when its 200 ms run out: its work is dropped. Sent
    // raw, because a Volley client would cancel it at the same moment, and the two race.
    let ext = volley::proto::Extensions { deadline_micros: Some(200_000), ..volley::proto::Extensions::NONE };
    let mut raw = Raw::connect(&addr, &request_frame(&HANG, 1, &ext)).await;
    assert_eq!(raw.answers(1).await, vec![Some(Code::DeadlineExceeded)]);
    let v = vars_when(admin, "4 expiries", |v| {
        v["server"]["deadline_expired"]["before_handler"] == 3
            && v["server"]["deadline_expired"]["in_handler"] == 1
    })
    .await;
    assert_eq!(server.expired_requests(), 4);
    assert_eq!(v["server"]["cancelled_requests"], 0);

    // One the caller drops while its handler waits: queued, then cancelled.
    let long = volley::CallOptions::default().timeout(Duration::from_secs(60));
    let pending = tokio::spawn({
        let client = client.clone();
        async move { client.call_with(&HANG, 0, long).await }
    });
    vars_when(admin, "the hanging request to be queued", |v| v["server"]["queued_requests"] == 1).await;
    pending.abort();
    let v = vars_when(admin, "the cancel", |v| v["server"]["cancelled_requests"] == 1).await;
    assert_eq!(v["server"]["queued_requests"], 0);
    assert_eq!(server.cancelled_requests(), 1);

    let (_, text) = get(admin, "/metrics").await;
    let counter = |name: &str, labels: &[(&str, &str)]| match prom_value(&text, name, labels) {
        Some(prometheus_parse::Value::Counter(v)) => v,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("volley_server_deadline_expired_total", &[("stage", "before_handler")]), 3.0);
    assert_eq!(counter("volley_server_deadline_expired_total", &[("stage", "in_handler")]), 1.0);
    assert_eq!(counter("volley_server_cancelled_requests_total", &[]), 1.0);
    assert!(matches!(
        prom_value(&text, "volley_server_queued_requests", &[]),
        Some(prometheus_parse::Value::Gauge(v)) if v == 0.0
    ));
    server.shutdown().await;
}

/// Each batch a connection's reader hands up records how often the reader waited for its
/// socket since the batch before: requests already buffered cost no wake-up, a request sent
/// after the previous reply needs one.
#[tokio::test]
async fn reader_wake_ups_are_counted_per_batch() {
    const ECHO: Method<u32, u32> = Method::new("metrics-wakeup-test", "echo");
    // Two requests per batch, so that requests read together make several batches. (The
    // test's runtime has one thread: a request sent after a reply reaches a reader that
    // finished its turn and waits for the socket, as a remote client's would.)
    let (server, addr, admin) = serve(Server::builder().max_batch(2).handle_fn(&ECHO, Ok)).await;
    let frames = |ids: std::ops::Range<u64>| -> Vec<u8> {
        ids.flat_map(|id| request_frame(&ECHO, id, &volley::proto::Extensions::NONE)).collect()
    };
    // Six requests in one write after the preamble: three batches from one read.
    let mut raw = Raw::connect(&addr, &frames(1..7)).await;
    assert_eq!(raw.answers(6).await, vec![None; 6]);
    let v = vars(admin).await;
    let w = &v["server"]["reader_wakeups"];
    assert_eq!(w["batches"], 3, "{v}");
    // The reader may have waited once for the first (or found everything there already).
    let woken = w["wakeups"].as_u64().unwrap();
    assert!(woken <= 1, "the batches read with the first needed no wake-up: {w}");
    // Then five one at a time, each after the previous reply: each needs the reader woken.
    for id in 7..12 {
        raw.s.write_all(&frames(id..id + 1)).await.unwrap();
        assert_eq!(raw.answers(1).await, vec![None]);
    }
    let v = vars(admin).await;
    let w = &v["server"]["reader_wakeups"];
    assert_eq!(w["batches"], 8, "{v}");
    assert!(w["wakeups"].as_u64().unwrap() >= woken + 5, "a wake-up per request sent alone: {w}");
    let (_, text) = get(admin, "/metrics").await;
    match prom_value(&text, "volley_server_reader_wakeups_per_batch", &[]) {
        Some(prometheus_parse::Value::Histogram(b)) => assert_eq!(b.last().unwrap().count, 8.0),
        other => panic!("wake-ups per batch: {other:?}"),
    }
    server.shutdown().await;
}

/// Server streams are counted — opened, items sent, ended by reason — in `/vars.json` and
/// `/metrics`.
#[tokio::test]
async fn streams_are_counted_by_how_they_ended() {
    use futures_util::StreamExt;
    const COUNT: volley::StreamMethod<u32, u32> = volley::StreamMethod::new("metrics-stream-test", "count");
    let builder = Server::builder().handle_stream(&COUNT, |n: u32| async move {
        Ok(futures_util::stream::iter(0..n).map(Ok::<u32, Status>))
    });
    let (server, addr, admin) = serve(builder).await;
    let client = Client::connect(&addr).await.unwrap();
    // Two streams run to their end (5 and 3 items), one is dropped after 2 of its items.
    for n in [5, 3] {
        assert_eq!(client.open_stream(&COUNT, n).await.unwrap().count().await, n as usize);
    }
    let mut endless = client.open_stream(&COUNT, u32::MAX).await.unwrap();
    for _ in 0..2 {
        endless.next().await.unwrap().unwrap();
    }
    vars_when(admin, "the third stream to be open", |v| v["server"]["streams"]["open"] == 1).await;
    drop(endless);
    let v = vars_when(admin, "the cancel", |v| v["server"]["streams"]["ended"]["cancelled"] == 1).await;
    let s = &v["server"]["streams"];
    assert_eq!(
        (s["opened"].as_u64(), s["open"].as_u64(), s["ended"]["done"].as_u64()),
        (Some(3), Some(0), Some(2))
    );
    assert!(s["items"].as_u64().unwrap() >= 10, "{s}");
    let (_, text) = get(admin, "/metrics").await;
    let counter = |name: &str, labels: &[(&str, &str)]| match prom_value(&text, name, labels) {
        Some(prometheus_parse::Value::Counter(v)) => v,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("volley_server_streams_opened_total", &[]), 3.0);
    assert_eq!(counter("volley_server_streams_ended_total", &[("reason", "done")]), 2.0);
    assert_eq!(counter("volley_server_streams_ended_total", &[("reason", "cancelled")]), 1.0);
    assert_eq!(counter("volley_server_streams_ended_total", &[("reason", "deadline")]), 0.0);
    assert!(counter("volley_server_stream_items_total", &[]) >= 10.0);
    server.shutdown().await;
}
