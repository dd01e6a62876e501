//! A frozen instance (SIGSTOP: its kernel still accepts connections and bytes, nothing
//! answers) among two, under 64 callers of a `ServiceClient`: the client's keepalive declares
//! the connection dead when a ping goes unanswered, the calls waiting on it fail over to the
//! other instance, and the frozen one is left out of rotation (its probe needs a round trip).
//! A caller that picked it before it was left out reconnects, and fails over when no preamble
//! came within the connect timeout.
//! Real processes: a controller and two `volley serve-echo`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use volley::bytes::Bytes;
use volley::service_client::ServiceConfig;
use volley::{CallOptions, ClientConfig, Keepalive, Method, ServiceClient};

#[path = "../../volley/tests/support/wait.rs"]
mod wait;
use wait::{eventually, wait_for, wait_until};

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

/// A child process, continued (if it was stopped) and killed when dropped, so a failed
/// assertion leaves nothing behind.
struct Child(std::process::Child);

impl Child {
    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `volley args` and returns it with the first line of its stdout or stderr that
/// contains `marker`, read until then; the rest of its output is drained.
fn start(args: &[&str], marker: &str, on_stderr: bool) -> (Child, String) {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_volley"))
            .args(args)
            .env_remove("VOLLEY_TOKEN")
            .env_remove("VOLLEY_REGISTRATION_CREDENTIAL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (out, err) = (child.0.stdout.take().unwrap(), child.0.stderr.take().unwrap());
    let (mut read, other): (Box<dyn BufRead + Send>, Box<dyn std::io::Read + Send>) = match on_stderr {
        true => (Box::new(BufReader::new(err)), Box::new(out)),
        false => (Box::new(BufReader::new(out)), Box::new(err)),
    };
    std::thread::spawn(move || std::io::copy(&mut { other }, &mut std::io::sink()));
    let mut line = String::new();
    while !line.contains(marker) {
        line.clear();
        assert!(read.read_line(&mut line).unwrap() > 0, "volley {args:?} ended before saying {marker:?}");
    }
    std::thread::spawn(move || std::io::copy(&mut read, &mut std::io::sink()));
    (child, line.trim().to_string())
}

fn echo_server(registry: &str) -> (Child, String) {
    let args = ["serve-echo", "--listen", "tcp://127.0.0.1:0", "--registry", registry];
    let (child, line) = start(&args, "serving echo on ", true);
    let addr = line.split_whitespace().find(|w| w.starts_with("tcp://")).expect("an address").to_string();
    (child, addr)
}

/// Calls completed, and per caller when its last call ended (ms since the test began).
struct Progress {
    ok: AtomicU64,
    errors: AtomicU64,
    last_done: Vec<AtomicU64>,
    stop: AtomicBool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_is_left_out_and_its_calls_fail_over() {
    let (_controller, registry) = start(&["controller", "--listen", "tcp://127.0.0.1:0"], "tcp://", false);
    let (a, a_addr) = echo_server(&registry);
    let (b, b_addr) = echo_server(&registry);
    // With calls waiting, a ping after 300 ms without a frame, dead 500 ms after it: a frozen
    // peer is found within about 1.1 s of its last frame.
    let keepalive =
        Keepalive::new(Duration::from_secs(30), Duration::from_millis(500)).busy(Duration::from_millis(300));
    // Probes soon and often (a probe's round trip may take the connect timeout): a probe that
    // only connected would let the frozen instance back within the test.
    let client_config = ClientConfig::default().connect_timeout(Duration::from_millis(500));
    let config = ServiceConfig::default()
        .client(client_config)
        .instance_keepalive(Some(keepalive))
        .quarantine(Duration::from_millis(300));
    let client = ServiceClient::connect_with(&registry, config).await.unwrap();
    let t0 = Instant::now();
    wait_for(Duration::from_secs(30), "both instances to register", async || {
        let _ = client.call(&ECHO, Bytes::from_static(b"hi")).await;
        client.instance_stats("echo").len() >= 2
    })
    .await;
    let progress = Arc::new(Progress {
        ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        last_done: (0..64).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
    });
    let callers: Vec<_> = (0..64)
        .map(|i| {
            let (client, p) = (client.clone(), progress.clone());
            tokio::spawn(async move {
                while !p.stop.load(Relaxed) {
                    let r = client.call_with(
                        &ECHO,
                        Bytes::from_static(b"hi"),
                        CallOptions::default().idempotent(),
                    );
                    match r.await {
                        Ok(_) => p.ok.fetch_add(1, Relaxed),
                        Err(_) => p.errors.fetch_add(1, Relaxed),
                    };
                    p.last_done[i].store(t0.elapsed().as_millis() as u64, Relaxed);
                }
            })
        })
        .collect();
    let attempts = |addr: &str| {
        let stats = client.instance_stats("echo");
        stats.iter().find(|s| s.address == addr).map_or(0, |s| s.attempts)
    };
    // Both instances take calls, then b freezes.
    wait_until(Duration::from_secs(30), "both instances to take calls", || {
        attempts(&b_addr) >= 1000 && attempts(&a_addr) >= 1000
    })
    .await;
    b.signal(libc::SIGSTOP);
    let frozen_at = Instant::now();
    // Real time (a real process, frozen by a signal): the window in which the keepalive must
    // find it out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (b_seen, ok_seen) = (attempts(&b_addr), progress.ok.load(Relaxed));
    let window_end = t0.elapsed().as_millis() as u64;
    let stuck_now =
        || -> Vec<usize> { (0..64).filter(|&i| progress.last_done[i].load(Relaxed) <= window_end).collect() };
    // At least 3 s of calls after the window; a caller held up past that is waited for up to
    // 12 s more, as a loaded machine can stretch the keepalive's ~1.1 s: a call left waiting on
    // the frozen instance would wait out its own 30 s timeout, far beyond that. (Real time: the
    // frozen instance is a real process.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The frozen instance is looked at now: waited on much longer, its registration would
    // lapse and it would leave the list.
    let stats = client.instance_stats("echo");
    let b_after = attempts(&b_addr);
    let t2 = Instant::now();
    eventually(Duration::from_secs(12), || stuck_now().is_empty()).await;
    let calls_after = t2.elapsed() + Duration::from_secs(3);
    progress.stop.store(true, Relaxed);
    let stuck = stuck_now();
    for c in callers {
        c.abort();
    }
    let ok_after = progress.ok.load(Relaxed);
    b.signal(libc::SIGCONT);
    drop((a, b));
    // From two seconds after the freeze on, no call went to the frozen instance...
    assert_eq!(b_after, b_seen, "calls went to the frozen instance: {stats:?}");
    let out = stats.iter().find(|s| s.address == b_addr).unwrap();
    assert_eq!(out.ejected, Some("unreachable"), "{stats:?}");
    // ...every caller went on calling (none was left waiting on it)...
    assert!(stuck.is_empty(), "callers {stuck:?} made no call after the window");
    // ...and the calls went on, on the other instance, without errors (they are idempotent:
    // those that were waiting on the frozen instance were sent again).
    assert!(
        ok_after - ok_seen >= 1000,
        "only {} calls in the {calls_after:?} after the window",
        ok_after - ok_seen
    );
    assert_eq!(progress.errors.load(Relaxed), 0);
    assert!(frozen_at.elapsed() < Duration::from_secs(30));
}
