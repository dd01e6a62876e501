//! How calls end when things go wrong: deadlines, a server that dies mid-call, panicking
//! handlers, graceful shutdown, blocking calls, batch handlers, and reconnection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use volley::{CallOptions, Client, Code, Error, Method, Server, Status};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until;

const ADD_ONE: Method<u64, u64> = Method::new("failures", "add_one");
const SLOW: Method<u64, u64> = Method::new("failures", "slow");
const HANG: Method<u64, u64> = Method::new("failures", "hang");
const PANICKY: Method<u64, u64> = Method::new("failures", "panicky");
const BATCH: Method<u64, u64> = Method::new("failures", "batch");

fn unix_address(tag: &str) -> String {
    format!("unix://{}/volley-failures-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id())
}

// ---------------------------------------------------------------------------------------------
// (a) Deadlines
// ---------------------------------------------------------------------------------------------

const LATE: Duration = Duration::from_secs(2);

/// `SLOW(ms)` sleeps `ms` milliseconds, then answers `ms * 1000`.
fn slow_server() -> Server {
    Server::builder()
        .handle(&ADD_ONE, |x: u64| async move { Ok(x + 1) })
        .handle(&SLOW, |ms: u64| async move {
            // The slow work the deadlines race: on the paused clock over inproc; on byte
            // transports on the machine's, as the client's deadlines there read its coarse clock.
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms * 1000)
        })
        .build()
}

