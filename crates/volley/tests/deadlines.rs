//! Deadlines and cancellation across the wire: a client sends each call's time budget (PROTOCOL
//! §6.2.2) and cancels the calls it drops; the server does not run a request whose budget is
//! spent, drops a handler still running when the budget runs out or its request is cancelled,
//! and a handler's own calls inherit what is left of the budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::{Decoder, Extensions, FrameBuilder, Limits, Message, PREAMBLE};
use volley::{CallOptions, Client, ClientConfig, Code, Error, Method, Server, ServerBuilder};

#[path = "support/old_server.rs"]
mod old_server;
#[path = "support/wait.rs"]
mod wait;
use wait::wait_until;

const ADD_ONE: Method<u64, u64> = Method::new("deadlines", "add_one");
const HANG: Method<u64, u64> = Method::new("deadlines", "hang");
const HOP: Method<u64, u64> = Method::new("deadlines", "hop");
const REMAINING: Method<u64, u64> = Method::new("deadlines", "remaining_ms");

fn address(tag: &str) -> String {
    format!("unix://{}/volley-deadlines-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id())
}

/// The call ran out of time: the client's own timer or the server's answer came first (they
/// race, both at the deadline).
fn ran_out<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::Timeout(_)))
        || matches!(r, Err(Error::Remote(s)) if s.code == Code::DeadlineExceeded)
}

/// Counts when it is dropped: a handler's future holding one was dropped (stopped) or ended.
struct Dropped(Arc<AtomicUsize>);
impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Adds `hang`, which never answers: it counts its runs in `started` and how many of its
/// futures were dropped in `dropped`.
fn with_hang(b: ServerBuilder, started: Arc<AtomicUsize>, dropped: Arc<AtomicUsize>) -> ServerBuilder {
    b.handle(&HANG, move |_: u64| {
        started.fetch_add(1, Ordering::SeqCst);
        let guard = Dropped(dropped.clone());
        async move {
            std::future::pending::<()>().await;
            drop(guard);
            Ok(0)
        }
    })
}

/// A server whose `add_one` counts its runs and whose `hang` never answers (it counts how many
/// of its futures were dropped).
fn counting_server(runs: Arc<AtomicUsize>, dropped: Arc<AtomicUsize>) -> Server {
    let b = Server::builder().handle_fn(&ADD_ONE, move |x: u64| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(x + 1)
    });
    with_hang(b, Arc::default(), dropped).build()
}

/// Sends raw requests for `add_one` with the given budgets (over the frame layer, as another implementation
/// would) and returns the answer to each, by id.
async fn raw_requests(addr: &str, budgets: &[Option<u32>]) -> Vec<(u64, Result<u64, Code>)> {
    raw_requests_to(addr, "add_one", budgets).await
}

async fn raw_requests_to(addr: &str, method: &str, budgets: &[Option<u32>]) -> Vec<(u64, Result<u64, Code>)> {
    let path = addr.strip_prefix("unix://").unwrap();
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    let mut fb = FrameBuilder::new(Limits::default());
    for (i, budget) in budgets.iter().enumerate() {
        let ext = Extensions { deadline_micros: *budget, ..Extensions::NONE };
        fb.request(i as u64 + 1, 0, &ext, ("deadlines", method), |b| volley::Wire::encode(&41u64, b))
            .unwrap();
    }
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    s.write_all(&PREAMBLE).await.unwrap();
    s.write_all(&segs.concat()).await.unwrap();
    let (mut dec, mut buf, mut out) = (Decoder::new(Limits::default()), BytesMut::new(), Vec::new());
    let mut answers = Vec::new();
    while answers.len() < budgets.len() {
        while let Some(frame) = dec.next_frame(&mut buf).unwrap() {
            volley::proto::decode_frame(&frame, &Limits::default(), &mut out).unwrap();
        }
        for m in out.drain(..) {
            match m {
                Message::Reply { id, payload } => {
                    answers.push((id, Ok(<u64 as volley::Wire>::decode(payload).unwrap())))
                }
                Message::Error { id, code, .. } => answers.push((id, Err(code))),
                other => panic!("unexpected {other:?}"),
            }
        }
        if answers.len() < budgets.len() {
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "the server closed the connection");
        }
    }
    answers.sort_by_key(|(id, _)| *id);
    answers
}

#[tokio::test]
async fn a_request_whose_budget_is_spent_is_not_run() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = counting_server(runs.clone(), dropped);
    let addr = server.listen(&address("spent")).await.unwrap().to_string();

    // Budgets: none, spent, a minute, spent.
    let answers = raw_requests(&addr, &[None, Some(0), Some(60_000_000), Some(0)]).await;
    assert_eq!(
        answers,
        vec![(1, Ok(42)), (2, Err(Code::DeadlineExceeded)), (3, Ok(42)), (4, Err(Code::DeadlineExceeded))]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the handler ran for the requests with budget left only");
    assert_eq!(server.expired_requests(), 2);
    server.shutdown().await;
}

