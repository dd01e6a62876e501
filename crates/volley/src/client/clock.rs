//! The clock of calls' deadlines: the coarse monotonic clock (`client/conn.rs` says why), or,
//! on a simulated host (feature `sim`), the simulation's time — so a deadline passes when
//! simulated time says so, not when the machine running the simulation got round to it.

pub(crate) use coarsetime::{Duration as Ticks, Instant};

/// Now, for deadlines.
#[inline]
pub(crate) fn now() -> Instant {
    #[cfg(feature = "sim")]
    if let Some(elapsed) = crate::transport::sim::elapsed() {
        return simulated(elapsed);
    }
    Instant::now()
}

/// Simulated time as a coarse instant: a fixed origin (taken once per process) plus the
/// simulation's elapsed time. Only differences between instants are read, never the value.
#[cfg(feature = "sim")]
fn simulated(elapsed: std::time::Duration) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now) + Ticks::from(elapsed)
}
