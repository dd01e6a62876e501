//! One instance of a service as a caller sees it: its address and registry entry, the
//! connection to it (made when it is listed, made again when it died), and its calls
//! outstanding.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::peak_ewma::PeakEwma;
use super::stats::PoolStats;
use crate::client::{CallOptions, Client, ClientConfig};
use crate::discovery::Instance;
use crate::error::{Error, Status};
use crate::health::{self, HealthRequest, Serving};
use crate::metrics::stats::Snapshot;
use crate::proto::Code;
use crate::transport::Address;
use arc_swap::{ArcSwap, ArcSwapOption};

/// One instance and the connection to it (made on first use).
pub(crate) struct Endpoint {
    pub address: String,
    /// Connect through the instance's same-host addresses first, when it runs on this host.
    prefer_local: bool,
    /// Updated in place when the registry changes the instance's weight or metadata, so the
    /// connection survives.
    info: ArcSwap<Instance>,
    client: ArcSwapOption<Client>,
    connecting: tokio::sync::Mutex<()>,
    /// Connection attempts that failed: a caller that waited for another's attempt, which
    /// failed, fails too instead of trying again.
    connect_failures: AtomicU64,
    /// Its first connection is being made in the background: out of rotation meanwhile,
    /// unless no instance is ready (see `Pool::warm`).
    warming: AtomicBool,
    outstanding: AtomicUsize,
    stats: Arc<PoolStats>,
    /// Attempts sent to this instance.
    pub attempts: AtomicU64,
    /// Failed calls in a row (outlier ejection).
    pub failures: AtomicU32,
    /// Latency of its calls (peak-EWMA balancing, outlier ejection).
    pub latency: PeakEwma,
}

impl Endpoint {
    pub fn new(instance: Instance, stats: Arc<PoolStats>, prefer_local: bool) -> Endpoint {
        Endpoint {
            address: instance.address.clone(),
            prefer_local,
            info: ArcSwap::from_pointee(instance),
            client: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
            connect_failures: AtomicU64::new(0),
            warming: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            stats,
            attempts: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            latency: PeakEwma::new(),
        }
    }

    pub fn instance(&self) -> Instance {
        (**self.info.load()).clone()
    }

    /// Takes the registry's new entry for this address (weight, metadata), keeping the
    /// connection.
    pub fn update(&self, instance: Instance) {
        if **self.info.load() != instance {
            self.info.store(Arc::new(instance));
        }
    }

    pub fn warming(&self) -> &AtomicBool {
        &self.warming
    }

    /// Calls outstanding on this instance (kept by least-outstanding balancing only).
    pub fn outstanding(&self) -> &AtomicUsize {
        &self.outstanding
    }

    pub fn weight(&self) -> u32 {
        self.info.load().weight.max(1)
    }

    /// The connection, made now if there is none or it died. Connecting here, before the
    /// request is handed over, means a failure to connect is known to have sent nothing.
    pub async fn connect(&self, config: &ClientConfig) -> Result<Client, Error> {
        if let Some(c) = self.client.load().as_deref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        let failures = self.connect_failures.load(Relaxed);
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(c) = self.client.load().as_deref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        // Many callers that picked a junk instance at once would each wait for the connect
        // before theirs, then fail one after the other: one refusal answers them all.
        if self.connect_failures.load(Relaxed) != failures {
            return Err(Error::Connection(format!(
                "{}: the connection attempt made meanwhile failed",
                self.address
            )));
        }
        let c = self.open(config).await.inspect_err(|_| {
            self.connect_failures.fetch_add(1, Relaxed);
        })?;
        if let Some(old) = self.client.swap(Some(Arc::new(c.clone()))) {
            self.stats.retire(old.counters());
        }
        Ok(c)
    }

    /// A new connection: through the first same-host address that opens, if the instance is
    /// on this host and the owner prefers those, else (or when none opens) through `address`.
    /// Each new connection tries them again, so a same-host address that failed once (its
    /// server was restarting) is used again when it works.
    async fn open(&self, config: &ClientConfig) -> Result<Client, Error> {
        for local in self.local_addresses() {
            match Client::connect_with(&local, config.clone()).await {
                Ok(c) => {
                    self.stats.local_connections.fetch_add(1, Relaxed);
                    return Ok(c);
                }
                Err(e) => {
                    self.stats.local_failures.fetch_add(1, Relaxed);
                    tracing::info!(address = %self.address, local = %local, error = %e, "could not open the same-host address of an instance on this host; connecting to its address");
                }
            }
        }
        Client::connect_with(&self.address, config.clone()).await
    }

    /// The same-host addresses to try, in the server's order: none unless the owner prefers
    /// them and the instance's host id is this process's. Addresses this build cannot dial
    /// (another scheme, `shm://` off Linux) and `inproc://` (not a host's) are skipped.
    fn local_addresses(&self) -> Vec<String> {
        let info = self.info.load();
        let here = crate::discovery::host_id();
        if !self.prefer_local || info.local_addresses.is_empty() || here != Some(info.host_id.as_str()) {
            return Vec::new();
        }
        let dialable = |a: &&String| Address::parse(a).is_ok_and(|a| !matches!(a, Address::Inproc(_)));
        info.local_addresses.iter().filter(dialable).cloned().collect()
    }

    /// The address of the connection in use, if there is one.
    pub fn connected_to(&self) -> Option<String> {
        let c = self.client.load();
        c.as_deref().filter(|c| c.is_connected()).map(|c| c.address().to_string())
    }

    /// A round trip to the instance within the connect timeout, asking whether it serves
    /// `service` (`volley.health`). Connecting is not enough: the kernel of a frozen process
    /// still accepts connections. An instance that answers it is draining or not serving
    /// stays out; one that refuses the question (a server without the health service) passes:
    /// it read and answered.
    pub async fn probe(&self, service: &str, config: &ClientConfig) -> Result<(), Error> {
        let client = self.connect(config).await?;
        let opts = CallOptions::default().timeout(config.connect_timeout);
        match client.call_with(&health::CHECK, HealthRequest::service(service), opts).await {
            Ok(h) if h.status == Serving::Serving => Ok(()),
            Ok(h) => Err(Error::Remote(Status::new(
                Code::Application,
                format!("the instance says it is {}: {}", h.status, h.reason),
            ))),
            Err(Error::Remote(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn counters(&self) -> Snapshot {
        self.client.load().as_deref().map(Client::counters).unwrap_or_default()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(c) = self.client.load().as_deref() {
            self.stats.retire(c.counters());
        }
    }
}

/// Counts a call as outstanding on an instance until dropped (also when the caller gives up).
pub(crate) struct Outstanding<'a>(&'a AtomicUsize);

impl<'a> Outstanding<'a> {
    pub fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Relaxed);
        Outstanding(n)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
