//! How a server leaves without losing a call: the settings of a graceful stop, and the stop
//! signals a process gets from systemd, Kubernetes, Docker or a terminal.

use std::time::Duration;

/// The steps of [`Server::stop_gracefully`](super::Server::stop_gracefully), each bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, derive_setters::Setters)]
#[non_exhaustive]
pub struct Drain {
    /// Longest wait for the registry to drop the server's instances (its leases revoked)
    /// before it goes on (default 1 s; the lease lapses by itself otherwise).
    pub deregister_within: Duration,
    /// How long the server keeps serving after it deregistered, while the callers' watches move
    /// them to other instances (default 1 s).
    pub grace: Duration,
    /// How long the handlers still running after the go-away get to finish; past it their
    /// requests are answered `ShuttingDown` (default 10 s).
    pub deadline: Duration,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            deregister_within: Duration::from_secs(1),
            grace: Duration::from_secs(1),
            deadline: Duration::from_secs(10),
        }
    }
}

/// A signal that asks a process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopSignal {
    /// `SIGTERM`: what systemd, Kubernetes, Docker and CI runners send.
    Terminate,
    /// `SIGINT`: Ctrl-C in a terminal.
    Interrupt,
}

/// Completes on the first `SIGTERM` or `SIGINT` the process gets from now on, and says which.
/// The handlers are installed when this is first polled; while any is installed, those signals
/// no longer end the process by themselves.
pub async fn shutdown_signal() -> std::io::Result<StopSignal> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => Ok(StopSignal::Terminate),
            _ = int.recv() => Ok(StopSignal::Interrupt),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.map(|()| StopSignal::Interrupt)
    }
}
