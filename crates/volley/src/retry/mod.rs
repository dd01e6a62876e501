//! When a call goes out again: the attempts of one call through a pool of instances (failover,
//! retries under a budget, hedged requests), and the settings users give them.
//!
//! - `attempts.rs` — a call's attempts (`Retrier`: pick, connect, attempt,
//!   retry or hedge, learn);
//! - `budget.rs` — the token bucket that bounds retries and hedges;
//! - `hedge.rs` — hedged requests: [`Hedge`], and the p95 latency a hedge waits for;
//! - `policy.rs` — [`RetryBudget`].

mod attempts;
mod budget;
mod hedge;
mod policy;

pub(crate) use attempts::{Plan, Retrier, RetryConfig};
pub use hedge::Hedge;
pub use policy::RetryBudget;
