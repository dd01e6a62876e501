//! `going_away::check` with the Rust client and server: the server sits behind a TCP proxy
//! that the check's steps freeze (nothing more reaches the server) and then cut (every
//! connection dropped, new ones refused), as a stopped, then killed, server process would be.
//! A proxy that is never cut must fail the check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use volley_conformance::going_away::{Plan, Step, check};
use volley_conformance::interop::reference_server;

/// Forwards connections to `upstream` until frozen (then drops what the client sends) or cut.
struct Proxy {
    address: String,
    frozen: Arc<AtomicBool>,
    tasks: std::sync::Mutex<JoinSet<()>>,
}

impl Proxy {
    async fn start(upstream: String) -> Arc<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let proxy = Arc::new(Proxy {
            address: format!("tcp://{}", listener.local_addr().unwrap()),
            frozen: frozen.clone(),
            tasks: Default::default(),
        });
        let upstream = upstream.trim_start_matches("tcp://").to_string();
        proxy.tasks.lock().unwrap().spawn(async move {
            let mut pumps = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                let ((client_rx, client_tx), (server_rx, server_tx)) =
                    (client.into_split(), server.into_split());
                pumps.spawn(pump(client_rx, server_tx, Some(frozen.clone())));
                pumps.spawn(pump(server_rx, client_tx, None));
            }
        });
        proxy
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Drops every connection and the listener: the client reads the end of its stream, and a
    /// reconnect is refused.
    fn cut(&self) {
        self.tasks.lock().unwrap().abort_all();
    }
}

/// Copies `from` to `to`; once `frozen` is set, reads and drops (the server hears nothing more).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0; 1 << 16];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if frozen.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn run_check(proxy: Arc<Proxy>, freeze: bool, cut: bool, plan: Plan) -> volley_conformance::Report {
    let address = proxy.address.clone();
    check(&address, Some("s3cret"), plan, move |step| {
        let proxy = proxy.clone();
        async move {
            match step {
                Step::Stop { .. } if freeze => proxy.freeze(),
                Step::GoAway { .. } if cut => proxy.cut(),
                _ => {}
            }
            Ok(())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_the_rust_client_ends_once_when_the_server_goes_away_mid_batch() {
    let server = reference_server(Some("s3cret"));
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let report = run_check(Proxy::start(bound).await, true, true, Plan::default()).await;
    assert!(report.passed(), "{}", report.render());
    let summary = &report.cases[0].0;
    assert!(summary.contains("10100 calls (10000 batch items, 100 single)"), "{summary}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_goes_away_fails_the_check() {
    let server = reference_server(Some("s3cret"));
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let proxy = Proxy::start(bound).await;
    let plan = Plan { wait: Duration::from_secs(2), ..Plan::default() };
    let report = run_check(proxy.clone(), true, false, plan).await;
    let why = report.cases[0].1.as_ref().unwrap_err();
    assert!(why.contains("had not ended 2s after the server went away"), "{why}");
    proxy.cut();
    server.shutdown().await;
}
