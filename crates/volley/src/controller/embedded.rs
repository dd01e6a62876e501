//! The process's embedded controller on [`DEFAULT_REGISTRY`]: a process whose roles all live in
//! it needs no other registry.

use std::time::Duration;

use super::server::{Controller, ControllerConfig};
use crate::discovery::DEFAULT_REGISTRY;
use crate::error::Error;

static EMBEDDED: tokio::sync::Mutex<Option<Controller>> = tokio::sync::Mutex::const_new(None);

/// The process's embedded controller on [`DEFAULT_REGISTRY`], started if it is not running.
///
/// It runs on the runtime that first needed it. If the application serves
/// [`DEFAULT_REGISTRY`] with a controller of its own, that one is used and this returns
/// `Ok(None)`.
pub async fn embedded() -> Result<Option<Controller>, Error> {
    let mut slot = EMBEDDED.lock().await;
    if let Some(c) = slot.as_ref().filter(|c| c.is_serving()) {
        return Ok(Some(c.clone()));
    }
    let name = DEFAULT_REGISTRY.trim_start_matches("inproc://");
    if crate::transport::inproc::lookup(name).is_some() {
        return Ok(None);
    }
    // No settling: an embedded controller restarts only with its process, and with it every
    // server that could have been registered, so there is nothing to wait for.
    let c = Controller::new(ControllerConfig { settle: Duration::ZERO, ..ControllerConfig::default() });
    c.listen(DEFAULT_REGISTRY).await?;
    tracing::debug!("started the embedded registry on {DEFAULT_REGISTRY}");
    *slot = Some(c.clone());
    Ok(Some(c))
}
