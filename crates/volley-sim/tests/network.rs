//! The library's own timers against a simulated network that fails: a keepalive that finds a
//! silent peer, a connect that hangs, a lease that lapses behind a cut link and comes back
//! when it heals. Each is a small simulation (a few hosts, simulated seconds) with bounds on
//! simulated time — exact, since no machine's load can stretch them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::{Client, ClientConfig, Error, Keepalive, Method, Server};

const ECHO: Method<u64, u64> = Method::new("net", "echo");

/// Simulated milliseconds since the simulation started.
fn now_ms() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64
}

/// What a host found, handed to the test once the simulation ends.
type Found<T> = Arc<Mutex<Option<T>>>;

fn sim(tick_ms: u64, secs: u64) -> turmoil::Sim<'static> {
    volley::transport::enable_simulation();
    turmoil::Builder::new()
        .rng_seed(1)
        .tick_duration(Duration::from_millis(tick_ms))
        .simulation_duration(Duration::from_secs(secs))
        .build()
}

fn echo_host(sim: &mut turmoil::Sim<'_>) {
    sim.host("srv", || async {
        let server = Server::builder().handle(&ECHO, |x: u64| async move { Ok(x) }).build();
        server.listen("tcp://srv:7000").await?;
        std::future::pending::<()>().await;
        drop(server);
        Ok(())
    });
}

/// Runs `sim` to its end, calling `drive` before every step with the simulated time.
fn run(mut sim: turmoil::Sim<'_>, mut drive: impl FnMut(&mut turmoil::Sim<'_>, u64)) {
    loop {
        let now = sim.elapsed().as_millis() as u64;
        drive(&mut sim, now);
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => panic!("the simulation did not finish: {e}"),
        }
    }
}

/// A peer that goes silent (its link held, as a frozen process) fails the calls waiting on
/// it once the keepalive gives up — busy silence 300 ms, then 500 ms for the ping's answer —
/// not when their 30 s deadline passes.
#[test]
fn the_keepalive_fails_a_call_to_a_silent_peer_long_before_its_deadline() {
    let mut sim = sim(1, 60);
    echo_host(&mut sim);
    let found: Found<(u64, u64, Result<u64, Error>)> = Arc::default();
    // The client asks for the hold (`ask`); the driver holds the link and says so (`held`).
    let (ask, held) = (Arc::new(AtomicBool::new(false)), Arc::new(tokio::sync::Notify::new()));
    {
        let (found, ask, held) = (found.clone(), ask.clone(), held.clone());
        sim.client("cli", async move {
            let keepalive = Keepalive::new(Duration::from_secs(10), Duration::from_millis(500))
                .busy(Duration::from_millis(300));
            let config = ClientConfig::default().timeout(Duration::from_secs(30)).keepalive(Some(keepalive));
            let client = Client::connect_with("tcp://srv:7000", config).await?;
            assert_eq!(client.call(&ECHO, 1).await?, 1);
            ask.store(true, Ordering::SeqCst);
            held.notified().await;
            let t0 = now_ms();
            let r = client.call(&ECHO, 2).await;
            *found.lock().unwrap() = Some((t0, now_ms(), r));
            Ok(())
        });
    }
    run(sim, |sim, _| {
        if ask.swap(false, Ordering::SeqCst) {
            sim.hold("cli", "srv");
            // A permit: the client takes it at its next poll even if it is not waiting yet.
            held.notify_one();
        }
    });
    let (t0, t1, r) = found.lock().unwrap().take().expect("the call ended");
    assert!(matches!(r, Err(Error::Connection(_) | Error::Closed)), "a connection error, not {r:?}");
    // Pinged after 300 ms of silence (counted from the last reply, before the call began;
    // looked at every 75 ms), dead 500 ms after the ping.
    let took = t1 - t0;
    assert!((500..=300 + 500 + 100).contains(&took), "failed after {took} simulated ms, expected 500–900");
}

