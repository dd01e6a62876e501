//! The adaptive concurrency limit: a server with one answers `Overloaded` at once beyond a
//! limit that follows its latency, instead of queueing requests until their callers give up.
//! Every request still ends exactly once, and the handler runs only for those admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use volley::{CallOptions, Client, Code, ConcurrencyLimit, Error, Method, Server};

const SLOW: Method<u64, u64> = Method::new("limit", "slow");
const SLOW_ASYNC: Method<u64, u64> = Method::new("limit", "slow_async");

fn address(tag: &str) -> String {
    format!("unix://{}/volley-limit-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id())
}

/// A server whose handlers take 2 ms per request: `slow` on the connection's task (it blocks,
/// as CPU work would), `slow_async` on a timer. Both count their runs.
fn server(runs: Arc<AtomicUsize>, limit: Option<ConcurrencyLimit>) -> Server {
    let runs_async = runs.clone();
    let mut b = Server::builder()
        .handle_fn(&SLOW, move |x: u64| {
            runs.fetch_add(1, Ordering::SeqCst);
            // Holds its real thread, as CPU work would.
            std::thread::sleep(Duration::from_millis(2));
            Ok(x)
        })
        .handle(&SLOW_ASYNC, move |x: u64| {
            runs_async.fetch_add(1, Ordering::SeqCst);
            async move {
                // Latency the adaptive limit measures, beside the blocking handler's real time.
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(x)
            }
        });
    if let Some(limit) = limit {
        b = b.concurrency_limit(limit);
    }
    b.build()
}

/// Sends `n` calls of `m` at once (they leave in a few frames and arrive together); returns
/// how many succeeded and how many were refused `Overloaded`. Any other outcome fails the test.
async fn burst(client: &Client, m: &Method<u64, u64>, n: u64) -> (usize, usize) {
    let opts = CallOptions::default().timeout(Duration::from_secs(120));
    let results = join_all((0..n).map(|i| client.call_with(m, i, opts))).await;
    let (mut ok, mut refused) = (0, 0);
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(x) => {
                assert_eq!(x, i as u64, "a reply for another request");
                ok += 1;
            }
            Err(Error::Remote(s)) if s.code == Code::Overloaded => refused += 1,
            Err(e) => panic!("call {i} ended with {e}"),
        }
    }
    (ok, refused)
}

fn limit() -> ConcurrencyLimit {
    ConcurrencyLimit::default().initial(50).window(Duration::from_millis(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_limit_are_refused_at_once_and_never_run() {
    for (tag, m) in [("sync", SLOW), ("async", SLOW_ASYNC)] {
        let runs = Arc::new(AtomicUsize::new(0));
        let server = server(runs.clone(), Some(limit()));
        let addr = server.listen(&address(tag)).await.unwrap().to_string();
        let client = Client::connect(&addr).await.unwrap();

        let (ok, refused) = burst(&client, &m, 2_000).await;
        assert_eq!(ok + refused, 2_000, "{tag}: every call ends once");
        assert!(refused > 0, "{tag}: 2,000 requests at once, a limit of 50: some must be refused");
        assert_eq!(runs.load(Ordering::SeqCst), ok, "{tag}: the handler ran for the admitted requests only");
        let (limit, in_flight) = server.concurrency().expect("the server has a limit");
        assert_eq!(in_flight, 0, "{tag}: nothing is left admitted after every reply");
        assert!((4..=50_000).contains(&limit), "{tag}: {limit}");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_above_the_target_shrinks_the_limit() {
    // 2 ms per request run one after another, a 5 ms target: however noisy the machine, a turn
    // of 50 such requests takes 100 ms, twenty times the target; the limit must come down.
    let runs = Arc::new(AtomicUsize::new(0));
    let server = server(runs, Some(limit()));
    let addr = server.listen(&address("shrinks")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    for _ in 0..3 {
        burst(&client, &SLOW, 500).await;
    }
    let (limit, _) = server.concurrency().unwrap();
    assert!(limit < 50, "the limit stayed at {limit}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_nothing_is_refused() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = server(runs.clone(), None);
    let addr = server.listen(&address("none")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    let (ok, refused) = burst(&client, &SLOW, 300).await;
    assert_eq!((ok, refused), (300, 0));
    assert_eq!(runs.load(Ordering::SeqCst), 300);
    assert_eq!(server.concurrency(), None);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_request_larger_than_the_limit_runs_when_it_is_alone() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = server(runs.clone(), Some(limit().initial(8)));
    let addr = server.listen(&address("batch")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    // A batch is one unit of work, admitted whole: alone, one larger than the limit still
    // runs, or it never could.
    let items: Vec<u64> = (0..20).collect();
    let out = client.call_batch(&SLOW_ASYNC, items).await;
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 20);
    server.shutdown().await;
}
