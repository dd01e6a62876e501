//! The built-in echo service.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use volley::bytes::Bytes;
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::{
    BidiStreamMethod, ClientConfig, ClientStreamMethod, Incoming, Method, Server, ServerBuilder, Status,
};

use crate::call_record::CallRecord;
use crate::refusal;

/// The echo service as a trait: what `volley bench --api generated` serves and calls through
/// (`EchoServer`, `EchoClient`). `volley serve-echo` serves the same method at the level below
/// ([`ECHO`] and `handle_fn`), because `--name` renames the service at run time.
#[volley::service]
pub trait Echo {
    /// Returns its payload. Echo never waits: it runs inline.
    #[sync]
    fn echo(&self, payload: Bytes) -> Result<Bytes, Status>;
}

pub struct Echoer;

impl Echo for Echoer {
    fn echo(&self, payload: Bytes) -> Result<Bytes, Status> {
        Ok(payload)
    }
}

/// The same service and method with an `async fn` handler (a future per request), for
/// `volley bench --handler async`: the generated client is the same, the server's form differs.
#[volley::service(name = "echo")]
pub trait EchoAsync {
    async fn echo(&self, payload: Bytes) -> Result<Bytes, Status>;
}

impl EchoAsync for Echoer {
    async fn echo(&self, payload: Bytes) -> Result<Bytes, Status> {
        Ok(payload)
    }
}

/// `echo/echo`: returns its payload.
pub const ECHO: Method<Bytes, Bytes> = EchoMethods::ECHO;

/// The echo method under another service name (`--name`): the method's service name is what
/// travels on the wire, so a renamed service needs its own descriptor. Leaked once per process.
pub fn method_named(service: &str) -> Method<Bytes, Bytes> {
    if service == ECHO.service() {
        return ECHO;
    }
    Method::new(Box::leak(service.to_string().into_boxed_str()), ECHO.name())
}

/// An echo server whose service is called `service`.
pub fn server_named(service: &str) -> Server {
    server_named_with(service, |b| b)
}

/// An echo server whose service is called `service`, with settings added by `configure`
/// (TLS, tokens).
pub fn server_named_with(service: &str, configure: impl FnOnce(ServerBuilder) -> ServerBuilder) -> Server {
    recording_server(service, None, configure)
}

/// An echo server whose handler also records the id of every request it runs in `record`
/// (`serve-echo --record-calls`), if one is given.
fn recording_server(
    service: &str,
    record: Option<Arc<CallRecord>>,
    configure: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> Server {
    let m = method_named(service);
    // Echo never waits: the synchronous form serves a batch in a plain loop.
    let builder = match record {
        None => Server::builder().handle_fn(&m, |b: Bytes| Ok(b)),
        Some(r) => Server::builder().handle_fn(&m, move |b: Bytes| {
            r.ran(&b);
            Ok(b)
        }),
    };
    // The conformance runner's stream cases open `echo`/`repeat`; other languages' clients
    // check their client and both-way streams against `gather` and `each` (PROTOCOL.md §19).
    let builder = if service == ECHO.service() { serve_streams(builder) } else { builder };
    configure(builder).build()
}

/// `echo`/`gather`, a client stream: its items joined, as one reply.
pub const GATHER: ClientStreamMethod<Bytes, Bytes> = ClientStreamMethod::new("echo", "gather");
/// `echo`/`each`, both ways: each item back, in order.
pub const EACH: BidiStreamMethod<Bytes, Bytes> = BidiStreamMethod::new("echo", "each");

/// The echo service's stream methods, one of each shape.
fn serve_streams(builder: ServerBuilder) -> ServerBuilder {
    volley_conformance::server_streams::serve_repeat(builder)
        .handle_client_stream(&GATHER, |mut items: Incoming<Bytes>| async move {
            let mut all = Vec::new();
            while let Some(item) = items.next().await {
                all.extend_from_slice(&item?);
            }
            Ok(Bytes::from(all))
        })
        .handle_bidi_stream(&EACH, |items: Incoming<Bytes>| async move { Ok(items) })
}

/// Security settings of `volley serve-echo`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Security {
    /// Require clients to present this token (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM certificate chain for tls:// listeners.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for tls:// listeners.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// PEM CA certificates: clients must present a certificate issued by one (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// The registry's registration credential, presented when registering
    /// (environment: VOLLEY_REGISTRATION_CREDENTIAL).
    #[arg(long, env = "VOLLEY_REGISTRATION_CREDENTIAL", hide_env_values = true)]
    pub registration_credential: Option<String>,
    /// The token the registry's controller requires of connections (environment:
    /// VOLLEY_REGISTRY_TOKEN).
    #[arg(long, env = "VOLLEY_REGISTRY_TOKEN", hide_env_values = true)]
    pub registry_token: Option<String>,
}

/// Where `volley serve-echo` listens, and what it registers.
pub struct Listen {
    pub address: String,
    /// The address registered in place of the one bound (`--advertise`).
    pub advertise: Option<String>,
    /// Same-host addresses, listened on and registered beside the address (`--listen-local`).
    pub local: Vec<String>,
}

/// What `volley serve-echo` does besides echoing.
pub struct Options {
    pub admin: Option<String>,
    /// Serve this long after deregistering on a stop signal (`--grace`).
    pub grace: Duration,
    /// Record the id of every request run in this file (`--record-calls`).
    pub record_calls: Option<PathBuf>,
}

