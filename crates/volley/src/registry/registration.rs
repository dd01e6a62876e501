//! The server side: registering instances under a lease and keeping it alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connection::Registry;
use crate::discovery::wire::{InstanceSpec, RegisterRequest, Registered};
use crate::error::Error;
use crate::server::{LeaseHealth, Server};
use crate::transport::Address;

/// Lease settings of a registration.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[derive(derive_setters::Setters)]
pub struct LeaseConfig {
    /// How long the registry keeps the instances listed without a renewal.
    pub ttl: Duration,
    /// How often the lease is renewed (default: a third of `ttl`, so two renewals may be lost
    /// before the lease lapses).
    pub renew_every: Option<Duration>,
    /// How soon a failed renewal (registry unreachable) is tried again (default: a tenth of
    /// `ttl`, at least 20 ms).
    pub retry_every: Option<Duration>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig { ttl: crate::discovery::DEFAULT_TTL, renew_every: None, retry_every: None }
    }
}

impl LeaseConfig {
    fn renew_interval(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3).max(Duration::from_millis(1))
    }

    fn retry_interval(&self) -> Duration {
        self.retry_every.unwrap_or((self.ttl / 10).max(Duration::from_millis(20))).min(self.renew_interval())
    }
}

/// A live registration: the lease that keeps a server's instances listed.
///
/// A task on the server renews the lease. If the registry does not know the lease any more
/// (it lapsed, or the controller restarted and lost its state) the task registers the
/// instances again under a new lease; if the registry is unreachable it keeps trying. When
/// the server shuts down, or [`deregister`](Self::deregister) is called, the lease is revoked
/// at once, so clients stop sending before the server stops answering; the server's
/// [`shutdown`](Server::shutdown) waits for that. Dropping this handle changes nothing: the
/// registration lives as long as the server.
#[derive(Clone)]
pub struct Registration {
    shared: Arc<Shared>,
}

struct Shared {
    lease: AtomicU64,
    instance_ids: Mutex<Vec<u64>>,
    registrations: AtomicU64,
    renewals: AtomicU64,
    stop: CancellationToken,
    done: CancellationToken,
}

impl Registration {
    /// The current lease id (changes when the instances are registered again).
    pub fn lease(&self) -> u64 {
        self.shared.lease.load(Relaxed)
    }

    /// The registry's ids of the instances, in registration order.
    pub fn instance_ids(&self) -> Vec<u64> {
        self.shared.instance_ids.lock().clone()
    }

    /// How many times the instances were registered: 1, plus one for each time they had to be
    /// registered again (after a controller restart or a lapsed lease).
    pub fn registrations(&self) -> u64 {
        self.shared.registrations.load(Relaxed)
    }

    /// Successful renewals so far.
    pub fn renewals(&self) -> u64 {
        self.shared.renewals.load(Relaxed)
    }

    /// Stops renewing and removes the instances from the registry now (the server keeps
    /// running). Returns when the registry has answered, or after a second.
    pub async fn deregister(&self) {
        self.shared.stop.cancel();
        self.shared.done.cancelled().await;
    }
}

impl Registry {
    /// Registers `instances` (services the server offers, at the addresses clients should use)
    /// under one lease, and keeps the lease alive for as long as `server` runs.
    pub async fn register(
        &self,
        server: &Server,
        instances: Vec<InstanceSpec>,
        lease: LeaseConfig,
    ) -> Result<Registration, Error> {
        if instances.is_empty() {
            return Err(Error::Usage("register needs at least one instance".into()));
        }
        if let Some(why) = instances.iter().find_map(|i| check_spec(i).err()) {
            return Err(Error::Usage(format!("register: {why}")));
        }
        // The first registration may wait as long as the lease it asks for (a store such as
        // etcd writes to disk, which can take seconds on a busy machine); a re-registration
        // in the background waits one renewal interval, then tries again.
        let first = register_once(self, &instances, &lease, lease.ttl.max(lease.renew_interval())).await?;
        let shared = Arc::new(Shared {
            lease: AtomicU64::new(first.lease),
            instance_ids: Mutex::new(first.instance_ids),
            registrations: AtomicU64::new(1),
            renewals: AtomicU64::new(0),
            stop: CancellationToken::new(),
            done: CancellationToken::new(),
        });
        let keeper = keep_alive(
            self.clone(),
            shared.clone(),
            instances,
            lease,
            server.leaving_token(),
            server.lease_health(),
        );
        server.spawn_departure(keeper);
        Ok(Registration { shared })
    }
}

