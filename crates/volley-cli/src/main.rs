//! `volley`: run an echo server, benchmark Volley.

mod bench;
mod codec_bench;
mod echo;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "volley", version, about = "Volley service messaging: echo server and benchmarks")]
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
    },
    /// Echo benchmark: server and load generator in one process, or against `--connect ADDR`.
    /// `volley bench codec` benchmarks the codec tiers instead.
    Bench(BenchCommand),
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
        Command::ServeEcho { listen } => echo::serve(&listen),
        Command::Bench(BenchCommand { what: Some(BenchWhat::Codec(args)), .. }) => codec_bench::run(args),
        Command::Bench(BenchCommand { what: None, echo }) => bench::run(echo),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volley: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
