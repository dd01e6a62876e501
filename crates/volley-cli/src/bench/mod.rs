//! `volley bench`: the echo benchmark.
//!
//! N concurrent callers share one connection (through a registry in direct mode: one per
//! instance) and call `echo/echo` in a loop for a fixed time after a warm-up — single calls, or
//! `call_batch` of `--batch-size` requests. Latency of every call goes into an HDR histogram;
//! throughput is calls (and requests) completed inside the measured window divided by its
//! length. Frames and messages sent by the client show how well bundling works (messages per
//! frame). `--api` picks the `Method` layer or the `#[volley::service]` trait's generated client
//! and server (`both`: side by side, in rounds interleaved by `--rounds`, with the ratio of the
//! medians); `--hostile` adds a misbehaving connection beside the callers.
//!
//! This file decides where the server and the callers run; the flags are in `args`, the
//! transports in `transport`, the servers started here in `local`, the clients in `caller`,
//! one measurement in `measure`, the output in `report`.

mod api;
mod args;
mod caller;
mod hostile;
mod local;
mod measure;
mod raw;
mod report;
mod resources;
mod stream;
mod transport;

use tokio::runtime::Runtime;

use api::Api;
pub use args::BenchArgs;
use args::{RegistryMode, RuntimeMode, plan};
use local::{Local, Target};
use measure::drive;
use report::Report;
use transport::Transport;

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.stream {
        return stream::run(&args);
    }
    if args.raw && (args.connect.is_some() || args.transport != Transport::Tcp) {
        return Err("--raw runs its own bare tcp echo: use it with --transport tcp, without --connect".into());
    }
    // Checked here so a bad --mode fails before anything starts; `drive` reads the styles.
    let (mode, _) = plan(&args)?;
    let reports = match (&args.connect, &args.registry, args.runtime) {
        (Some(addr), _, _) => client_runtime(args.runtime)?
            .block_on(drive(every_api(&args, Target::Plain(addr.clone())), args.clone()))?,
        (None, Some(reg), _) => client_runtime(args.runtime)?
            .block_on(drive(every_api(&args, Target::Registry(reg.clone(), mode)), args.clone()))?,
        (None, None, RuntimeMode::Split) => on_two_threads(&args, mode)?,
        (None, None, runtime) => client_runtime(runtime)?.block_on(in_one_runtime(&args, mode))?,
    };
    report::print_all(&reports, args.json)?;
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    if errors > 0 {
        return Err(format!("{errors} requests failed"));
    }
    Ok(())
}

/// The same target for every API measured (`plan` allows several APIs only with servers
/// started here, so a target given on the command line has one).
fn every_api(args: &BenchArgs, target: Target) -> Vec<(Api, Target)> {
    args.api.apis().into_iter().map(|api| (api, target.clone())).collect()
}

/// `--runtime split`: the server (and the controller, in registry modes) on a thread and a
/// single-threaded runtime of their own, the callers on this thread's.
fn on_two_threads(args: &BenchArgs, mode: RegistryMode) -> Result<Vec<Report>, String> {
    let (target_tx, target_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_args = args.clone();
    let server_thread = std::thread::Builder::new()
        .name("volley-server".into())
        .spawn(move || -> Result<(), String> {
            resources::server_cpu::register_this_thread();
            current_thread()?.block_on(serve_until_stopped(&server_args, mode, target_tx, stop_rx));
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let targets = target_rx.recv().map_err(|e| e.to_string())??;
    let reports = current_thread()?.block_on(drive(targets, args.clone()));
    let _ = stop_tx.send(());
    server_thread.join().map_err(|_| "server thread panicked".to_string())??;
    reports
}

/// The server side of `--runtime split`: starts the servers, sends their targets, serves until
/// told to stop.
async fn serve_until_stopped(
    args: &BenchArgs,
    mode: RegistryMode,
    targets: std::sync::mpsc::Sender<Result<Vec<(Api, Target)>, String>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    if args.raw {
        let bound = raw::listen().await;
        let _ = targets.send(bound.map(|b| vec![(Api::Method, Target::Plain(b))]));
        let _ = stop.await;
        return;
    }
    match Local::start_all(args, mode, &args.api.apis()).await {
        Ok((started, locals)) => {
            let _ = targets.send(Ok(started));
            let _ = stop.await;
            for local in locals {
                local.shutdown().await;
            }
        }
        Err(e) => {
            let _ = targets.send(Err(e));
        }
    }
}

/// `--runtime shared|multi`: the servers and the callers on one runtime.
async fn in_one_runtime(args: &BenchArgs, mode: RegistryMode) -> Result<Vec<Report>, String> {
    if args.raw {
        let addr = raw::listen().await?;
        return drive(vec![(Api::Method, Target::Plain(addr))], args.clone()).await;
    }
    let (targets, locals) = Local::start_all(args, mode, &args.api.apis()).await?;
    let reports = drive(targets, args.clone()).await;
    for local in locals {
        local.shutdown().await;
    }
    reports
}

fn current_thread() -> Result<Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

fn client_runtime(mode: RuntimeMode) -> Result<Runtime, String> {
    match mode {
        RuntimeMode::Multi => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string()),
        _ => current_thread(),
    }
}
