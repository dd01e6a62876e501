//! `volley controller` and `volley ls`.

use crate::output::outln;
use volley::ClientConfig;
use volley::controller::{Controller, ControllerConfig};
use volley::registry::Registry;

use crate::refusal;
use crate::shedding::Shedding;

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

/// The warning of a controller that takes registrations from anyone (`volley controller` at
/// start, `volley ls`).
const OPEN_REGISTRATION: &str = "no registration credential: anyone who can connect may register \
     instances under any service name (or take over an address); set one with `volley controller \
     --registration-credential` (or VOLLEY_REGISTRATION_CREDENTIAL) and give it to the servers";

/// `volley controller --listen ADDR [--store memory|etcd://...]`: a standalone registry until
/// Ctrl-C.
pub fn serve(
    listen: &str,
    store: &str,
    registration_credential: Option<String>,
    token: Option<String>,
    admin: Option<String>,
    forget_after: std::time::Duration,
    shedding: Shedding,
) -> Result<(), String> {
    runtime()?.block_on(async {
        if registration_credential.is_none() {
            eprintln!("warning: {OPEN_REGISTRATION}");
        }
        let tokens = token.into_iter().map(String::into_bytes).collect();
        let mut config = ControllerConfig::default().tokens(tokens);
        config.registration_credential = registration_credential;
        config.admin = admin;
        config.forget_after = forget_after;
        config.concurrency_limit = shedding.limit();
        let controller = match store {
            "memory" => Controller::new(config),
            s if s.starts_with("etcd://") => etcd_controller(s, config).await?,
            s => {
                return Err(format!(
                    "--store {s:?}: expected memory or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"
                ));
            }
        };
        let bound = controller.listen(listen).await.map_err(|e| e.to_string())?;
        eprintln!("registry controller on {bound}, store {store} (SIGTERM or Ctrl-C to stop)");
        if let Some(admin) = controller.admin_address() {
            eprintln!("admin endpoint on http://{admin}/ (/metrics, /vars.json)");
        }
        // Scripts read the bound address (with the real port for tcp://HOST:0) from stdout.
        outln!("{bound}");
        let signal = volley::shutdown_signal().await.map_err(|e| e.to_string())?;
        // Pending watches are answered at once and every connection gets a go-away, so clients
        // with a list of controllers move to the next (a second signal stops at once).
        eprintln!("{signal:?}: shutting down");
        tokio::select! {
            () = controller.shutdown() => Ok(()),
            _ = volley::shutdown_signal() => {
                eprintln!("second signal: stopping at once");
                std::process::exit(1)
            }
        }
    })
}

/// A controller over etcd: several of them over one etcd act as one registry.
#[cfg(feature = "etcd")]
async fn etcd_controller(url: &str, config: ControllerConfig) -> Result<Controller, String> {
    use std::sync::Arc;
    let etcd = volley_etcd::EtcdConfig::parse(url)?;
    let store = volley_etcd::EtcdStore::connect(etcd).await.map_err(|e| format!("--store {url}: {e}"))?;
    Ok(Controller::with_store(Arc::new(store), config))
}

#[cfg(not(feature = "etcd"))]
async fn etcd_controller(url: &str, _: ControllerConfig) -> Result<Controller, String> {
    Err(format!(
        "--store {url}: this volley was built without etcd support; rebuild it with \
         `cargo build --release -p volley-cli --features etcd` (see docs/ETCD.md)"
    ))
}

