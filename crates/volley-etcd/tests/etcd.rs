//! The registry on a real etcd: several controllers over one etcd acting as one registry,
//! leases that lapse in etcd, controller failover, etcd going down and coming back, client ids
//! unique across controllers and restarts, compaction. Each test starts its own etcd
//! (tests/common), so each is ignored unless the run asks for ignored tests: `scripts/test`
//! installs etcd and runs them all (`cargo test -- --include-ignored`). Asked for without etcd,
//! they fail naming the fix; they never pass without it. The `harness` module at the end
//! checks that.

mod common;

use std::collections::HashSet;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Etcd, wait_for};
use volley::controller::{Controller, ControllerConfig, Store};
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registration, Registry};
use volley::service_client::{Mode, ServiceConfig};
use volley::{Method, Server, ServiceClient};
use volley_etcd::{EtcdConfig, EtcdStore, pb};

const SERVICE: &str = "etcd-test";
/// Replies with the name of the instance that answered.
const WHO: Method<u64, String> = Method::new(SERVICE, "who");

/// Generous: the machine running the tests may be busy. Waits end as soon as their condition
/// holds, so they cost nothing when things work.
const PATIENCE: Duration = Duration::from_secs(30);

fn short_lease() -> LeaseConfig {
    // etcd counts whole seconds and raises very short leases to its minimum (about 2 s). A
    // first registration may take up to the ttl, a renewal up to `renew_every` (an etcd write
    // on a busy machine can be slow), so neither is very short.
    LeaseConfig::default()
        .ttl(Duration::from_secs(3))
        .renew_every(Some(Duration::from_secs(1)))
        .retry_every(Some(Duration::from_millis(100)))
}

async fn store(etcd: &Etcd, prefix: &str) -> EtcdStore {
    let config = EtcdConfig { id_block: 4, ..EtcdConfig::parse(&etcd.url(prefix)).unwrap() };
    EtcdStore::connect(config).await.unwrap()
}

/// A controller over etcd, listening on a free TCP port.
async fn controller(etcd: &Etcd, prefix: &str) -> (Controller, String) {
    let c = Controller::with_store(Arc::new(store(etcd, prefix).await), ControllerConfig::default());
    let addr = c.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    (c, addr)
}

fn service_config() -> ServiceConfig {
    ServiceConfig::default()
        .mode(Mode::Direct)
        .watch_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(100))
}

/// An instance of `SERVICE` named `name`, registered through `registry`.
async fn instance(registry: &Registry, name: &str) -> (Server, String, Registration) {
    let n = name.to_string();
    let server = Server::builder()
        .handle(&WHO, move |_: u64| {
            let n = n.clone();
            async move { Ok(n) }
        })
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let reg = registry
        .register(&server, vec![InstanceSpec::new(SERVICE, addr.clone())], short_lease())
        .await
        .unwrap();
    (server, addr, reg)
}

async fn resolved(registry: &Registry) -> HashSet<String> {
    match registry.resolve(SERVICE).await {
        Ok(r) => r.instances.into_iter().map(|i| i.address).collect(),
        Err(_) => HashSet::new(),
    }
}

fn cached(client: &ServiceClient) -> HashSet<String> {
    client.cached_instances(SERVICE).unwrap_or_default().into_iter().map(|i| i.address).collect()
}

