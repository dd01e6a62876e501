//! Client ids tied to the connections that hold them.
//!
//! A client id is held by the connection that asked for it (`alloc_client_id`) and by every
//! connection that claimed it since (`claim_client_id`, or a watch carrying it). When the last
//! of them closes, the controller gives the id back to the store: a client killed with -9, or
//! whose machine went away (the server's keepalive closes its connection), no longer keeps its
//! id for the life of the controller. An id held by an open connection is never handed out
//! again, and only a connection that holds an id may release it.
//!
//! Ids asked for over `inproc://` have no connection to follow: they are held until released
//! (a client in the process releases its id when dropped).

use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::shrink::Shrink;
use super::store::Store;
use crate::server::ConnectionScope;

/// Which connections hold which client ids.
#[derive(Default)]
pub(crate) struct Holders {
    state: Mutex<HoldState>,
}

#[derive(Default)]
struct HoldState {
    /// Connection id -> the client ids it holds.
    by_connection: FxHashMap<u64, Vec<u32>>,
    /// Client id -> the connections holding it (almost always one; two while a client moves
    /// from its first-contact connection to its own).
    by_id: FxHashMap<u32, Vec<u64>>,
}

impl Holders {
    /// Records that `connection` holds `id`; returns whether it is the connection's first id
    /// (then the caller must [`follow`] the connection).
    fn hold(&self, id: u32, connection: u64) -> bool {
        let mut st = self.state.lock();
        let holders = st.by_id.entry(id).or_default();
        if holders.contains(&connection) {
            return false;
        }
        holders.push(connection);
        let ids = st.by_connection.entry(connection).or_default();
        ids.push(id);
        ids.len() == 1
    }

    /// `connection` closed: forgets it, and returns the ids no other connection holds (to be
    /// given back to the store).
    fn closed(&self, connection: u64) -> Vec<u32> {
        let mut st = self.state.lock();
        let ids = st.by_connection.remove(&connection).unwrap_or_default();
        let mut free = Vec::new();
        for id in ids {
            let Some(holders) = st.by_id.get_mut(&id) else { continue };
            holders.retain(|&c| c != connection);
            if holders.is_empty() {
                st.by_id.remove(&id);
                free.push(id);
            }
        }
        st.by_connection.shrink_if_sparse();
        st.by_id.shrink_if_sparse();
        free
    }

    /// Whether `connection` (`None`: an inproc caller) may release `id`: it holds it, or no
    /// connection does.
    pub fn may_release(&self, id: u32, connection: Option<u64>) -> bool {
        let st = self.state.lock();
        match st.by_id.get(&id) {
            None => true,
            Some(holders) => connection.is_some_and(|c| holders.contains(&c)),
        }
    }

    /// `id` was released: no connection holds it any more.
    pub fn forget(&self, id: u32) {
        let mut st = self.state.lock();
        for c in st.by_id.remove(&id).unwrap_or_default() {
            if let Some(ids) = st.by_connection.get_mut(&c) {
                ids.retain(|&i| i != id);
            }
        }
        st.by_id.shrink_if_sparse();
    }

    /// Ids held by open connections (for tests and stats).
    pub fn held(&self) -> usize {
        self.state.lock().by_id.len()
    }
}

/// Ties `id` to `connection` (if the caller came over one): when every connection holding it
/// has closed, the id goes back to `store`. Ends early when `stop` is cancelled (the
/// controller shut down; its store goes with it).
pub(crate) fn hold(
    holders: &Arc<Holders>,
    store: &Arc<dyn Store>,
    stop: &tokio_util::sync::CancellationToken,
    id: u32,
    connection: Option<ConnectionScope>,
) {
    let Some(connection) = connection else { return };
    if !holders.hold(id, connection.id) {
        return;
    }
    let (holders, store, stop) = (holders.clone(), store.clone(), stop.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = connection.closed() => {}
            _ = stop.cancelled() => return,
        }
        for id in holders.closed(connection.id) {
            if let Err(e) = store.release_client_id(id).await {
                tracing::debug!(id, error = %e, "could not give back the client id of a closed connection");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_free_when_its_last_holder_closes() {
        let h = Holders::default();
        assert!(h.hold(7, 1), "the connection's first id");
        assert!(!h.hold(8, 1), "its second");
        assert!(h.hold(7, 2), "a claim from another connection");
        assert!(!h.may_release(7, Some(3)) && !h.may_release(7, None), "only holders release");
        assert!(h.may_release(7, Some(2)) && h.may_release(99, None));
        assert_eq!(h.closed(1), vec![8], "7 is still held by connection 2");
        assert_eq!(h.held(), 1);
        assert_eq!(h.closed(2), vec![7]);
        assert_eq!(h.closed(2), Vec::<u32>::new(), "closing twice releases nothing");
        h.hold(9, 4);
        h.forget(9);
        assert_eq!((h.held(), h.closed(4)), (0, vec![]));
    }
}