/// `volley ls --registry ADDR [--json]`: services and instances, and a warning when the
/// controller takes registrations from anyone.
pub fn ls(registry: &str, json: bool, token: Option<String>, methods: bool) -> Result<(), String> {
    runtime()?.block_on(async {
        let what = format!("registry {registry}");
        let mut config = ClientConfig::default();
        config.token = token.clone().map(String::into_bytes);
        let r = Registry::connect_with(registry, config).await.map_err(|e| match e.is_permanent() {
            true => refusal::connecting(&what, &e, "--token", "VOLLEY_TOKEN"),
            false => format!("{what}: {e}"),
        })?;
        let listing = r.list().await.map_err(|e| format!("{what}: {e}"))?;
        // A controller older than `info` answers UnknownMethod: nothing is known then.
        let open = r.info().await.ok().map(|i| !i.registration_credential);
        // Each service's methods, from its first instance's reflection (or why not).
        let mut reflected = std::collections::HashMap::new();
        if methods {
            for s in listing.services.iter().filter(|s| !s.instances.is_empty()) {
                let catalog = crate::call::reflect(&s.instances[0].instance.address, &token).await;
                let service = catalog.map(|c| c.service(&s.name).cloned());
                reflected.insert(s.name.clone(), service);
            }
        }
        if json {
            let services: Vec<serde_json::Value> = listing
                .services
                .iter()
                .map(|s| {
                    let instances: Vec<serde_json::Value> = s
                        .instances
                        .iter()
                        .map(|i| {
                            serde_json::json!({
                                "id": i.instance.id,
                                "address": i.instance.address,
                                "weight": i.instance.weight,
                                "metadata": i.instance.metadata,
                                "host_id": i.instance.host_id,
                                "local_addresses": i.instance.local_addresses,
                                "lease": i.instance.lease,
                                "lease_ttl_ms": i.lease_ttl_ms,
                                "expires_in_ms": i.expires_in_ms,
                            })
                        })
                        .collect();
                    let mut out =
                        serde_json::json!({ "name": s.name, "revision": s.revision, "instances": instances });
                    match reflected.get(&s.name) {
                        Some(Ok(Some(info))) => out["methods"] = serde_json::json!(info.methods),
                        Some(Ok(None)) => out["methods_error"] = "not served by its first instance".into(),
                        Some(Err(e)) => out["methods_error"] = e.clone().into(),
                        None => {}
                    }
                    out
                })
                .collect();
            let out = serde_json::json!({
                "registry": registry,
                "epoch": listing.epoch,
                "revision": listing.revision,
                "settling": listing.settling,
                "registration_open": open,
                "services": services,
                "omitted": listing.omitted,
            });
            outln!("{out}");
        } else {
            let settling =
                if listing.settling { " (settling: servers may still be registering)" } else { "" };
            outln!("registry {registry}, revision {}{settling}", listing.revision);
            if open == Some(true) {
                outln!("warning: {OPEN_REGISTRATION}");
            }
            if listing.services.iter().all(|s| s.instances.is_empty()) {
                outln!("  no instances");
            }
            for s in listing.services.iter().filter(|s| !s.instances.is_empty()) {
                let n = s.instances.len();
                outln!("{} ({n} instance{})", s.name, if n == 1 { "" } else { "s" });
                for i in &s.instances {
                    let meta: Vec<String> =
                        i.instance.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    outln!(
                        "  {:<28} weight {:<3} lease expires in {:>6} ms  {}",
                        i.instance.address,
                        i.instance.weight,
                        i.expires_in_ms,
                        meta.join(" ")
                    );
                    if !i.instance.local_addresses.is_empty() {
                        let (local, host) = (i.instance.local_addresses.join(" "), &i.instance.host_id);
                        outln!("    and for clients on host {host}: {local}");
                    }
                }
                match reflected.get(&s.name) {
                    Some(Ok(Some(info))) => {
                        outln!("  methods:");
                        for m in &info.methods {
                            outln!("    {}", crate::call::method_line(m));
                        }
                    }
                    Some(Ok(None)) => outln!("  methods: not served by its first instance"),
                    Some(Err(e)) => outln!("  methods: {e}"),
                    None => {}
                }
            }
            if listing.omitted > 0 {
                outln!(
                    "({} more services not shown: the list passed the controller's bound on a reply)",
                    listing.omitted
                );
            }
        }
        Ok(())
    })
}