fn set(items: &[&String]) -> HashSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn a_registration_through_controller_a_is_seen_through_b_and_its_removal_is_pushed() {
    let etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "visible").await;
    let (b, b_addr) = controller(&etcd, "visible").await;
    assert_eq!(a.epoch(), b.epoch(), "controllers over one etcd prefix share an epoch");
    let via_a = Registry::connect(&a_addr).await.unwrap();
    let via_b = Registry::connect(&b_addr).await.unwrap();

    let (s1, s1_addr, _r1) = instance(&via_a, "i1").await;
    let (s2, s2_addr, _r2) = instance(&via_a, "i2").await;
    // Through B: a look-up, and a client (whose first look-up and watch go to B).
    wait_for(PATIENCE, "B to list both instances", async || {
        resolved(&via_b).await == set(&[&s1_addr, &s2_addr])
    })
    .await;
    let client = ServiceClient::connect_with(&b_addr, service_config()).await.unwrap();
    let mut answered = HashSet::new();
    for _ in 0..20 {
        answered.insert(client.call(&WHO, 0).await.unwrap());
    }
    assert_eq!(answered, HashSet::from(["i1".to_string(), "i2".to_string()]));

    // i1 shuts down: it deregisters through A; B's watch pushes the removal to the client.
    s1.shutdown().await;
    wait_for(PATIENCE, "the client (watching B) to drop i1", async || cached(&client) == set(&[&s2_addr]))
        .await;
    assert_eq!(client.stats().lookups, 1, "the removal came by watch, not by another look-up");
    assert_eq!(resolved(&via_b).await, set(&[&s2_addr]));
    for _ in 0..10 {
        assert_eq!(client.call(&WHO, 0).await.unwrap(), "i2");
    }
    // Both controllers list the same thing, at the same revision.
    let (la, lb) = (via_a.resolve(SERVICE).await.unwrap(), via_b.resolve(SERVICE).await.unwrap());
    assert_eq!((la.revision, la.instances), (lb.revision, lb.instances));
    s2.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A child process that does not outlive a failed test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn a_server_whose_process_is_killed_disappears_when_its_lease_lapses() {
    let etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "killed").await;
    let registry = Registry::connect(&a_addr).await.unwrap();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_volley-etcd-test-server"))
            .args([&a_addr, SERVICE, "child", "3000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let child_addr =
        line.trim().strip_prefix("ready ").unwrap_or_else(|| panic!("child said {line:?}")).to_string();
    let listed = resolved(&registry).await;
    assert_eq!(listed, set(&[&child_addr]), "the child registered");
    let client = ServiceClient::connect_with(&a_addr, service_config()).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "child");

    // SIGKILL: no deregistration, no more renewals. The lease (3 s) lapses in etcd, etcd
    // deletes the key, the watch tells the controller.
    child.0.kill().unwrap();
    let killed = Instant::now();
    child.0.wait().unwrap();
    wait_for(PATIENCE, "the killed server to disappear", async || resolved(&registry).await.is_empty()).await;
    let gone_after = killed.elapsed();
    // It went because its lease ran out, not at once: the last renewal (every second) left at
    // least about 2 s.
    assert!(gone_after >= Duration::from_secs(1), "gone after {gone_after:?}: before its lease could lapse");
    let r = registry.resolve(SERVICE).await.unwrap();
    assert!(r.known && r.instances.is_empty());
    a.shutdown().await;
}

