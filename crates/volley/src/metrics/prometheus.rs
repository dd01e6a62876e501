//! A [`Scrape`] in the Prometheus text format (version 0.0.4), through the `prometheus-client`
//! crate's encoder (names, label escaping, `# HELP`/`# TYPE`, histogram series). Our
//! histograms are read at scrape time by a collector, not kept in the crate's own metric types:
//! its `Histogram::observe` takes a mutex per observation.

use std::fmt::Error as FmtError;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::histogram::Snapshot;
use super::method::ERROR_LABELS;
use super::scrape::{Named, Scrape};

/// The `Content-Type` of the text this module writes.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Latency bucket bounds: every power of four nanoseconds from 1 µs to 17 s (powers of two
/// are edges of the histogram's buckets, so each bound counts within a nanosecond).
fn latency_bounds() -> impl Iterator<Item = u64> {
    (10..=34).step_by(2).map(|p| 1u64 << p)
}

/// Batch, frame-size and wake-up bounds: 1, 2, 4 ... 65,536 (exact up to 32).
fn count_bounds() -> impl Iterator<Item = u64> {
    (0..=16).map(|p| 1u64 << p)
}

/// The scrape as Prometheus text.
pub(crate) fn encode(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collect(scrape)));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}

struct Collect(Scrape);

impl std::fmt::Debug for Collect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Collect")
    }
}

impl Collector for Collect {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), FmtError> {
        let s = &self.0;
        methods(&mut enc, "server", &s.server.methods)?;
        methods(&mut enc, "client", &s.client)?;
        server(&mut enc, s)?;
        if let Some(r) = &s.registry {
            let st = &r.counters;
            gauge(
                &mut enc,
                "volley_registry_services",
                "Services with at least one instance.",
                r.services.len() as u64,
            )?;
            let mut m = enc.encode_descriptor(
                "volley_registry_instances",
                "Instances registered, per service.",
                None,
                MetricType::Gauge,
            )?;
            for svc in &r.services {
                m.encode_family(&[("service", svc.name.as_str())])?
                    .encode_gauge(&(svc.instances.len() as u64))?;
            }
            counter(
                &mut enc,
                "volley_registry_lease_renewals",
                "Lease renewals accepted.",
                st.lease_renewals,
            )?;
            counter(
                &mut enc,
                "volley_registry_expired_instances",
                "Instances removed as their lease lapsed.",
                st.expired_instances,
            )?;
            counter(
                &mut enc,
                "volley_registry_watch_events",
                "Watches answered with a change.",
                st.watch_events,
            )?;
            counter(&mut enc, "volley_registry_resolves", "Services looked up.", st.resolves)?;
            counter(
                &mut enc,
                "volley_registry_relayed_calls",
                "Calls relayed to instances.",
                st.relayed_calls,
            )?;
            gauge(
                &mut enc,
                "volley_registry_client_ids_held",
                "Client ids held by open connections.",
                st.client_ids_held,
            )?;
        }
        Ok(())
    }
}

fn methods(enc: &mut DescriptorEncoder, side: &str, list: &[Named]) -> Result<(), FmtError> {
    if list.is_empty() {
        return Ok(());
    }
    let labels = |n: &Named| [("service", n.service.to_string()), ("method", n.method.to_string())];
    let name = format!("volley_{side}_calls");
    let mut m = enc.encode_descriptor(
        &name,
        "Calls that ended (answered, failed or abandoned).",
        None,
        MetricType::Counter,
    )?;
    for n in list {
        m.encode_family(&labels(n))?.encode_counter::<NoLabelSet, _, u64>(&n.snap.calls, None)?;
    }
    let name = format!("volley_{side}_errors");
    let mut m =
        enc.encode_descriptor(&name, "Calls that ended in an error, by code.", None, MetricType::Counter)?;
    for n in list {
        for (i, &count) in n.snap.errors.iter().enumerate().filter(|(_, c)| **c > 0) {
            let [s, me] = labels(n);
            let l = [s, me, ("code", ERROR_LABELS[i].to_string())];
            m.encode_family(&l)?.encode_counter::<NoLabelSet, _, u64>(&count, None)?;
        }
    }
    let name = format!("volley_{side}_in_flight");
    let mut m = enc.encode_descriptor(&name, "Calls started and not yet ended.", None, MetricType::Gauge)?;
    for n in list {
        m.encode_family(&labels(n))?.encode_gauge(&n.snap.in_flight)?;
    }
    let name = format!("volley_{side}_latency_seconds");
    let help = "Time from a call's start to its end (a server: its handler batch's).";
    let mut m = enc.encode_descriptor(&name, help, None, MetricType::Histogram)?;
    for n in list {
        histogram(&mut m.encode_family(&labels(n))?, &n.snap.latency, latency_bounds(), 1e-9)?;
    }
    let name = format!("volley_{side}_batch_size");
    let help = "Requests per handler batch (server) or per batch chunk (client).";
    let mut m = enc.encode_descriptor(&name, help, None, MetricType::Histogram)?;
    for n in list {
        histogram(&mut m.encode_family(&labels(n))?, &n.snap.batch, count_bounds(), 1.0)?;
    }
    Ok(())
}

