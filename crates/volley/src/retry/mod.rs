//! When a call goes out again: the attempts of one call through a pool of instances (failover,
//! retries under a budget, hedged requests), and the settings users give them.
//!
//! - `attempts.rs` — a call's attempts ([`Retrier`](attempts::Retrier): pick, connect, attempt,
//!   retry or hedge, learn);
//! - `budget.rs` — the token bucket that bounds retries and hedges;
//! - `p95.rs` — the latency a hedge waits for; `policy.rs` — [`RetryBudget`], [`Hedge`].

mod attempts;
mod budget;
mod p95;
mod policy;

pub(crate) use attempts::{Plan, Retrier, RetryConfig};
pub use policy::{Hedge, RetryBudget};
