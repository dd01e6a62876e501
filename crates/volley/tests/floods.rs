//! Floods that must cost only their senders: many connections each holding most of a large
//! frame (the server's receive budget), stalled request heads at the admin endpoint, and a
//! flood of scrapes beside RPC. Each runs with a canary on another connection that must keep
//! being served. Bounds on time are generous: the machine may be loaded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::bytes::Bytes;
use volley::proto::{Code, Decoder, Limits, Message, PREAMBLE, decode_frame};
use volley::{Client, ConcurrencyLimit, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

const ECHO: Method<Bytes, Bytes> = Method::new("floods", "echo");

/// A server with an echo method on tcp, with its admin endpoint.
async fn serve(builder: volley::ServerBuilder) -> (Server, String, SocketAddr) {
    let server = builder.handle_fn(&ECHO, Ok).admin("127.0.0.1:0").build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let admin = server.admin_address().expect("the admin endpoint started with listen");
    (server, addr, admin)
}

fn host_port(addr: &str) -> &str {
    addr.trim_start_matches("tcp://")
}

/// GETs `path`; the status and body, or `None` if no answer came within `within`.
async fn get_within(admin: SocketAddr, path: &str, within: Duration) -> Option<(u16, String)> {
    tokio::time::timeout(within, async {
        let mut s = TcpStream::connect(admin).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8(out).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
    })
    .await
    .ok()
    .flatten()
}

/// The value of an unlabelled sample in the admin endpoint's `/metrics`.
async fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let (code, text) =
        get_within(admin, "/metrics", Duration::from_secs(30)).await.expect("/metrics answered");
    assert_eq!(code, 200);
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What the server sent on `s` until it closed (or `within` passed).
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> Vec<Message> {
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(within, s.read_to_end(&mut bytes)).await;
    let limits = Limits::default();
    let (mut d, mut out) = (Decoder::new(limits), Vec::new());
    let mut buf = volley::bytes::BytesMut::from(&bytes[..]);
    while let Ok(Some(body)) = d.next_frame(&mut buf) {
        decode_frame(&body, &limits, &mut out).unwrap();
    }
    out
}

/// One call of the canary, which must succeed.
async fn canary(client: &Client, n: u32) -> Duration {
    let t = Instant::now();
    let payload = Bytes::from(n.to_le_bytes().to_vec());
    assert_eq!(client.call(&ECHO, payload.clone()).await.unwrap(), payload);
    t.elapsed()
}

const FRAME: usize = 4 << 20;
/// The senders' bytes: all but the last of a frame of `FRAME` bytes (static, so 32 senders do
/// not hold 32 copies).
static BODY: [u8; FRAME - 1] = [0; FRAME - 1];

/// 32 connections each send most of a 4 MiB frame and stop: the server holds no more for them
/// than its receive budget (16 MiB: three such frames), the others wait with their bytes in the
/// kernel (back-pressure, not an error), and a canary on another connection is served all
/// along. When the senders leave, the budget is whole again. Without the budget the server
/// would hold 32 × 4 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_being_received_are_held_within_the_budget_while_a_canary_is_served() {
    const BUDGET: usize = 16 << 20;
    let builder = Server::builder().receive_budget(BUDGET).read_timeout(Some(Duration::from_secs(120)));
    let (server, addr, admin) = serve(builder).await;
    assert_eq!(metric(admin, "volley_server_receive_budget_bytes").await, Some(BUDGET as f64));
    let client = Client::connect(&addr).await.unwrap();
    canary(&client, 0).await;

    let mut senders = Vec::new();
    for _ in 0..32 {
        let mut s = TcpStream::connect(host_port(&addr)).await.unwrap();
        senders.push(tokio::spawn(async move {
            s.write_all(&PREAMBLE).await.unwrap();
            s.write_all(&(FRAME as u32).to_le_bytes()).await.unwrap();
            // Blocks for good on the connections waiting for the budget.
            let _ = s.write_all(&BODY).await;
            std::future::pending::<()>().await;
        }));
    }
    // The budget fills (three frames of 4 MiB and 4 bytes), and stays within its bound while
    // the canary keeps being served.
    let (mut most, mut calls) = (0.0f64, 0u32);
    wait_for(Duration::from_secs(60), "the budget to fill", async || {
        let held = metric(admin, "volley_server_receive_held_bytes").await.unwrap();
        assert!(held <= BUDGET as f64, "{held} bytes held with a budget of {BUDGET}");
        most = most.max(held);
        calls += 1;
        canary(&client, calls).await;
        most >= (3 * FRAME) as f64 && calls >= 20
    })
    .await;
    assert_eq!(server.connections().served, 33, "the waiting senders are kept, not refused");

    for s in &senders {
        s.abort();
    }
    wait_for(Duration::from_secs(60), "the senders' budget to be given back", async || {
        metric(admin, "volley_server_receive_held_bytes").await == Some(0.0)
            && server.connections().served <= 1
    })
    .await;
    canary(&client, 0).await;
    server.shutdown().await;
}