/// A call with a 100 ms deadline to a handler that takes 2 s ends with `Timeout` after about
/// 100 ms; the client keeps working; the late reply is dropped without harm.
async fn deadline_fires(addr: &str) {
    let server = slow_server();
    let bound = server.listen(addr).await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 1).await, Ok(2));
    let received_before = client.counters().messages_received;

    let deadline = Duration::from_millis(100);
    let t0 = Instant::now();
    let r = client.call_with(&SLOW, LATE.as_millis() as u64, CallOptions::default().timeout(deadline)).await;
    let elapsed = t0.elapsed();
    assert_eq!(r, Err(Error::Timeout(deadline)), "{bound}");
    assert!(
        // The late reply would come after LATE: half of it leaves room for a noisy machine.
        elapsed >= Duration::from_millis(80) && elapsed < LATE / 2,
        "{bound}: timed out after {elapsed:?}, expected about {deadline:?}"
    );
    assert_eq!(client.pending_calls(), 0, "{bound}: the timed-out call left a waiter");

    // The connection is fine: the next call works at once.
    let t1 = Instant::now();
    assert_eq!(client.call(&ADD_ONE, 41).await, Ok(42), "{bound}");
    assert!(t1.elapsed() < LATE / 2, "{bound}: the next call waited for the slow one");

    // Wait for the late reply (on byte transports the server's own answer at the deadline,
    // counted as received; inproc drops the handler with the call), then check it was dropped
    // and mixed up with nothing.
    if !addr.starts_with("inproc") {
        wait_until(Duration::from_secs(5), "the late reply", || {
            client.counters().messages_received >= received_before + 2
        })
        .await;
    }
    assert_eq!(client.pending_calls(), 0, "{bound}");
    assert_eq!(client.call(&ADD_ONE, 99).await, Ok(100), "{bound}");
    // A call with a roomy deadline to the same slow handler still succeeds, and one with a
    // short deadline next to it does not take it down.
    let roomy = client.call_with(&SLOW, 300, CallOptions::default().timeout(Duration::from_secs(5)));
    let short = client.call_with(&SLOW, 400, CallOptions::default().timeout(deadline));
    let (roomy, short) = tokio::join!(roomy, short);
    assert_eq!(roomy, Ok(300_000), "{bound}");
    assert_eq!(short, Err(Error::Timeout(deadline)), "{bound}");
    drop(client);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_fires_tcp() {
    deadline_fires("tcp://127.0.0.1:0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_fires_unix() {
    deadline_fires(&unix_address("deadline")).await;
}

/// Inproc deadlines are tokio timers: on the paused clock the test waits on no real time.
#[tokio::test(start_paused = true)]
async fn deadline_fires_inproc() {
    deadline_fires("inproc://failures-deadline").await;
}

/// Many calls with short deadlines at once: each ends exactly once, with `Timeout`, and none
/// is left in the pending table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_deadlines_at_once() {
    let server = slow_server();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let client = client.clone();
        // Deadlines spread over 50..250 ms, handlers that take 1 s. Each call's time counts from
        // its own start (a task the runtime polls late starts its deadline late), on the coarse
        // clock the client's deadlines use: under CPU steal it lags the precise clock by tens
        // of milliseconds, and on the precise clock a deadline would seem to fire early.
        let deadline = Duration::from_millis(50 + i % 200);
        tasks.push(tokio::spawn(async move {
            let t0 = coarsetime::Instant::now();
            let r = client.call_with(&SLOW, 1000, CallOptions::default().timeout(deadline)).await;
            (deadline, r, Duration::from(t0.elapsed()))
        }));
    }
    for t in tasks {
        let (deadline, r, at) = t.await.unwrap();
        assert_eq!(r, Err(Error::Timeout(deadline)));
        assert!(
            // Early by at most the coarse clock's tick (4 ms at 250 Hz).
            at + Duration::from_millis(5) >= deadline && at < deadline + Duration::from_millis(500),
            "deadline {deadline:?} fired at {at:?}"
        );
    }
    assert_eq!(client.pending_calls(), 0);
    assert_eq!(client.call(&ADD_ONE, 1).await, Ok(2));
    drop(client);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// (b) The server dies mid-call
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_dying_mid_call_ends_every_pending_call() {
    const CALLS: usize = 50;
    let entered = Arc::new(AtomicUsize::new(0));
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
    let server_thread = {
        let entered = entered.clone();
        std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            let server = rt.block_on(async move {
                let server = Server::builder()
                    .handle(&HANG, move |_: u64| {
                        entered.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<Result<u64, Status>>()
                    })
                    .handle(&ADD_ONE, |x: u64| async move { Ok(x + 1) })
                    .build();
                let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
                addr_tx.send(bound.to_string()).unwrap();
                server
            });
            kill_rx.recv().unwrap();
            // The process of the server "dies": every task, socket and timer goes at once.
            rt.shutdown_background();
            drop(server);
        })
    };
    let addr = addr_rx.await.unwrap();
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 1).await, Ok(2));

    let ends: Arc<Vec<AtomicUsize>> = Arc::new((0..CALLS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (client, ends) = (client.clone(), ends.clone());
        tasks.push(tokio::spawn(async move {
            let r = client.call(&HANG, i as u64).await;
            ends[i].fetch_add(1, Ordering::SeqCst);
            r
        }));
    }
    wait_until(Duration::from_secs(3), "all calls to reach the handler", || {
        entered.load(Ordering::SeqCst) == CALLS
    })
    .await;
    assert_eq!(client.pending_calls(), CALLS);
    assert!(ends.iter().all(|e| e.load(Ordering::SeqCst) == 0));

    let t0 = Instant::now();
    kill_tx.send(()).unwrap();
    let mut connection_errors = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(2), t)
            .await
            .unwrap_or_else(|_| panic!("call {i} still pending 2 s after the server died"))
            .unwrap();
        match r {
            Err(Error::Connection(_)) => connection_errors += 1,
            other => panic!("call {i}: expected a connection error, got {other:?}"),
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(connection_errors, CALLS);
    assert_eq!(client.pending_calls(), 0);
    // Each call ended exactly once (every task has finished, so none can end again).
    for (i, e) in ends.iter().enumerate() {
        assert_eq!(e.load(Ordering::SeqCst), 1, "call {i}");
    }
    server_thread.join().unwrap();

    // Nobody listens any more: a new call fails (reconnecting is refused), it does not hang.
    let r = tokio::time::timeout(Duration::from_secs(2), client.call(&ADD_ONE, 1))
        .await
        .expect("a call to a dead server hung");
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// (c) Panicking handlers
// ---------------------------------------------------------------------------------------------

/// What the batch handler of [`panicky_server`] saw: its largest batch and how often it ran.
#[derive(Default)]
struct BatchStats {
    max: AtomicUsize,
    calls: AtomicUsize,
}

fn panicky_server(stats: Arc<BatchStats>) -> Server {
    Server::builder()
        .handle(&ADD_ONE, |x: u64| async move { Ok(x + 1) })
        .handle(&PANICKY, |x: u64| {
            if x == 1 {
                panic!("refused to even start on {x}");
            }
            async move {
                if x == 13 {
                    panic!("unlucky number {x}");
                }
                Ok(x * 2)
            }
        })
        .handle_batch(&BATCH, move |xs: Vec<u64>| {
            stats.max.fetch_max(xs.len(), Ordering::SeqCst);
            stats.calls.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::task::yield_now().await;
                if xs.contains(&13) {
                    panic!("batch with 13 in it");
                }
                xs.into_iter().map(|x| Ok(x * 3 + 1)).collect::<Vec<Result<u64, Status>>>()
            }
        })
        .build()
}

