//! `volley`: run a registry controller or an echo server, list a registry, benchmark Volley,
//! run the search-engine testbed.

mod bench;
mod call;
mod call_record;
mod conformance;
mod controller;
mod echo;
mod health;
mod output;
mod overload_bench;
mod payload;
mod protobuf;
mod refusal;
mod registry_bench;
mod rolling_bench;
mod shedding;
mod terminal;
mod testbed;
mod top;

// `--features mimalloc` or `--features jemalloc` picks the process's global allocator (both:
// jemalloc). The default is the system allocator: see docs/BENCHMARKS.md, "Global allocator".
#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The global allocator this binary was built with.
pub const GLOBAL_ALLOCATOR: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "volley", version, about = "Volley service messaging: registry, echo server and benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the built-in echo service until interrupted (Ctrl-C shuts down gracefully).
    ServeEcho {
        /// Address to listen on: unix:///PATH, tcp://HOST:PORT, tls://HOST:PORT (with
        /// --tls-cert and --tls-key) or shm:///PATH (shared memory with clients on this host).
        #[arg(long, default_value = "tcp://127.0.0.1:7411")]
        listen: String,
        /// Register the service with the registry at this address, or with the first that
        /// answers of a comma-separated list of controllers (and renew the lease until shut
        /// down, when it is revoked at once).
        #[arg(long)]
        registry: Option<String>,
        /// The service name to serve and register.
        #[arg(long, default_value = "echo")]
        name: String,
        /// The address to register, if clients must dial another one than --listen (for
        /// example when listening on 0.0.0.0).
        #[arg(long)]
        advertise: Option<String>,
        /// Also listen on this address that only clients on this host can open (shm://NAME,
        /// shm:///PATH or unix:///PATH), and register it beside the --listen address: clients
        /// on this host that prefer same-host addresses (`bench --prefer-local`) connect
        /// through it, others through --listen. May be given more than once.
        #[arg(long, value_name = "ADDR")]
        listen_local: Vec<String>,
        /// Serve the admin endpoint over HTTP on HOST:PORT (or a bare PORT on 127.0.0.1): a
        /// status page at /, Prometheus metrics at /metrics, JSON at /vars.json.
        #[arg(long, value_name = "ADDR")]
        admin: Option<String>,
        /// On SIGTERM or SIGINT: how long to keep serving after deregistering, while callers
        /// move to other instances, before the go-away (a second signal stops at once).
        #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
        grace: f64,
        /// Record the id of every request the handler runs (a payload's first 8 bytes, little
        /// endian, when not 0) in FILE, which survives the process however it ends: how
        /// `volley bench rolling` counts calls run twice.
        #[arg(long, value_name = "FILE")]
        record_calls: Option<std::path::PathBuf>,
        #[command(flatten)]
        security: echo::Security,
        #[command(flatten)]
        shedding: shedding::Shedding,
    },
    /// Run a standalone registry controller until interrupted. Prints the bound address.
    Controller {
        /// Address to listen on: unix:///PATH or tcp://HOST:PORT.
        #[arg(long, default_value = "tcp://127.0.0.1:7400")]
        listen: String,
        /// Where registrations, leases and client ids live: `memory` (this process only), or
        /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` so that several controllers over one etcd
        /// act as one registry (needs a build with `--features etcd`; see docs/ETCD.md).
        #[arg(long, default_value = "memory")]
        store: String,
        /// Refuse register, renew and deregister calls that do not carry this credential
        /// (read from the environment variable VOLLEY_REGISTRATION_CREDENTIAL if set there).
        /// Without one, anyone who can connect may register instances under any name: the
        /// controller warns at start, and `volley ls` says so.
        #[arg(long, env = "VOLLEY_REGISTRATION_CREDENTIAL", hide_env_values = true)]
        registration_credential: Option<String>,
        /// Refuse connections that do not present this token (environment: VOLLEY_TOKEN);
        /// servers present it with `serve-echo --registry-token`, clients with `--token`.
        #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Serve the admin endpoint over HTTP on HOST:PORT (or a bare PORT on 127.0.0.1): a
        /// status page at /, Prometheus metrics at /metrics, JSON at /vars.json.
        #[arg(long, value_name = "ADDR")]
        admin: Option<String>,
        /// Seconds a service whose last instance went is still known (listed, and its metric
        /// series kept) before the controller forgets it.
        #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
        forget_after: f64,
        #[command(flatten)]
        shedding: shedding::Shedding,
    },
    /// List the services and instances a registry knows.
    Ls {
        /// The registry controller's address (or several, comma-separated: the first that
        /// answers).
        #[arg(long)]
        registry: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// The token the controller requires (environment: VOLLEY_TOKEN).
        #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Also list each service's methods and their types (from the reflection of its
        /// first instance: `volley describe`).
        #[arg(long)]
        methods: bool,
    },
    /// Whether servers take new calls (`volley.health`): one server (`--connect ADDR
    /// [SERVICE]`) or every instance of a service (`--registry R SERVICE`), once or with
    /// `--watch` as it changes. Exits 0 when all serve, 1 when one does not or is draining, 2
    /// when one could not be asked.
    Health(health::HealthArgs),
    /// A server's services and methods, with each method's handler kind and the tier, format
    /// and type of its request and reply (from its `volley.reflect`): `volley describe ADDR`,
    /// or `volley describe --registry R SERVICE`.
    Describe(call::DescribeArgs),
    /// Call a method with JSON typed here, encoded for the method's format as the server's
    /// reflection names it; the reply is printed as JSON.
    ///
    /// volley call --connect tcp://127.0.0.1:7411 echo echo '"hello"'
    ///
    /// volley call --registry tcp://127.0.0.1:7400 shop buy '{"item":"tea","count":2}'
    ///
    /// seq 1000 | volley call --connect tcp://127.0.0.1:7411 math square --batch
    ///
    /// volley call --connect tcp://127.0.0.1:7400 shop.v1 buy '{"sku":"tea","qty":2}'
    ///
    /// A protobuf method (the last) takes and prints protobuf's JSON mapping, through the
    /// descriptor set its server's reflection hands out. A failed call exits with status 1 and
    /// prints its error code and message.
    Call(call::CallArgs),
    /// A process's methods from its admin endpoint (`--admin` of serve-echo, controller):
    /// calls/s, errors/s, p50/p99/p99.9 and batch sizes over the last seconds, redrawn every
    /// second until Ctrl-C.
    Top {
        /// The admin endpoint: HOST:PORT, http://HOST:PORT or a bare PORT on 127.0.0.1.
        addr: String,
        /// Seconds between redraws.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many redraws.
        #[arg(long)]
        count: Option<u64>,
    },
    /// A process's metrics from its admin endpoint, once: a table, or with --json the
    /// endpoint's /vars.json.
    Stats {
        /// The admin endpoint: HOST:PORT, http://HOST:PORT or a bare PORT on 127.0.0.1.
        addr: String,
        /// Print the endpoint's JSON (one object) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Echo benchmark: server and load generator in one process, or against `--connect ADDR`
    /// or `--registry ADDR`. `volley bench registry` runs the registry's scenarios instead.
    Bench(BenchCommand),
    /// The search-engine testbed of the 2009 MF message-framework report — Document, LA, Index
    /// shards and Main as Volley services — run over a matrix of configurations (relayed or
    /// direct, single calls or batches, codec tier), reporting indexing and query time,
    /// messages and bytes, and the cuts against the baseline (the old design's way: relayed,
    /// single calls, general codec) next to the cuts the report published. Every
    /// configuration's answers must agree (and match a brute-force scan on the synthetic
    /// corpus), or the command fails naming the first differing query.
    Testbed(testbed::TestbedArgs),
    /// The wire-protocol conformance suite against a server or client under test.
    Conformance(conformance::ConformanceArgs),
    /// One role process of `volley testbed --processes` (started by the testbed itself).
    #[command(hide = true)]
    TestbedRole(testbed::RoleArgs),
}

/// `volley bench [FLAGS]` runs the echo benchmark; `volley bench registry SCENARIO [FLAGS]` the
/// registry's scenarios, `volley bench overload` goodput under overload. Echo flags and a
/// subcommand do not mix. (The benchmarks of Volley's parts — codec tiers, memory pools, idle
/// connections, large payloads — are research, not the product: `volley-research` in
/// crates/volley-bench.)
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct BenchCommand {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    #[command(flatten)]
    echo: bench::BenchArgs,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// The registry under mistakes and attacks, each against an undisturbed run: `pollution`
    /// (2,000 dead instances beside 2 live ones, direct mode) and `restart` (the controller
    /// killed for 1 s under relayed load).
    Registry(registry_bench::RegistryBenchArgs),
    /// Goodput under overload: a server offered 10× its capacity by callers with 50 ms
    /// deadlines, with the deadlines sent to the server and without, side by side.
    Overload(overload_bench::OverloadArgs),
    /// A rolling restart under load, with real processes: a controller and three `serve-echo`
    /// instances, 64 callers through the ServiceClient; each instance in turn stopped (SIGTERM,
    /// SIGINT, or SIGKILL with --kill) and started again, three rounds. Reports failed calls,
    /// calls run twice (counted at the handler), p50/p99 around each restart, stop times.
    Rolling(rolling_bench::RollingArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VOLLEY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(terminal::stderr_colour())
        .init();
    let command = Cli::parse().command;
    if let Command::Health(args) = command {
        return health::run(args);
    }
    let result = match command {
        Command::ServeEcho {
            listen,
            registry,
            name,
            advertise,
            listen_local,
            admin,
            grace,
            record_calls,
            security,
            shedding,
        } => {
            let listen = echo::Listen { address: listen, advertise, local: listen_local };
            match Duration::try_from_secs_f64(grace) {
                Ok(grace) => {
                    let options = echo::Options { admin, grace, record_calls };
                    echo::serve(&listen, registry.as_deref(), &name, options, &security, shedding)
                }
                Err(_) => Err(format!("--grace {grace}: expected a number of seconds, 0 or more")),
            }
        }
        Command::Controller {
            listen,
            store,
            registration_credential,
            token,
            admin,
            forget_after,
            shedding,
        } => match Duration::try_from_secs_f64(forget_after) {
            Ok(forget_after) => controller::serve(
                &listen,
                &store,
                registration_credential,
                token,
                admin,
                forget_after,
                shedding,
            ),
            Err(_) => Err(format!("--forget-after {forget_after}: expected a number of seconds, 0 or more")),
        },
        Command::Ls { registry, json, token, methods } => controller::ls(&registry, json, token, methods),
        Command::Describe(args) => call::describe(args),
        Command::Call(args) => match call::call(args) {
            Ok(true) => Ok(()),
            // Each failed item is on its own line already.
            Ok(false) => return std::process::ExitCode::FAILURE,
            Err(e) => Err(e),
        },
        Command::Top { addr, interval, count } => match Duration::try_from_secs_f64(interval) {
            Ok(i) if !i.is_zero() => top::top(&addr, i, count),
            _ => Err(format!("--interval {interval}: expected a positive number of seconds")),
        },
        Command::Stats { addr, json } => top::stats(&addr, json),
        Command::Bench(BenchCommand { what: Some(BenchWhat::Registry(args)), .. }) => {
            registry_bench::run(args)
        }
        Command::Bench(BenchCommand { what: Some(BenchWhat::Overload(args)), .. }) => {
            overload_bench::run(args)
        }
        Command::Bench(BenchCommand { what: Some(BenchWhat::Rolling(args)), .. }) => rolling_bench::run(args),
        Command::Bench(BenchCommand { what: None, echo }) => bench::run(echo),
        Command::Testbed(args) => testbed::run(args).map_err(|e| e.to_string()),
        Command::Conformance(args) => conformance::run(args),
        Command::TestbedRole(args) => testbed::role(args).map_err(|e| e.to_string()),
        Command::Health(_) => unreachable!("answered above"),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volley: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