/// A connection to a peer whose link is held (a partition as TCP sees it: the handshake's
/// segments wait) fails at its connect timeout, exactly.
#[test]
fn a_connect_over_a_held_link_fails_at_its_connect_timeout() {
    let mut sim = sim(1, 30);
    echo_host(&mut sim);
    let found: Found<(u64, Result<(), Error>)> = Arc::default();
    {
        let found = found.clone();
        sim.client("cli", async move {
            // The driver holds the link before the first step.
            let t0 = now_ms();
            let config = ClientConfig::default().connect_timeout(Duration::from_millis(700));
            let r = Client::connect_with("tcp://srv:7000", config).await.map(drop);
            *found.lock().unwrap() = Some((now_ms() - t0, r));
            Ok(())
        });
    }
    let mut held = false;
    run(sim, |sim, _| {
        if !held {
            sim.hold("cli", "srv");
            held = true;
        }
    });
    let (took, r) = found.lock().unwrap().take().expect("the connect ended");
    assert!(r.is_err(), "connected over a held link");
    assert!((700..=710).contains(&took), "gave up after {took} simulated ms, not 700");
}

/// An instance cut from its controller for three lease times: the controller stops listing it
/// within a lease time (1 s) plus its expiry tick, and lists it again within a lease time of
/// the link healing (its renewal finds the lease gone and registers again).
#[test]
fn a_lease_lapses_behind_a_cut_link_and_the_instance_is_listed_again_once_it_heals() {
    const CUT_MS: u64 = 2_000;
    const HEAL_MS: u64 = 5_000;
    let mut sim = sim(5, 60);
    sim.host("ctl", || async {
        let c = Controller::new(
            ControllerConfig::default().expiry_tick(Duration::from_millis(50)).settle(Duration::ZERO),
        );
        c.listen("tcp://ctl:9000").await?;
        std::future::pending::<()>().await;
        drop(c);
        Ok(())
    });
    sim.host("srv", || async {
        let server = Server::builder().handle(&ECHO, |x: u64| async move { Ok(x) }).build();
        let addr = server.listen("tcp://srv:7000").await?;
        let registry = Registry::connect("tcp://ctl:9000").await?;
        let lease = LeaseConfig::default().ttl(Duration::from_secs(1));
        let _r = registry.register(&server, vec![InstanceSpec::new("net", addr.to_string())], lease).await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    // (when, listed) as the observer saw it every 20 ms.
    let seen: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    {
        let seen = seen.clone();
        sim.client("obs", async move {
            let registry = Registry::connect("tcp://ctl:9000").await?;
            while now_ms() < 8_000 {
                let listed =
                    registry.resolve("net").await?.instances.iter().any(|i| i.address == "tcp://srv:7000");
                seen.lock().unwrap().push((now_ms(), listed));
                // The observer's pace, in simulated time.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        });
    }
    let (mut cut, mut healed) = (false, false);
    run(sim, |sim, now| {
        if !cut && now >= CUT_MS {
            sim.hold("srv", "ctl");
            cut = true;
        }
        if !healed && now >= HEAL_MS {
            sim.release("srv", "ctl");
            healed = true;
        }
    });
    let seen = seen.lock().unwrap();
    assert!(seen.iter().any(|&(t, l)| t < CUT_MS && l), "listed before the cut");
    let gone = seen.iter().find(|&&(t, l)| t >= CUT_MS && !l).map(|&(t, _)| t).expect("never delisted");
    // Its last renewal came at most a third of a lease before the cut; the lease ends a lease
    // time after that renewal, and the expiry tick and the observer's pace add 70 ms.
    assert!(gone - CUT_MS <= 1_000 + 70, "delisted {} ms after the cut", gone - CUT_MS);
    assert!(gone - CUT_MS >= 600, "delisted {} ms after the cut: before its lease ran out", gone - CUT_MS);
    let back = seen.iter().find(|&&(t, l)| t >= HEAL_MS && l).map(|&(t, _)| t).expect("never listed again");
    assert!(back - HEAL_MS <= 1_000, "listed again {} ms after the link healed", back - HEAL_MS);
    assert!(seen.iter().filter(|&&(t, _)| t >= back).all(|&(_, l)| l), "dropped again after it came back");
}
