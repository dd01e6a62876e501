//! `volley conformance`: the wire-protocol conformance suite of tests/conformance, played
//! against any implementation over a socket (the runners are in the `volley-conformance`
//! crate; tests/conformance/README.md says what each side checks).

use std::io::BufRead;
use std::time::Duration;

use clap::{Args, Subcommand};
use volley_conformance::client_side::ClientSide;
use volley_conformance::evolution::{self, Release};
use volley_conformance::going_away::{self, Plan, Step};
use volley_conformance::json::unhex_checked;
use volley_conformance::{Report, driver, interop, server_side};

#[derive(Args)]
pub struct ConformanceArgs {
    #[command(subcommand)]
    side: Side,
}

#[derive(Subcommand)]
enum Side {
    /// Connect to a server under test at ADDR (tcp://HOST:PORT or unix:///PATH) serving
    /// echo/echo, and play the server cases; exit non-zero if any fails.
    Server {
        addr: String,
        /// Seconds each case may take before it fails (a server that never closes).
        #[arg(long, default_value_t = 30.0)]
        per_case: f64,
        /// A shell command that makes the server under test shut down gracefully (say
        /// `kill -TERM 1234`), run after the other cases with a connection open: the server
        /// must then send GoAway(ShuttingDown) on it. Without it that case is not played.
        #[arg(long)]
        stop_command: Option<String>,
    },
    /// Listen at ADDR (port 0: any) and play the server's side of the client cases against
    /// the driver of a client under test (`volley conformance drive` for the Rust client,
    /// `python -m volley.conformance` for Python); exit non-zero if any fails.
    Client {
        addr: String,
        /// Seconds to wait for a driver to play every case.
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
    },
    /// The Rust client's driver: play the cases of a `volley conformance client` runner at ADDR.
    Drive {
        addr: String,
        /// Seconds each call may take.
        #[arg(long, default_value_t = 30.0)]
        call_timeout: f64,
    },
    /// The Rust client against a server under test at ADDR serving echo/echo and
    /// echo/fail_odd: payloads to 1 MiB, 1,000 pipelined calls, a batch of 10,000 with
    /// failures in place, unknown names and (with --token, which the server requires) bad
    /// tokens; exit non-zero if any fails.
    Interop {
        addr: String,
        #[arg(long)]
        token: Option<String>,
    },
    /// The Rust client against a server under test at ADDR (serving echo/echo) that goes away
    /// mid-batch, made to by whoever runs this: it streams a batch of ITEMS through the server;
    /// once half is answered it prints a line asking for the server to be stopped (SIGSTOP)
    /// and waits for a line on stdin; then it sends SINGLES calls and more of the batch, prints
    /// a line asking for the server to go away (SIGKILL) and waits for a line again. Every item
    /// and call must then end exactly once, with its own reply or a connection error; exit
    /// non-zero if not.
    GoingAway {
        addr: String,
        #[arg(long)]
        token: Option<String>,
        /// Items of the batch (chunks of 100, 8 in flight).
        #[arg(long, default_value_t = 10_000)]
        items: usize,
        /// Single calls sent while the server is stopped.
        #[arg(long, default_value_t = 100)]
        singles: usize,
    },
    /// Serve echo/echo and echo/fail_odd at ADDR (port 0: any) until interrupted: the Rust
    /// server that other implementations' clients check themselves against.
    Serve {
        addr: String,
        /// Require this token of every connection.
        #[arg(long)]
        token: Option<String>,
    },
    /// Serve `evolve/json`, `evolve/msgpack` and `evolve/proto` at ADDR (port 0: any) with the
    /// old or the new release of their item type (the new one adds a field with a default)
    /// until interrupted: the Rust server of the cross-language evolution tests
    /// (PROTOCOL.md §15.5).
    EvolutionServe {
        addr: String,
        /// old or new.
        #[arg(long)]
        release: Release,
    },
    /// Call `evolve/json`, `evolve/msgpack` and `evolve/proto` at ADDR once each with the old
    /// or the new release of their item type, and print what the replies decoded to, as one
    /// JSON object by tier: the Rust client of the cross-language evolution tests.
    EvolutionCall {
        addr: String,
        /// old or new.
        #[arg(long)]
        release: Release,
    },
    /// The reference stable hash (PROTOCOL.md §15.2; with --seed, the seeded XXH3-64 of the
    /// hash ring, §16.6) of each line of hex on stdin, one lower-case hex hash per line: for
    /// checking another implementation's hash against this one.
    Hash {
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

pub fn run(args: ConformanceArgs) -> Result<(), String> {
    let secs = |what: &str, s: f64| {
        Duration::try_from_secs_f64(s).map_err(|_| format!("--{what} {s}: expected a number of seconds"))
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("starting the runtime: {e}"))?;
    match args.side {
        Side::Server { addr, per_case, stop_command } => {
            let per_case = secs("per-case", per_case)?;
            let stop = stop_command.map(stop_by_command);
            verdict(runtime.block_on(server_side::play_and_stop(&addr, per_case, stop)))
        }
        Side::Client { addr, timeout } => {
            let timeout = secs("timeout", timeout)?;
            runtime.block_on(async {
                let runner = ClientSide::bind(&addr).await?;
                // Drivers and tests wait for this line: it carries the port picked for port 0.
                println!("conformance runner on {}", runner.address());
                verdict(runner.serve(timeout).await)
            })
        }
        Side::Drive { addr, call_timeout } => {
            let call_timeout = secs("call-timeout", call_timeout)?;
            let refused = runtime.block_on(driver::drive(&addr, call_timeout)).map_err(|e| e.to_string())?;
            match refused.as_slice() {
                [] => Ok(()),
                _ => Err(format!("the runner refused these outcomes:\n{}", refused.join("\n"))),
            }
        }
        Side::Interop { addr, token } => verdict(runtime.block_on(interop::check(&addr, token.as_deref()))),
        Side::GoingAway { addr, token, items, singles } => {
            if !(2..=u32::MAX as usize).contains(&items) {
                return Err(format!("--items {items}: expected 2 to {}", u32::MAX));
            }
            let plan = Plan { items, singles, ..Plan::default() };
            verdict(runtime.block_on(going_away::check(&addr, token.as_deref(), plan, prompt)))
        }
        Side::Serve { addr, token } => runtime.block_on(serve(&addr, token.as_deref())),
        Side::EvolutionServe { addr, release } => runtime.block_on(async {
            let server = evolution::server(release);
            let bound = server.listen(&addr).await.map_err(|e| format!("listening on {addr}: {e}"))?;
            // Tests wait for this line: it carries the port picked for port 0.
            println!("evolution server on {bound}");
            tokio::signal::ctrl_c().await.map_err(|e| format!("waiting for Ctrl-C: {e}"))?;
            server.shutdown().await;
            Ok(())
        }),
        Side::EvolutionCall { addr, release } => {
            println!("{}", runtime.block_on(evolution::call(&addr, release))?);
            Ok(())
        }
        Side::Hash { seed } => hash_lines(seed),
    }
}

/// Runs `command` with `sh -c` to stop the server under test; it must exit successfully.
fn stop_by_command(command: String) -> server_side::Stop {
    Box::new(move || {
        Box::pin(async move {
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&command)
                .status()
                .await
                .map_err(|e| format!("running {command:?}: {e}"))?;
            if status.success() { Ok(()) } else { Err(format!("{command:?} exited with {status}")) }
        })
    })
}

fn verdict(report: Report) -> Result<(), String> {
    print!("{}", report.render());
    if report.passed() { Ok(()) } else { Err("conformance cases failed".into()) }
}

/// Asks (on stdout) for the server to be acted on, and waits for the line on stdin that says
/// it was.
async fn prompt(step: Step) -> Result<(), String> {
    match step {
        Step::Stop { answered, items } => {
            println!("{answered} of {items} items answered: stop the server, then send a line")
        }
        Step::GoAway { in_flight } => {
            println!("{in_flight} calls in flight: make the server go away, then send a line")
        }
    }
    let read = tokio::task::spawn_blocking(|| std::io::stdin().lock().read_line(&mut String::new()));
    match tokio::time::timeout(Duration::from_secs(600), read).await {
        Ok(Ok(Ok(n))) if n > 0 => Ok(()),
        Ok(Ok(Ok(_))) => Err("stdin closed before the server was acted on".into()),
        Ok(Ok(Err(e))) => Err(format!("reading stdin: {e}")),
        Ok(Err(e)) => Err(format!("reading stdin: {e}")),
        Err(_) => Err("no line on stdin within 600 s".into()),
    }
}

async fn serve(addr: &str, token: Option<&str>) -> Result<(), String> {
    let server = interop::reference_server(token);
    let bound = server.listen(addr).await.map_err(|e| format!("listening on {addr}: {e}"))?;
    // Tests wait for this line: it carries the port picked for port 0.
    println!("conformance server on {bound}");
    tokio::signal::ctrl_c().await.map_err(|e| format!("waiting for Ctrl-C: {e}"))?;
    server.shutdown().await;
    Ok(())
}

fn hash_lines(seed: u64) -> Result<(), String> {
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.map_err(|e| format!("reading stdin: {e}"))?;
        let bytes = unhex_checked(line.trim()).map_err(|e| format!("line {}: {e}", n + 1))?;
        println!("{:016x}", volley_conformance::xxh3(&bytes, seed));
    }
    Ok(())
}
