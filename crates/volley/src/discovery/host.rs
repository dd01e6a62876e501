//! Which host this process runs on, as the registry compares it: a caller uses an instance's
//! same-host addresses (`shm://`, `unix://`) only when the instance's host id equals its own.
//!
//! The id is the kernel's boot id and the process's network namespace
//! (`BOOT_ID/net:[INODE]`, docs/PROTOCOL.md §16.1):
//!
//! - **The boot id** (`/proc/sys/kernel/random/boot_id`) is a random UUID the kernel draws at
//!   each boot, the same for every process on that kernel — containers included, as they share
//!   it — and different on every other machine. `/etc/machine-id` is not: it is copied with the
//!   images that clone a machine or build a container, so two hosts can share one, and a
//!   shm address that names a socket on the other host would reach a different server of the
//!   same name here. The hostname adds nothing a random UUID lacks, and each container has its
//!   own.
//! - **The network namespace**: containers on one kernel usually have one each, and an abstract
//!   unix socket (`shm://NAME`) exists only in its namespace — so two containers may each hold a
//!   different `volley-shm/NAME`. Processes in one namespace (a host's services, the
//!   containers of one pod) reach each other's abstract sockets.
//!
//! Same host id is a promise that a same-host address *may* work, not that it does (a socket
//! path in a mount namespace the caller does not share, a server that stopped listening there):
//! the caller falls back to the instance's `address` when it cannot open it.
//!
//! `VOLLEY_HOST_ID`, when set and not empty, replaces the computed id (for deployments that
//! know better, such as containers that share a socket directory but not a network namespace).

use std::sync::OnceLock;

/// The environment variable that replaces the computed host id.
pub const HOST_ID_ENV: &str = "VOLLEY_HOST_ID";

/// This process's host id, computed once: `VOLLEY_HOST_ID` if set, else the boot id and the
/// network namespace (Linux). `None` where neither is available: such a process registers no
/// same-host addresses and never prefers them.
pub fn host_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| match std::env::var(HOST_ID_ENV) {
        Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
        _ => computed(),
    })
    .as_deref()
}

#[cfg(target_os = "linux")]
fn computed() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let net = std::fs::read_link("/proc/self/ns/net").ok()?;
    Some(format!("{}/{}", boot.trim(), net.to_str()?))
}

#[cfg(not(target_os = "linux"))]
fn computed() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn the_host_id_is_the_boot_id_and_the_network_namespace() {
        let id = super::computed().expect("Linux has a boot id and a network namespace");
        let (boot, net) = id.split_once('/').unwrap();
        assert_eq!(boot.len(), 36, "a UUID: {boot}");
        assert!(net.starts_with("net:[") && net.ends_with(']'), "{net}");
        assert_eq!(super::computed().as_deref(), Some(id.as_str()), "stable");
    }
}
