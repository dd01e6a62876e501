//! A helper for volley-etcd's tests (not a tool): a process that serves `who` (replies with its
//! name), registers it with a registry under a short lease, prints `ready ADDRESS` and runs
//! until killed. The tests SIGKILL it to check that a dead server's lease lapses.
//!
//! Usage: `volley-etcd-test-server REGISTRY SERVICE NAME TTL_MS`

use std::time::Duration;

use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::{Method, Server};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, registry, service, name, ttl_ms] = &args[..] else {
        eprintln!("usage: volley-etcd-test-server REGISTRY SERVICE NAME TTL_MS");
        std::process::exit(2);
    };
    let who: Method<u64, String> = Method::new(service.clone().leak(), "who");
    let name = name.clone();
    let server = Server::builder()
        .handle(&who, move |_: u64| {
            let n = name.clone();
            async move { Ok(n) }
        })
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.expect("listen").to_string();
    let registry = Registry::connect(registry).await.expect("registry");
    let ttl = Duration::from_millis(ttl_ms.parse().expect("TTL_MS"));
    registry
        .register(
            &server,
            vec![InstanceSpec::new(service.clone(), addr.clone())],
            LeaseConfig::default().ttl(ttl),
        )
        .await
        .expect("register");
    println!("ready {addr}");
    std::future::pending::<()>().await;
}
