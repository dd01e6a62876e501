//! How a server sheds load it cannot serve in time: the `--adaptive-limit` switch of the
//! commands that serve (`serve-echo`, `testbed-role`, `testbed`).

use volley::{ConcurrencyLimit, ServerBuilder};

/// Load shedding settings.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Shedding {
    /// Bound the requests handled at once by a limit that follows the latency the server
    /// observes (aiming at a 5 ms sojourn from read to reply); requests beyond it are answered
    /// Overloaded at once instead of queueing until their callers give up. Off by default;
    /// the limit shows in the admin endpoint as volley_server_concurrency_limit.
    #[arg(long)]
    pub adaptive_limit: bool,
}

impl Shedding {
    /// The adaptive limit to configure, if switched on.
    pub fn limit(self) -> Option<ConcurrencyLimit> {
        self.adaptive_limit.then(ConcurrencyLimit::default)
    }

    pub fn apply(self, b: ServerBuilder) -> ServerBuilder {
        match self.limit() {
            Some(l) => b.concurrency_limit(l),
            None => b,
        }
    }
}
