//! Running configurations: the roles in this process or in child processes, the driver's
//! indexing and query phases, timing, traffic counters, and the agreement check.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use volley::ServiceClient;
use volley::codec::Json;
use volley::controller::{Controller, ControllerConfig};
use volley::service_client::Mode;

use crate::codec::{Codec, CodecKind, Fast, General};
use crate::corpus::{CorpusSpec, DocText};
use crate::roles::{self, Counts, Driver, Empty, Role, RoleSettings};
use crate::search::{self, Hit, Query, QueryClass};

/// How the roles reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// In-process queues: values are handed over, nothing is encoded, no bytes are counted.
    Inproc,
    Unix,
    Tcp,
    /// Shared memory (Linux), set up over unix sockets in the run's directory.
    Shm,
    /// Found through the registry: every role registers a tcp address with a shm address
    /// beside it, and the clients — all on this host — prefer the shm one (relayed calls go
    /// from the controller to the roles over tcp: its relay does not prefer them).
    TcpShm,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Inproc => "inproc",
            Transport::Unix => "unix",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            Transport::TcpShm => "tcp+shm",
        }
    }

    pub fn parse(s: &str) -> Option<Transport> {
        match s {
            "inproc" => Some(Transport::Inproc),
            "unix" => Some(Transport::Unix),
            "tcp" => Some(Transport::Tcp),
            "shm" => Some(Transport::Shm),
            "tcp+shm" => Some(Transport::TcpShm),
            _ => None,
        }
    }
}

pub fn mode_name(m: Mode) -> &'static str {
    m.name()
}

/// One configuration of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    pub mode: Mode,
    /// Items per request; 1 means single calls.
    pub batch: usize,
    pub codec: CodecKind,
    pub transport: Transport,
}

/// The seed's "at most 128 requests are sent once".
pub const DEFAULT_BATCH: usize = 128;

impl Config {
    /// The baseline: relayed, single calls, general codec (the seed's old MF), over `transport`.
    pub fn baseline(transport: Transport) -> Config {
        Config { mode: Mode::Relayed, batch: 1, codec: CodecKind::General, transport }
    }

    pub fn is_baseline(&self) -> bool {
        *self == Config::baseline(self.transport)
    }

    pub fn name(&self) -> String {
        let calls = if self.batch <= 1 { "single".to_string() } else { format!("batch{}", self.batch) };
        format!("{}+{}+{}", mode_name(self.mode), calls, self.codec.name())
    }

    /// The default matrix: the baseline, the best (direct, batches, fast tier) and the steps
    /// between them, one change at a time.
    pub fn matrix(transport: Transport, batch: usize) -> Vec<Config> {
        let c = |mode, batch, codec| Config { mode, batch, codec, transport };
        vec![
            Config::baseline(transport),
            c(Mode::Relayed, batch, CodecKind::General),
            c(Mode::Direct, 1, CodecKind::General),
            c(Mode::Direct, batch, CodecKind::General),
            c(Mode::Direct, batch, CodecKind::Fast),
        ]
    }
}

/// What the testbed runs on, whatever the configuration.
#[derive(Debug, Clone)]
pub struct Setup {
    pub corpus: CorpusSpec,
    pub shards: u32,
    /// Queries per class.
    pub queries: usize,
    /// Seed of the query draw.
    pub query_seed: u64,
    /// Run each role in its own process (this executable, see [`ROLE_SUBCOMMAND`]).
    pub processes: bool,
    /// The executable to start roles with (default: this one).
    pub exe: Option<PathBuf>,
    /// Roles started with another command instead (a role written in another language): the
    /// role's name (`la`, `main` ...) and the command line, to which the role arguments of
    /// [`ROLE_SUBCOMMAND`] are appended. Only with `processes`.
    pub role_commands: Vec<(String, Vec<String>)>,
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
    /// The roles' servers shed load beyond an adaptive concurrency limit
    /// ([`ConcurrencyLimit::default`](volley::ConcurrencyLimit)); role processes get
    /// `--adaptive-limit`.
    pub adaptive_limit: bool,
}