/// A frame larger than the whole budget can never be taken: its connection gets a go-away
/// (`Overloaded`) naming the budget at once, and the others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_budget_is_refused_at_once_with_a_clear_reason() {
    let (server, addr, _) = serve(Server::builder().receive_budget(1 << 20)).await;
    let client = Client::connect(&addr).await.unwrap();
    let mut s = TcpStream::connect(host_port(&addr)).await.unwrap();
    s.write_all(&PREAMBLE).await.unwrap();
    s.write_all(&(2u32 << 20).to_le_bytes()).await.unwrap();
    s.write_all(&[0; 1000]).await.unwrap();
    let t = Instant::now();
    let msgs = read_until_closed(&mut s, Duration::from_secs(30)).await;
    let reason = msgs.iter().find_map(|m| match m {
        Message::GoAway { code: Code::Overloaded, message } => {
            Some(String::from_utf8_lossy(&message[..]).into_owned())
        }
        _ => None,
    });
    let reason = reason.unwrap_or_else(|| panic!("no Overloaded go-away: {msgs:?}"));
    assert!(reason.contains("budget of 1048576 bytes"), "{reason}");
    assert!(t.elapsed() < Duration::from_secs(10), "refused only after {:?}", t.elapsed());
    canary(&client, 1).await;
    server.shutdown().await;
}

