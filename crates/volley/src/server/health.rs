//! What a server says of its health: whether it takes new callers and why not (the admin
//! endpoint's `/readyz`), and the same per service through the `volley.health` service every
//! server answers (`check` now, `watch` when it changes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::Status;
use crate::health::{Health as Answer, HealthRequest, HealthWatch, MAX_WATCH, Serving};
use crate::proto::Code;
use crate::transport::Address;

/// Most watches held at once; beyond it a watch is answered at once (the caller asks again),
/// so a flood of watches holds no more than this many requests.
const MAX_WATCHERS: usize = 1024;

/// A server's health, shared by the server, its listeners, its registrations and the handlers
/// of `volley.health`.
pub(crate) struct Health {
    draining: AtomicBool,
    /// Listeners that failed for good (the socket closed under them), with the error.
    failed_listeners: Mutex<Vec<(Address, String)>>,
    /// Services their owner said do not take new calls, with why.
    not_serving: Mutex<FxHashMap<String, String>>,
    /// Registrations whose lease the registry has not confirmed within its time, with why.
    leases: Mutex<BTreeMap<u64, String>>,
    next_lease: AtomicU64,
    /// Bumped on every change, for watches.
    changed: tokio::sync::watch::Sender<u64>,
    watchers: AtomicUsize,
    /// The services the server has handlers for (an unknown one is answered `UnknownService`).
    services: Vec<String>,
}

impl Health {
    pub fn new(services: Vec<String>) -> Self {
        Health {
            draining: AtomicBool::new(false),
            failed_listeners: Mutex::new(Vec::new()),
            not_serving: Mutex::default(),
            leases: Mutex::default(),
            next_lease: AtomicU64::new(0),
            changed: tokio::sync::watch::Sender::new(0),
            watchers: AtomicUsize::new(0),
            services,
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The server starts to leave: it is not ready for new callers any more.
    pub fn start_draining(&self) {
        if !self.draining.swap(true, Ordering::AcqRel) {
            self.bump();
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn listener_failed(&self, address: Address, error: String) {
        self.failed_listeners.lock().push((address, error));
        self.bump();
    }

    pub fn failed_listeners(&self) -> Vec<(Address, String)> {
        self.failed_listeners.lock().clone()
    }

    /// Whether the registration `key`'s lease is held (`None`) or why not.
    fn set_lease(&self, key: u64, problem: Option<String>) {
        let changed = {
            let mut leases = self.leases.lock();
            match problem {
                Some(why) => leases.insert(key, why).is_none(),
                None => leases.remove(&key).is_some(),
            }
        };
        if changed {
            self.bump();
        }
    }

    /// Marks `service` as taking new calls, or not and why.
    pub fn set_serving(&self, service: &str, problem: Option<String>) {
        let changed = {
            let mut map = self.not_serving.lock();
            match problem {
                Some(why) => map.insert(service.to_string(), why.clone()).as_ref() != Some(&why),
                None => map.remove(service).is_some(),
            }
        };
        if changed {
            self.bump();
        }
    }

    /// Whether the server takes new callers, or why not: it is not leaving, every listener it
    /// opened still accepts, and the registry confirmed every lease in time.
    pub fn ready(&self) -> Result<(), String> {
        if self.is_draining() {
            return Err("the server is stopping".into());
        }
        if let Some((address, error)) = self.failed_listeners.lock().first() {
            return Err(format!("the listener on {address} failed: {error}"));
        }
        if let Some(why) = self.leases.lock().values().next() {
            return Err(why.clone());
        }
        Ok(())
    }

    /// The status of `service` (empty: the server as a whole).
    pub fn status(&self, service: &str) -> Result<Answer, Status> {
        if !service.is_empty() && !self.services.iter().any(|s| s == service) {
            return Err(Status::new(Code::UnknownService, format!("no service named {service:?}")));
        }
        let answer = |status, reason| Ok(Answer { status, reason });
        if self.is_draining() {
            return answer(Serving::Draining, "the server is stopping".into());
        }
        if let Err(why) = self.ready() {
            return answer(Serving::NotServing, why);
        }
        match self.not_serving.lock().get(service) {
            Some(why) => answer(Serving::NotServing, why.clone()),
            None => answer(Serving::Serving, String::new()),
        }
    }

    /// The `check` method.
    pub fn check(&self, req: HealthRequest) -> Result<Answer, Status> {
        self.status(&req.service)
    }

    /// The `watch` method: answers when the status is not `req.last` any more, at the
    /// timeout, or at once while draining (the server is about to go; a watch held then would
    /// only hold its stop back).
    pub async fn watch(self: Arc<Self>, req: HealthWatch) -> Result<Answer, Status> {
        let mut changes = self.changed.subscribe();
        let now = self.status(&req.service)?;
        let timeout = Duration::from_millis(req.timeout_ms).min(MAX_WATCH);
        if req.last != Some(now.status) || now.status == Serving::Draining || timeout.is_zero() {
            return Ok(now);
        }
        let Some(_held) = Watcher::enter(&self.watchers) else { return Ok(now) };
        let expiry = tokio::time::sleep(timeout);
        tokio::pin!(expiry);
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return self.status(&req.service) },
                () = &mut expiry => return self.status(&req.service),
            }
            let now = self.status(&req.service)?;
            if Some(now.status) != req.last || now.status == Serving::Draining {
                return Ok(now);
            }
        }
    }
}

/// One registration's say in its server's readiness: the server is not ready while the
/// registry has not confirmed the lease within its time (callers resolving the service would
/// not find it). Says nothing any more once dropped.
pub(crate) struct LeaseHealth {
    health: Arc<Health>,
    key: u64,
}

impl LeaseHealth {
    pub fn new(health: Arc<Health>) -> Self {
        let key = health.next_lease.fetch_add(1, Ordering::Relaxed);
        LeaseHealth { health, key }
    }