/// What the controller would refuse, said before asking it, and same-host addresses that no
/// caller could dial (the controller does not parse addresses, so that a newer transport's
/// can be registered through an older controller).
fn check_spec(spec: &InstanceSpec) -> Result<(), String> {
    if !spec.local_addresses.is_empty() && spec.host_id.is_empty() {
        return Err(format!(
            "{}@{}: local addresses need a host id (InstanceSpec::local_address sets this host's, if it is known; {} sets it)",
            spec.service,
            spec.address,
            crate::discovery::HOST_ID_ENV
        ));
    }
    spec.check()?;
    for a in &spec.local_addresses {
        match Address::parse(a) {
            Ok(Address::Inproc(_)) => {
                return Err(format!(
                    "local address {a}: inproc:// names a server in one process, not on a host"
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(format!("local address: {e}")),
        }
    }
    Ok(())
}

async fn register_once(
    registry: &Registry,
    instances: &[InstanceSpec],
    lease: &LeaseConfig,
    timeout: Duration,
) -> Result<Registered, Error> {
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: lease.ttl.as_millis() as u64,
        instances: instances.to_vec(),
        credential: String::new(),
    };
    registry.register_raw(req, timeout).await
}

async fn keep_alive(
    registry: Registry,
    shared: Arc<Shared>,
    instances: Vec<InstanceSpec>,
    lease: LeaseConfig,
    server_leaving: CancellationToken,
    health: LeaseHealth,
) {
    let mut wait = lease.renew_interval();
    let mut confirmed = Instant::now();
    // Whether the last exchange reached the controller: then a lost connection means it went
    // away, and the keeper renews as soon as one can be made again (a restarted controller
    // has forgotten the lease: the renewal says so and the instances are registered at once).
    let mut reached = true;
    loop {
        tokio::select! {
            biased;
            _ = server_leaving.cancelled() => break,
            _ = shared.stop.cancelled() => break,
            _ = registry.connection_lost(), if reached => {
                tracing::debug!("lost the registry connection; renewing as soon as it is back");
            }
            _ = tokio::time::sleep(wait) => {}
        }
        let held;
        (wait, reached, held) = renew_or_register(&registry, &shared, &instances, &lease).await;
        if held {
            confirmed = Instant::now();
            health.held();
        } else if confirmed.elapsed() >= lease.ttl {
            // The registry has dropped the instances by now (or cannot be asked): callers
            // resolving the service do not find this server, so it is not ready.
            health.not_held(format!(
                "the registry has not confirmed lease {} for {:?} (its time is {:?})",
                shared.lease.load(Relaxed),
                confirmed.elapsed(),
                lease.ttl
            ));
        }
    }
    // Deregister at once: clients learn of it through their watches while this server is still
    // answering what it already received.
    let id = shared.lease.load(Relaxed);
    match registry.deregister(id, Duration::from_secs(1)).await {
        Ok(n) => tracing::debug!(lease = id, instances = n, "deregistered"),
        Err(e) => tracing::debug!(lease = id, error = %e, "deregistering failed; the lease will lapse"),
    }
    shared.done.cancel();
}

/// One renewal — and a registration, if the controller does not hold the lease whole any
/// more. Returns how long until the next try, whether the controller answered, and whether the
/// lease is held now.
async fn renew_or_register(
    registry: &Registry,
    shared: &Shared,
    instances: &[InstanceSpec],
    lease: &LeaseConfig,
) -> (Duration, bool, bool) {
    let (renew_every, retry_every) = (lease.renew_interval(), lease.retry_interval());
    // A controller that cannot be reached is tried again when the registry's reconnect pacing
    // allows (a quarter of a second at most), not a tenth of the lease time later.
    let retry = |e: &Error| match e {
        Error::Connection(_) | Error::NotRun(_) => {
            registry.reconnect_wait().clamp(Duration::from_millis(10), retry_every)
        }
        _ => retry_every,
    };
    let id = shared.lease.load(Relaxed);
    match registry.renew(id, renew_every).await {
        Ok(r) if r.known => {
            shared.renewals.fetch_add(1, Relaxed);
            (renew_every, true, true)
        }
        Ok(_) => match register_once(registry, instances, lease, renew_every).await {
            Ok(r) => {
                tracing::info!(
                    old = id,
                    new = r.lease,
                    "the registry no longer held this server's instances (its lease lapsed, the controller restarted, or another registration took an address); registered again"
                );
                shared.lease.store(r.lease, Relaxed);
                *shared.instance_ids.lock() = r.instance_ids;
                shared.registrations.fetch_add(1, Relaxed);
                (renew_every, true, true)
            }
            Err(e) => {
                log_failure("registering again", &e);
                (retry(&e), !matches!(e, Error::Connection(_) | Error::NotRun(_)), false)
            }
        },
        Err(e) => {
            log_failure("renewing the lease", &e);
            (retry(&e), !matches!(e, Error::Connection(_) | Error::NotRun(_)), false)
        }
    }
}

/// A refusal that retrying cannot fix (a wrong credential) is worth a warning; an unreachable
/// controller is not (it is retried, and calls go on).
fn log_failure(what: &str, e: &Error) {
    if e.is_permanent() {
        tracing::warn!(error = %e, "{what} was refused; will retry");
    } else {
        tracing::debug!(error = %e, "{what} failed; will retry");
    }
}