async fn panics_become_error_replies(addr: &str) {
    let server = panicky_server(Arc::default());
    let bound = server.listen(addr).await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    // Panic inside the handler's future.
    match client.call(&PANICKY, 13).await {
        Err(Error::Remote(s)) => {
            assert_eq!(s.code, Code::Panicked, "{bound}: {s}");
            assert!(s.message.contains("unlucky number 13"), "{bound}: {s}");
        }
        other => panic!("{bound}: expected Panicked, got {other:?}"),
    }
    assert_eq!(client.call(&PANICKY, 4).await, Ok(8), "{bound}");
    // Panic in the handler function itself, before it returns a future.
    match client.call(&PANICKY, 1).await {
        Err(Error::Remote(s)) => {
            assert_eq!(s.code, Code::Panicked, "{bound}: {s}");
            assert!(s.message.contains("refused to even start"), "{bound}: {s}");
        }
        other => panic!("{bound}: expected Panicked, got {other:?}"),
    }
    assert_eq!(client.call(&PANICKY, 5).await, Ok(10), "{bound}");
    assert_eq!(client.call(&ADD_ONE, 5).await, Ok(6), "{bound}");

    // A batch handler that panics fails its batch; the next call is served.
    let r = client.call(&BATCH, 13).await;
    assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Panicked), "{bound}: {r:?}");
    assert_eq!(client.call(&BATCH, 2).await, Ok(7), "{bound}");

    // Panicking and healthy single requests side by side: only the panicking ones fail.
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let x = if i % 4 == 0 { 13 } else { 100 + i };
            (x, c.call(&PANICKY, x).await)
        }));
    }
    for t in tasks {
        let (x, r) = t.await.unwrap();
        if x == 13 {
            assert_eq!(r.err().and_then(|e| e.code()), Some(Code::Panicked));
        } else {
            assert_eq!(r, Ok(x * 2), "{bound}");
        }
    }
    assert_eq!(client.pending_calls(), 0);
    drop(client);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_become_error_replies_tcp() {
    panics_become_error_replies("tcp://127.0.0.1:0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_become_error_replies_inproc() {
    panics_become_error_replies("inproc://failures-panics").await;
}

// ---------------------------------------------------------------------------------------------
// (d) Graceful shutdown
// ---------------------------------------------------------------------------------------------

async fn graceful_shutdown(addr: &str) {
    const CALLS: u64 = 20;
    let entered = Arc::new(AtomicUsize::new(0));
    let counted = entered.clone();
    let server = Server::builder()
        .handle(&SLOW, move |x: u64| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                // Work a shutdown must wait for: on the paused clock over inproc, on the
                // machine's over real sockets.
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(x + 1000)
            }
        })
        .build();
    let bound = server.listen(addr).await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let c = client.clone();
        tasks.push(tokio::spawn(async move { c.call(&SLOW, i).await }));
    }
    wait_until(Duration::from_secs(2), "calls to reach the handler", || {
        entered.load(Ordering::SeqCst) == CALLS as usize
    })
    .await;

    tokio::time::timeout(Duration::from_secs(3), server.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{bound}: shutdown hung"));
    // Shutdown waited for the handlers.
    assert!(
        t0.elapsed() >= Duration::from_millis(290),
        "{bound}: shutdown returned after {:?}, before the handlers finished",
        t0.elapsed()
    );
    for (i, t) in tasks.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(2), t).await.expect("call hung").unwrap();
        assert_eq!(r, Ok(i as u64 + 1000), "{bound}: call {i}");
    }

    // Nobody is listening any more.
    let r = Client::connect(&bound.to_string()).await;
    assert!(matches!(r, Err(Error::Connection(_))), "{bound}: connect after shutdown: {:?}", r.map(|_| ()));
    // The old client's calls fail, promptly.
    let r = tokio::time::timeout(Duration::from_secs(2), client.call(&SLOW, 1))
        .await
        .expect("call after shutdown hung");
    assert!(matches!(r, Err(Error::Connection(_))), "{bound}: {r:?}");
    // Listening again on a shut-down server is refused.
    assert_eq!(server.listen(addr).await, Err(Error::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_tcp() {
    graceful_shutdown("tcp://127.0.0.1:0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_unix() {
    graceful_shutdown(&unix_address("shutdown")).await;
}

/// The handlers' 300 ms and the shutdown's wait for them on the paused clock.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_inproc() {
    graceful_shutdown("inproc://failures-shutdown").await;
}

// ---------------------------------------------------------------------------------------------
// (e) Blocking calls
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_blocking_from_a_plain_thread_and_refused_inside_the_runtime() {
    let server = Server::builder().handle(&ADD_ONE, |x: u64| async move { Ok(x + 1) }).build();
    for addr in ["tcp://127.0.0.1:0", "inproc://failures-blocking"] {
        let bound = server.listen(addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();

        // From a thread that knows nothing of the runtime.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c = client.clone();
        let thread = std::thread::spawn(move || {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let results: Vec<_> = (0..10u64).map(|i| c.call_blocking(&ADD_ONE, i)).collect();
            tx.send(results).unwrap();
        });
        let results =
            tokio::time::timeout(Duration::from_secs(3), rx).await.expect("call_blocking hung").unwrap();
        thread.join().unwrap();
        assert_eq!(results, (1..=10u64).map(Ok).collect::<Vec<_>>(), "{bound}");

        // From inside the runtime: refused, not a deadlock or a panic.
        let r = client.call_blocking(&ADD_ONE, 1);
        assert!(matches!(r, Err(Error::Usage(_))), "{bound}: {r:?}");
        // And the client still works afterwards.
        assert_eq!(client.call(&ADD_ONE, 2).await, Ok(3));
    }
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// (f) Batch handlers see real batches
// ---------------------------------------------------------------------------------------------

/// Many callers at once: the batch handler sees batches of more than one request, and every
/// result goes back to its own caller. Returns (handler invocations, calls) of `rounds` bursts.
async fn batch_handler_gets_batches(addr: &str, rounds: usize) -> (usize, usize) {
    let stats = Arc::new(BatchStats::default());
    let server = panicky_server(stats.clone());
    let bound = server.listen(addr).await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    // A lone call is a batch of one.
    assert_eq!(client.call(&BATCH, 10).await, Ok(31));
    assert_eq!(stats.max.load(Ordering::SeqCst), 1);
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);

    const CALLERS: u64 = 500;
    for round in 0..rounds as u64 {
        let start = Arc::new(tokio::sync::Barrier::new(CALLERS as usize));
        let mut tasks = Vec::new();
        for i in 0..CALLERS {
            let (c, start) = (client.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                // Never 13, which makes the batch panic.
                let x = 1000 + round * CALLERS + i;
                (x, c.call(&BATCH, x).await)
            }));
        }
        for t in tasks {
            let (x, r) =
                tokio::time::timeout(Duration::from_secs(5), t).await.expect("batch call hung").unwrap();
            assert_eq!(r, Ok(x * 3 + 1), "{bound}: result of {x} went elsewhere");
        }
    }
    let requests = rounds * CALLERS as usize;
    let max = stats.max.load(Ordering::SeqCst);
    let calls = stats.calls.load(Ordering::SeqCst) - 1;
    assert!(max <= 1000, "{bound}: batch of {max} exceeds max_batch");
    assert!(
        max > 1,
        "{bound}: the batch handler only ever saw batches of {max} ({calls} calls for {requests} requests)"
    );
    drop(client);
    server.shutdown().await;
    (calls, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_handler_gets_batches_tcp() {
    let (calls, requests) = batch_handler_gets_batches("tcp://127.0.0.1:0", 1).await;
    assert!(calls < requests, "{calls} handler invocations for {requests} requests");
}

/// Inproc batch handlers are fed by a per-method queue drained by a dispatcher task; concurrent
/// callers must share handler invocations.
///
/// Regression test: on a multi-threaded runtime the dispatcher, woken by the first caller's
/// push, used to run right after that caller (tokio's LIFO slot) and take the one request
/// queued so far, again and again — 800..2,050 invocations for these 2,500 calls, often a
/// whole burst in batches of one. Yielding once before taking brings it to 40..115.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_handler_gets_batches_inproc() {
    let (calls, requests) = batch_handler_gets_batches("inproc://failures-batches", 5).await;
    assert!(calls * 10 <= requests, "{calls} handler invocations for {requests} concurrent requests");
}

/// `max_batch` bounds a batch even when the requests arrive in one frame: a peer may bundle up
/// to `Limits::max_messages_per_frame` (4096) messages per frame.
///
/// Regression test: `max` used to be checked only between frames, so all 50 requests of one
/// frame reached the handler in one call although `max_batch` was 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_batch_bounds_a_batch_that_arrives_in_one_frame() {
    use bytes::{Bytes, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use volley::proto::{Decoder, FrameBuilder, Limits, Message, PREAMBLE, decode_frame};

    let max_seen = Arc::new(AtomicUsize::new(0));
    let seen = max_seen.clone();
    let server = Server::builder()
        .max_batch(8)
        .handle_batch(&BATCH, move |xs: Vec<u64>| {
            seen.fetch_max(xs.len(), Ordering::SeqCst);
            async move { xs.into_iter().map(|x| Ok(x + 7)).collect::<Vec<Result<u64, Status>>>() }
        })
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();

    let mut fb = FrameBuilder::new(Limits::default());
    for i in 0..50u64 {
        fb.request_bytes(
            i,
            0,
            &volley::proto::Extensions::NONE,
            (BATCH.service(), BATCH.name()),
            Bytes::copy_from_slice(&i.to_le_bytes()),
        )
        .unwrap();
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (1, 50), "one frame of 50 requests");
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&segs.concat());

    let mut s = tokio::net::TcpStream::connect(bound.strip_prefix("tcp://").unwrap()).await.unwrap();
    s.write_all(&bytes).await.unwrap();
    let limits = Limits::default();
    let (mut dec, mut buf, mut msgs) = (Decoder::new(limits), BytesMut::new(), Vec::new());
    let read = async {
        while msgs.len() < 50 {
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "server closed");
            while let Some(f) = dec.next_frame(&mut buf).unwrap() {
                decode_frame(&f, &limits, &mut msgs).unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3), read).await.expect("replies");
    // Every request answered once, to its own id.
    let mut ids: Vec<u64> = msgs
        .iter()
        .map(|m| match m {
            Message::Reply { id, payload } => {
                assert_eq!(&payload[..], &(id + 7).to_le_bytes());
                *id
            }
            other => panic!("{other:?}"),
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..50).collect::<Vec<u64>>());
    let max = max_seen.load(Ordering::SeqCst);
    assert!(max <= 8, "batch handler got a batch of {max} with max_batch 8");
    assert!(max >= 2, "the frame's requests were still batched (got {max})");
    drop(s);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// More ways for a call to end
// ---------------------------------------------------------------------------------------------

/// A caller that gives up (its future is dropped) leaves no waiter behind, tells the server
/// (a cancel message), and the connection keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_giving_up_leaves_no_waiter() {
    let server = Server::builder()
        .handle(&ADD_ONE, |x: u64| async move { Ok(x + 1) })
        .handle(&HANG, |_: u64| std::future::pending::<Result<u64, Status>>())
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 1).await, Ok(2));
    let received = server.counters().messages_received;

    let c = client.clone();
    let task = tokio::spawn(async move { c.call(&HANG, 5).await });
    wait_until(Duration::from_secs(2), "the call to be pending", || client.pending_calls() == 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(client.pending_calls(), 0);
    // The request and then its cancel reach the server.
    wait_until(Duration::from_secs(2), "the cancel to reach the server", || {
        server.counters().messages_received == received + 2
    })
    .await;
    assert_eq!(client.call(&ADD_ONE, 2).await, Ok(3));
    assert_eq!(client.pending_calls(), 0);
    drop(client);
    server.shutdown_within(Duration::from_millis(200)).await;
}

