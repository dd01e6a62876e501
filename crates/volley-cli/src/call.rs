//! `volley describe` (a server's methods and their types, from its `volley.reflect`) and
//! `volley call` (one method called with JSON typed at a shell, or one call per line of
//! standard input), against a server's address or a service by name through a registry.

use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use serde_json::Value;
use volley::bytes::Bytes;
use volley::reflect::{Catalog, MethodInfo, ServiceInfo};
use volley::registry::Registry;
use volley::service_client::ServiceConfig;
use volley::{BatchOptions, CallOptions, Client, ClientConfig, Error, Method, ServiceClient};

use crate::output::outln;
use crate::payload::{self, Options, Shape};

/// Where the server is: an address, or a service's instances through a registry.
#[derive(Args, Clone)]
pub struct Target {
    /// The server's address (tcp://HOST:PORT, unix:///PATH, tls://HOST:PORT, shm://NAME).
    #[arg(long, value_name = "ADDR", conflicts_with = "registry")]
    pub connect: Option<String>,
    /// A registry controller's address: the service is found by name there.
    #[arg(long, value_name = "ADDR")]
    pub registry: Option<String>,
    /// The token the server (and registry) require (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `volley call`'s arguments.
#[derive(Args)]
pub struct CallArgs {
    #[command(flatten)]
    target: Target,
    /// The service.
    service: String,
    /// The method.
    method: String,
    /// The request as JSON (a string, number, object, array, or null; for a protobuf message,
    /// an object in protobuf's JSON mapping). Omit it for a method that takes no value, or
    /// with --batch.
    json: Option<String>,
    /// Read one request (JSON) per line of standard input and print one result per line, in
    /// order; the exit status is 1 if any failed.
    #[arg(long)]
    batch: bool,
    /// Route by this key on the service's consistent-hash ring (the same instance for the same
    /// key; needs --registry). The key is a string.
    #[arg(long)]
    key: Option<String>,
    /// Seconds each call may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    timeout: f64,
    /// Bytes as base64 (requests and replies), not UTF-8 text; also the way to send a payload
    /// whose format JSON cannot describe (bitcode, plain-data structs).
    #[arg(long)]
    base64: bool,
}

/// `volley describe`'s arguments.
#[derive(Args)]
pub struct DescribeArgs {
    /// The server's address; or, with --registry, the service to describe.
    what: String,
    /// Find the service by name through this registry (and describe its first instance).
    #[arg(long, value_name = "ADDR")]
    registry: Option<String>,
    /// Print the catalog as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The token the server (and registry) require (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

fn client_config(token: &Option<String>) -> ClientConfig {
    let mut c = ClientConfig::default();
    c.token = token.clone().map(String::into_bytes);
    c
}

/// The catalog of the server at `addr`.
pub async fn reflect(addr: &str, token: &Option<String>) -> Result<Catalog, String> {
    let client = Client::connect_with(addr, client_config(token))
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    match client.call(&volley::reflect::LIST, ()).await {
        Ok(c) => Ok(c.into_inner()),
        Err(Error::Remote(s)) if s.code == volley::Code::UnknownService => Err(format!(
            "{addr} does not answer volley.reflect (reflection is off, or the server predates it)"
        )),
        Err(e) => Err(format!("{addr}: volley.reflect: {e}")),
    }
}

/// The address of a live instance of `service` in the registry at `registry`.
async fn instance(registry: &str, service: &str, token: &Option<String>) -> Result<String, String> {
    let r = Registry::connect_with(registry, client_config(token))
        .await
        .map_err(|e| format!("registry {registry}: {e}"))?;
    let resolved = r.resolve(service).await.map_err(|e| format!("registry {registry}: {e}"))?;
    resolved
        .instances
        .first()
        .map(|i| i.address.clone())
        .ok_or_else(|| format!("registry {registry}: service {service:?} has no instance"))
}

pub fn describe(args: DescribeArgs) -> Result<(), String> {
    runtime()?.block_on(async {
        let (addr, only) = match &args.registry {
            Some(r) => (instance(r, &args.what, &args.token).await?, Some(args.what.as_str())),
            None => (args.what.clone(), None),
        };
        let mut catalog = reflect(&addr, &args.token).await?;
        if let Some(service) = only {
            catalog.services.retain(|s| s.name == service);
        }
        if args.json {
            let out = serde_json::json!({ "address": addr, "services": catalog.services });
            outln!("{out}");
        } else {
            outln!("{addr}");
            for s in &catalog.services {
                print_service(s, "");
            }
        }
        Ok(())
    })
}

/// A service's methods, one line each: name, handler kind, request and reply.
pub fn print_service(s: &ServiceInfo, indent: &str) {
    outln!("{indent}{}", s.name);
    for m in &s.methods {
        outln!("{indent}  {}", method_line(m));
    }
}

pub fn method_line(m: &MethodInfo) -> String {
    let ty = |t: &volley::reflect::TypeInfo| format!("{} ({} {})", short(&t.name), t.tier, t.format);
    format!("{:<16} {:<6}  {} -> {}", m.name, m.kind.name(), ty(&m.request), ty(&m.reply))
}

/// A type name without its module paths: `alloc::vec::Vec<u8>` → `Vec<u8>`.
fn short(name: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    for c in name.chars().chain(std::iter::once('\0')) {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(""));
            word.clear();
            if c != '\0' {
                out.push(c);
            }
        }
    }
    out
}

