//! The batch API: order, per-item failures, chunking, blocking and streaming forms, overload.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use volley::{BatchOptions, Client, Code, Error, Method, Server, Status};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until;

const SQUARE: Method<u64, u64> = Method::new("math", "square");
const SLOW: Method<u64, u64> = Method::new("math", "slow");

fn addresses(tag: &str) -> Vec<String> {
    vec![
        format!("inproc://batch-{tag}"),
        format!("unix://{}/volley-batch-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id()),
        "tcp://127.0.0.1:0".into(),
    ]
}

/// Squares its input; fails on multiples of 1000 and panics on 4242.
fn math_server(batches: Arc<AtomicUsize>) -> Server {
    Server::builder()
        .handle_batch(&SQUARE, move |xs: Vec<u64>| {
            batches.fetch_add(1, Ordering::Relaxed);
            async move {
                xs.into_iter()
                    .map(|x| if x % 1000 == 0 { Err(Status::app(format!("no {x}"))) } else { Ok(x * x) })
                    .collect()
            }
        })
        .build()
}

fn check_results(results: &[Result<u64, Error>], n: u64) {
    assert_eq!(results.len() as u64, n);
    for (x, r) in (0..n).zip(results) {
        if x % 1000 == 0 {
            match r {
                Err(Error::Remote(s)) => {
                    assert_eq!(s.code, Code::Application);
                    assert_eq!(s.message, format!("no {x}"));
                }
                other => panic!("item {x}: expected its own error, got {other:?}"),
            }
        } else {
            assert_eq!(r.as_ref().ok(), Some(&(x * x)), "item {x}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_items_in_input_order_with_failures_in_place() {
    for addr in addresses("order") {
        let batches = Arc::new(AtomicUsize::new(0));
        let server = math_server(batches.clone());
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        let results = client.call_batch(&SQUARE, 0..10_000u64).await;
        check_results(&results, 10_000);
        // 10,000 items in chunks of 128: 79 chunks, so the handler saw about 79 batches (a
        // chunk larger than max_batch would be split, here none is).
        let seen = batches.load(Ordering::Relaxed);
        assert!((79..=79 * 2).contains(&seen), "{bound}: {seen} handler batches for 79 chunks");
        if bound.transport() != "inproc" {
            // One message per chunk, not per item.
            let sent = client.counters().messages_sent;
            assert!(sent <= 79 + 2, "{bound}: {sent} messages for 79 chunks");
        }
        drop(client);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_size_and_empty_batches() {
    let server = math_server(Arc::new(AtomicUsize::new(0)));
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();
    assert!(client.call_batch(&SQUARE, Vec::<u64>::new()).await.is_empty());
    let before = client.counters().messages_sent;
    let results = client.call_batch_with(&SQUARE, 1..=10u64, BatchOptions::default().chunk_size(3)).await;
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        (1..=10).map(|x| x * x).collect::<Vec<_>>()
    );
    assert_eq!(client.counters().messages_sent - before, 4, "10 items in chunks of 3 are 4 messages");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_item_handlers_and_unknown_methods_in_batches() {
    for addr in addresses("items") {
        let server = Server::builder()
            .handle(&SLOW, |x: u64| async move {
                if x == 7 {
                    panic!("seven");
                }
                Ok(x + 1)
            })
            .build();
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        let results = client.call_batch(&SLOW, 0..300u64).await;
        for (x, r) in (0..300u64).zip(&results) {
            match (x, r) {
                (7, Err(Error::Remote(s))) => assert_eq!(s.code, Code::Panicked),
                (7, other) => panic!("{bound}: expected a panic reply, got {other:?}"),
                (_, r) => assert_eq!(r.as_ref().ok(), Some(&(x + 1)), "{bound}: item {x}"),
            }
        }
        // A method the server does not have: every item carries the error.
        let results = client.call_batch(&SQUARE, 0..5u64).await;
        assert_eq!(results.len(), 5);
        assert!(
            results.iter().all(|r| r.as_ref().err().and_then(Error::code) == Some(Code::UnknownMethod)),
            "{results:?}"
        );
        drop(client);
        server.shutdown().await;
    }
}

#[test]
fn blocking_batch_and_blocking_iterator() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (server, client) = rt.block_on(async {
        let server = math_server(Arc::new(AtomicUsize::new(0)));
        let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        (server, client)
    });
    let results = client.call_batch_blocking(&SQUARE, 0..2000u64).unwrap();
    check_results(&results, 2000);
    let streamed: Vec<_> =
        client.call_batch_iter(&SQUARE, 0..3000u64, BatchOptions::default().window(4)).unwrap().collect();
    check_results(&streamed, 3000);
    // Inside the runtime the blocking forms refuse instead of blocking a runtime thread.
    rt.block_on(async {
        assert!(matches!(client.call_batch_blocking(&SQUARE, 0..1u64), Err(Error::Usage(_))));
    });
    rt.block_on(server.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_yields_in_order_with_a_bounded_window() {
    for addr in addresses("stream") {
        let batches = Arc::new(AtomicUsize::new(0));
        let server = math_server(batches);
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        let pulled = Arc::new(AtomicUsize::new(0));
        let p = pulled.clone();
        let reqs = (0..20_000u64).inspect(move |_| {
            p.fetch_add(1, Ordering::Relaxed);
        });
        let opts = BatchOptions::default().chunk_size(100).window(3);
        let mut stream = client.call_batch_stream(&SQUARE, reqs, opts);
        let mut got = Vec::new();
        while let Some(r) = stream.next().await {
            // The stream never pulls more than window chunks ahead of what it has yielded
            // (plus the chunk being yielded).
            let ahead = pulled.load(Ordering::Relaxed) - got.len();
            assert!(ahead <= 4 * 100, "{bound}: {ahead} requests pulled ahead of the consumer");
            got.push(r);
        }
        check_results(&got, 20_000);
        drop(stream);
        drop(client);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_overloaded_at_once_and_admitted_requests_complete() {
    let in_handler = Arc::new(AtomicUsize::new(0));
    let h = in_handler.clone();
    let server = Server::builder()
        .max_queued(200)
        .handle(&SLOW, move |x: u64| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::Relaxed);
                // Slow work on the machine's clock: the flood is on a real socket.
                tokio::time::sleep(Duration::from_millis(200)).await;
                h.fetch_sub(1, Ordering::Relaxed);
                Ok(x)
            }
        })
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();
    // 10x the bound, all at once, as single calls and as a batch.
    let started = Instant::now();
    let mut calls = Vec::new();
    for x in 0..1000u64 {
        let client = client.clone();
        calls.push(tokio::spawn(async move { client.call(&SLOW, x).await }));
    }
    let batch = client.call_batch(&SLOW, 0..1000u64).await;
    let (mut ok, mut overloaded) = (0, 0);
    for (x, r) in calls.into_iter().enumerate() {
        match r.await.unwrap() {
            Ok(v) => {
                assert_eq!(v, x as u64);
                ok += 1;
            }
            Err(e) if e.code() == Some(Code::Overloaded) => overloaded += 1,
            Err(e) => panic!("call {x}: {e}"),
        }
    }
    for r in &batch {
        match r {
            Ok(_) => ok += 1,
            Err(e) if e.code() == Some(Code::Overloaded) => overloaded += 1,
            Err(e) => panic!("batch item: {e}"),
        }
    }
    assert_eq!(ok + overloaded, 2000, "every request ended");
    // At most the bound, plus what a lone batch takes beyond its share (half the bound).
    assert!(
        overloaded >= 2000 - (200 + 1000 - 100),
        "{overloaded} overloaded of 2000 against a bound of 200"
    );
    assert!(ok >= 200, "the admitted requests complete: {ok}");
    // Nothing waited for the slow handler more than a few of its turns.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(in_handler.load(Ordering::Relaxed) == 0);
    server.shutdown().await;
}

const HOLD: Method<u64, u64> = Method::new("math", "hold");

/// A batch request at the protocol's item limit, held by its handler, takes only its share (half)
/// of the server's bound on held requests (`max_queued`, 50,000 by default): 64 callers' single
/// calls beside it are all served, none answered `Overloaded`. Counted whole, the held batch
/// would fill the bound and every single call beside it would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_batch_at_the_item_limit_leaves_single_calls_their_room() {
    let (open, gate) = tokio::sync::watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let h = held.clone();
    let server = Server::builder()
        .handle_batch(&HOLD, move |xs: Vec<u64>| {
            h.fetch_add(xs.len(), Ordering::Relaxed);
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                xs.into_iter().map(Ok).collect()
            }
        })
        .handle(&SLOW, |x: u64| async move {
            // Held for a moment too (across a turn of the runtime): single calls count in the
            // bound beside the batch.
            tokio::task::yield_now().await;
            Ok(x)
        })
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let n = volley::proto::Limits::default().max_batch_items;
    assert_eq!(n, 65_536);
    let big = Client::connect(&addr).await.unwrap();
    let batch = tokio::spawn(async move {
        big.call_batch_with(&HOLD, 0..n as u64, BatchOptions::default().chunk_size(n)).await
    });
    wait_until(Duration::from_secs(60), "the batch to reach its handler", || {
        held.load(Ordering::Relaxed) >= n
    })
    .await;

    let mut callers = Vec::new();
    for c in 0..64u64 {
        let client = Client::connect(&addr).await.unwrap();
        callers.push(tokio::spawn(async move {
            let (mut ok, mut overloaded) = (0u64, 0u64);
            for i in 0..20u64 {
                let x = c * 1000 + i;
                match client.call(&SLOW, x).await {
                    Ok(v) => {
                        assert_eq!(v, x);
                        ok += 1;
                    }
                    Err(e) if e.code() == Some(Code::Overloaded) => overloaded += 1,
                    Err(e) => panic!("call {x}: {e}"),
                }
            }
            (ok, overloaded)
        }));
    }
    let (mut ok, mut overloaded) = (0, 0);
    for c in callers {
        let (o, r) = c.await.unwrap();
        (ok, overloaded) = (ok + o, overloaded + r);
    }
    assert!(!batch.is_finished(), "the batch was held the whole time");
    assert_eq!((ok, overloaded), (64 * 20, 0), "single calls beside a held batch of {n} items");

    open.send(true).unwrap();
    let results = batch.await.unwrap();
    assert_eq!(results.len(), n);
    for (x, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap(), x as u64);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_wait_for_room_under_the_in_flight_bound() {
    // The handlers hold their calls until the gate opens: the bound is full for as long as the
    // test looks at it, on any machine.
    let (open, gate) = tokio::sync::watch::channel(false);
    let entered = Arc::new(AtomicUsize::new(0));
    let seen = entered.clone();
    let server = Server::builder()
        .handle(&SLOW, move |x: u64| {
            let mut gate = gate.clone();
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = gate.wait_for(|open| *open).await;
                Ok(x)
            }
        })
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let config = volley::ClientConfig::default().max_in_flight(16);
    let client = Client::connect_with(&bound.to_string(), config).await.unwrap();
    let mut calls = Vec::new();
    for x in 0..100u64 {
        let client = client.clone();
        calls.push(tokio::spawn(async move { client.call(&SLOW, x).await }));
    }
    // Sixteen calls reach the server and hold the bound; the other 84 wait for room.
    wait_until(Duration::from_secs(60), "16 calls to reach their handlers", || {
        entered.load(Ordering::SeqCst) == 16
    })
    .await;
    assert_eq!(client.pending_calls(), 16);
    let mut max_pending = 16;
    open.send(true).unwrap();
    wait_until(Duration::from_secs(60), "the calls to finish", || {
        max_pending = max_pending.max(client.pending_calls());
        calls.iter().all(|c| c.is_finished())
    })
    .await;
    for (x, c) in calls.into_iter().enumerate() {
        assert_eq!(c.await.unwrap(), Ok(x as u64));
    }
    assert!(max_pending <= 16, "{max_pending} calls in flight with a bound of 16");
    assert_eq!(entered.load(Ordering::SeqCst), 100, "every call ran once");
    // A chunk larger than the bound is refused with a clear error rather than waiting forever.
    let r = client.call_batch_with(&SLOW, 0..100u64, BatchOptions::default().chunk_size(50)).await;
    assert!(matches!(&r[0], Err(Error::Usage(_))), "{:?}", r[0]);
    server.shutdown().await;
}

/// An application-level batch: the request type is itself a batch, and the
/// service processes it as one unit — one message, one handler call, one reply.
#[derive(serde::Serialize, serde::Deserialize)]
struct Numbers(Vec<u64>);
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Sum {
    count: u64,
    total: u64,
}
volley::wire!(Numbers, Sum);

const SUM: Method<Numbers, Sum> = Method::new("math", "sum");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_level_batch_is_one_message_and_one_handler_call() {
    for addr in addresses("app") {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let server = Server::builder()
            .handle(&SUM, move |n: Numbers| {
                c.fetch_add(1, Ordering::Relaxed);
                async move { Ok(Sum { count: n.0.len() as u64, total: n.0.iter().sum() }) }
            })
            .build();
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        let before = client.counters().messages_sent;
        let sum = client.call(&SUM, Numbers((1..=10_000).collect())).await.unwrap();
        assert_eq!(sum, Sum { count: 10_000, total: 50_005_000 });
        assert_eq!(calls.load(Ordering::Relaxed), 1, "{bound}");
        if bound.transport() != "inproc" {
            assert_eq!(
                client.counters().messages_sent - before,
                1,
                "{bound}: one message for the whole batch"
            );
        }
        drop(client);
        server.shutdown().await;
    }
}

/// The synchronous handler form: same results as the async forms on every transport, single and
/// batched, and a panic is still one item's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_handlers_serve_singles_and_batches_and_contain_panics() {
    for addr in addresses("sync") {
        let server = Server::builder()
            .handle_fn(&SQUARE, |x: u64| {
                if x == 13 {
                    panic!("unlucky");
                }
                if x.is_multiple_of(1000) { Err(Status::app(format!("no {x}"))) } else { Ok(x * x) }
            })
            .build();
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        assert_eq!(client.call(&SQUARE, 12).await, Ok(144), "{bound}");
        match client.call(&SQUARE, 13).await {
            Err(Error::Remote(s)) => assert_eq!(s.code, Code::Panicked, "{bound}"),
            other => panic!("{bound}: expected a panic reply, got {other:?}"),
        }
        let results = client.call_batch(&SQUARE, 0..3000u64).await;
        for (x, r) in (0..3000u64).zip(&results) {
            match x {
                13 => assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Panicked), "{bound}"),
                x if x % 1000 == 0 => {
                    assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Application))
                }
                x => assert_eq!(r.as_ref().ok(), Some(&(x * x)), "{bound}: item {x}"),
            }
        }
        assert_eq!(client.call(&SQUARE, 3).await, Ok(9), "{bound}: still serving after panics");
        drop(client);
        server.shutdown().await;
    }
}
