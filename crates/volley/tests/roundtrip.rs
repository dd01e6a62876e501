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
