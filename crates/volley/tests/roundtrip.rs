//! Round trips on every transport, payload sizes from 0 bytes to 4 MiB.

use bytes::Bytes;
use volley::{Client, Method, Server};

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

fn addresses(tag: &str) -> Vec<String> {
    let dir = std::env::temp_dir();
    vec![
        format!("inproc://roundtrip-{tag}"),
        format!("unix://{}/volley-roundtrip-{tag}-{}.sock", dir.display(), std::process::id()),
        "tcp://127.0.0.1:0".to_string(),
    ]
}

fn pattern(n: usize) -> Bytes {
    (0..n).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_every_size_on_every_transport() {
    for addr in addresses("sizes") {
        let server = Server::builder().handle(&ECHO, |b: Bytes| async move { Ok(b) }).build();
        let bound = server.listen(&addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        for n in [0, 1, 7, 64, 4095, 4096, 16 * 1024 - 1, 16 * 1024, 65_537, 1 << 20, 4 << 20] {
            let payload = pattern(n);
            let reply =
                client.call(&ECHO, payload.clone()).await.unwrap_or_else(|e| panic!("{bound} {n}: {e}"));
            assert_eq!(reply.len(), n, "{bound}");
            assert!(reply == payload, "{bound}: payload of {n} bytes came back changed");
        }
        drop(client);
        server.shutdown().await;
    }
}

/// An inproc client remembers the methods it called (a slot per method, fewer slots than these
/// methods): every one of many methods, called again and again, reaches its own handler.
#[tokio::test]
async fn many_inproc_methods_each_reach_their_own_handler() {
    let methods: Vec<Method<u64, u64>> =
        (0..40).map(|i| Method::new("many", Box::leak(format!("m{i}").into_boxed_str()))).collect();
    let mut builder = Server::builder();
    for (i, m) in methods.iter().enumerate() {
        builder = builder.handle_fn(m, move |x: u64| Ok(x * 100 + i as u64));
    }
    let server = builder.build();
    let addr = server.listen("inproc://roundtrip-many-methods").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    for round in 0..3u64 {
        for (i, m) in methods.iter().enumerate() {
            assert_eq!(client.call(m, round).await.unwrap(), round * 100 + i as u64, "{m:?}");
        }
    }
    server.shutdown().await;
}

/// A call whose types differ from the handler's gets a clear error in process, whether or not
/// the method was called (and remembered) with the right types before; the right types still work.
#[tokio::test]
async fn an_inproc_call_with_other_types_than_the_handlers_fails_clearly() {
    const RIGHT: Method<u64, u64> = Method::new("typed", "double");
    const WRONG: Method<String, String> = Method::new("typed", "double");
    let server = Server::builder().handle_fn(&RIGHT, |x: u64| Ok(2 * x)).build();
    let addr = server.listen("inproc://roundtrip-typed").await.unwrap();
    for right_first in [false, true] {
        let client = Client::connect(&addr.to_string()).await.unwrap();
        if right_first {
            assert_eq!(client.call(&RIGHT, 4).await.unwrap(), 8);
        }
        for _ in 0..2 {
            match client.call(&WRONG, "x".to_string()).await {
                Err(volley::Error::Remote(s)) => {
                    assert_eq!(s.code, volley::Code::BadRequest);
                    assert!(s.message.contains("other request/reply types"), "{s:?}");
                }
                other => panic!("expected a type error, got {other:?}"),
            }
        }
        assert_eq!(client.call(&RIGHT, 5).await.unwrap(), 10);
    }
    server.shutdown().await;
}

/// Inproc calls to a synchronous handler never wait, yet a task looping on them still yields
/// to the runtime: on one thread, a task spawned beside the loop runs long before the loop
/// would end on its own.
#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_inproc_calls_that_never_wait_yields_to_other_tasks() {
    const DOUBLE: Method<u64, u64> = Method::new("loop", "double");
    let server = Server::builder().handle_fn(&DOUBLE, |x: u64| Ok(2 * x)).build();
    let addr = server.listen("inproc://roundtrip-loop-yields").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    let other_ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = other_ran.clone();
    tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::Relaxed) });
    const LIMIT: u64 = 1_000_000;
    let mut calls = 0;
    while calls < LIMIT && !other_ran.load(std::sync::atomic::Ordering::Relaxed) {
        assert_eq!(client.call(&DOUBLE, calls).await.unwrap(), 2 * calls);
        calls += 1;
    }
    assert!(
        other_ran.load(std::sync::atomic::Ordering::Relaxed),
        "the spawned task never ran in {LIMIT} calls"
    );
    assert!(calls < 100_000, "the loop yielded only after {calls} calls");
    server.shutdown().await;
}

/// The same method names at other addresses (a `const` method used from several codegen units
/// has them) reach the same handler through an inproc client's method cache, and other types
/// under those names still get the clear error.
#[tokio::test]
async fn an_inproc_method_named_by_text_at_another_address_is_the_same_method() {
    const TRIPLE: Method<u64, u64> = Method::new("copies", "triple");
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let copy: Method<u64, u64> = Method::new(leak("copies"), leak("triple"));
    let wrong: Method<String, String> = Method::new(leak("copies"), leak("triple"));
    let server = Server::builder().handle_fn(&TRIPLE, |x: u64| Ok(3 * x)).build();
    let addr = server.listen("inproc://roundtrip-copies").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    for i in 0..4u64 {
        assert_eq!(client.call(&TRIPLE, i).await.unwrap(), 3 * i);
        assert_eq!(client.call(&copy, i).await.unwrap(), 3 * i);
        match client.call(&wrong, "x".to_string()).await {
            Err(volley::Error::Remote(s)) => assert_eq!(s.code, volley::Code::BadRequest, "{s:?}"),
            other => panic!("expected a type error, got {other:?}"),
        }
    }
    server.shutdown().await;
}