/// A stray registration takes a live server's address under a lease it never renews: the
/// store says at the server's next renewal that its lease lost the instance (through the claim
/// key the instance key no longer sits beside), the server registers again, and once the stray
/// lease has lapsed the address is still listed, under the server's lease, and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn an_address_taken_by_a_stray_lease_comes_back_to_its_server_when_the_stray_lapses() {
    use volley::discovery::wire::{REGISTER, RegisterRequest};
    let etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "stray").await;
    let registry = Registry::connect(&a_addr).await.unwrap();
    let (server, addr, reg) = instance(&registry, "real").await;
    let store = store(&etcd, "stray").await;
    assert!(store.renew(reg.lease()).await.unwrap().intact);

    let raw = volley::Client::connect(&a_addr).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 2_000,
        instances: vec![InstanceSpec::new(SERVICE, addr.clone())],
        credential: String::new(),
    };
    let stray = raw.call(&REGISTER, req).await.unwrap().lease;
    let listed_under = async || {
        let r = registry.resolve(SERVICE).await.unwrap();
        r.instances.iter().map(|i| (i.address.clone(), i.lease)).collect::<Vec<_>>()
    };
    // The server's renewal (every second) finds the claim without its key and registers again.
    wait_for(PATIENCE, "the server to take its address back", async || {
        let now = listed_under().await;
        reg.registrations() >= 2 && now == [(addr.clone(), reg.lease())]
    })
    .await;
    // The stray lease lapses (etcd's minimum lease time) holding nothing.
    let stray_alive = async || {
        let req = pb::LeaseTimeToLiveRequest { id: stray as i64, keys: false };
        let r = pb::lease_client::LeaseClient::new(store.channel()).lease_time_to_live(req).await.unwrap();
        r.into_inner().ttl > 0
    };
    wait_for(PATIENCE, "the stray lease to lapse", async || !stray_alive().await).await;
    assert_eq!(listed_under().await, [(addr.clone(), reg.lease())]);
    assert!(store.renew(reg.lease()).await.unwrap().intact, "the server's new lease holds its instance");
    let client = ServiceClient::connect_with(&a_addr, service_config()).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "real");
    assert_eq!(reg.registrations(), 2, "registered again exactly once");
    server.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn killing_controller_a_moves_clients_and_servers_to_b_and_calls_go_on() {
    let etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "failover").await;
    let (b, b_addr) = controller(&etcd, "failover").await;
    let both = format!("{a_addr},{b_addr}");
    let registry = Registry::connect(&both).await.unwrap();
    assert_eq!(registry.current_controller(), a_addr);
    let (s1, s1_addr, r1) = instance(&registry, "i1").await;
    let client = ServiceClient::connect_with(&both, service_config()).await.unwrap();
    assert_eq!(client.registry().current_controller(), a_addr);
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "i1");

    a.shutdown().await;
    // Calls go on (direct mode: to the instance), before and after the failover.
    for i in 0..50 {
        assert_eq!(client.call(&WHO, i).await.unwrap(), "i1", "call {i} after A went");
    }
    // The server's renewals move to B, which knows the lease (it lives in etcd): no second
    // registration is needed.
    let renewals = r1.renewals();
    wait_for(PATIENCE, "renewals through B", async || {
        registry.current_controller() == b_addr && r1.renewals() > renewals + 2
    })
    .await;
    assert_eq!(r1.registrations(), 1, "the lease survived the controller");
    assert!(registry.stats().failovers >= 1);

    // A server that registers now (through B) reaches the client through B.
    let via_b = Registry::connect(&b_addr).await.unwrap();
    let (s2, s2_addr, _r2) = instance(&via_b, "i2").await;
    wait_for(PATIENCE, "the client to learn of i2 through B", async || {
        cached(&client) == set(&[&s1_addr, &s2_addr])
    })
    .await;
    assert_eq!(client.registry().current_controller(), b_addr);
    assert!(client.registry().stats().failovers >= 1);
    let mut answered = HashSet::new();
    for _ in 0..20 {
        answered.insert(client.call(&WHO, 0).await.unwrap());
    }
    assert_eq!(answered, HashSet::from(["i1".to_string(), "i2".to_string()]));
    // New clients given the list start on B.
    let late = ServiceClient::connect_with(&both, service_config()).await.unwrap();
    assert_eq!(late.registry().current_controller(), b_addr);
    assert!(late.call(&WHO, 0).await.is_ok());
    s1.shutdown().await;
    s2.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn with_etcd_down_clients_call_from_the_cache_and_when_it_is_back_the_state_converges() {
    let mut etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "outage").await;
    let registry = Registry::connect(&a_addr).await.unwrap();
    let (s1, s1_addr, _r1) = instance(&registry, "i1").await;
    let (s2, s2_addr, _r2) = instance(&registry, "i2").await;
    let client = ServiceClient::connect_with(&a_addr, service_config()).await.unwrap();
    wait_for(PATIENCE, "the client to see both", async || {
        let _ = client.call(&WHO, 0).await;
        cached(&client) == set(&[&s1_addr, &s2_addr])
    })
    .await;
    assert!(a.stats().store.reachable);

    etcd.stop();
    wait_for(PATIENCE, "the controller to notice", async || !a.stats().store.reachable).await;
    assert!(a.stats().store.outages >= 1);
    // Calls go on from the cache, to both instances; the controller still answers look-ups
    // from its last good state.
    let mut answered = HashSet::new();
    for i in 0..40 {
        answered
            .insert(client.call(&WHO, i).await.unwrap_or_else(|e| panic!("call {i} with etcd down: {e}")));
    }
    assert_eq!(answered, HashSet::from(["i1".to_string(), "i2".to_string()]));
    assert_eq!(resolved(&registry).await, set(&[&s1_addr, &s2_addr]));
    // Registrations fail while etcd is away.
    let lone = Server::builder().build();
    let lone_addr = lone.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let spec = vec![InstanceSpec::new(SERVICE, lone_addr)];
    assert!(registry.register(&lone, spec, short_lease()).await.is_err(), "registered with etcd down");
    // i2 goes away while etcd cannot hear of it: its deregistration fails, so its lease has
    // to lapse once etcd is back.
    s2.shutdown().await;

    etcd.restart().await;
    wait_for(PATIENCE, "the controller to reconnect", async || a.stats().store.reachable).await;
    let (s3, s3_addr, _r3) = instance(&registry, "i3").await;
    // Converged: i2's lease lapsed, i3 arrived; the client, the controller and a fresh
    // controller reading etcd from scratch all agree.
    wait_for(PATIENCE, "the client to converge", async || cached(&client) == set(&[&s1_addr, &s3_addr]))
        .await;
    assert_eq!(resolved(&registry).await, set(&[&s1_addr, &s3_addr]));
    let (fresh, fresh_addr) = controller(&etcd, "outage").await;
    let via_fresh = Registry::connect(&fresh_addr).await.unwrap();
    assert_eq!(resolved(&via_fresh).await, set(&[&s1_addr, &s3_addr]));
    let mut answered = HashSet::new();
    for i in 0..20 {
        answered.insert(client.call(&WHO, i).await.unwrap());
    }
    assert_eq!(answered, HashSet::from(["i1".to_string(), "i3".to_string()]));
    assert!(a.stats().store.errors > 0);
    for s in [&s1, &s3] {
        s.shutdown().await;
    }
    a.shutdown().await;
    fresh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn a_thousand_client_ids_through_two_controllers_at_once_are_distinct_and_never_reused() {
    let etcd = Etcd::start().await;
    let (a, a_addr) = controller(&etcd, "ids").await;
    let (b, b_addr) = controller(&etcd, "ids").await;
    let via = [Registry::connect(&a_addr).await.unwrap(), Registry::connect(&b_addr).await.unwrap()];
    // Blocks of 4 ids per transaction (see `store`): the two controllers race on the counter
    // about 250 times.
    let asks = (0..1000).map(|i| {
        let r = via[i % 2].clone();
        async move { r.alloc_client_id().await.unwrap() }
    });
    let ids: Vec<u32> = futures_util::future::join_all(asks).await;
    let distinct: HashSet<u32> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 1000, "{} duplicates", 1000 - distinct.len());
    assert!(!distinct.contains(&0));
    // The connections' own ids too.
    assert!(!distinct.contains(&via[0].client_id()) && !distinct.contains(&via[1].client_id()));
    assert_ne!(via[0].client_id(), via[1].client_id());

    // A controller restart does not hand out an id again, nor does releasing one.
    drop(via);
    a.shutdown().await;
    b.shutdown().await;
    let restarted = store(&etcd, "ids").await;
    assert!(!restarted.release_client_id(ids[0]).await.unwrap(), "ids are not given back");
    for _ in 0..20 {
        let id = restarted.alloc_client_id().await.unwrap();
        assert!(!distinct.contains(&id), "id {id} handed out twice");
    }
}

