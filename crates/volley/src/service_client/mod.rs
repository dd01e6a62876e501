//! [`ServiceClient`]: calls services by name. **Direct mode** (default): resolve once through
//! the [`Registry`](crate::Registry), cache, follow changes by watch (`watch.rs`), call
//! instances directly through a [`balance`](crate::balance) pool with the attempts of
//! [`retry`](crate::retry) (failover; opt-in retries under a budget, hedged requests, outlier
//! ejection), keep calling from the cache while the registry is down, and reach instances on
//! this host through the shared-memory (or unix) address they advertise beside their tcp one.
//! **Relayed mode**: every call goes through the controller. Scatter-gather calls every
//! instance, and [`merge_sorted`] merges what it gathered.

mod client;
mod merge;
mod watch;

pub use client::{Gathered, Mode, ServiceClient, ServiceClientStats, ServiceConfig};
pub use merge::merge_sorted;