const BLOB: Method<bytes::Bytes, u64> = Method::new("failures", "blob");
const MAKE_BLOB: Method<u64, bytes::Bytes> = Method::new("failures", "make_blob");

/// Requests over the client's frame limit fail with `TooLarge` before anything is sent;
/// replies over the server's limit become `Code::TooLarge` error replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_requests_and_replies() {
    let limits = volley::Limits::default().max_frame_len(1000);
    let server = Server::builder()
        .limits(limits)
        .handle(&BLOB, |b: bytes::Bytes| async move { Ok(b.len() as u64) })
        .handle(&MAKE_BLOB, |n: u64| async move { Ok(bytes::Bytes::from(vec![9u8; n as usize])) })
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let config = volley::ClientConfig::default().limits(limits);
    let client = Client::connect_with(&bound.to_string(), config).await.unwrap();
    let sent_before = client.counters();

    for n in [2000usize, 20_000] {
        match client.call(&BLOB, bytes::Bytes::from(vec![1u8; n])).await {
            Err(Error::TooLarge { len, max }) => {
                assert!(len > n, "{len}");
                assert_eq!(max, 1000);
            }
            other => panic!("{n} bytes: expected TooLarge, got {other:?}"),
        }
        assert_eq!(client.pending_calls(), 0);
    }
    assert_eq!(client.counters().messages_sent, sent_before.messages_sent, "nothing sent");
    assert_eq!(client.call(&BLOB, bytes::Bytes::from(vec![1u8; 500])).await, Ok(500));

    for n in [2000u64, 20_000] {
        match client.call(&MAKE_BLOB, n).await {
            Err(Error::Remote(s)) => assert_eq!(s.code, Code::TooLarge, "{s}"),
            other => panic!("reply of {n}: expected a TooLarge error reply, got {other:?}"),
        }
    }
    assert_eq!(client.call(&MAKE_BLOB, 100).await, Ok(bytes::Bytes::from(vec![9u8; 100])));
    drop(client);
    server.shutdown().await;
}

