//! What a server's handlers need of it: the runtime and task tracker their work runs under,
//! how many requests one batch may hold, and the count of requests answered
//! `DeadlineExceeded`. The server holds it, and each handler holds it weakly: a handler is
//! part of the server's router, so a strong link back would keep the server alive.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

pub(crate) struct Host {
    /// Most requests handed to a handler at once (`ServerConfig::max_batch`).
    pub max_batch: usize,
    /// Accept loops, connections, inproc dispatchers and handler batches still running.
    pub tasks: TaskTracker,
    /// The runtime `listen` was first called on.
    pub runtime: OnceLock<Handle>,
    /// Requests answered `DeadlineExceeded` because their caller's budget ran out first.
    pub expired: AtomicU64,
}

impl Host {
    pub fn new(max_batch: usize) -> Host {
        Host { max_batch, tasks: TaskTracker::new(), runtime: OnceLock::new(), expired: AtomicU64::new(0) }
    }

    /// Spawns on the server's runtime (the one `listen` was first called on).
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let rt = self.runtime.get().cloned().unwrap_or_else(Handle::current);
        self.tasks.spawn_on(fut, &rt);
    }
}