/// `volley serve-echo`: serves until SIGTERM or SIGINT (Ctrl-C), then stops gracefully
/// (`Server::stop_gracefully`: deregistered first, serving `grace` longer while callers move,
/// then a go-away and the drain) and exits 0; a second signal stops it at once. A registry that
/// refuses the server for good (a wrong token or registration credential) ends it too, with a
/// non-zero status.
pub fn serve(
    listen: &Listen,
    registry: Option<&str>,
    name: &str,
    options: Options,
    security: &Security,
    shedding: crate::shedding::Shedding,
) -> Result<(), String> {
    let Options { admin, grace, record_calls } = options;
    let record = record_calls.as_deref().map(CallRecord::create).transpose()?.map(Arc::new);
    if !listen.local.is_empty() && registry.is_some() && volley::discovery::host_id().is_none() {
        return Err(format!(
            "--listen-local: this host's id is unknown, so no client could tell it shares the host; set {}",
            volley::discovery::HOST_ID_ENV
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let tls = match (&security.tls_cert, &security.tls_key) {
        (Some(cert), Some(key)) => Some(
            volley::transport::tls::TlsServer::from_pem_files(cert, key, security.tls_client_ca.as_deref())
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let token = security.token.clone();
    let credential = security.registration_credential.clone();
    rt.block_on(async {
        let server = recording_server(name, record, |mut b| {
            if let Some(t) = token {
                b = b.token(t);
            }
            if let Some(tls) = tls {
                b = b.tls(tls);
            }
            if let Some(admin) = admin {
                b = b.admin(admin);
            }
            shedding.apply(b)
        });
        let bound = server.listen(&listen.address).await.map_err(|e| e.to_string())?;
        eprintln!("serving {name} on {bound} (SIGTERM or Ctrl-C to stop)");
        let mut local = Vec::new();
        for a in &listen.local {
            let l = server.listen(a).await.map_err(|e| format!("--listen-local {a}: {e}"))?.to_string();
            eprintln!("serving {name} on {l} too, for clients on this host");
            local.push(l);
        }
        if let Some(admin) = server.admin_address() {
            eprintln!("admin endpoint on http://{admin}/ (/metrics, /vars.json)");
        }
        // A refusal that retrying cannot fix ends the command (after a graceful shutdown).
        let (fatal_tx, mut fatal) = tokio::sync::mpsc::channel::<String>(1);
        if let Some(registry_addr) = registry {
            let addr = listen.advertise.clone().unwrap_or_else(|| bound.to_string());
            if addr.contains("0.0.0.0") || addr.contains("[::]") {
                eprintln!("warning: registering {addr}, which clients cannot dial; use --advertise ADDR");
            }
            let spec =
                local.iter().fold(InstanceSpec::new(name.to_string(), addr), |s, l| s.local_address(l));
            let registering = Registering {
                server: server.clone(),
                registry: registry_addr.to_string(),
                spec,
                credential: credential.clone(),
                token: security.registry_token.clone(),
            };
            tokio::spawn(async move {
                if let Err(why) = registering.run().await {
                    let _ = fatal_tx.send(why).await;
                }
            });
        }
        let signal = tokio::select! {
            r = volley::shutdown_signal() => r.map_err(|e| e.to_string())?,
            Some(why) = fatal.recv() => {
                eprintln!("shutting down");
                server.shutdown().await;
                return Err(why);
            }
        };
        eprintln!("{signal:?}: stopping gracefully: deregistering, serving {grace:?} more, then draining (a second signal stops at once)");
        let drain = volley::Drain::default().grace(grace);
        tokio::select! {
            drained = server.stop_gracefully(drain) => {
                if !drained {
                    eprintln!("the drain deadline passed: requests still running were answered ShuttingDown");
                }
                eprintln!("stopped");
                Ok(())
            }
            _ = volley::shutdown_signal() => {
                eprintln!("second signal: stopping at once");
                std::process::exit(1)
            }
        }
    })
}

/// Registers the echo server with a registry, waiting for one that is not up yet (the server
/// serves meanwhile). Returns an error only for a refusal that retrying will not fix.
struct Registering {
    server: Server,
    registry: String,
    spec: InstanceSpec,
    credential: Option<String>,
    token: Option<String>,
}

impl Registering {
    async fn run(self) -> Result<(), String> {
        let what = format!("registry {}", self.registry);
        let mut config = ClientConfig::default();
        config.token = self.token.clone().map(String::into_bytes);
        let mut warned = false;
        loop {
            let failed = match Registry::connect_with(&self.registry, config.clone()).await {
                Err(e) if e.is_permanent() => {
                    return Err(refusal::connecting(&what, &e, "--registry-token", "VOLLEY_REGISTRY_TOKEN"));
                }
                Err(e) => e,
                Ok(registry) => {
                    if let Some(c) = &self.credential {
                        registry.set_registration_credential(c.clone());
                    }
                    match registry
                        .register(&self.server, vec![self.spec.clone()], LeaseConfig::default())
                        .await
                    {
                        Ok(reg) => {
                            let (name, addr) = (&self.spec.service, &self.spec.address);
                            let local = match self.spec.local_addresses.join(", ") {
                                l if l.is_empty() => l,
                                l => format!(" and {l} for clients on this host"),
                            };
                            eprintln!(
                                "registered {name} at {addr}{local} with {} (lease {})",
                                self.registry,
                                reg.lease()
                            );
                            return Ok(());
                        }
                        Err(e) if e.is_permanent() => return Err(refusal::registering(&what, &e)),
                        Err(e) => e,
                    }
                }
            };
            if !warned {
                eprintln!("{what} not reachable ({failed}); retrying");
                warned = true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}
