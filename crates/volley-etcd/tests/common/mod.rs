//! A real etcd server for the tests: started on 127.0.0.1 with free ports and a temporary data
//! directory, killed when dropped. The tests that need one are ignored unless the run asks for
//! ignored tests (`scripts/test` does, after installing etcd); asked for without an etcd
//! binary, they fail with a message that names the fix. They never pass without etcd.

#![allow(dead_code)]

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use volley_etcd::pb;

/// Where Debian's etcd-server package puts etcd, for a `PATH` without /usr/bin.
const DEBIAN_ETCD: &str = "/usr/bin/etcd";

pub struct Etcd {
    bin: PathBuf,
    child: Option<Child>,
    pub client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    /// This member's name and the `--initial-cluster` it was started with.
    name: String,
    initial_cluster: String,
}

/// The etcd binary: `explicit` (the `VOLLEY_ETCD_BIN` variable) if set, else `etcd` on `path`
/// (the `PATH` variable), else `fallback`. The error says what was looked at and how to fix it.
pub fn locate_etcd(
    explicit: Option<OsString>,
    path: Option<OsString>,
    fallback: &Path,
) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "VOLLEY_ETCD_BIN is {}, which is not a file: point it at an etcd binary",
                p.display()
            ))
        };
    }
    let on_path = path.iter().flat_map(std::env::split_paths).map(|d| d.join("etcd")).find(|p| p.is_file());
    on_path.or_else(|| Some(fallback.to_path_buf()).filter(|p| p.is_file())).ok_or_else(|| {
        format!(
            "this test needs etcd, and there is none on PATH or at {}: run scripts/test, which \
             installs it (apt-get install etcd-server) and runs every test; or set VOLLEY_ETCD_BIN",
            fallback.display()
        )
    })
}

/// The etcd binary of this machine, or a panic that names the fix.
fn etcd_binary() -> PathBuf {
    let found =
        locate_etcd(std::env::var_os("VOLLEY_ETCD_BIN"), std::env::var_os("PATH"), DEBIAN_ETCD.as_ref());
    found.unwrap_or_else(|e| panic!("{e}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Etcd {
    /// A running etcd. Panics when there is no etcd binary here (see [`locate_etcd`]).
    pub async fn start() -> Etcd {
        let mut members = Etcd::start_cluster(1).await;
        members.pop().unwrap()
    }

    /// A cluster of `n` members on 127.0.0.1, each with its own ports and data directory.
    pub async fn start_cluster(n: usize) -> Vec<Etcd> {
        // A free port is only free when it was probed: another process's connection may take
        // it before etcd binds it (more likely on a loaded machine). Such a start is tried
        // again on other ports; any other failure to start is the test's.
        for attempt in 1.. {
            match Etcd::try_start_cluster(n).await {
                Ok(members) => return members,
                Err(log) if attempt < 3 && log.contains("address already in use") => {
                    eprintln!("etcd could not bind its ports (attempt {attempt}); again on others");
                }
                Err(log) => panic!("etcd exited at start:\n{log}"),
            }
        }
        unreachable!()
    }

    /// Starts a cluster; `Err` with the log of a member that exited at start.
    async fn try_start_cluster(n: usize) -> Result<Vec<Etcd>, String> {
        let bin = etcd_binary();
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| Etcd {
                bin: bin.clone(),
                child: None,
                client_port: free_port(),
                peer_port: free_port(),
                dir: tempfile::tempdir().unwrap(),
                name: format!("volley-test-{i}"),
                initial_cluster: String::new(),
            })
            .collect();
        let initial: Vec<String> =
            members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect();
        for m in &mut members {
            m.initial_cluster = initial.join(",");
            m.launch();
        }
        // A member answers once a quorum is up: start them all, then wait for each.
        for m in &mut members {
            m.wait_ready().await?;
        }
        Ok(members)
    }

    fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where etcd's output goes (kept across restarts).
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Everything etcd has logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    async fn spawn(&mut self) {
        self.launch();
        if let Err(log) = self.wait_ready().await {
            panic!("etcd exited at start:\n{log}");
        }
    }

    fn launch(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        // Appended to, so that a restart keeps the log of the run before.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let child = Command::new(&self.bin)
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.data_dir().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            // Test members share one disk with the build and each other: without fsync a slow
            // disk cannot stall raft into missed heartbeats and elections. A killed member
            // still finds its data (from etcd 3.4.16 the flag still writes it out, and the
            // kernel keeps what was written); only a machine crash would lose it, which no
            // test does. Pre-vote keeps a member that stalled (CPU steal) from deposing a
            // healthy leader when it wakes up.
            .args(["--unsafe-no-fsync", "--pre-vote"])
            // Info level: elections, slow disk and heartbeat warnings are what a failing test
            // needs to show (see `Drop`).
            .args(["--logger", "zap", "--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// Waits until a read answers (a loaded machine may take a while); `Err` with etcd's log
    /// if it exited instead.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let mut exited = None;
        wait_for(Duration::from_secs(60), "etcd to answer", async || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                exited = Some(format!("({status})\n{}", self.log()));
                return true;
            }
            self.ready().await
        })
        .await;
        exited.map_or(Ok(()), Err)
    }

    async fn ready(&self) -> bool {
        let Ok(ep) =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.client_port))
        else {
            return false;
        };
        let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(2), ep.connect()).await else {
            return false;
        };
        let mut kv = pb::kv_client::KvClient::new(channel);
        let req = pb::RangeRequest { key: b"/ready".to_vec(), ..Default::default() };
        matches!(tokio::time::timeout(Duration::from_secs(2), kv.range(req)).await, Ok(Ok(_)))
    }

    /// `etcd://127.0.0.1:PORT/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{}/{prefix}", self.client_port)
    }

    /// `etcd://127.0.0.1:PORT1,127.0.0.1:PORT2,.../PREFIX` for several members.
    pub fn cluster_url(members: &[Etcd], prefix: &str) -> String {
        let hosts: Vec<String> = members.iter().map(|m| format!("127.0.0.1:{}", m.client_port)).collect();
        format!("etcd://{}/{prefix}", hosts.join(","))
    }

    /// Kills etcd (SIGKILL: no goodbye to its clients).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// A gRPC client of the KV service (compaction, direct reads).
    pub async fn kv(&self) -> pb::kv_client::KvClient<tonic::transport::Channel> {
        let ep = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.client_port))
            .unwrap();
        pb::kv_client::KvClient::new(ep.connect().await.unwrap())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        // A failing test shows what etcd was doing: its log is gone with the directory.
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().filter(|l| telling(l)).collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!(
                "--- {}'s log: warnings and elections, last {} ---\n{}",
                self.name,
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// How much of each member's log a failing test prints.
const LOG_TAIL: usize = 40;

/// Whether a log line tells something about a failure: a warning or error (slow disk, missed
/// heartbeats, lost peers), or a leader election. Start-up chatter is left out.
fn telling(line: &str) -> bool {
    !line.contains(r#""level":"info""#)
        || ["leader", "election", "candidate"].iter().any(|w| line.contains(w))
}

#[path = "../../../volley/tests/support/wait.rs"]
mod wait;
pub use wait::wait_for;
