//! Listening and registering in one call, for the common case: every service the server
//! offers, at the address it bound, under the default lease.

use crate::discovery::InstanceSpec;
use crate::error::Error;
use crate::registry::{LeaseConfig, Registration, Registry};
use crate::server::Server;
use crate::transport::Address;

impl Server {
    /// Listens on `addr` and registers every service this server has handlers for with
    /// `registry`, at the address bound, under one lease ([`LeaseConfig::default`]) that a
    /// task renews for as long as the server runs and revokes when it shuts down. Returns the
    /// address bound and the registration.
    ///
    /// The address registered is the one bound, so listen on one that callers can reach: for
    /// a wildcard (`tcp://0.0.0.0:7000`), weights, metadata or another lease, listen with
    /// [`listen`](Self::listen) and register with [`Registry::register`]. If registering
    /// fails the server keeps listening and the error says why: shut it down, or register it
    /// with [`Registry::register`] later.
    ///
    /// ```
    /// # #[volley::service] trait Greeter { async fn hi(&self, name: String) -> Result<String, volley::Status>; }
    /// # struct Hello;
    /// # impl Greeter for Hello { async fn hi(&self, name: String) -> Result<String, volley::Status> { Ok(name) } }
    /// use volley::discovery::DEFAULT_REGISTRY;
    /// use volley::registry::Registry;
    /// use volley::Server;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> volley::Result<()> {
    /// let registry = Registry::connect(DEFAULT_REGISTRY).await?; // or tcp://HOST:PORT
    /// let server = Server::builder().serve(GreeterServer::new(Hello)).build();
    /// let (addr, _registration) = server.listen_and_register("inproc://doc-hello", &registry).await?;
    /// # assert_eq!(registry.resolve("greeter").await?.instances[0].address, addr.to_string());
    /// # server.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn listen_and_register(
        &self,
        addr: &str,
        registry: &Registry,
    ) -> Result<(Address, Registration), Error> {
        self.listen_and_register_with(addr, &[], registry).await
    }

    /// Like [`listen_and_register`](Self::listen_and_register), and also listens on each of
    /// `local` — addresses only a caller on this host can open, such as `shm://NAME` — and
    /// registers them beside `addr` as the instances' same-host addresses, with this host's
    /// [`host_id`](crate::discovery::host_id). A [`ServiceClient`](crate::ServiceClient) with
    /// [`prefer_local`](crate::service_client::ServiceConfig::prefer_local) on this host connects
    /// through them (the first that opens); any other caller through `addr`. Returns the
    /// address bound for `addr` ([`addresses`](Self::addresses) lists all of them).
    ///
    /// ```
    /// # #[volley::service] trait Greeter { async fn hi(&self, name: String) -> Result<String, volley::Status>; }
    /// # struct Hello;
    /// # impl Greeter for Hello { async fn hi(&self, name: String) -> Result<String, volley::Status> { Ok(name) } }
    /// use volley::discovery::DEFAULT_REGISTRY;
    /// use volley::registry::Registry;
    /// use volley::Server;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> volley::Result<()> {
    /// # let registry = Registry::connect(DEFAULT_REGISTRY).await?;
    /// let server = Server::builder().serve(GreeterServer::new(Hello)).build();
    /// # #[cfg(target_os = "linux")]
    /// server.listen_and_register_with("tcp://127.0.0.1:0", &["shm://doc-hello"], &registry).await?;
    /// # server.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn listen_and_register_with(
        &self,
        addr: &str,
        local: &[&str],
        registry: &Registry,
    ) -> Result<(Address, Registration), Error> {
        let services = self.services();
        if services.is_empty() {
            return Err(Error::Usage("listen_and_register: the server has no handlers to register".into()));
        }
        if !local.is_empty() && crate::discovery::host_id().is_none() {
            return Err(Error::Usage(format!(
                "listen_and_register: same-host addresses need this host's id, which is unknown here (set {})",
                crate::discovery::HOST_ID_ENV
            )));
        }
        let bound = self.listen(addr).await?;
        let mut bound_local = Vec::with_capacity(local.len());
        for a in local {
            bound_local.push(self.listen(a).await?.to_string());
        }
        let instances = services
            .into_iter()
            .map(|s| {
                bound_local
                    .iter()
                    .fold(InstanceSpec::new(s, bound.to_string()), |spec, a| spec.local_address(a))
            })
            .collect();
        let registration = registry.register(self, instances, LeaseConfig::default()).await?;
        Ok((bound, registration))
    }
}
