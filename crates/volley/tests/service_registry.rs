//! Generated clients over a `ServiceClient`: key routing, scatter-gather, batches and streams
//! spread over a service's instances; and servers that listen and register in one call.
//! Every test uses its own controller at its own address.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures_util::StreamExt;
use volley::balance::{HashRing, hash_key};
use volley::controller::{Controller, ControllerConfig};
use volley::registry::Registry;
use volley::service_client::ServiceConfig;
use volley::{BatchOptions, Error, Server, ServiceClient, Status};

/// One shard of a sharded service: it knows its own name.
#[volley::service]
pub trait Shard {
    /// The name of the shard that answered.
    #[sync]
    fn who(&self) -> Result<String, Status>;
    /// `x + 1`, answered by whichever shard the call reached.
    async fn next(&self, x: u64) -> Result<u64, Status>;
}

/// A second service, so that a server offers two.
#[volley::service]
pub trait Health {
    #[sync]
    fn ok(&self) -> Result<bool, Status>;
}

struct Named(String);

impl Shard for Named {
    fn who(&self) -> Result<String, Status> {
        Ok(self.0.clone())
    }
    async fn next(&self, x: u64) -> Result<u64, Status> {
        Ok(x + 1)
    }
}

impl Health for Named {
    fn ok(&self) -> Result<bool, Status> {
        Ok(true)
    }
}

#[path = "support/wait.rs"]
mod wait;
use wait::wait_for;

async fn controller(tag: &str) -> (Controller, Registry) {
    let c = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let addr = c.listen(&format!("inproc://service-registry-{tag}")).await.unwrap();
    let registry = Registry::connect(&addr.to_string()).await.unwrap();
    (c, registry)
}

/// `n` shards named `s0`..., each listening and registered with one call.
async fn shards(registry: &Registry, tag: &str, n: usize) -> Vec<Server> {
    let mut servers = Vec::new();
    for i in 0..n {
        let server = Server::builder().serve(ShardServer::new(Named(format!("s{i}")))).build();
        let (addr, registration) =
            server.listen_and_register(&format!("inproc://service-{tag}-{i}"), registry).await.unwrap();
        assert_eq!(addr.to_string(), format!("inproc://service-{tag}-{i}"));
        assert_eq!(registration.instance_ids().len(), 1, "one service, one instance");
        servers.push(server);
    }
    servers
}

async fn stop(servers: Vec<Server>, controller: Controller) {
    for s in servers {
        s.shutdown().await;
    }
    controller.shutdown().await;
}

fn client(registry: &Registry) -> ShardClient<ServiceClient> {
    ShardClient::new(ServiceClient::with_registry(registry.clone(), ServiceConfig::default()))
}

