//! `volley`: run an echo server, benchmark Volley.

mod bench;
mod echo;

use clap::{Parser, Subcommand};

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
    Bench(bench::BenchArgs),
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
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volley: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