/// How the calls reach the service.
enum Caller {
    Direct(Client),
    Named(ServiceClient),
}

pub fn call(args: CallArgs) -> Result<bool, String> {
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| format!("--timeout {}: expected a positive number of seconds", args.timeout))?;
    let opts = Options { base64: args.base64 };
    runtime()?.block_on(async {
        let t = &args.target;
        let (addr, caller) = match (&t.connect, &t.registry) {
            (Some(addr), _) => {
                if args.key.is_some() {
                    return Err("--key routes among a service's instances: it needs --registry".into());
                }
                let client = Client::connect_with(addr, client_config(&t.token))
                    .await
                    .map_err(|e| format!("connecting to {addr}: {e}"))?;
                (addr.clone(), Caller::Direct(client))
            }
            (None, Some(registry)) => {
                let addr = instance(registry, &args.service, &t.token).await?;
                let mut config = ServiceConfig::default();
                config.client = client_config(&t.token);
                let sc = ServiceClient::connect_with(registry, config)
                    .await
                    .map_err(|e| format!("registry {registry}: {e}"))?;
                (addr, Caller::Named(sc))
            }
            (None, None) => return Err("say where the service is: --connect ADDR or --registry ADDR".into()),
        };
        let catalog = reflect(&addr, &t.token).await?;
        let m = catalog.method(&args.service, &args.method).ok_or_else(|| {
            match catalog.service(&args.service) {
                None => format!(
                    "{addr} has no service {:?} (volley describe {addr} lists what it has)",
                    args.service
                ),
                Some(_) => format!(
                    "service {:?} has no method {:?} (volley describe {addr})",
                    args.service, args.method
                ),
            }
        })?;
        let (request_shape, reply_shape) = (Shape::of(&m.request), Shape::of(&m.reply));
        // The names live as long as the process: a method descriptor holds static names.
        let method: Method<Bytes, Bytes> =
            Method::new(Box::leak(args.service.clone().into()), Box::leak(args.method.clone().into()));
        if args.batch {
            let lines: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .collect::<Result<_, _>>()
                .map_err(|e| format!("reading standard input: {e}"))?;
            let lines: Vec<&str> = lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
            let mut requests = Vec::with_capacity(lines.len());
            for (i, l) in lines.iter().enumerate() {
                let v: Value =
                    serde_json::from_str(l).map_err(|e| format!("line {}: not JSON: {e}", i + 1))?;
                let payload =
                    payload::encode(&request_shape, &v, opts).map_err(|e| format!("line {}: {e}", i + 1))?;
                requests.push(Bytes::from(payload));
            }
            let results = match &caller {
                Caller::Direct(c) => {
                    c.call_batch_with(&method, requests, BatchOptions::default().timeout(timeout)).await
                }
                Caller::Named(sc) => match &args.key {
                    None => sc.call_batch(&method, requests).await,
                    Some(key) => {
                        let mut out = Vec::with_capacity(requests.len());
                        for r in requests {
                            let o = CallOptions::default().timeout(timeout);
                            out.push(sc.call_keyed_with(&method, key.as_str(), r, o).await);
                        }
                        out
                    }
                },
            };
            let mut all_ok = true;
            for r in results {
                match r.map_err(|e| error_json(&e)).and_then(|p| {
                    payload::decode(&reply_shape, &p, opts)
                        .map_err(|e| serde_json::json!({"error": {"message": e}}))
                }) {
                    Ok(v) => outln!("{v}"),
                    Err(e) => {
                        all_ok = false;
                        outln!("{e}");
                    }
                }
            }
            return Ok(all_ok);
        }
        let v: Value = match &args.json {
            Some(text) => serde_json::from_str(text).map_err(|e| format!("the request is not JSON: {e}"))?,
            None if m.request.format == "unit" => Value::Null,
            None => {
                return Err(format!(
                    "{}/{} takes a {}: give it as JSON",
                    args.service, args.method, m.request.format
                ));
            }
        };
        let request = Bytes::from(payload::encode(&request_shape, &v, opts)?);
        let o = CallOptions::default().timeout(timeout);
        let reply = match (&caller, &args.key) {
            (Caller::Direct(c), _) => c.call_with(&method, request, o).await,
            (Caller::Named(sc), None) => sc.call_with(&method, request, o).await,
            (Caller::Named(sc), Some(key)) => sc.call_keyed_with(&method, key.as_str(), request, o).await,
        };
        match reply {
            Ok(p) => {
                outln!("{}", payload::decode(&reply_shape, &p, opts)?);
                Ok(true)
            }
            Err(e) => Err(error_line(&e)),
        }
    })
}

/// A failed call as one line: its code (by name and number) and message.
fn error_line(e: &Error) -> String {
    match e {
        Error::Remote(s) => format!("{:?} ({}): {}", s.code, s.code.to_u16(), s.message),
        other => other.to_string(),
    }
}

/// A failed item of a batch, as the line printed in its place.
fn error_json(e: &Error) -> Value {
    match e {
        Error::Remote(s) => {
            serde_json::json!({"error": {"code": format!("{:?}", s.code), "number": s.code.to_u16(), "message": s.message}})
        }
        other => serde_json::json!({"error": {"message": other.to_string()}}),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(super::short("alloc::vec::Vec<u8>"), "Vec<u8>");
        assert_eq!(super::short("volley::codec::wrap::Json<app::Order>"), "Json<Order>");
        assert_eq!(super::short("()"), "()");
    }
}
