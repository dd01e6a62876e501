//! The client side of `volley bench`: what makes the calls (a plain client or a service client
//! through a registry, through the `Method` layer or the generated `EchoClient`), and what one
//! call achieved.

use std::sync::Arc;

use volley::bytes::Bytes;
use volley::service_client::{Mode, ServiceConfig};
use volley::{BatchOptions, Client, Method, ServiceClient, Snapshot};

use super::api::Api;
use super::args::{BenchArgs, RegistryMode};
use super::local::Target;
use super::transport::{client_config, scheme};
use crate::echo::{ECHO, EchoClient, method_named};

/// The client side of the benchmark: a plain client, or a service client through a registry;
/// through the `Method` layer or the generated `EchoClient`.
pub enum Caller {
    Plain(Client),
    Service(ServiceClient, Method<Bytes, Bytes>),
    Generated(EchoClient<Client>),
    GeneratedService(EchoClient<ServiceClient>),
}

impl Caller {
    pub async fn call(&self, p: Bytes) -> Outcome {
        let len = p.len();
        let r = match self {
            Caller::Plain(c) => c.call(&ECHO, p).await,
            Caller::Service(c, m) => c.call(m, p).await,
            Caller::Generated(c) => c.echo(p).await,
            Caller::GeneratedService(c) => c.echo(p).await,
        };
        Outcome::of(std::iter::once(r), len)
    }

    pub async fn call_batch(&self, p: Bytes, n: usize, opts: BatchOptions) -> Outcome {
        let reqs = (0..n).map(|_| p.clone());
        let results = match self {
            Caller::Plain(c) => c.call_batch_with(&ECHO, reqs, opts).await,
            Caller::Service(c, m) => c.call_batch_with(m, reqs, opts).await,
            Caller::Generated(c) => c.echo_batch_with(reqs, opts).await,
            Caller::GeneratedService(c) => c.echo_batch_with(reqs, opts).await,
        };
        Outcome::of(results, p.len())
    }

    /// One call before the run: a refusal that retrying will not fix (a wrong token) ends the
    /// benchmark at once, with the flag that fixes it, instead of failing every call.
    async fn probe(&self, what: &str) -> Result<(), String> {
        let r = match self {
            Caller::Plain(c) => c.call(&ECHO, Bytes::new()).await,
            Caller::Generated(c) => c.echo(Bytes::new()).await,
            Caller::Service(c, m) => c.call(m, Bytes::new()).await,
            Caller::GeneratedService(c) => c.echo(Bytes::new()).await,
        };
        match r {
            Err(e) if e.is_permanent() => {
                Err(crate::refusal::connecting(what, &e, "--token", "VOLLEY_TOKEN"))
            }
            _ => Ok(()),
        }
    }

    /// Transport counters of every connection the client uses.
    pub fn counters(&self) -> Snapshot {
        match self {
            Caller::Plain(c) => c.counters(),
            Caller::Generated(c) => c.inner().counters(),
            Caller::Service(c, _) => c.stats().transport(),
            Caller::GeneratedService(c) => c.inner().stats().transport(),
        }
    }

    fn service_client(&self) -> Option<&ServiceClient> {
        match self {
            Caller::Plain(_) | Caller::Generated(_) => None,
            Caller::Service(c, _) => Some(c),
            Caller::GeneratedService(c) => Some(c.inner()),
        }
    }

    /// (registry look-ups, messages to and from the controller).
    pub fn registry(&self) -> (u64, u64) {
        let Some(service) = self.service_client() else { return (0, 0) };
        let s = service.stats();
        (s.lookups, s.registry_messages())
    }

    /// The address of the first instance's live connection (direct mode through a registry).
    fn connected_to(&self, service: &str) -> Option<String> {
        self.service_client()?.instance_stats(service).into_iter().find_map(|i| i.connected_to)
    }
}

/// What one call (single or batch) achieved.
#[derive(Default)]
pub struct Outcome {
    pub ok: u64,
    pub failed: u64,
    pub error: Option<String>,
}

