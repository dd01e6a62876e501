//! `shm://` across two real processes: this test binary runs itself again as the peer (the
//! test `peer_process`, told what to be by an environment variable), so the
//! mapping, the wake-up channels and the set-up socket really cross a process boundary, and the peer
//! can be killed with `SIGKILL` in the middle of a call.
#![cfg(target_os = "linux")]

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use volley::{BatchOptions, Client, ClientConfig, Error, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
/// Answers after the given number of milliseconds.
const SLOW: Method<u64, u64> = Method::new("echo", "slow");

/// What the peer process is, and the address it uses: `serve ADDR` or `call ADDR`.
const PEER_ENV: &str = "VOLLEY_SHM_TEST_PEER";

/// Generous: the machine is shared, and a process may start slowly.
const DEADLINE: Duration = Duration::from_secs(60);

/// Two tests in one: started by [`spawn_peer`] (with [`PEER_ENV`] set) this is the peer
/// process, serving or calling until it is killed; run by the test harness, it starts such a
/// peer itself and makes one call to it, the smallest check across processes. (No test is
/// ignored, so `--include-ignored` runs nothing that only works as a child.)
#[test]
fn peer_process() {
    let Ok(role) = std::env::var(PEER_ENV) else {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        return rt.block_on(async {
            let addr = address("smoke");
            let _peer = spawn_peer("serve", &addr);
            let client = connect_when_up(&addr, ClientConfig::default()).await;
            assert_eq!(client.call(&ECHO, pattern(64, 3)).await.unwrap(), pattern(64, 3));
        });
    };
    let (what, addr) = role.split_once(' ').expect("ROLE ADDR");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        match what {
            "serve" => {
                let server = echo_server(Arc::default());
                server.listen(addr).await.unwrap();
            }
            "call" => {
                // Slow calls, in flight on the test's server when it kills this process.
                let client = Client::connect(addr).await.unwrap();
                let _ = join_all((0..50).map(|_| client.call(&SLOW, 3_000))).await;
            }
            _ => panic!("unknown peer role {what}"),
        }
        std::future::pending::<()>().await
    });
}

/// An echo server whose slow method counts the calls it started in `started`.
fn echo_server(started: Arc<AtomicUsize>) -> Server {
    Server::builder()
        .handle(&ECHO, |b: Bytes| async move { Ok(b) })
        .handle(&SLOW, move |ms: u64| {
            started.fetch_add(1, Ordering::SeqCst);
            async move {
                // Calls held in flight while a real process is killed under them.
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ms)
            }
        })
        .build()
}

/// The peer, killed (`SIGKILL`) when dropped; a killed server cannot remove its socket file,
/// so the peer's owner does.
struct Peer {
    child: Child,
    socket_file: Option<String>,
}

impl Peer {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
        if let Some(path) = &self.socket_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn spawn_peer(role: &str, addr: &str) -> Peer {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, format!("{role} {addr}"))
        .spawn()
        .unwrap();
    let socket_file = (role == "serve").then(|| addr.strip_prefix("shm://").unwrap().to_string());
    Peer { child, socket_file }
}

fn address(tag: &str) -> String {
    format!("shm://{}/volley-shm-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id())
}

/// Connects to the peer's server once it listens.
async fn connect_when_up(addr: &str, config: ClientConfig) -> Client {
    let mut client = None;
    wait_for(DEADLINE, &format!("the peer to listen on {addr}"), async || {
        client = Client::connect_with(addr, config.clone()).await.ok();
        client.is_some()
    })
    .await;
    client.unwrap()
}

/// Mappings of this process that belong to connections to `addr` (the memory file is named
/// after the address).
fn mappings_of(addr: &str) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| l.contains("memfd:volley-shm") && l.contains(addr)).count()
}

