//! Which instance a call goes to: the instances of a service as a caller sees them
//! ([`pool`](self) of endpoints, one connection each), balancing by weighted round-robin, two
//! random choices by outstanding calls or by peak-EWMA latency, routing by key on a consistent
//! hash ring, and taking out instances that cannot be reached, keep failing or are far slower
//! than their peers (outlier ejection, then probes before they take calls again).
//!
//! - `pool.rs` — [`Balance`], the pool of one service: its view, the pick, ejections, probes,
//!   and what an attempt's outcome teaches it;
//! - `endpoint.rs` — one instance and its connection; `p2c.rs` — two random choices;
//!   `peak_ewma.rs` — the latency average; `ring.rs` — the key-hash ring ([`HashRing`]);
//! - `ejection.rs` — who is out, why, and when to probe; `policy.rs` — [`Outliers`],
//!   [`InstanceStats`]; `stats.rs` — the counters of an owner's pools.

mod ejection;
mod endpoint;
mod p2c;
mod peak_ewma;
mod policy;
mod pool;
mod ring;
mod stats;

pub(crate) use ejection::Reason;
pub(crate) use endpoint::{Endpoint, Outstanding};
pub use policy::{InstanceStats, Outliers};
pub use pool::Balance;
pub(crate) use pool::{Pick, Pool, PoolConfig, unreachable};
pub use ring::{HashRing, MAX_RING_WEIGHT, VNODES_PER_WEIGHT, hash_key, key_hash};
pub(crate) use stats::PoolStats;
