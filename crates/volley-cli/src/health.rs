//! `volley health`: asks servers whether they take new calls (`volley.health`), once or as it
//! changes, directly or every instance of a service the registry lists.

use std::time::Duration;

use clap::Args;
use volley::health::{self, Health, HealthRequest, HealthWatch, Serving};
use volley::registry::Registry;
use volley::{CallOptions, Client, ClientConfig};

use crate::output::outln;
use crate::refusal;

/// `volley health`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["connect", "registry"])))]
pub struct HealthArgs {
    /// Ask the server at this address (unix:///PATH, tcp://HOST:PORT, ...).
    #[arg(long, value_name = "ADDR")]
    connect: Option<String>,
    /// Ask every instance of SERVICE that this registry lists (one controller's address, or
    /// several comma-separated).
    #[arg(long, value_name = "ADDR", requires = "service")]
    registry: Option<String>,
    /// The service asked about; without it, the server as a whole (with --connect).
    service: Option<String>,
    /// Print every change until interrupted, instead of asking once (with --connect).
    #[arg(long, conflicts_with = "registry")]
    watch: bool,
    /// Print JSON lines instead of text.
    #[arg(long)]
    json: bool,
    /// Give up on a server that does not answer within this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    timeout: f64,
    /// The token the servers (and the controller) require (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Exits 0 when everything asked about serves, 1 when something does not (or is draining),
/// 2 when a server could not be asked: what scripts and orchestrators' exec probes expect.
pub fn run(args: HealthArgs) -> std::process::ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(ask(&args)));
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("volley: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn ask(args: &HealthArgs) -> Result<bool, String> {
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| format!("--timeout {}: expected a positive number of seconds", args.timeout))?;
    let mut config = ClientConfig::default();
    config.token = args.token.clone().map(String::into_bytes);
    config.connect_timeout = timeout;
    let service = args.service.clone().unwrap_or_default();
    if let Some(addr) = &args.connect {
        let client = connect(addr, &config).await?;
        if args.watch {
            return watch(&client, addr, &service, timeout, args.json).await;
        }
        let h = check(&client, addr, &service, timeout).await?;
        print(addr, &service, &h, args.json);
        return Ok(h.status == Serving::Serving);
    }
    let registry = args.registry.as_deref().expect("clap requires --connect or --registry");
    let what = format!("registry {registry}");
    let r = Registry::connect_with(registry, config.clone()).await.map_err(|e| match e.is_permanent() {
        true => refusal::connecting(&what, &e, "--token", "VOLLEY_TOKEN"),
        false => format!("{what}: {e}"),
    })?;
    let resolved = r.resolve(&service).await.map_err(|e| format!("{what}: {e}"))?;
    if resolved.instances.is_empty() {
        let why = if resolved.known { "no instance is listed" } else { "the registry does not know it" };
        return Err(format!("{what}: service {service:?}: {why}"));
    }
    // Every instance at once: one that hangs costs its timeout, not the others'.
    let asks: Vec<_> = resolved
        .instances
        .iter()
        .map(|i| {
            let (config, service, address) = (config.clone(), service.clone(), i.address.clone());
            tokio::spawn(async move {
                let client = connect(&address, &config).await?;
                check(&client, &address, &service, timeout).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(asks.len());
    for ask in asks {
        answers.push(ask.await.map_err(|e| e.to_string())?);
    }
    let mut all_serving = true;
    let mut unreachable = 0;
    for (i, answer) in resolved.instances.iter().zip(answers) {
        match answer {
            Ok(h) => {
                all_serving &= h.status == Serving::Serving;
                print(&i.address, &service, &h, args.json);
            }
            Err(e) => {
                unreachable += 1;
                match args.json {
                    true => outln!(
                        "{}",
                        serde_json::json!({ "address": i.address, "service": service, "error": e })
                    ),
                    false => outln!("{}  {service}  unreachable: {e}", i.address),
                }
            }
        }
    }
    if unreachable > 0 {
        return Err(format!("{unreachable} of {} instances could not be asked", resolved.instances.len()));
    }
    Ok(all_serving)
}

async fn connect(addr: &str, config: &ClientConfig) -> Result<Client, String> {
    Client::connect_with(addr, config.clone()).await.map_err(|e| match e.is_permanent() {
        true => refusal::connecting(addr, &e, "--token", "VOLLEY_TOKEN"),
        false => format!("{addr}: {e}"),
    })
}

async fn check(client: &Client, addr: &str, service: &str, timeout: Duration) -> Result<Health, String> {
    let opts = CallOptions::default().timeout(timeout);
    client
        .call_with(&health::CHECK, HealthRequest::service(service), opts)
        .await
        .map_err(|e| explain(addr, e))
}

/// Prints the status now, then each change, until the connection fails (exit 2) or the
/// process is interrupted.
async fn watch(
    client: &Client,
    addr: &str,
    service: &str,
    timeout: Duration,
    json: bool,
) -> Result<bool, String> {
    let mut last = None;
    loop {
        let req = HealthWatch { service: service.to_string(), last, timeout_ms: 30_000 };
        // The watch is held up to its 30 s; the timeout is for the answer after that.
        let opts = CallOptions::default().timeout(Duration::from_secs(30) + timeout);
        let h = client.call_with(&health::WATCH, req, opts).await.map_err(|e| explain(addr, e))?;
        if last != Some(h.status) {
            print(addr, service, &h, json);
            last = Some(h.status);
        }
    }
}

fn explain(addr: &str, e: volley::Error) -> String {
    match &e {
        volley::Error::Remote(s)
            if s.code == volley::Code::UnknownMethod || s.code == volley::Code::UnknownService =>
        {
            if s.message.contains(health::SERVICE) {
                format!("{addr}: the server does not answer {} (older than it): {e}", health::SERVICE)
            } else {
                format!("{addr}: {e}")
            }
        }
        _ => format!("{addr}: {e}"),
    }
}

fn print(addr: &str, service: &str, h: &Health, json: bool) {
    if json {
        outln!(
            "{}",
            serde_json::json!({ "address": addr, "service": service, "status": h.status, "reason": h.reason })
        );
        return;
    }
    let what = if service.is_empty() { "(server)" } else { service };
    match h.reason.is_empty() {
        true => outln!("{addr}  {what}  {}", h.status),
        false => outln!("{addr}  {what}  {} ({})", h.status, h.reason),
    }
}