fn pattern(n: usize, seed: usize) -> Bytes {
    (0..n).map(|i| (i * 31 + seed) as u8).collect::<Vec<u8>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_every_size_and_batches_cross_to_another_process() {
    let addr = address("sizes");
    let _peer = spawn_peer("serve", &addr);
    // One client with the default ring, one whose 4 KiB rings every large message streams through.
    for ring in [1 << 20, 4096] {
        let client = connect_when_up(&addr, ClientConfig::default().shm_ring(ring)).await;
        for n in [0, 1, 64, 4095, 4096, 4097, 65_537, 1 << 20, 4 << 20] {
            let payload = pattern(n, ring);
            let reply = client.call(&ECHO, payload.clone()).await.unwrap_or_else(|e| panic!("{n}: {e}"));
            assert!(reply == payload, "ring {ring}: {n} bytes came back changed");
        }
        let items: Vec<Bytes> = (0..5_000).map(|i| pattern(64, i)).collect();
        let replies = client.call_batch_with(&ECHO, items.clone(), BatchOptions::default()).await;
        assert_eq!(replies.len(), items.len());
        for (i, (reply, item)) in replies.into_iter().zip(&items).enumerate() {
            assert_eq!(&reply.unwrap_or_else(|e| panic!("item {i}: {e}")), item, "item {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_callers_each_get_their_own_reply() {
    let addr = address("concurrent");
    let _peer = spawn_peer("serve", &addr);
    let client = connect_when_up(&addr, ClientConfig::default().shm_ring(64 << 10)).await;
    let replies = Arc::new(AtomicUsize::new(0));
    let callers = (0..1_000).map(|i| {
        let (client, replies) = (client.clone(), replies.clone());
        tokio::spawn(async move {
            for round in 0..5 {
                let mine = pattern(16 + i % 300, i * 7 + round);
                assert_eq!(client.call(&ECHO, mine.clone()).await.unwrap(), mine, "caller {i}");
                replies.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    for caller in join_all(callers).await {
        caller.unwrap();
    }
    assert_eq!(replies.load(Ordering::Relaxed), 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_batch_fails_every_pending_call_once_and_the_mapping_goes() {
    let addr = address("killed-server");
    let mut peer = spawn_peer("serve", &addr);
    let client = connect_when_up(&addr, ClientConfig::default().timeout(Duration::from_secs(600))).await;
    assert_eq!(mappings_of(&addr), 1, "one connection, one mapping");
    // Ten chunks of 100 requests, each one call in flight.
    let batch = {
        let (client, opts) = (client.clone(), BatchOptions::default().chunk_size(100));
        tokio::spawn(async move { client.call_batch_with(&SLOW, vec![600_000u64; 1_000], opts).await })
    };
    let singles: Vec<_> = (0..100)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.call(&SLOW, 600_000).await })
        })
        .collect();
    wait_until(DEADLINE, "every call to be in flight", || client.pending_calls() == 110).await;
    let killed = Instant::now();
    peer.kill();
    let results = tokio::time::timeout(DEADLINE, batch).await.expect("the batch ended").unwrap();
    assert_eq!(results.len(), 1_000, "one result per item");
    let singles = join_all(singles).await.into_iter().map(|j| j.unwrap());
    for r in results.into_iter().chain(singles) {
        assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");
    }
    // Far sooner than the 600 s the calls had.
    assert!(killed.elapsed() < DEADLINE, "pending calls failed after {:?}", killed.elapsed());
    assert_eq!(client.pending_calls(), 0);
    wait_until(DEADLINE, "the mapping to be unmapped", || mappings_of(&addr) == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_call_frees_its_connection_and_mapping_on_the_server() {
    let addr = address("killed-client");
    let started = Arc::new(AtomicUsize::new(0));
    let server = echo_server(started.clone());
    let bound = server.listen(&addr).await.unwrap().to_string();
    let mut peer = spawn_peer("call", &bound);
    wait_until(DEADLINE, "the peer's 50 calls to reach their handler", || {
        started.load(Ordering::SeqCst) == 50
    })
    .await;
    assert_eq!(server.connections().served, 1);
    assert_eq!(mappings_of(&addr), 1, "the server maps the client's memory file");
    peer.kill();
    // The server lets the handlers finish (as on every transport), then finds no one to reply
    // to and closes.
    wait_until(DEADLINE, "the server to drop the connection", || server.connections().served == 0).await;
    wait_until(DEADLINE, "the server to unmap the memory", || mappings_of(&addr) == 0).await;
    // And it serves the next client as before.
    let client = Client::connect(&bound).await.unwrap();
    assert_eq!(client.call(&ECHO, pattern(100, 1)).await.unwrap(), pattern(100, 1));
    drop(client);
    server.shutdown().await;
}