impl Outcome {
    /// Counts replies of the expected length as successes.
    pub fn of<E: ToString>(results: impl IntoIterator<Item = Result<Bytes, E>>, len: usize) -> Outcome {
        let mut o = Outcome::default();
        for r in results {
            match r {
                Ok(reply) if reply.len() == len => o.ok += 1,
                Ok(reply) => o.fail(format!("reply of {} bytes, sent {len}", reply.len())),
                Err(e) => o.fail(e.to_string()),
            }
        }
        o
    }

    fn fail(&mut self, e: String) {
        self.failed += 1;
        self.error.get_or_insert(e);
    }
}

/// One API's end of the benchmark: where the load goes, and what calls.
pub struct Side {
    pub api: Api,
    pub target: Target,
    /// `None` for `--raw`.
    pub caller: Option<Arc<Caller>>,
    pub transport: String,
    pub registry_mode: RegistryMode,
}

impl Side {
    pub async fn connect(api: Api, target: Target, args: &BenchArgs) -> Result<Side, String> {
        let (caller, transport, registry_mode) = match &target {
            Target::Plain(addr) => Self::by_address(api, addr, args).await?,
            Target::Registry(reg, mode) => Self::through_registry(api, reg, *mode, args).await?,
        };
        if let Some(c) = &caller {
            let what = match &target {
                Target::Plain(addr) => format!("server {addr}"),
                Target::Registry(reg, _) => format!("service {} through registry {reg}", args.service),
            };
            c.probe(&what).await?;
        }
        // The instance's connection is made now: report the transport it took.
        let transport = match caller.as_ref().and_then(|c| c.connected_to(&args.service)) {
            Some(addr) if registry_mode == RegistryMode::Direct => scheme(&addr),
            _ => transport,
        };
        Ok(Side { api, target, caller: caller.map(Arc::new), transport, registry_mode })
    }

    /// A client of the server at `addr` (none with `--raw`, whose callers connect each on
    /// their own), and the transport to report.
    async fn by_address(
        api: Api,
        addr: &str,
        args: &BenchArgs,
    ) -> Result<(Option<Caller>, String, RegistryMode), String> {
        if args.raw {
            return Ok((None, "raw-tcp".to_string(), RegistryMode::None));
        }
        let config = client_config(addr, args.token.as_deref()).metrics(!args.no_metrics);
        let client = Client::connect_with(addr, config).await.map_err(|e| e.to_string())?;
        let caller = match api {
            Api::Method => Caller::Plain(client),
            Api::Generated => Caller::Generated(EchoClient::new(client)),
        };
        Ok((Some(caller), scheme(addr), RegistryMode::None))
    }

    /// A service client through the registry at `reg`, and the transport to report: the
    /// controller's in relayed mode, the first instance's in direct mode.
    async fn through_registry(
        api: Api,
        reg: &str,
        mode: RegistryMode,
        args: &BenchArgs,
    ) -> Result<(Option<Caller>, String, RegistryMode), String> {
        let how = if mode == RegistryMode::Relayed { Mode::Relayed } else { Mode::Direct };
        let mut client = volley::ClientConfig::default();
        client.token = args.token.clone().map(String::into_bytes);
        let config = ServiceConfig::default().mode(how).client(client).prefer_local(args.prefer_local);
        let what = format!("registry {reg}");
        let client = ServiceClient::connect_with(reg, config).await.map_err(|e| match e.is_permanent() {
            true => crate::refusal::connecting(&what, &e, "--token", "VOLLEY_TOKEN"),
            false => format!("{what}: {e}"),
        })?;
        let transport = match mode {
            // Every call goes to the controller; the client never looks the service up.
            RegistryMode::Relayed => scheme(reg),
            // Resolves the service: the one look-up of the run.
            _ => {
                let instances =
                    client.instances(&args.service).await.map_err(|e| format!("{}: {e}", args.service))?;
                scheme(&instances[0].address)
            }
        };
        let caller = match api {
            Api::Method => Caller::Service(client, method_named(&args.service)),
            Api::Generated => Caller::GeneratedService(EchoClient::new(client)),
        };
        Ok((Some(caller), transport, mode))
    }
}
