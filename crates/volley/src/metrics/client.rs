//! The metrics of the methods this process calls, kept for every client together.
//!
//! A call names its method by a [`Method`](crate::Method) descriptor, a `const` with
//! `&'static str` names, so there is no place in it to keep a handle. Instead each thread keeps
//! a small direct-mapped cache from the names' addresses (static, so never reused for other
//! text) to the method's metrics: a hit costs a few compares, with no lock and no hashing of
//! names. The same names at another address (see [`NamesKey`](crate::method::NamesKey)) are
//! found by text and take over the slot. A miss looks the names up in the process's table
//! under a lock, once per method and thread. Entries live for the rest of the process, so the table is bounded: past
//! [`MAX_METHODS`], further methods share one entry named `_other`.

use std::cell::Cell;
use std::sync::LazyLock;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::method::{Home, MethodMetrics, thread_token};
use crate::method::NamesKey as Key;

/// Most methods with series of their own (bounds memory and the series a scrape returns).
pub(crate) const MAX_METHODS: usize = 1024;

/// Cache slots per thread (a power of two).
const SLOTS: usize = 16;

#[derive(Default)]
struct Table {
    by_name: FxHashMap<(Box<str>, Box<str>), &'static MethodMetrics>,
    /// In the order first called, for reports.
    all: Vec<&'static MethodMetrics>,
    overflow: Option<&'static MethodMetrics>,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

/// A method's metrics and this thread's tally of them.
type Entry = (&'static MethodMetrics, Home);

thread_local! {
    // Cells, not a `RefCell`: nothing runs while a slot is read or written that could reach
    // the cache again, so a borrow flag would only cost its checks.
    static CACHE: [Cell<(Key, Option<Entry>)>; SLOTS] = const { [const { Cell::new((Key::NONE, None)) }; SLOTS] };
}

/// The metrics of calls to `service`/`method` from this process, and this thread's tally.
#[inline]
pub(crate) fn method(service: &'static str, method: &'static str) -> Entry {
    let key = Key::of(service, method);
    let slot = key.slot(SLOTS);
    // The closures are kept this small so that `with` is inlined, and with it the access to
    // the thread-local (out of line, `with` was an indirect call to the thread-local's accessor
    // and made the probe about twice as costly).
    match CACHE.with(|c| c[slot].get()) {
        (k, Some(e)) if k.same_address(key) => e,
        (k, Some(e)) if k.same_text(key) => {
            CACHE.with(|c| c[slot].set((key, Some(e))));
            e
        }
        _ => fill(slot, key, service, method),
    }
}

#[cold]
#[inline(never)]
fn fill(slot: usize, key: Key, service: &str, method: &str) -> Entry {
    let m = lookup(service, method);
    let e = (m, (m.tally(), thread_token()));
    CACHE.with(|c| c[slot].set((key, Some(e))));
    e
}

fn lookup(service: &str, method: &str) -> &'static MethodMetrics {
    let mut t = TABLE.lock();
    if let Some(m) = t.by_name.get(&(service.into(), method.into())) {
        return m;
    }
    if t.all.len() >= MAX_METHODS {
        let other = t.overflow.unwrap_or_else(|| Box::leak(Box::new(MethodMetrics::new("_other", "_other"))));
        t.overflow = Some(other);
        return other;
    }
    let m: &'static MethodMetrics = Box::leak(Box::new(MethodMetrics::new(service, method)));
    t.by_name.insert((service.into(), method.into()), m);
    t.all.push(m);
    m
}

/// Every client method called so far in this process.
pub(crate) fn methods() -> Vec<&'static MethodMetrics> {
    let t = TABLE.lock();
    t.all.iter().copied().chain(t.overflow).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_names_give_the_same_metrics_and_other_names_others() {
        let a = method("client-table-test", "a").0;
        let b = method("client-table-test", "b").0;
        assert!(std::ptr::eq(a, method("client-table-test", "a").0));
        assert!(!std::ptr::eq(a, b));
        // The same text at another address (not from the cache) finds the same entry.
        let other: &'static str = Box::leak(String::from("client-table-test").into_boxed_str());
        assert!(std::ptr::eq(a, method(other, "a").0));
        assert!(methods().iter().any(|m| std::ptr::eq(*m, b)));
    }
}