#[tokio::test(flavor = "current_thread")]
async fn keyed_calls_reach_the_shard_that_owns_the_key_on_the_ring() {
    let (controller, registry) = controller("keyed").await;
    let servers = shards(&registry, "keyed", 4).await;
    let shard = client(&registry);

    let instances = shard.inner().instances(ShardMethods::SERVICE).await.unwrap();
    let ring = HashRing::new(instances.iter().map(|i| (i.address.as_str(), i.weight)));
    let mut owners = BTreeSet::new();
    for key in 0..200u64 {
        let owner = &instances[ring.node(hash_key(&key)).unwrap()].address;
        let expected = format!("s{}", owner.rsplit('-').next().unwrap());
        let who = shard.who_keyed(&key).await.unwrap();
        assert_eq!(who, expected, "key {key} went to {who}, but {owner} owns it");
        assert_eq!(shard.who_keyed(&key).await.unwrap(), who, "key {key} moved between calls");
        owners.insert(who);
        // A keyed call with a request value.
        assert_eq!(shard.next_keyed(&key, key).await.unwrap(), key + 1);
    }
    assert_eq!(owners.len(), 4, "200 keys should reach every one of 4 shards: {owners:?}");
    stop(servers, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn scatter_gathers_one_answer_from_every_shard() {
    let (controller, registry) = controller("scatter").await;
    let servers = shards(&registry, "scatter", 3).await;
    let shard = client(&registry);

    let gathered = shard.who_scatter().await.unwrap();
    let mut names: Vec<String> = gathered.into_iter().map(|g| g.result.unwrap()).collect();
    names.sort();
    assert_eq!(names, ["s0", "s1", "s2"]);
    let nexts = shard.next_scatter(41).await.unwrap();
    assert_eq!(nexts.len(), 3);
    assert!(nexts.iter().all(|g| matches!(g.result, Ok(42))), "{nexts:?}");
    stop(servers, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn batches_and_streams_through_the_registry_spread_over_instances_in_order() {
    let (controller, registry) = controller("spread").await;
    let servers = shards(&registry, "spread", 3).await;
    let shard = client(&registry);

    let results = shard.next_batch_with(0..1_000u64, BatchOptions::default().chunk_size(50)).await;
    let values: Vec<u64> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(values, (1..=1_000).collect::<Vec<_>>());

    let opts = BatchOptions::default().chunk_size(16).window(3);
    let streamed: Vec<u64> = shard.next_stream(0..5_000u64, opts).map(Result::unwrap).collect().await;
    assert_eq!(streamed, (1..=5_000).collect::<Vec<_>>(), "the stream keeps input order");

    // Chunks of `who` are balanced round-robin: more than one shard answers.
    let whos = shard.who_batch_with(std::iter::repeat_n((), 64), BatchOptions::default().chunk_size(8)).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for w in whos {
        *counts.entry(w.unwrap()).or_default() += 1;
    }
    assert!(counts.len() > 1, "every chunk went to one shard: {counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 64);
    stop(servers, controller).await;
}

#[tokio::test(flavor = "current_thread")]
async fn listen_and_register_registers_every_service_and_shutdown_removes_them() {
    let (controller, registry) = controller("both").await;
    let server = Server::builder()
        .serve(ShardServer::new(Named("both".into())))
        .serve(HealthServer::new(Named("both".into())))
        .build();
    assert_eq!(server.services(), ["health", "shard"]);
    let addr = "inproc://service-registry-both-server";
    let (bound, registration) = server.listen_and_register(addr, &registry).await.unwrap();
    assert_eq!(registration.instance_ids().len(), 2);
    for service in [ShardMethods::SERVICE, HealthMethods::SERVICE] {
        let resolved = registry.resolve(service).await.unwrap();
        let listed: Vec<&str> = resolved.instances.iter().map(|i| i.address.as_str()).collect();
        assert_eq!(listed, [bound.to_string()], "{service}");
    }
    let health = HealthClient::new(ServiceClient::with_registry(registry.clone(), ServiceConfig::default()));
    assert!(health.ok().await.unwrap());

    server.shutdown().await;
    // Shutdown revokes the lease (and waits for it): the registry lists nothing at once.
    wait_for(Duration::from_secs(10), "the instance to be unlisted after shutdown", async || {
        registry.resolve(ShardMethods::SERVICE).await.unwrap().instances.is_empty()
    })
    .await;
    assert!(registry.resolve(HealthMethods::SERVICE).await.unwrap().instances.is_empty());
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn listen_and_register_refuses_a_server_without_handlers() {
    let (controller, registry) = controller("empty").await;
    let server = Server::builder().build();
    match server.listen_and_register("inproc://service-registry-empty-server", &registry).await {
        Err(Error::Usage(m)) => assert!(m.contains("no handlers"), "{m}"),
        Err(other) => panic!("expected a usage error, got {other:?}"),
        Ok((addr, _)) => panic!("registered {addr} without a handler"),
    }
    assert!(server.addresses().is_empty(), "nothing was bound");
    controller.shutdown().await;
}