/// 32 connections that send half a request head, re-opened again and again, cannot lock
/// scrapers out of the admin endpoint: a newcomer takes the place of the oldest half-open one,
/// and a head that does not arrive within seconds frees its place anyway. Every scrape is
/// answered, and well within a second unless the machine is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_heads_do_not_lock_scrapers_out_of_the_admin_endpoint() {
    let (server, addr, admin) = serve(Server::builder()).await;
    let client = Client::connect(&addr).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let opened = Arc::new(AtomicU64::new(0));
    let stalled = tokio::spawn({
        let (stop, opened) = (stop.clone(), opened.clone());
        async move {
            while !stop.is_cancelled() {
                let mut held = Vec::new();
                for _ in 0..32 {
                    if let Ok(mut s) = TcpStream::connect(admin).await {
                        let _ = s.write_all(b"GET /metr").await;
                        held.push(s);
                        opened.fetch_add(1, Ordering::SeqCst);
                    }
                }
                // The attacker holds its heads for a while on the machine's clock: the admin
                // endpoint is a thread of its own, with its own (real) timeouts.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    wait_until(Duration::from_secs(30), "the first 32 stalled heads", || opened.load(Ordering::SeqCst) >= 32)
        .await;
    let mut slowest = Duration::ZERO;
    // Scrapes until the attacker has re-opened its heads at least once (and 20 at least).
    let (mut n, began) = (0u32, Instant::now());
    while n < 20 || opened.load(Ordering::SeqCst) < 64 {
        let opened = opened.load(Ordering::SeqCst);
        assert!(began.elapsed() < Duration::from_secs(60), "the stalled heads were not re-opened: {opened}");
        n += 1;
        let t = Instant::now();
        let answer = get_within(admin, "/metrics", Duration::from_secs(5)).await;
        let took = t.elapsed();
        let (code, body) = answer.unwrap_or_else(|| panic!("scrape {n} not answered within 5 s"));
        assert_eq!(code, 200);
        assert!(body.contains("volley_server_connections_open"), "{body}");
        slowest = slowest.max(took);
        canary(&client, n).await;
    }
    stop.cancel();
    stalled.await.unwrap();
    let opened = opened.load(Ordering::SeqCst);
    eprintln!("{n} scrapes beside {opened} stalled heads: slowest {slowest:?}");
    server.shutdown().await;
}

/// The p99 of `samples`.
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

/// 32 clients scraping `/metrics` and `/vars.json` as fast as they can do not stall RPC: the
/// endpoint runs on a thread of its own. A canary calling all along is served every time; its
/// p99 with and without the flood is printed (and must stay within a bound loose enough for a
/// loaded 2-core machine, where the flood's thread takes a core's share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_flood_does_not_stall_rpc() {
    // Many methods make a large scrape.
    let mut builder = Server::builder();
    const METHODS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let methods: Vec<Method<Bytes, Bytes>> =
        METHODS.iter().flat_map(|s| METHODS.iter().map(move |m| Method::new(s, m))).collect();
    for m in &methods {
        builder = builder.handle_fn(m, Ok);
    }
    let (server, addr, admin) = serve(builder).await;
    let client = Client::connect(&addr).await.unwrap();
    for m in &methods {
        client.call(m, Bytes::from_static(b"x")).await.unwrap();
    }
    const CALLS: u32 = 2_000;
    let measure = |client: Client| async move {
        let mut lat = Vec::with_capacity(CALLS as usize);
        for n in 0..CALLS {
            lat.push(canary(&client, n).await);
        }
        lat
    };
    let mut quiet = measure(client.clone()).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let served = Arc::new(AtomicU64::new(0));
    let mut scrapers = Vec::new();
    for i in 0..32 {
        let (stop, served) = (stop.clone(), served.clone());
        scrapers.push(tokio::spawn(async move {
            let path = if i % 2 == 0 { "/metrics" } else { "/vars.json" };
            let mut mine = 0u64;
            while !stop.is_cancelled() {
                if let Some((200, _)) = get_within(admin, path, Duration::from_secs(30)).await {
                    served.fetch_add(1, Ordering::SeqCst);
                    mine += 1;
                }
            }
            mine
        }));
    }
    // The flood is on: a round of scrapes was served before the measure starts.
    wait_until(Duration::from_secs(30), "the scrape flood to start", || served.load(Ordering::SeqCst) >= 32)
        .await;
    let mut flooded = measure(client.clone()).await;
    stop.cancel();
    let mut scrapes = 0;
    for s in scrapers {
        scrapes += s.await.unwrap();
    }
    let (q, f) = (p99(&mut quiet), p99(&mut flooded));
    eprintln!(
        "canary p99: {q:?} quiet, {f:?} beside {scrapes} scrapes ({:.2}x)",
        f.as_secs_f64() / q.as_secs_f64()
    );
    assert!(scrapes >= 32, "the flood was served too: {scrapes} scrapes");
    assert!(f < q * 20 + Duration::from_millis(50), "the canary's p99 went from {q:?} to {f:?}");
    server.shutdown().await;
}

/// The adaptive concurrency limit, when configured, shows in the admin endpoint (what the
/// binaries' `--adaptive-limit` is checked by); without it, no such series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_shows_in_the_admin_endpoint_when_on() {
    let (on, _, admin_on) = serve(Server::builder().concurrency_limit(ConcurrencyLimit::default())).await;
    let initial = ConcurrencyLimit::default().initial as f64;
    assert_eq!(metric(admin_on, "volley_server_concurrency_limit").await, Some(initial));
    let (off, _, admin_off) = serve(Server::builder()).await;
    assert_eq!(metric(admin_off, "volley_server_concurrency_limit").await, None);
    on.shutdown().await;
    off.shutdown().await;
}
