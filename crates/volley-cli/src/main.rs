//! `volley`: run a registry controller or an echo server, list a registry, benchmark Volley,
//! run the search-engine testbed.

mod bench;
mod codec_bench;
mod controller;
mod echo;
mod testbed;

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
        /// Address to listen on: unix:///PATH or tcp://HOST:PORT.
        #[arg(long, default_value = "tcp://127.0.0.1:7411")]
        listen: String,
        /// Register the service with the registry at this address (and renew the lease until
        /// shut down, when it is revoked at once).
        #[arg(long)]
        registry: Option<String>,
        /// The service name to serve and register.
        #[arg(long, default_value = "echo")]
        name: String,
        /// The address to register, if clients must dial another one than --listen (for
        /// example when listening on 0.0.0.0).
        #[arg(long)]
        advertise: Option<String>,
    },
    /// Run a standalone registry controller until interrupted. Prints the bound address.
    Controller {
        /// Address to listen on: unix:///PATH or tcp://HOST:PORT.
        #[arg(long, default_value = "tcp://127.0.0.1:7400")]
        listen: String,
    },
    /// List the services and instances a registry knows.
    Ls {
        /// The registry controller's address.
        #[arg(long)]
        registry: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Echo benchmark: server and load generator in one process, or against `--connect ADDR`
    /// or `--registry ADDR`.
    /// `volley bench codec` benchmarks the codec tiers instead.
    Bench(BenchCommand),
    /// The search-engine testbed of seeds/000 §8 — Document, LA, Index shards and Main as
    /// Volley services — run over a matrix of configurations (relayed or direct, single calls
    /// or batches, codec tier), reporting indexing and query time, messages and bytes, and the
    /// cuts against the baseline (relayed + single calls + general codec). Every
    /// configuration's answers must agree (and match a brute-force scan on the synthetic
    /// corpus), or the command fails naming the first differing query.
    Testbed(testbed::TestbedArgs),
    /// One role process of `volley testbed --processes` (started by the testbed itself).
    #[command(hide = true)]
    TestbedRole(testbed::RoleArgs),
}

/// `volley bench [FLAGS]` runs the echo benchmark, as it always has; `volley bench codec
/// [FLAGS]` runs the codec benchmark. Echo flags and a subcommand do not mix.
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
    /// Codec tiers against each other and a bare memcpy: the seed's serialization tables 1-3
    /// (string, Vec<i32>, Vec<POD>, HashMap<String, i32>, HashMap<i32, i32>, hash-table inserts).
    Codec(codec_bench::CodecArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VOLLEY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::ServeEcho { listen, registry, name, advertise } => {
            echo::serve(&listen, registry.as_deref(), &name, advertise.as_deref())
        }
        Command::Controller { listen } => controller::serve(&listen),
        Command::Ls { registry, json } => controller::ls(&registry, json),
        Command::Bench(BenchCommand { what: Some(BenchWhat::Codec(args)), .. }) => codec_bench::run(args),
        Command::Bench(BenchCommand { what: None, echo }) => bench::run(echo),
        Command::Testbed(args) => testbed::run(args).map_err(|e| e.to_string()),
        Command::TestbedRole(args) => testbed::role(args).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volley: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