/// A long group of slow requests read together outlasts their budget: a synchronous handler
/// stops being called for them once it has passed, and each is still answered once.
#[tokio::test]
async fn a_synchronous_handler_is_not_called_for_requests_that_expired_while_their_group_ran() {
    const SLOW_SYNC: Method<u64, u64> = Method::new("deadlines", "slow_sync");
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let server = Server::builder()
        .handle_fn(&SLOW_SYNC, move |x: u64| {
            counted.fetch_add(1, Ordering::SeqCst);
            // Real blocking work: the point is a handler that holds its thread while the
            // group's budget runs out on the machine's clock.
            std::thread::sleep(Duration::from_millis(10));
            Ok(x + 1)
        })
        .build();
    let addr = server.listen(&address("group")).await.unwrap().to_string();

    // 64 requests of 10 ms each, with 300 ms to live: at least 340 ms of them cannot be run.
    let answers = raw_requests_to(&addr, "slow_sync", &[Some(300_000); 64]).await;
    let ok = answers.iter().filter(|(_, r)| *r == Ok(42)).count();
    let expired = answers.iter().filter(|(_, r)| *r == Err(Code::DeadlineExceeded)).count();
    assert_eq!((ok + expired, answers.len()), (64, 64), "{answers:?}");
    assert!(expired > 0, "ok {ok}, expired {expired}");
    assert_eq!(runs.load(Ordering::SeqCst), ok, "the handler ran for the answered requests only");
    assert_eq!(server.expired_requests(), expired as u64);
    server.shutdown().await;
}

/// A Volley client sends budgets once the server's preamble said it accepts them: a call with
/// a zero timeout then reaches the server as a spent budget, and its handler never runs.
#[tokio::test]
async fn the_client_sends_its_budget_and_a_spent_one_is_not_run() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = counting_server(runs.clone(), dropped);
    let addr = server.listen(&address("client")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    // The first reply comes after the server's preamble: from then on, budgets are sent.
    assert_eq!(client.call(&ADD_ONE, 1).await.unwrap(), 2);

    for _ in 0..5 {
        let r = client.call_with(&ADD_ONE, 1, CallOptions::default().timeout(Duration::ZERO)).await;
        assert!(ran_out(&r), "{r:?}");
    }
    wait_until(Duration::from_secs(20), "5 expired requests", || server.expired_requests() == 5).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the first call ran");

    // Without budgets on the wire, the same calls reach the handler.
    let quiet = Client::connect_with(&addr, ClientConfig::default().send_deadlines(false)).await.unwrap();
    assert_eq!(quiet.call(&ADD_ONE, 1).await.unwrap(), 2);
    // (Its caller may see the reply or its own timeout first: the two race.)
    let _ = quiet.call_with(&ADD_ONE, 1, CallOptions::default().timeout(Duration::ZERO)).await;
    wait_until(Duration::from_secs(20), "the handler's run", || runs.load(Ordering::SeqCst) == 3).await;
    assert_eq!(server.expired_requests(), 5);
    server.shutdown().await;
}

