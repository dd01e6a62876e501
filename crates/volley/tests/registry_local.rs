//! Same-host addresses in the registry (docs/PROTOCOL.md §16.1, §16.2): a server registers a
//! tcp address and a shm address beside it; a `ServiceClient` that prefers them, on the same
//! host, connects over shm, and over tcp otherwise — without the preference, to an instance on
//! another host, or when the shm address cannot be opened. Registrations of the revision
//! before (one address) still work, and a client of that revision still gets an address it can
//! use. Which transport served a call is read on the server's side (the peer its handler saw)
//! and on the client's (its counters and the connection it holds).
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use volley::bytes::Bytes;
use volley::codec::Json;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::wire::{self, Instance};
use volley::discovery::{InstanceSpec, host_id};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::ServiceConfig;
use volley::{CallOptions, Client, Code, Error, Method, Server, ServiceClient, Wire, current_peer};

/// Answers with the peer the server saw: `tcp://…` for a tcp connection, `shm peer …` for a
/// shared-memory one.
const PEER: Method<(), String> = Method::new("where", "peer");

fn shm(tag: &str) -> String {
    format!("shm://volley-registry-local-{tag}-{}", std::process::id())
}

async fn controller(tag: &str) -> (Controller, Registry) {
    let c = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let addr = c.listen(&format!("inproc://registry-local-{tag}")).await.unwrap();
    let registry = Registry::connect(&addr.to_string()).await.unwrap();
    (c, registry)
}

fn server() -> Server {
    Server::builder()
        .handle_fn(&PEER, |()| Ok(current_peer().map(|p| p.to_string()).unwrap_or_default()))
        .build()
}

fn client(registry: &Registry, prefer_local: bool) -> ServiceClient {
    ServiceClient::with_registry(registry.clone(), ServiceConfig::default().prefer_local(prefer_local))
}

/// Calls `n` times: every call must succeed and be served over the transport whose peers start
/// with `peer` (`tcp://` or `shm peer`). Returns the client's (local connections, local
/// failures).
async fn served_over(client: &ServiceClient, n: usize, peer: &str) -> (u64, u64) {
    for _ in 0..n {
        let seen = client.call(&PEER, ()).await.expect("the call succeeds");
        assert!(seen.starts_with(peer), "served by {seen}, not over {peer}");
    }
    let stats = client.stats();
    (stats.local_connections, stats.local_failures)
}

