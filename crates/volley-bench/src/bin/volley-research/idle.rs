//! `volley-research idle`: the server's resident memory with N idle TCP connections.
//!
//! The server runs in this process (an echo server as `volley serve-echo` builds it, on one
//! single-threaded runtime); the clients run in a child process (this binary again, hidden
//! flag `--clients-for`), so the resident set measured is the server's alone and the file
//! descriptors are split between two processes. Each client connection sends the preamble and
//! one echo request (64 bytes), reads the reply, and then sits idle. Once all N are idle the
//! server reads its resident set from `/proc/self/statm`.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use volley::bytes::{BufMut, Bytes};
use volley::proto::{FrameBuilder, Limits, PREAMBLE};
use volley::{Method, Server};

use crate::output::outln;

/// `echo/echo`, served synchronously as `volley serve-echo` serves it.
const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

#[derive(Args, Debug, Clone)]
pub struct IdleArgs {
    /// Idle connections to open.
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Seconds to let the server settle once every connection is idle.
    #[arg(long, default_value_t = 1.0)]
    settle: f64,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// (internal) Be the client process: connect to this address.
    #[arg(long, hide = true)]
    clients_for: Option<String>,
}

#[derive(Serialize)]
struct Report {
    case: &'static str,
    connections: usize,
    /// The server process's resident set with all connections idle.
    rss_bytes: u64,
    /// Its resident set before the connections were opened (server listening, warmed up).
    rss_before_bytes: u64,
    rss_per_connection_bytes: f64,
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

pub fn run(args: IdleArgs) -> Result<(), String> {
    if let Some(addr) = &args.clients_for {
        return clients(addr, args.connections);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        rt.block_on(async move {
            let server = Server::builder().handle_fn(&ECHO, |b: Bytes| Ok(b)).build();
            let bound = server.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string());
            let _ = addr_tx.send(bound.map(|b| b.to_string()));
            let _ = stop_rx.await;
            server.shutdown().await;
        })
    });
    let addr = addr_rx.recv().map_err(|e| e.to_string())??;
    let host = addr.trim_start_matches("tcp://").to_string();
    // Warm up: a few connections make a call and leave.
    drop(clients_in_process(&host, 20)?);
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_bytes();

    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["idle", "--clients-for", &host, "--connections", &args.connections.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the client process: {e}"))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(format!("client process failed: {line:?}"));
    }
    std::thread::sleep(Duration::from_secs_f64(args.settle));
    let after = rss_bytes();
    drop(child.stdin.take()); // the clients exit when their stdin closes
    let _ = child.wait();
    let _ = stop_tx.send(());
    let _ = server.join();

    let report = Report {
        case: "idle",
        connections: args.connections,
        rss_bytes: after,
        rss_before_bytes: before,
        rss_per_connection_bytes: after.saturating_sub(before) as f64 / args.connections.max(1) as f64,
    };
    if args.json {
        outln!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        outln!(
            "{} idle tcp connections: server rss {:.1} MiB (before {:.1} MiB, {:.0} bytes per connection)",
            report.connections,
            report.rss_bytes as f64 / (1 << 20) as f64,
            report.rss_before_bytes as f64 / (1 << 20) as f64,
            report.rss_per_connection_bytes,
        );
    }
    Ok(())
}

/// The client process: opens the connections, makes one call on each, says `ready`, and holds
/// them until its stdin closes.
fn clients(addr: &str, n: usize) -> Result<(), String> {
    let conns = clients_in_process(addr, n)?;
    outln!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(conns);
    Ok(())
}

fn clients_in_process(addr: &str, n: usize) -> Result<Vec<TcpStream>, String> {
    (0..n).map(|i| connect_and_call(addr, i as u64).map_err(|e| format!("connection {i}: {e}"))).collect()
}

/// One connection: preamble, one echo request of 64 bytes, its reply read back.
fn connect_and_call(addr: &str, id: u64) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request(id, 0, &volley::proto::Extensions::NONE, (ECHO.service(), ECHO.name()), |b| {
        b.put_slice(&[id as u8; 64]);
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    s.write_all(&PREAMBLE)?;
    for seg in &segs {
        s.write_all(seg)?;
    }
    let mut preamble = [0u8; 8];
    s.read_exact(&mut preamble)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body)?;
    if !body.ends_with(&[id as u8; 64]) {
        return Err(std::io::Error::other("the reply did not carry the payload back"));
    }
    Ok(s)
}
