//! Listening and registering in one call, for the common case: every service the server
//! offers, at the address it bound, under the default lease.

use crate::error::Error;
use crate::registry::{InstanceSpec, LeaseConfig, Registration, Registry};
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
    /// use volley::registry::{DEFAULT_REGISTRY, Registry};
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
        let services = self.services();
        if services.is_empty() {
            return Err(Error::Usage("listen_and_register: the server has no handlers to register".into()));
        }
        let bound = self.listen(addr).await?;
        let instances = services.into_iter().map(|s| InstanceSpec::new(s, bound.to_string())).collect();
        let registration = registry.register(self, instances, LeaseConfig::default()).await?;
        Ok((bound, registration))
    }
}