async fn stop(client: ServiceClient, server: Server, controller: Controller) {
    drop(client);
    server.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_registration_with_a_shm_address_beside_tcp_resolves_to_both() {
    let (controller, registry) = controller("resolve").await;
    let server = server();
    let local = shm("resolve");
    let (tcp, registration) =
        server.listen_and_register_with("tcp://127.0.0.1:0", &[&local], &registry).await.unwrap();
    assert_eq!(registration.instance_ids().len(), 1, "one service, one instance, two addresses");
    let resolved = registry.resolve("where").await.unwrap();
    let [i] = &resolved.instances[..] else { panic!("one instance: {resolved:?}") };
    assert_eq!(i.address, tcp.to_string());
    assert!(i.address.starts_with("tcp://127.0.0.1:"), "{}", i.address);
    assert_eq!(i.local_addresses, std::slice::from_ref(&local));
    assert_eq!(Some(i.host_id.as_str()), host_id());
    let listed: Vec<String> = server.addresses().iter().map(|a| a.to_string()).collect();
    assert_eq!(listed, [tcp.to_string(), local], "the server listens on both");
    server.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn with_prefer_local_a_client_on_the_same_host_connects_over_shm() {
    let (controller, registry) = controller("prefer").await;
    let server = server();
    let local = shm("prefer");
    server.listen_and_register_with("tcp://127.0.0.1:0", &[&local], &registry).await.unwrap();
    let client = client(&registry, true);
    assert_eq!(served_over(&client, 5, "shm peer").await, (1, 0), "one shm connection for 5 calls");
    assert_eq!(client.instance_stats("where")[0].connected_to.as_deref(), Some(local.as_str()));
    stop(client, server, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn without_the_preference_the_client_connects_over_tcp() {
    let (controller, registry) = controller("default").await;
    let server = server();
    let (tcp, _) =
        server.listen_and_register_with("tcp://127.0.0.1:0", &[&shm("default")], &registry).await.unwrap();
    let client = client(&registry, false);
    assert_eq!(served_over(&client, 5, "tcp://127.0.0.1:").await, (0, 0));
    assert_eq!(client.instance_stats("where")[0].connected_to, Some(tcp.to_string()));
    stop(client, server, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_instance_registered_from_another_host_is_reached_at_its_address() {
    let (controller, registry) = controller("other-host").await;
    let server = server();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    // The shm address works here, but the instance says it runs elsewhere: a caller cannot
    // know that a name there is the same socket here, so it must not try it.
    let local = server.listen(&shm("other-host")).await.unwrap().to_string();
    let spec = InstanceSpec::new("where", &tcp).host_id("another-host").local_address(&local);
    assert_eq!(spec.host_id, "another-host", "an explicit host id is kept");
    registry.register(&server, vec![spec], LeaseConfig::default()).await.unwrap();
    let client = client(&registry, true);
    assert_eq!(served_over(&client, 3, "tcp://").await, (0, 0), "the shm address was not tried");
    stop(client, server, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_shm_address_that_cannot_be_opened_falls_back_to_tcp_and_calls_succeed() {
    let (controller, registry) = controller("fallback").await;
    let server = server();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    // Advertised, but nothing listens there.
    let spec = InstanceSpec::new("where", &tcp).local_address(shm("fallback-nobody"));
    registry.register(&server, vec![spec], LeaseConfig::default()).await.unwrap();
    let client = client(&registry, true);
    assert_eq!(served_over(&client, 5, "tcp://").await, (0, 1), "tried once, for the one connection made");
    assert_eq!(client.stats().instances_dropped, 0, "the instance answers at its address: it stays in");
    assert_eq!(client.instance_stats("where")[0].connected_to, Some(tcp));
    stop(client, server, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn when_the_shm_connection_dies_the_next_one_falls_back_to_tcp() {
    let (controller, registry) = controller("shm-dies").await;
    // The shm side of the instance is a server of its own, so it can go away alone.
    let (tcp_server, shm_server) = (server(), server());
    let tcp = tcp_server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let local = shm_server.listen(&shm("shm-dies")).await.unwrap().to_string();
    let spec = InstanceSpec::new("where", &tcp).local_address(&local);
    registry.register(&tcp_server, vec![spec], LeaseConfig::default()).await.unwrap();
    let client = client(&registry, true);
    assert_eq!(served_over(&client, 1, "shm peer").await, (1, 0));
    shm_server.shutdown().await;
    // Calls that meet the closing connection may fail (they are not idempotent); once the
    // client has seen it close, the next connection goes to tcp.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let peer = loop {
        match client.call(&PEER, ()).await {
            Ok(p) if p.starts_with("tcp://") => break p,
            _ if tokio::time::Instant::now() < deadline => tokio::task::yield_now().await,
            other => panic!("no call reached tcp within 30 s: {other:?}"),
        }
    };
    assert!(peer.starts_with("tcp://"));
    let stats = client.stats();
    assert_eq!(stats.local_connections, 1);
    assert!(stats.local_failures >= 1, "{stats:?}");
    stop(client, tcp_server, controller).await;
}

/// The shortest register request of the revision before same-host addresses.
const OLD_REGISTER: &str = r#"{"instances":[{"service":"where","address":"ADDR"}]}"#;

#[tokio::test(flavor = "current_thread")]
async fn an_old_style_registration_is_accepted_listed_as_before_and_called_at_its_address() {
    let (controller, registry) = controller("old-server").await;
    let server = server();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let raw = Client::connect("inproc://registry-local-old-server").await.unwrap();
    let payload = Bytes::from(OLD_REGISTER.replace("ADDR", &tcp));
    raw.call_raw(wire::SERVICE, "register", payload, CallOptions::default()).await.unwrap();
    // Listed byte for byte as before: no field of the later revision appears.
    let resolved =
        raw.call_raw(wire::SERVICE, "resolve", Bytes::from_static(b"where"), CallOptions::default());
    let text = String::from_utf8(resolved.await.unwrap().to_vec()).unwrap();
    assert!(text.contains(&format!(r#""address":"{tcp}","weight":1,"metadata":{{}}}}]"#)), "{text}");
    assert!(!text.contains("host_id") && !text.contains("local_addresses"), "{text}");
    let client = client(&registry, true);
    assert_eq!(served_over(&client, 3, "tcp://").await, (0, 0), "nothing to try");
    stop(client, server, controller).await;
}

/// `Instance` and `Resolved` as a client of the revision before same-host addresses reads them
/// (serde ignores the fields it does not know, as §16.2 requires of every receiver).
#[derive(Serialize, Deserialize)]
struct OldInstance {
    id: u64,
    lease: u64,
    service: String,
    address: String,
    weight: u32,
    metadata: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct OldResolved {
    service: String,
    epoch: u64,
    revision: u64,
    known: bool,
    settling: bool,
    instances: Vec<OldInstance>,
}

#[tokio::test(flavor = "current_thread")]
async fn an_old_client_reads_a_registration_with_a_shm_address_and_calls_its_tcp_address() {
    let (controller, registry) = controller("old-client").await;
    let server = server();
    server.listen_and_register_with("tcp://127.0.0.1:0", &[&shm("old-client")], &registry).await.unwrap();
    let raw = Client::connect("inproc://registry-local-old-client").await.unwrap();
    let reply = raw.call_raw(wire::SERVICE, "resolve", Bytes::from_static(b"where"), CallOptions::default());
    let Json(resolved) = Json::<OldResolved>::decode(reply.await.unwrap()).unwrap();
    let [i] = &resolved.instances[..] else { panic!("one instance") };
    assert!(i.address.starts_with("tcp://"), "{}", i.address);
    let direct = Client::connect(&i.address).await.unwrap();
    assert!(direct.call(&PEER, ()).await.unwrap().starts_with("tcp://"));
    server.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn bad_same_host_addresses_are_refused_with_a_clear_error() {
    let (controller, registry) = controller("refused").await;
    let server = server();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    // Caught before asking the controller: no host id, an address that does not parse, inproc.
    for (spec, says) in [
        (InstanceSpec { local_addresses: vec![shm("x")], ..InstanceSpec::new("where", &tcp) }, "host id"),
        (InstanceSpec::new("where", &tcp).local_address("shm://a b"), "shm://a b"),
        (InstanceSpec::new("where", &tcp).local_address("inproc://x"), "inproc"),
    ] {
        match registry.register(&server, vec![spec], LeaseConfig::default()).await {
            Err(Error::Usage(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected a usage error naming {says}, got {:?}", other.map(|r| r.lease())),
        }
    }
    // A peer that skips those checks is answered BadRequest by the controller.
    let raw = Client::connect("inproc://registry-local-refused").await.unwrap();
    let no_host =
        format!(r#"{{"instances":[{{"service":"where","address":"{tcp}","local_addresses":["shm://x"]}}]}}"#);
    let too_many: Vec<String> = (0..=wire::MAX_LOCAL_ADDRESSES).map(|k| format!("\"shm://x{k}\"")).collect();
    let too_many = format!(
        r#"{{"instances":[{{"service":"where","address":"{tcp}","host_id":"h","local_addresses":[{}]}}]}}"#,
        too_many.join(",")
    );
    for (payload, says) in [(no_host, "host_id"), (too_many, "at most 8")] {
        match raw.call_raw(wire::SERVICE, "register", Bytes::from(payload), CallOptions::default()).await {
            Err(Error::Remote(s)) => {
                assert_eq!(s.code, Code::BadRequest);
                assert!(s.message.contains(says), "{}", s.message);
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }
    assert!(registry.resolve("where").await.unwrap().instances.is_empty(), "nothing was registered");
    server.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_local_address_added_to_a_spec_carries_this_hosts_id() {
    let spec = InstanceSpec::new("s", "tcp://10.0.0.5:7000").local_address("shm://s");
    assert_eq!(Some(spec.host_id.as_str()), host_id());
    let i: Instance = spec.instance(3, 4);
    assert_eq!((i.id, i.lease, i.local_addresses), (3, 4, vec!["shm://s".to_string()]));
}