    pub fn held(&self) {
        self.health.set_lease(self.key, None);
    }

    pub fn not_held(&self, why: String) {
        self.health.set_lease(self.key, Some(why));
    }
}

impl Drop for LeaseHealth {
    fn drop(&mut self) {
        self.held();
    }
}

/// One held watch, counted while it lives.
struct Watcher<'a>(&'a AtomicUsize);

impl<'a> Watcher<'a> {
    fn enter(count: &'a AtomicUsize) -> Option<Self> {
        let before = count.fetch_add(1, Ordering::AcqRel);
        let w = Watcher(count);
        (before < MAX_WATCHERS).then_some(w)
    }
}

impl Drop for Watcher<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Arc<Health> {
        Arc::new(Health::new(vec!["echo".into()]))
    }

    fn watch(last: Serving, ms: u64) -> HealthWatch {
        HealthWatch { service: "echo".into(), last: Some(last), timeout_ms: ms }
    }

    #[test]
    fn the_status_says_why_it_is_not_serving() {
        let h = health();
        assert_eq!(h.status("echo").unwrap().status, Serving::Serving);
        assert_eq!(h.status("").unwrap().status, Serving::Serving);
        assert_eq!(h.status("nope").unwrap_err().code, Code::UnknownService);

        h.set_serving("echo", Some("its database is down".into()));
        let a = h.status("echo").unwrap();
        assert_eq!((a.status, a.reason.as_str()), (Serving::NotServing, "its database is down"));
        assert_eq!(h.status("").unwrap().status, Serving::Serving, "the server as a whole still serves");
        h.set_serving("echo", None);

        let lease = LeaseHealth::new(h.clone());
        lease.not_held("lease 7 not confirmed".into());
        assert_eq!(h.ready(), Err("lease 7 not confirmed".into()));
        assert_eq!(h.status("echo").unwrap().status, Serving::NotServing);
        lease.held();
        assert_eq!(h.ready(), Ok(()));
        lease.not_held("lease 7 not confirmed".into());
        drop(lease);
        assert_eq!(h.ready(), Ok(()), "a registration gone says nothing");

        h.start_draining();
        assert_eq!(h.status("echo").unwrap().status, Serving::Draining);
        assert_eq!(h.status("").unwrap().status, Serving::Draining);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_answers_when_the_status_changes() {
        let h = health();
        let w = tokio::spawn(h.clone().watch(watch(Serving::Serving, 30_000)));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!w.is_finished(), "nothing changed: the watch is held");
        h.set_serving("echo", Some("maintenance".into()));
        let a = w.await.unwrap().unwrap();
        assert_eq!((a.status, a.reason.as_str()), (Serving::NotServing, "maintenance"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_answers_at_its_timeout_and_at_once_when_it_differs_or_drains() {
        let h = health();
        let started = tokio::time::Instant::now();
        let a = h.clone().watch(watch(Serving::Serving, 2_000)).await.unwrap();
        assert_eq!(a.status, Serving::Serving);
        assert_eq!(started.elapsed(), Duration::from_secs(2));

        let a = h.clone().watch(watch(Serving::NotServing, 2_000)).await.unwrap();
        assert_eq!(a.status, Serving::Serving, "the caller's status is stale: answered at once");
        assert_eq!(started.elapsed(), Duration::from_secs(2));

        let w = tokio::spawn(h.clone().watch(watch(Serving::Serving, 30_000)));
        tokio::task::yield_now().await;
        h.start_draining();
        assert_eq!(w.await.unwrap().unwrap().status, Serving::Draining);
        let a = h.clone().watch(watch(Serving::Draining, 30_000)).await.unwrap();
        assert_eq!(a.status, Serving::Draining, "while draining a watch is not held");
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn watches_beyond_the_bound_are_answered_at_once() {
        let h = health();
        let held: Vec<_> = (0..MAX_WATCHERS)
            .map(|_| tokio::spawn(h.clone().watch(watch(Serving::Serving, 30_000))))
            .collect();
        while h.watchers.load(Ordering::Acquire) < MAX_WATCHERS {
            tokio::task::yield_now().await;
        }
        let started = tokio::time::Instant::now();
        let a = h.clone().watch(watch(Serving::Serving, 30_000)).await.unwrap();
        assert_eq!(a.status, Serving::Serving);
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(held.iter().all(|w| !w.is_finished()));
        h.start_draining();
        for w in held {
            assert_eq!(w.await.unwrap().unwrap().status, Serving::Draining);
        }
    }
}
