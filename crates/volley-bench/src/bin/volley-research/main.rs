//! `volley-research`: benchmarks of Volley's parts on their own — the codec tiers, the memory
//! pools against general allocators, the memory of idle connections, large payloads off the
//! connection's task — that informed its design. They are research, not the product: the
//! `volley` binary does not carry them (nor the allocators the pool benchmark compares).
//! docs/BENCHMARKS.md gives each one's method and latest figures.

mod codec;
mod idle;
mod large;
mod output;
mod pools;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "volley-research",
    about = "Benchmarks of Volley's codec tiers, memory pools, idle connections and large payloads"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Codec tiers against each other and a bare memcpy: the MF report's serialization tables
    /// 1-3 (string, Vec<i32>, Vec<POD>, HashMap<String, i32>, HashMap<i32, i32>, hash-table
    /// inserts).
    Codec(codec::CodecArgs),
    /// Memory pools against the system allocator, mimalloc and jemalloc: the experiments of a
    /// published study of memory pools in a high-concurrency search service (fixed-size churn,
    /// hash-table churn with 1 and N threads, a map from a custom allocator, variable sizes
    /// with 4 threads, 4-byte arena allocations).
    Pools(pools::PoolsArgs),
    /// The server's resident memory with N idle TCP connections (clients in a child process).
    Idle(idle::IdleArgs),
    /// Large-payload echo over TCP: the server's (de)serialization on the connection's task
    /// against on the codec pool, side by side (1 MiB, bitcode and JSON).
    Large(large::LargeArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Codec(args) => codec::run(args),
        Command::Pools(args) => pools::run(args),
        Command::Idle(args) => idle::run(args),
        Command::Large(args) => large::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volley-research: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
