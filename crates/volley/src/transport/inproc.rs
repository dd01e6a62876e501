//! The process-wide table of inproc servers, by name.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use crate::Error;
use crate::server::Shared;

static SERVERS: LazyLock<Mutex<HashMap<String, Weak<Shared>>>> = LazyLock::new(Default::default);

/// Publishes `server` under `name`. Fails if a live server already has the name.
pub(crate) fn bind(name: &str, server: &Arc<Shared>) -> Result<(), Error> {
    let mut table = SERVERS.lock();
    if table.get(name).is_some_and(|w| w.strong_count() > 0) {
        return Err(Error::InvalidAddress {
            addr: format!("inproc://{name}"),
            reason: "address in use by another server in this process".into(),
        });
    }
    table.insert(name.to_string(), Arc::downgrade(server));
    Ok(())
}

/// Removes `name` if it still belongs to `server`.
pub(crate) fn unbind(name: &str, server: &Arc<Shared>) {
    let mut table = SERVERS.lock();
    if table.get(name).is_some_and(|w| w.as_ptr() == Arc::as_ptr(server)) {
        table.remove(name);
    }
}

/// The live server named `name`.
pub(crate) fn lookup(name: &str) -> Option<Arc<Shared>> {
    SERVERS.lock().get(name).and_then(Weak::upgrade)
}