/// Same-host addresses (PROTOCOL.md §16.2.1) are kept with the instance in etcd, so another
/// controller's store lists them; an invalid one is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn same_host_addresses_are_kept_in_etcd_and_listed_by_another_store() {
    let etcd = Etcd::start().await;
    let (writer, reader) = (store(&etcd, "local").await, store(&etcd, "local").await);
    let lease = writer.grant(Duration::from_secs(30)).await.unwrap();
    let spec = InstanceSpec::new(SERVICE, "tcp://127.0.0.1:1").host_id("h").local_address("shm://s");
    writer.register(lease, &[spec]).await.unwrap();
    wait_for(PATIENCE, "the instance", async || reader.resolve(SERVICE).await.unwrap().instances.len() == 1)
        .await;
    let listed = reader.resolve(SERVICE).await.unwrap().instances.remove(0);
    assert_eq!((listed.host_id.as_str(), listed.local_addresses), ("h", vec!["shm://s".to_string()]));
    let no_host = InstanceSpec {
        local_addresses: vec!["shm://s".into()],
        ..InstanceSpec::new(SERVICE, "tcp://127.0.0.1:2")
    };
    let refused = writer.register(lease, &[no_host]).await.unwrap_err().to_string();
    assert!(refused.contains("host_id"), "{refused}");
    assert_eq!(writer.resolve(SERVICE).await.unwrap().instances.len(), 1, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn a_watch_whose_revision_was_compacted_relists_and_converges() {
    let etcd = Etcd::start().await;
    let behind = store(&etcd, "compact").await;
    let writer = store(&etcd, "compact").await;
    let lease = writer.grant(Duration::from_secs(30)).await.unwrap();
    writer.register(lease, &[InstanceSpec::new(SERVICE, "tcp://127.0.0.1:1")]).await.unwrap();
    wait_for(PATIENCE, "the first instance", async || {
        behind.resolve(SERVICE).await.unwrap().instances.len() == 1
    })
    .await;
    let relists = behind.status().relists;

    // `behind` stops watching; meanwhile one instance goes, another comes, and etcd compacts
    // its history past `behind`'s revision.
    behind.pause_watch(true);
    let lease2 = writer.grant(Duration::from_secs(30)).await.unwrap();
    writer.register(lease2, &[InstanceSpec::new(SERVICE, "tcp://127.0.0.1:2")]).await.unwrap();
    writer.revoke(lease).await.unwrap();
    let now = writer.resolve(SERVICE).await.unwrap();
    assert_eq!(now.instances.iter().map(|i| i.address.as_str()).collect::<Vec<_>>(), ["tcp://127.0.0.1:2"]);
    let mut kv = etcd.kv().await;
    let head = kv.range(pb::RangeRequest { key: b"/".to_vec(), ..Default::default() }).await.unwrap();
    let revision = head.into_inner().header.unwrap().revision;
    kv.compact(pb::CompactionRequest { revision, physical: true }).await.unwrap();
    assert_eq!(
        behind.resolve(SERVICE).await.unwrap().instances[0].address,
        "tcp://127.0.0.1:1",
        "still behind"
    );

    behind.pause_watch(false);
    wait_for(PATIENCE, "the store to re-list", async || behind.status().relists > relists).await;
    wait_for(PATIENCE, "the store to converge", async || {
        let r = behind.resolve(SERVICE).await.unwrap();
        r.instances == now.instances
    })
    .await;
    let r = behind.resolve(SERVICE).await.unwrap();
    assert!(
        r.revision >= now.revision,
        "a watch from the old revision answers: {} < {}",
        r.revision,
        now.revision
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd: run scripts/test, which installs it"]
async fn with_one_of_three_etcd_members_down_the_registry_carries_on() {
    let mut members = Etcd::start_cluster(3).await;
    let url = Etcd::cluster_url(&members, "members");
    let config = EtcdConfig { id_block: 4, ..EtcdConfig::parse(&url).unwrap() };
    let store = EtcdStore::connect(config).await.unwrap();
    let c = Controller::with_store(Arc::new(store), ControllerConfig::default());
    let addr = c.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let registry = Registry::connect(&addr).await.unwrap();
    let (s1, s1_addr, r1) = instance(&registry, "i1").await;
    let client = ServiceClient::connect_with(&addr, service_config()).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "i1");

    // The member the store talks to (the first of its list) dies; the other two keep a quorum
    // (after an election, if it was the leader).
    members[0].stop();
    let (t0, mut last) = (Instant::now(), String::new());
    wait_for(PATIENCE, "etcd writes through the other members", async || {
        // Each new refusal is shown if the test fails (with the members' logs, see `Etcd`'s
        // drop); a repeat of the one before is not, as attempts can come every 20 ms.
        let r = c.store().grant(Duration::from_secs(1)).await;
        if let Err(e) = &r {
            let error = e.to_string();
            if error != last {
                eprintln!("{:?} after the kill: {error}", t0.elapsed());
                last = error;
            }
        }
        r.is_ok()
    })
    .await;
    // Registrations, renewals and the watch carry on through them.
    let (s2, s2_addr, _r2) = instance(&registry, "i2").await;
    wait_for(PATIENCE, "the client to learn of i2", async || cached(&client) == set(&[&s1_addr, &s2_addr]))
        .await;
    let renewals = r1.renewals();
    wait_for(PATIENCE, "renewals through the other members", async || r1.renewals() > renewals + 2).await;
    assert_eq!(r1.registrations(), 1, "the lease lived on in the cluster");
    wait_for(PATIENCE, "the watch to be up again", async || c.stats().store.reachable).await;
    // i2 leaves: the removal still reaches the client.
    s2.shutdown().await;
    wait_for(PATIENCE, "the client to drop i2", async || cached(&client) == set(&[&s1_addr])).await;
    s1.shutdown().await;
    c.shutdown().await;
}

/// What keeps the tests above from passing without etcd: they are ignored by default, a run
/// that asks for them without etcd fails naming the fix, and CI cannot leave them out.
mod harness {
    use std::process::Command;

    use crate::common::locate_etcd;

    /// The names of this binary's tests: all of them, or only the ignored ones.
    fn listed(only_ignored: bool) -> Vec<String> {
        let mut list = Command::new(std::env::current_exe().unwrap());
        list.arg("--list");
        if only_ignored {
            list.arg("--ignored");
        }
        let out = list.output().unwrap();
        assert!(out.status.success(), "--list: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).unwrap();
        stdout.lines().filter_map(|l| l.strip_suffix(": test")).map(String::from).collect()
    }

    /// Run without etcd and without scripts/test, no test that needs etcd reports a pass:
    /// every test here but the harness's own is ignored, so the summary counts it as ignored
    /// (and `cargo test` prints the reason next to its name).
    #[test]
    fn every_test_that_needs_etcd_is_ignored_by_default() {
        let all = listed(false);
        let needs_etcd: Vec<&String> = all.iter().filter(|t| !t.starts_with("harness::")).collect();
        assert!(needs_etcd.len() >= 7, "too few tests listed: {all:?}");
        let ignored = listed(true);
        assert_eq!(ignored.iter().collect::<Vec<_>>(), needs_etcd, "ignored tests against the etcd ones");
    }

    /// Asked for where there is no etcd, a test fails (`Etcd::start` panics with this message)
    /// and the message names the fix; where there is one, it is found.
    #[test]
    fn a_missing_etcd_is_an_error_that_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let nowhere = dir.path().join("not-here");
        let err = locate_etcd(None, Some(dir.path().into()), &nowhere).unwrap_err();
        assert!(err.contains("run scripts/test") && err.contains("etcd-server"), "{err}");
        let err = locate_etcd(Some(nowhere.clone().into()), Some(dir.path().into()), &nowhere).unwrap_err();
        assert!(err.contains("VOLLEY_ETCD_BIN"), "{err}");

        let on_path = dir.path().join("etcd");
        std::fs::write(&on_path, "").unwrap();
        assert_eq!(locate_etcd(None, Some(dir.path().into()), &nowhere), Ok(on_path.clone()));
        assert_eq!(locate_etcd(None, None, &on_path), Ok(on_path.clone()), "the fallback");
        let explicit = dir.path().join("etcd-3.5");
        std::fs::write(&explicit, "").unwrap();
        let found = locate_etcd(Some(explicit.clone().into()), Some(dir.path().into()), &on_path);
        assert_eq!(found, Ok(explicit), "VOLLEY_ETCD_BIN wins over PATH");
    }

    /// Why a run may not leave the ignored tests out: on CI (`CI=true`) the etcd tests must run.
    fn ci_refusal(ci: Option<&str>, args: &[&str]) -> Option<String> {
        let runs_ignored = args.iter().any(|a| *a == "--include-ignored" || *a == "--ignored");
        (ci == Some("true") && !runs_ignored).then(|| {
            "CI=true, but this run leaves the etcd tests out (they are ignored by default): \
             run scripts/test, which installs etcd and passes --include-ignored"
                .to_string()
        })
    }

    /// On CI nothing is skipped: a `cargo test` without `--include-ignored` fails here.
    #[test]
    fn on_ci_a_run_without_the_etcd_tests_fails() {
        let args: Vec<String> = std::env::args().collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if let Some(why) = ci_refusal(std::env::var("CI").ok().as_deref(), &args) {
            panic!("{why}");
        }
        assert!(ci_refusal(Some("true"), &["etcd-tests"]).is_some());
        assert!(ci_refusal(Some("true"), &["etcd-tests", "--include-ignored"]).is_none());
        assert!(ci_refusal(Some("true"), &["etcd-tests", "--ignored"]).is_none());
        assert!(ci_refusal(None, &["etcd-tests"]).is_none());
        assert!(ci_refusal(Some("false"), &["etcd-tests"]).is_none());
    }
}