/// The hidden subcommand a role process is started with: `volley testbed-role ...`.
pub const ROLE_SUBCOMMAND: &str = "testbed-role";

/// One configuration's measurements.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub config: Config,
    pub index_s: f64,
    pub query_s: HashMap<QueryClass, f64>,
    pub messages: u64,
    pub bytes: u64,
    pub postings: u64,
    /// Connections the driver and the roles opened through same-host addresses.
    pub local_connections: u64,
    pub results: HashMap<QueryClass, Vec<Vec<Hit>>>,
}

/// The workload shared by every configuration of a run.
pub struct Workload {
    pub docs: Vec<DocText>,
    pub queries: Vec<(QueryClass, Vec<Query>)>,
    /// The brute-force answers (synthetic corpus only).
    pub oracle: Option<HashMap<QueryClass, Vec<Vec<Hit>>>>,
}

pub const CLASSES: [QueryClass; 2] = [QueryClass::High, QueryClass::Low];

impl Workload {
    pub fn new(setup: &Setup) -> std::io::Result<Workload> {
        let docs = setup.corpus.load()?;
        let queries: Vec<_> = CLASSES
            .iter()
            .map(|&c| (c, search::make_queries(&docs, c, setup.queries, setup.query_seed)))
            .collect();
        let oracle = setup.corpus.is_synthetic().then(|| {
            let analyzed: Vec<Vec<String>> = docs.iter().map(|d| crate::analyzer::analyze(&d.text)).collect();
            queries.iter().map(|(c, q)| (*c, search::brute_force(&analyzed, q, search::TOP_K))).collect()
        });
        Ok(Workload { docs, queries, oracle })
    }
}

/// Errors of a testbed run.
#[derive(Debug)]
pub enum TestbedError {
    Volley(volley::Error),
    Io(std::io::Error),
    /// A role process failed to start or died.
    Process(String),
    Interrupted,
}

impl std::fmt::Display for TestbedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TestbedError::Volley(e) => write!(f, "{e}"),
            TestbedError::Io(e) => write!(f, "{e}"),
            TestbedError::Process(e) => write!(f, "role process: {e}"),
            TestbedError::Interrupted => write!(f, "interrupted"),
        }
    }
}

impl std::error::Error for TestbedError {}

impl From<volley::Error> for TestbedError {
    fn from(e: volley::Error) -> Self {
        TestbedError::Volley(e)
    }
}
impl From<std::io::Error> for TestbedError {
    fn from(e: std::io::Error) -> Self {
        TestbedError::Io(e)
    }
}

/// Runs one configuration from a fresh start (its own controller and roles), and stops it.
pub async fn run_config(setup: &Setup, work: &Workload, config: Config) -> Result<Outcome, TestbedError> {
    match config.codec {
        CodecKind::General => run_tier::<General>(setup, work, config).await,
        CodecKind::Fast => run_tier::<Fast>(setup, work, config).await,
    }
}

static RUN: AtomicU64 = AtomicU64::new(0);

/// Addresses of one run: sockets in a temporary directory (removed when dropped), unique
/// inproc names, or loopback ports chosen by the system.
struct Addresses {
    dir: tempfile::TempDir,
    transport: Transport,
    run: u64,
}

impl Addresses {
    fn new(transport: Transport) -> std::io::Result<Addresses> {
        let dir = tempfile::Builder::new().prefix("volley-testbed-").tempdir()?;
        Ok(Addresses { dir, transport, run: RUN.fetch_add(1, Relaxed) })
    }

    fn of(&self, name: &str) -> String {
        match self.transport {
            Transport::Inproc => format!("inproc://testbed-{}-{}-{name}", std::process::id(), self.run),
            Transport::Unix => format!("unix://{}", self.dir.path().join(format!("{name}.sock")).display()),
            Transport::Tcp | Transport::TcpShm => "tcp://127.0.0.1:0".to_string(),
            Transport::Shm => format!("shm://{}", self.dir.path().join(format!("{name}.sock")).display()),
        }
    }