fn server(enc: &mut DescriptorEncoder, s: &Scrape) -> Result<(), FmtError> {
    let sv = &s.server;
    gauge(enc, "volley_uptime_seconds", "Seconds since the admin endpoint started.", s.uptime.as_secs())?;
    gauge(enc, "volley_server_connections_open", "Connections served now.", sv.connections.served as u64)?;
    gauge(
        enc,
        "volley_server_connections_opening",
        "Connections in their handshake now.",
        sv.connections.opening as u64,
    )?;
    counter(enc, "volley_server_connections_accepted", "Connections accepted and served.", sv.accepted)?;
    counter(
        enc,
        "volley_server_connections_refused",
        "Connections refused (over max_connections).",
        sv.refused,
    )?;
    counter(
        enc,
        "volley_server_connections_evicted",
        "Opening connections closed to make room.",
        sv.connections.opening_evicted,
    )?;
    counter(
        enc,
        "volley_server_overload_refusals",
        "Requests answered Overloaded (queue bound full).",
        sv.overload_refusals,
    )?;
    let mut m = enc.encode_descriptor(
        "volley_server_deadline_expired",
        "Requests answered DeadlineExceeded as their caller's time budget ran out: before their \
         handler ran (it never ran for them) or while it ran (its work was dropped).",
        None,
        MetricType::Counter,
    )?;
    for (stage, n) in [("before_handler", sv.expiries.before_handler), ("in_handler", sv.expiries.in_handler)]
    {
        m.encode_family(&[("stage", stage)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
    }
    counter(
        enc,
        "volley_server_cancelled_requests",
        "Requests whose running handler was stopped because their client cancelled them.",
        sv.cancelled,
    )?;
    counter(enc, "volley_server_streams_opened", "Server streams opened.", sv.streams.opened)?;
    counter(enc, "volley_server_stream_items", "Items sent on server streams.", sv.streams.items)?;
    gauge(enc, "volley_server_streams_open", "Server streams open now.", sv.streams.open())?;
    let mut m = enc.encode_descriptor(
        "volley_server_streams_ended",
        "Server streams ended, by reason: done (the producer finished), error, cancelled (by the \
         client, or its connection closed), deadline, shutdown.",
        None,
        MetricType::Counter,
    )?;
    for (reason, n) in sv.streams.ended {
        m.encode_family(&[("reason", reason)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
    }
    gauge(
        enc,
        "volley_server_queued_requests",
        "Requests held now by handlers that did not finish on their first poll (bounded by max_queued).",
        sv.queued,
    )?;
    gauge(
        enc,
        "volley_server_receive_held_bytes",
        "Bytes held now in buffers of large frames being received and by replies peers have not read, \
         over all connections (bounded by receive_budget).",
        sv.receive_held,
    )?;
    gauge(
        enc,
        "volley_server_receive_budget_bytes",
        "The bound on bytes held for large frames being received (receive_budget).",
        sv.receive_budget,
    )?;
    if let Some((limit, in_flight)) = sv.concurrency {
        gauge(
            enc,
            "volley_server_concurrency_limit",
            "The adaptive concurrency limit now (only with one configured).",
            limit,
        )?;
        gauge(
            enc,
            "volley_server_concurrency_in_flight",
            "Requests admitted under the adaptive concurrency limit and not yet answered.",
            in_flight,
        )?;
    }
    let t = &sv.transport;
    counter(enc, "volley_server_frames_read", "Frames received.", t.frames_received)?;
    counter(enc, "volley_server_frames_written", "Frames sent.", t.frames_sent)?;
    counter(enc, "volley_server_messages_read", "Messages received.", t.messages_received)?;
    counter(enc, "volley_server_messages_written", "Messages sent.", t.messages_sent)?;
    counter(enc, "volley_server_bytes_read", "Bytes received.", t.bytes_received)?;
    counter(enc, "volley_server_bytes_written", "Bytes sent.", t.bytes_sent)?;
    for (name, help, h) in [
        ("volley_server_messages_per_frame_read", "Messages per frame received.", &sv.per_frame_read),
        ("volley_server_messages_per_frame_written", "Messages per frame sent.", &sv.per_frame_written),
        (
            "volley_server_reader_wakeups_per_batch",
            "For each batch of messages a connection's reader handed to the dispatcher, how many times \
             it had waited for its socket and been woken since the batch before (0: the bytes were \
             already there).",
            &sv.wakeups_per_batch,
        ),
    ] {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
        histogram(&mut m, h, count_bounds(), 1.0)?;
    }
    Ok(())
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), FmtError> {
    enc.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), FmtError> {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?.encode_gauge(&v)
}

/// One histogram series: buckets at `bounds`, values scaled by `scale` (nanoseconds to seconds).
fn histogram(
    m: &mut MetricEncoder,
    h: &Snapshot,
    bounds: impl Iterator<Item = u64>,
    scale: f64,
) -> Result<(), FmtError> {
    let bounds: Vec<u64> = bounds.collect();
    let mut below = 0;
    let buckets: Vec<(f64, u64)> = h
        .cumulative(&bounds)
        .into_iter()
        .map(|(bound, cumulative)| {
            let in_bucket = cumulative - below;
            below = cumulative;
            (bound as f64 * scale, in_bucket)
        })
        .collect();
    m.encode_histogram::<NoLabelSet>(h.sum() as f64 * scale, h.count(), &buckets, None)
}
