//! A flood of service names whose leases lapse gives its memory back: once the controller has
//! forgotten them, its heap is where it was before the flood, whatever the flood's size.
//!
//! The bound is on **live heap bytes** (counted by this binary's global allocator), not on the
//! resident set: what a structure keeps after its entries are gone (a hash map keeps its
//! table at its largest size until told otherwise) shows here exactly, while the resident set
//! also moves with what the allocator keeps of freed memory. `volley bench registry names`
//! measures the resident set of a controller process.
//!
//! The controller and its one registering peer share this process over `inproc://`, on the
//! paused clock: the flood's leases all hold at once (its peak), then lapse together when the
//! test moves the clock past them.

use std::time::Duration;

use volley::Client;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{REGISTER, RegisterRequest};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::live_bytes;

/// Lease time of the flood's registrations: long enough that all of them hold at once.
const TTL: Duration = Duration::from_secs(60);

/// Registers `names` services, one lease each (256 registrations in flight), checks they are
/// all held at once, then lets the leases lapse and waits until every name is forgotten.
async fn flood(controller: &Controller, raw: &Client, tag: &str, names: usize) {
    let forgotten_before = controller.stats().services_forgotten;
    let mut in_flight = tokio::task::JoinSet::new();
    for k in 0..names {
        let req = RegisterRequest {
            lease: 0,
            ttl_ms: TTL.as_millis() as u64,
            instances: vec![InstanceSpec::new(format!("{tag}-name-{k:08}"), "tcp://127.0.0.1:9")],
            credential: String::new(),
        };
        let raw = raw.clone();
        in_flight.spawn(async move { raw.call(&REGISTER, req).await });
        if in_flight.len() >= 256 {
            in_flight.join_next().await.unwrap().unwrap().unwrap();
        }
    }
    while let Some(r) = in_flight.join_next().await {
        r.unwrap().unwrap();
    }
    drop(in_flight);
    let listed = controller.store().list().await.unwrap();
    assert_eq!(listed.len(), names, "every name of the flood is held at its peak");
    drop(listed);
    // Past the leases, a second at a time (the connection's keepalive sees each step).
    for _ in 0..TTL.as_secs() + 2 {
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    wait_until(Duration::from_secs(120), "every name of the flood forgotten", || {
        controller.stats().services_forgotten >= forgotten_before + names as u64
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_lapsed_names_leaves_the_heap_where_it_was() {
    const NAMES: usize = 40_000;
    /// What the heap may have grown by after the flood is forgotten. A controller that keeps
    /// its lease table at its peak size keeps about 4.8 MiB for 40,000 leases.
    const MAX_GROWTH: isize = 256 << 10;

    let addr = format!("inproc://controller-memory-{}", std::process::id());
    let config = ControllerConfig::default()
        .expiry_tick(Duration::from_millis(100))
        .forget_after(Duration::from_secs(1))
        .settle(Duration::ZERO);
    let controller = Controller::new(config);
    controller.listen(&addr).await.unwrap();
    let raw = Client::connect(&addr).await.unwrap();

    // Warm up: the connection, the runtime and the registry's methods reach their working size
    // (a small flood of the same shape).
    flood(&controller, &raw, "warm", 1_000).await;
    let idle = live_bytes();

    flood(&controller, &raw, "flood", NAMES).await;
    let after = live_bytes();
    let growth = after - idle;
    eprintln!(
        "{NAMES} lapsed names: heap {idle} bytes before the flood, {after} once forgotten ({growth:+} bytes; bound {MAX_GROWTH})"
    );
    assert!(
        growth < MAX_GROWTH,
        "the controller kept {growth} bytes after {NAMES} names it forgot (bound {MAX_GROWTH})"
    );
    controller.shutdown().await;
}