    /// The same-host address `name` also listens on and registers, if the transport has one.
    fn local(&self, name: &str) -> Option<String> {
        (self.transport == Transport::TcpShm)
            .then(|| format!("shm://{}", self.dir.path().join(format!("{name}-shm.sock")).display()))
    }
}

/// The roles of a run, wherever they live.
enum Roles {
    Here(Vec<roles::RunningRole>),
    Children { children: Vec<Child>, stats: ServiceClient },
}

/// A role process; killed if still running when dropped (after a failure or an interrupt).
struct Child {
    name: String,
    child: tokio::process::Child,
}

impl Roles {
    async fn counts(&self) -> Result<Counts, TestbedError> {
        let mut total = Counts::default();
        match self {
            Roles::Here(roles) => {
                roles.iter().for_each(|r| total.add(&Counts::of(&r.server, r.client.as_ref())))
            }
            Roles::Children { stats, .. } => {
                for service in [roles::DOCUMENT, roles::LA, roles::INDEX, roles::MAIN] {
                    for g in stats.scatter(&roles::stats(service), Json(Empty {})).await? {
                        total.add(&g.result?.0);
                    }
                }
            }
        }
        Ok(total)
    }

    async fn stop(self) {
        match self {
            Roles::Here(roles) => roles::RunningRole::shutdown_all(roles).await,
            Roles::Children { mut children, stats } => {
                drop(stats);
                // Callers first (Main, Document), as in one process; closing its stdin tells a
                // role process to shut down.
                children.sort_by_key(|c| match c.name.as_str() {
                    "main" => 0,
                    "document" => 1,
                    "la" => 2,
                    _ => 3,
                });
                for c in &mut children {
                    drop(c.child.stdin.take());
                    if tokio::time::timeout(Duration::from_secs(5), c.child.wait()).await.is_err() {
                        tracing::warn!(role = %c.name, "role process did not stop; killing it");
                        let _ = c.child.kill().await;
                    }
                }
            }
        }
    }
}

async fn run_tier<C: Codec>(setup: &Setup, work: &Workload, config: Config) -> Result<Outcome, TestbedError> {
    let addrs = Addresses::new(config.transport)?;
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let registry = controller.listen(&addrs.of("registry")).await?.to_string();
    let settings = RoleSettings {
        registry: registry.clone(),
        mode: config.mode,
        batch: config.batch,
        corpus: setup.corpus.clone(),
        prefer_local: config.transport == Transport::TcpShm,
        concurrency_limit: setup.adaptive_limit.then(volley::ConcurrencyLimit::default),
    };
    let outcome = async {
        let roles = if setup.processes {
            start_children(setup, &settings, &addrs, config).await?
        } else {
            let mut v = Vec::new();
            for role in Role::all(setup.shards) {
                let local = addrs.local(&role.name());
                let local: Vec<&str> = local.iter().map(String::as_str).collect();
                v.push(roles::start::<C>(role, &settings, &addrs.of(&role.name()), &local).await?);
            }
            Roles::Here(v)
        };
        let measured = measure::<C>(work, config, &settings, &roles, &controller).await;
        roles.stop().await;
        measured
    }
    .await;
    controller.shutdown().await;
    outcome
}

async fn measure<C: Codec>(
    work: &Workload,
    config: Config,
    settings: &RoleSettings,
    roles: &Roles,
    controller: &Controller,
) -> Result<Outcome, TestbedError> {
    let client = ServiceClient::connect_with(&settings.registry, settings.service_config()).await?;
    let driver = Driver::<C>::new(client.clone(), config.batch);
    let traffic = |c: Counts| {
        let s = controller.stats().server;
        Counts {
            messages: c.messages + s.messages_sent + s.messages_received,
            bytes: c.bytes + s.bytes_sent + s.bytes_received,
            local_connections: c.local_connections,
        }
    };
    let before = traffic(roles.counts().await?);
    let t = Instant::now();
    let indexed = driver.index().await?;
    let index_s = t.elapsed().as_secs_f64();
    driver.prepare().await?;
    let mut query_s = HashMap::new();
    let mut results = HashMap::new();
    for (class, queries) in &work.queries {
        let t = Instant::now();
        let r = driver.search(queries).await?;
        query_s.insert(*class, t.elapsed().as_secs_f64());
        results.insert(*class, r);
    }
    let after = traffic(roles.counts().await?);
    Ok(Outcome {
        config,
        index_s,
        query_s,
        messages: after.messages - before.messages,
        bytes: after.bytes - before.bytes,
        postings: indexed.postings,
        local_connections: after.local_connections + client.stats().local_connections,
        results,
    })
}

