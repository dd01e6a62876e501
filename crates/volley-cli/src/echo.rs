//! The built-in echo service.

use volley::bytes::Bytes;
use volley::registry::{InstanceSpec, LeaseConfig, Registry};
use volley::{Method, Server};

/// `echo/echo`: returns its payload.
pub const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

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
    let m = method_named(service);
    // Echo never waits: the synchronous form serves a batch in a plain loop.
    Server::builder().handle_fn(&m, |b: Bytes| Ok(b)).build()
}

/// `volley serve-echo`: serves until Ctrl-C, then shuts down gracefully (deregistering first
/// if it registered).
pub fn serve(
    listen: &str,
    registry: Option<&str>,
    name: &str,
    advertise: Option<&str>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let server = server_named(name);
        let bound = server.listen(listen).await.map_err(|e| e.to_string())?;
        eprintln!("serving {name} on {bound} (Ctrl-C to stop)");
        if let Some(registry_addr) = registry {
            let addr = advertise.map(str::to_string).unwrap_or_else(|| bound.to_string());
            if addr.contains("0.0.0.0") || addr.contains("[::]") {
                eprintln!("warning: registering {addr}, which clients cannot dial; use --advertise ADDR");
            }
            // A registry that is not up yet is waited for: the server serves meanwhile.
            let (server, name, registry_addr) = (server.clone(), name.to_string(), registry_addr.to_string());
            tokio::spawn(async move {
                let mut warned = false;
                loop {
                    let registered = async {
                        let registry = Registry::connect(&registry_addr).await?;
                        let spec = InstanceSpec::new(name.clone(), addr.clone());
                        registry.register(&server, vec![spec], LeaseConfig::default()).await
                    };
                    match registered.await {
                        Ok(reg) => {
                            eprintln!(
                                "registered {name} at {addr} with {registry_addr} (lease {})",
                                reg.lease()
                            );
                            return;
                        }
                        Err(e) if !warned => {
                            eprintln!("registry {registry_addr} not reachable ({e}); retrying");
                            warned = true;
                        }
                        Err(_) => {}
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
        eprintln!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}
