//! Floods that must cost only their senders: many connections each holding most of a large
//! frame (the server's receive budget). Each runs with a canary on another connection that must keep
//! being served. Bounds on time are generous: the machine may be loaded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::bytes::Bytes;
use volley::proto::{Code, Decoder, Limits, Message, PREAMBLE, decode_frame};
use volley::{Client, ConcurrencyLimit, Method, Server};

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
    let (start, mut most, mut calls) = (Instant::now(), 0.0f64, 0u32);
    loop {
        let held = metric(admin, "volley_server_receive_held_bytes").await.unwrap();
        assert!(held <= BUDGET as f64, "{held} bytes held with a budget of {BUDGET}");
        most = most.max(held);
        calls += 1;
        canary(&client, calls).await;
        if most >= (3 * FRAME) as f64 && calls >= 20 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the budget never filled: at most {most} bytes held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.connections().served, 33, "the waiting senders are kept, not refused");

    for s in &senders {
        s.abort();
    }
    let start = Instant::now();
    while metric(admin, "volley_server_receive_held_bytes").await != Some(0.0)
        || server.connections().served > 1
    {
        assert!(start.elapsed() < Duration::from_secs(60), "the senders' budget was not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
