//! `volley testbed`: the search-engine testbed of the 2009 MF message-framework report, over
//! Volley, with its report; `volley testbed-role` is the hidden subcommand a role process runs.

use std::path::PathBuf;

use crate::output::{out, outln};
use clap::{Args, ValueEnum};
use volley::service_client::Mode;
use volley_testbed::roles::{Role, RoleSettings};
use volley_testbed::run::DEFAULT_BATCH;
use volley_testbed::{CodecKind, Config, CorpusSpec, Setup, Transport};

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Relayed,
    Direct,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CodecArg {
    /// JSON (the general tier, self-describing; the baseline's codec).
    General,
    /// bitcode.
    Fast,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PythonRole {
    /// Linguistic analysis (`la`/`analyze`).
    La,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TransportArg {
    Inproc,
    Unix,
    Tcp,
    /// Shared memory (Linux), set up over unix sockets.
    Shm,
    /// Through the registry: every role registers a tcp address and a shm address beside it,
    /// and the clients (all on this host) connect through the shm one.
    #[value(name = "tcp+shm")]
    TcpShm,
}

/// Default synthetic corpus size: the default matrix (five configurations, the slowest the
/// relayed single-call JSON baseline) finishes well within a minute on a busy 2-core machine.
pub const DEFAULT_DOCS: u32 = 3000;

#[derive(Args)]
pub struct TestbedArgs {
    /// Synthetic corpus: number of documents (40-160 words each, Zipf-distributed vocabulary).
    #[arg(long, default_value_t = DEFAULT_DOCS)]
    docs: u32,
    /// Seed of the synthetic corpus and of the query draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Read the corpus from the regular files in DIR instead (one document per file).
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Index shards (Index instances; terms are routed to them by key hash).
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Queries per class (high- and low-frequency terms; half OR, half AND).
    #[arg(long, default_value_t = 400)]
    queries: usize,
    /// Run one configuration (plus the baseline) with this registry mode instead of the matrix.
    /// Any of --mode, --batch, --single, --codec selects one configuration; the others then
    /// default to direct, batches of 128 and the fast codec.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Run one configuration with requests of up to N items (documents, queries).
    #[arg(long, value_name = "N", conflicts_with = "single")]
    batch: Option<usize>,
    /// Run one configuration with single calls (one item per request).
    #[arg(long)]
    single: bool,
    /// Run one configuration with this codec tier.
    #[arg(long, value_enum)]
    codec: Option<CodecArg>,
    /// How the roles talk: unix sockets (default), tcp on loopback, shared memory (shm), tcp
    /// addresses with shm ones beside them in the registry, which the clients prefer (tcp+shm),
    /// or inproc (no encoding, so no bytes or messages counted).
    #[arg(long, value_enum, default_value = "unix")]
    transport: TransportArg,
    /// Run every role in its own process (started and stopped by the testbed); needs unix, tcp,
    /// shm or tcp+shm.
    #[arg(long)]
    processes: bool,
    /// Run the LA role as a Python process (`python -m volley.testbed_la`, from
    /// clients/python), the other roles in Rust: a mixed system end to end. Needs
    /// --processes and --codec general (the fast tier, bitcode, is Rust's only).
    #[arg(long, value_enum, requires = "processes")]
    python_role: Option<PythonRole>,
    /// The Python interpreter for --python-role (with the volley package installed).
    #[arg(long, default_value = "python3", requires = "python_role")]
    python: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the % cuts against the baseline as a bar chart (PNG).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    shedding: crate::shedding::Shedding,
}

pub fn run(a: TestbedArgs) -> Result<(), Box<dyn std::error::Error>> {
    let transport = match a.transport {
        TransportArg::Inproc => Transport::Inproc,
        TransportArg::Unix => Transport::Unix,
        TransportArg::Tcp => Transport::Tcp,
        TransportArg::Shm => Transport::Shm,
        TransportArg::TcpShm => Transport::TcpShm,
    };
    if a.processes && transport == Transport::Inproc {
        return Err("--processes needs --transport unix, tcp, shm or tcp+shm".into());
    }
    let corpus = match &a.corpus {
        Some(d) => CorpusSpec::Dir(d.clone()),
        None => CorpusSpec::Synthetic { docs: a.docs, seed: a.seed },
    };
    if a.python_role.is_some() && !matches!(a.codec, Some(CodecArg::General)) {
        return Err("--python-role needs --codec general: the fast tier (bitcode) has no Python codec".into());
    }
    let single_config = a.mode.is_some() || a.batch.is_some() || a.single || a.codec.is_some();
    let configs = if single_config {
        let config = Config {
            mode: match a.mode {
                Some(ModeArg::Relayed) => Mode::Relayed,
                _ => Mode::Direct,
            },
            batch: if a.single { 1 } else { a.batch.unwrap_or(DEFAULT_BATCH).max(1) },
            codec: match a.codec {
                Some(CodecArg::General) => CodecKind::General,
                _ => CodecKind::Fast,
            },
            transport,
        };
        let base = Config::baseline(transport);
        if config == base { vec![base] } else { vec![base, config] }
    } else {
        Config::matrix(transport, DEFAULT_BATCH)
    };
    let setup = Setup {
        corpus,
        shards: a.shards.max(1),
        queries: a.queries,
        query_seed: a.seed,
        processes: a.processes,
        exe: None,
        role_commands: match a.python_role {
            Some(PythonRole::La) => {
                vec![("la".into(), vec![a.python.clone(), "-m".into(), "volley.testbed_la".into()])]
            }
            None => Vec::new(),
        },
        progress: !a.json,
        adaptive_limit: a.shedding.adaptive_limit,
    };
    let report = volley_testbed::run(&setup, &configs)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        out!("{}", report.table());
    }
    if let Some(path) = &a.plot {
        volley_testbed::plot::draw(&report, path)?;
        if !a.json {
            outln!("plot: {}", path.display());
        }
    }
    match &report.mismatch {
        Some(m) => Err(format!("testbed results disagree: {m}").into()),
        None => Ok(()),
    }
}

/// `volley testbed-role`: one role of a `--processes` run (started by `volley testbed`).
#[derive(Args)]
pub struct RoleArgs {
    /// document, la, indexN or main.
    #[arg(long)]
    role: String,
    #[arg(long)]
    registry: String,
    #[arg(long)]
    listen: String,
    /// A same-host address to listen on too, registered beside --listen.
    #[arg(long)]
    listen_local: Option<String>,
    /// Connect to instances on this host through their same-host addresses.
    #[arg(long)]
    prefer_local: bool,
    #[arg(long, value_enum)]
    mode: ModeArg,
    #[arg(long)]
    batch: usize,
    #[arg(long, value_enum)]
    codec: CodecArg,
    #[arg(long, default_value_t = DEFAULT_DOCS)]
    docs: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    corpus: Option<PathBuf>,
    #[command(flatten)]
    shedding: crate::shedding::Shedding,
}

pub fn role(a: RoleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let role = match a.role.as_str() {
        "document" => Role::Document,
        "la" => Role::La,
        "main" => Role::Main,
        other => match other.strip_prefix("index").and_then(|n| n.parse().ok()) {
            Some(n) => Role::Index(n),
            None => return Err(format!("unknown role {other}").into()),
        },
    };
    let settings = RoleSettings {
        registry: a.registry,
        mode: match a.mode {
            ModeArg::Relayed => Mode::Relayed,
            ModeArg::Direct => Mode::Direct,
        },
        batch: a.batch,
        corpus: match a.corpus {
            Some(d) => CorpusSpec::Dir(d),
            None => CorpusSpec::Synthetic { docs: a.docs, seed: a.seed },
        },
        prefer_local: a.prefer_local,
        concurrency_limit: a.shedding.limit(),
    };
    let codec = match a.codec {
        CodecArg::General => CodecKind::General,
        CodecArg::Fast => CodecKind::Fast,
    };
    volley_testbed::run::role_main(role, codec, settings, &a.listen, a.listen_local.as_deref())?;
    Ok(())
}
