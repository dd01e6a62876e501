//! The library's time follows the simulated clock, not the machine's: a call's deadline passes
//! after one simulated second whether the simulation runs far faster than real time or far
//! slower. A deadline (or any timer on the call's path) read from the wall clock fails one of
//! the two: it fires after ~100 simulated seconds in the first, or within a third of a
//! simulated second in the second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use volley::{Client, ClientConfig, Error, Method, Server};

const ECHO: Method<u64, u64> = Method::new("clock", "echo");

/// Runs one simulation: a first call connects; then the link is held (the server looks
/// frozen) and a second call with a 1 s timeout is made. `wall_per_step` is real time spent on
/// every simulated millisecond while the link is held. Returns the second call's simulated
/// duration in ms and its outcome.
fn held_call(wall_per_step: Duration) -> (u64, Result<u64, Error>) {
    volley::transport::enable_simulation();
    let mut sim = turmoil::Builder::new()
        .rng_seed(1)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(Duration::from_secs(20))
        .build();
    sim.host("srv", || async {
        let server = Server::builder().handle(&ECHO, |x: u64| async move { Ok(x) }).build();
        server.listen("tcp://srv:7000").await?;
        std::future::pending::<()>().await;
        drop(server);
        Ok(())
    });
    let connected = Arc::new(AtomicBool::new(false));
    let took = Arc::new(AtomicU64::new(0));
    let outcome = Arc::new(std::sync::Mutex::new(None));
    {
        let (connected, took, outcome) = (connected.clone(), took.clone(), outcome.clone());
        sim.client("cli", async move {
            let client = Client::connect_with(
                "tcp://srv:7000",
                ClientConfig::default().timeout(Duration::from_secs(1)),
            )
            .await?;
            assert_eq!(client.call(&ECHO, 5).await?, 5, "the first call goes through");
            connected.store(true, Ordering::SeqCst);
            // The driver holds the link before the next step (simulated time).
            tokio::time::sleep(Duration::from_millis(5)).await;
            let t0 = tokio::time::Instant::now();
            let r = client.call(&ECHO, 6).await;
            took.store(t0.elapsed().as_millis() as u64, Ordering::SeqCst);
            *outcome.lock().unwrap() = Some(r);
            Ok(())
        });
    }
    let mut held = false;
    loop {
        if !held && connected.load(Ordering::SeqCst) {
            sim.hold("cli", "srv");
            held = true;
        }
        if held && !wall_per_step.is_zero() {
            // Real time on purpose: the simulation runs slower than the wall clock.
            std::thread::sleep(wall_per_step);
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => panic!("the simulation did not finish: {e}"),
        }
    }
    let r = outcome.lock().unwrap().take().expect("the second call ended");
    (took.load(Ordering::SeqCst), r)
}

fn assert_one_simulated_second((took, r): (u64, Result<u64, Error>)) {
    assert!(matches!(r, Err(Error::Timeout(_))), "a held call times out: {r:?}");
    assert!((1_000..1_100).contains(&took), "the deadline passed after {took} simulated ms, not ~1000");
}

#[test]
fn a_deadline_follows_simulated_time_when_the_simulation_runs_fast() {
    assert_one_simulated_second(held_call(Duration::ZERO));
}

#[test]
fn a_deadline_follows_simulated_time_when_the_simulation_runs_slow() {
    // 3 ms of real time per simulated ms: a wall-clock deadline would pass after ~330 steps.
    assert_one_simulated_second(held_call(Duration::from_millis(3)));
}
