//! What one measurement is asked to do and with which settings, and the helpers every runner
//! shares (a fresh unix socket path, pinning a thread to a core): what `runner.rs` and the raw
//! ceiling's own runner (`raw_echo.rs`) both start from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use core_affinity::CoreId;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Latency,
    Throughput,
    Batch,
    /// One request, many replies: `requests` items through `concurrency` server streams.
    #[serde(rename = "server_stream")]
    ServerStream,
}

/// What to measure: calls in a closed loop (or at a fixed rate) for a while, or a fixed
/// number of requests as fast as the method allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scenario {
    pub kind: Kind,
    /// Callers sharing the connection (latency/throughput), for a unary batch run the calls
    /// kept in flight, for server streams the streams open at once.
    pub concurrency: usize,
    pub payload: usize,
    /// Batch scenario: how many requests; server streams: how many items in all.
    pub requests: u64,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub warmup: Duration,
    pub duration: Duration,
    pub rate: Option<f64>,
    /// Volley's batch: requests per chunk and chunks in flight.
    pub chunk_size: usize,
    pub chunk_window: usize,
    /// Volley's server streams: each stream's credit window (items).
    pub stream_window: u32,
    /// Time bound of a run of unary calls in the batch scenario.
    pub batch_max: Duration,
    /// Cores for the server and the client (`None`: not pinned).
    pub cores: Option<(CoreId, CoreId)>,
}

/// A number no other endpoint of this process has.
pub fn unique() -> u64 {
    static UNIQUE: AtomicU64 = AtomicU64::new(0);
    UNIQUE.fetch_add(1, Ordering::Relaxed)
}

/// A fresh unix socket path in the temporary directory.
pub fn unix_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("volley-compare-{what}-{}-{}.sock", std::process::id(), unique()))
}

/// Pins the calling thread; says so once if the OS refused (the run goes on unpinned).
pub fn pin(core: Option<CoreId>) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Some(core) = core
        && !core_affinity::set_for_current(core)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        eprintln!("could not pin a thread to core {}: running unpinned", core.id);
    }
}