/// When the budget runs out while an async handler waits, the server drops the handler's
/// future (its work stops) and answers `DeadlineExceeded`.
#[tokio::test]
async fn a_handler_still_running_at_the_deadline_is_stopped() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = counting_server(runs, dropped.clone());
    let addr = server.listen(&address("stop")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    client.call(&ADD_ONE, 1).await.unwrap();

    let r = client.call_with(&HANG, 0, CallOptions::default().timeout(Duration::from_millis(200))).await;
    assert!(ran_out(&r), "{r:?}");
    wait_until(Duration::from_secs(20), "the hanging handler to be dropped", || {
        dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    // The server's deadline and the client's own timer (whose Cancel stops the work too) race
    // at the same instant: either way the work ends once, counted once.
    wait_until(Duration::from_secs(20), "the stop to be counted", || {
        server.expired_requests() + server.cancelled_requests() == 1
    })
    .await;
    // Its place is free: the server serves on.
    assert_eq!(client.call(&ADD_ONE, 1).await.unwrap(), 2);
    server.shutdown().await;
}

/// Three hops: the caller's budget reaches the innermost handler, and when the caller gives up,
/// every hop's work stops (each server drops its handler at the deadline it inherited).
#[tokio::test]
async fn three_hops_inherit_the_first_callers_budget() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let inner = counting_server(runs, dropped.clone());
    let inner = {
        // `remaining_ms`: what is left of this request's deadline, as its handler sees it.
        let remaining = Server::builder()
            .handle_fn(&REMAINING, |_: u64| {
                let d = volley::current_deadline().ok_or_else(|| {
                    volley::Status::new(Code::BadRequest, "this request came without a deadline")
                })?;
                Ok(d.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64)
            })
            .build();
        (inner, remaining)
    };
    let hang_addr = inner.0.listen(&address("hop3")).await.unwrap().to_string();
    let remaining_addr = inner.1.listen(&address("hop3r")).await.unwrap().to_string();

    // The middle hop forwards `x` to `hang` (x = 0) or to `remaining_ms` (x = 1).
    let (to_hang, to_remaining) =
        (Client::connect(&hang_addr).await.unwrap(), Client::connect(&remaining_addr).await.unwrap());
    to_hang.call(&ADD_ONE, 1).await.unwrap();
    // The first call on a new connection carries its budget too: it waits for the server's
    // preamble to announce extensions (the handler fails a request that came without).
    let left = to_remaining.call(&REMAINING, 0).await.unwrap();
    assert!(left > 0 && left <= ClientConfig::default().timeout.as_millis() as u64, "{left} ms");
    let middle = Server::builder()
        .handle(&HOP, move |x: u64| {
            let (to_hang, to_remaining) = (to_hang.clone(), to_remaining.clone());
            async move {
                let r = if x == 0 {
                    to_hang.call(&HANG, 0).await
                } else {
                    to_remaining.call(&REMAINING, 0).await
                };
                r.map_err(|e| volley::Status::new(Code::Internal, e.to_string()))
            }
        })
        .build();
    let middle_addr = middle.listen(&address("hop2")).await.unwrap().to_string();

    // The first hop: the test's client calls `middle` through a server of its own.
    let to_middle = Client::connect(&middle_addr).await.unwrap();
    let first = Server::builder()
        .handle(&HOP, move |x: u64| {
            let to_middle = to_middle.clone();
            async move {
                to_middle.call(&HOP, x).await.map_err(|e| volley::Status::new(Code::Internal, e.to_string()))
            }
        })
        .build();
    let first_addr = first.listen(&address("hop1")).await.unwrap().to_string();
    let client = Client::connect(&first_addr).await.unwrap();
    // Every client's own default timeout is 30 s; the innermost handler sees the first
    // caller's 20 s, less what the hops took (also on this first call over the test's client's
    // and the first hop's new connections).
    let left =
        client.call_with(&HOP, 1, CallOptions::default().timeout(Duration::from_secs(20))).await.unwrap();
    assert!(left <= 20_000 && left > 0, "the innermost handler saw {left} ms left");

    // The first caller gives up after 300 ms: the innermost handler is dropped too, long
    // before any hop's own 30 s timeout.
    let r = client.call_with(&HOP, 0, CallOptions::default().timeout(Duration::from_millis(300))).await;
    assert!(r.is_err(), "{r:?}"); // (how it ran out depends on which hop noticed first)
    wait_until(Duration::from_secs(15), "the innermost handler to be dropped", || {
        dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    for s in [&first, &middle, &inner.0, &inner.1] {
        s.shutdown().await;
    }
}

/// A server whose `hop` forwards each request to `next` (a `hop` again, or `hang` when `next`
/// is the innermost server) and counts its handler futures that were dropped.
fn forwarding_server(next: Client, to: &'static Method<u64, u64>, dropped: Arc<AtomicUsize>) -> Server {
    Server::builder()
        .handle(&HOP, move |x: u64| {
            let (next, guard) = (next.clone(), Dropped(dropped.clone()));
            async move {
                let r =
                    next.call(to, x).await.map_err(|e| volley::Status::new(Code::Internal, e.to_string()));
                drop(guard);
                r
            }
        })
        .build()
}

/// Three hops and a caller that drops its call long before any deadline: its Cancel stops the
/// first hop's handler, whose dropped call cancels the second's, whose dropped call cancels
/// the third's. Each server counts one cancelled request and no expired one.
#[tokio::test]
async fn cancelling_the_first_call_cancels_every_hop() {
    let (started, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let inner = with_hang(Server::builder(), started.clone(), dropped.clone()).build();
    let inner_addr = inner.listen(&address("cancel3")).await.unwrap().to_string();
    let middle_dropped = Arc::new(AtomicUsize::new(0));
    let middle =
        forwarding_server(Client::connect(&inner_addr).await.unwrap(), &HANG, middle_dropped.clone());
    let middle_addr = middle.listen(&address("cancel2")).await.unwrap().to_string();
    let first_dropped = Arc::new(AtomicUsize::new(0));
    let first = forwarding_server(Client::connect(&middle_addr).await.unwrap(), &HOP, first_dropped.clone());
    let first_addr = first.listen(&address("cancel1")).await.unwrap().to_string();
    let client = Client::connect(&first_addr).await.unwrap();

    // The call cannot finish (the innermost handler never answers); the caller drops it once
    // the innermost handler runs.
    let call = client.call_with(&HOP, 0, CallOptions::default().timeout(Duration::from_secs(60)));
    tokio::select! {
        r = call => panic!("the call ended: {r:?}"),
        _ = wait_until(Duration::from_secs(20), "the call to reach the innermost server", || {
            started.load(Ordering::SeqCst) == 1
        }) => {}
    }
    for (name, server, dropped) in [
        ("first", &first, &first_dropped),
        ("middle", &middle, &middle_dropped),
        ("innermost", &inner, &dropped),
    ] {
        wait_until(Duration::from_secs(15), &format!("the {name} hop's handler to be dropped"), || {
            dropped.load(Ordering::SeqCst) == 1
        })
        .await;
        wait_until(Duration::from_secs(15), &format!("the {name} hop to count the cancel"), || {
            server.cancelled_requests() == 1
        })
        .await;
        assert_eq!(server.expired_requests(), 0, "the {name} hop saw a deadline, not a cancel");
    }
    for s in [&first, &middle, &inner] {
        s.shutdown().await;
    }
}

/// A server whose preamble announces no features (an older implementation) never receives a
/// request extension, however long the client has been talking to it.
#[tokio::test]
async fn a_server_without_the_extensions_feature_gets_plain_requests() {
    let path = format!("{}/volley-deadlines-old-{}.sock", std::env::temp_dir().display(), std::process::id());
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let old_server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        old_server::answer_without_features(s, 3, 7).await
    });
    let client = Client::connect(&format!("unix://{path}")).await.unwrap();
    for _ in 0..3 {
        let opts = CallOptions::default().timeout(Duration::from_secs(20));
        assert_eq!(client.call_with(&ADD_ONE, 1, opts).await.unwrap(), 7);
    }
    for (flags, ext) in old_server.await.unwrap() {
        assert_eq!(flags & 0x02, 0, "the extensions flag was set");
        assert_eq!(ext, Extensions::NONE);
    }
}

/// A caller that drops its call (it stops waiting) sends `Cancel`; the server drops the
/// handler's work at once, long before the call's 30 s deadline.
#[tokio::test]
async fn a_dropped_call_stops_its_handler() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = counting_server(runs, dropped.clone());
    let addr = server.listen(&address("cancel")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    client.call(&ADD_ONE, 1).await.unwrap();

    let call = client.call_with(&HANG, 0, CallOptions::default().timeout(Duration::from_secs(30)));
    assert!(tokio::time::timeout(Duration::from_millis(100), call).await.is_err(), "the call cannot finish");
    wait_until(Duration::from_secs(10), "the cancelled handler to be dropped", || {
        dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    wait_until(Duration::from_secs(10), "the cancel to be counted", || server.cancelled_requests() == 1)
        .await;
    assert_eq!(server.expired_requests(), 0);
    assert_eq!(client.call(&ADD_ONE, 1).await.unwrap(), 2);
    server.shutdown().await;
}

/// A call that waits for room under the client's in-flight bound waits no longer than its own
/// timeout (and is then never sent).
#[tokio::test]
async fn a_call_waiting_for_room_gives_up_at_its_timeout() {
    let (runs, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = counting_server(runs.clone(), dropped.clone());
    let addr = server.listen(&address("room")).await.unwrap().to_string();
    let client = Client::connect_with(&addr, ClientConfig::default().max_in_flight(1)).await.unwrap();
    let hog = {
        let client = client.clone();
        tokio::spawn(async move {
            client.call_with(&HANG, 0, CallOptions::default().timeout(Duration::from_secs(60))).await
        })
    };
    wait_until(Duration::from_secs(10), "the hanging call to hold the one place", || {
        client.pending_calls() == 1
    })
    .await;

    let t0 = Instant::now();
    let r = client.call_with(&ADD_ONE, 1, CallOptions::default().timeout(Duration::from_millis(200))).await;
    assert_eq!(r, Err(Error::Timeout(Duration::from_millis(200))));
    assert!(t0.elapsed() < Duration::from_secs(20), "waited {:?} for room", t0.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the call that found no room was sent");
    // Dropping the hanging call cancels it, which stops its handler: the server can then
    // shut down gracefully (it waits for running handlers).
    hog.abort();
    wait_until(Duration::from_secs(10), "the cancelled handler to be dropped", || {
        dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    server.shutdown().await;
}