async fn start_children(
    setup: &Setup,
    settings: &RoleSettings,
    addrs: &Addresses,
    config: Config,
) -> Result<Roles, TestbedError> {
    let exe = match &setup.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe()?,
    };
    let mut children = Vec::new();
    for role in Role::all(setup.shards) {
        let own = setup.role_commands.iter().find(|(name, line)| *name == role.name() && !line.is_empty());
        let mut cmd = match own {
            Some((_, line)) => {
                let mut cmd = tokio::process::Command::new(&line[0]);
                cmd.args(&line[1..]);
                cmd
            }
            None => {
                let mut cmd = tokio::process::Command::new(&exe);
                cmd.arg(ROLE_SUBCOMMAND);
                cmd
            }
        };
        cmd.args([
            "--role",
            &role.name(),
            "--registry",
            &settings.registry,
            "--listen",
            &addrs.of(&role.name()),
        ])
        .args(["--mode", mode_name(config.mode), "--batch", &config.batch.to_string()])
        .args(["--codec", config.codec.name()]);
        match &setup.corpus {
            CorpusSpec::Synthetic { docs, seed } => {
                cmd.args(["--docs", &docs.to_string(), "--seed", &seed.to_string()]);
            }
            CorpusSpec::Dir(d) => {
                cmd.arg("--corpus").arg(d);
            }
        }
        if own.is_none() && settings.concurrency_limit.is_some() {
            cmd.arg("--adaptive-limit");
        }
        // A role in another language listens on its --listen address only.
        if let (None, Some(local)) = (own, addrs.local(&role.name())) {
            cmd.args(["--listen-local", &local, "--prefer-local"]);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| {
            let program = own.map_or_else(|| exe.display().to_string(), |(_, line)| line.join(" "));
            TestbedError::Process(format!("start {program}: {e}"))
        })?;
        children.push(Child { name: role.name(), child });
    }
    // Every role prints "ready ADDRESS" once it serves and is registered.
    for c in &mut children {
        let out = c.child.stdout.take().expect("piped");
        let mut line = String::new();
        let read =
            tokio::time::timeout(Duration::from_secs(60), BufReader::new(out).read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0 && line.starts_with("ready")) {
            return Err(TestbedError::Process(format!(
                "{} did not become ready ({:?})",
                c.name,
                line.trim()
            )));
        }
    }
    let stats = ServiceClient::connect(&settings.registry).await?;
    Ok(Roles::Children { children, stats })
}

/// The entry point of a role process (`volley testbed-role`): serve `role` until stdin closes,
/// at `listen` and at the same-host address `local`, if given.
pub fn role_main(
    role: Role,
    codec: CodecKind,
    settings: RoleSettings,
    listen: &str,
    local: Option<&str>,
) -> Result<(), TestbedError> {
    let rt = tokio::runtime::Runtime::new()?;
    let local: Vec<&str> = local.into_iter().collect();
    rt.block_on(async {
        let running = match codec {
            CodecKind::General => roles::start::<General>(role, &settings, listen, &local).await?,
            CodecKind::Fast => roles::start::<Fast>(role, &settings, listen, &local).await?,
        };
        let bound = running.server.addresses().first().map(|a| a.to_string()).unwrap_or_default();
        println!("ready {bound}");
        use std::io::Write;
        std::io::stdout().flush()?;
        // Until the driver closes our stdin (or dies), or an interrupt.
        let mut stdin = tokio::io::stdin();
        let mut sink = Vec::new();
        tokio::select! {
            _ = tokio::io::AsyncReadExt::read_to_end(&mut stdin, &mut sink) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        running.shutdown().await;
        Ok(())
    })
}