/// A second server cannot take an address a live one holds; the first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_in_use_is_refused() {
    let unix = unix_address("in-use");
    let inproc = "inproc://failures-in-use";
    let first = numbered_server(1);
    first.listen(&unix).await.unwrap();
    first.listen(inproc).await.unwrap();
    let second = numbered_server(2);
    let r = second.listen(&unix).await;
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");
    let r = second.listen(inproc).await;
    assert!(matches!(r, Err(Error::InvalidAddress { .. })), "{r:?}");
    for addr in [unix.as_str(), inproc] {
        let c = Client::connect(addr).await.unwrap();
        assert_eq!(c.call(&ADD_ONE, 1).await, Ok(2), "{addr}");
    }
    // Once the first is gone, the second may take them.
    first.shutdown().await;
    second.listen(&unix).await.unwrap();
    second.listen(inproc).await.unwrap();
    for addr in [unix.as_str(), inproc] {
        let c = Client::connect(addr).await.unwrap();
        assert_eq!(c.call(&ADD_ONE, 1).await, Ok(3), "{addr}");
    }
    second.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// (g) Reconnection
// ---------------------------------------------------------------------------------------------

fn numbered_server(generation: u64) -> Server {
    Server::builder().handle(&ADD_ONE, move |x: u64| async move { Ok(x + generation) }).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_server_restart_on_same_unix_path() {
    let addr = unix_address("restart");
    let first = numbered_server(1);
    first.listen(&addr).await.unwrap();
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 10).await, Ok(11));

    first.shutdown().await;
    // While nobody listens, calls fail promptly with a connection error.
    let r = tokio::time::timeout(Duration::from_secs(2), client.call(&ADD_ONE, 10))
        .await
        .expect("call to a stopped server hung");
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");

    // The server comes back on the same path: the same client reaches it.
    let second = numbered_server(2);
    second.listen(&addr).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(2), client.call(&ADD_ONE, 10))
        .await
        .expect("call after restart hung");
    assert_eq!(r, Ok(12), "served by the restarted server");
    // Clones share the new connection.
    assert_eq!(client.clone().call(&ADD_ONE, 20).await, Ok(22));

    // And once more, restarting without any call in between.
    second.shutdown().await;
    let third = numbered_server(3);
    third.listen(&addr).await.unwrap();
    // The first call may be the one that finds the old connection dead (it was sent before
    // the client read the server's go-away): then it fails, and the very next call reconnects.
    let r = match client.call(&ADD_ONE, 10).await {
        Err(Error::Connection(_)) => client.call(&ADD_ONE, 10).await,
        other => other,
    };
    assert_eq!(r, Ok(13), "served by the third server");
    drop(client);
    third.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_server_restart_on_same_tcp_port() {
    let first = numbered_server(1);
    let bound = first.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let client = Client::connect(&bound).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 10).await, Ok(11));
    first.shutdown().await;
    let r = client.call(&ADD_ONE, 10).await;
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");

    let second = numbered_server(2);
    second.listen(&bound).await.unwrap();
    assert_eq!(client.call(&ADD_ONE, 10).await, Ok(12));
    drop(client);
    second.shutdown().await;
}
