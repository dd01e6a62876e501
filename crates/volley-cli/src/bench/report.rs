//! What `volley bench` reports: one measurement's figures (text or JSON), and the summaries
//! over all of them — the hostile client's cost, batch against single calls, the generated
//! API against the `Method` layer.

use serde::Serialize;

use super::api::{Api, Figure};
use super::args::{Handler, RegistryMode, RuntimeMode, Style};
use super::hostile::Hostile;
use crate::output::outln;

/// One measurement: what `--json` prints, one object per line.
#[derive(Serialize, Debug)]
pub struct Report {
    /// `method` or `generated` (`--api`).
    pub api: Api,
    /// 1-based, with `--rounds`.
    pub round: usize,
    /// The in-process server's handler form (`sync` or `async`).
    pub handler: Handler,
    pub transport: String,
    pub runtime: RuntimeMode,
    /// `single` or `batch`.
    pub mode: Style,
    /// Requests per call (1 in single mode).
    pub batch_size: usize,
    pub payload: usize,
    pub concurrency: usize,
    /// Calls completed (a `call_batch` counts once).
    pub calls: u64,
    /// Requests completed.
    pub items: u64,
    pub seconds: f64,
    pub calls_per_s: f64,
    pub items_per_s: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub errors: u64,
    pub frames_sent: u64,
    pub messages_sent: u64,
    pub messages_per_frame: f64,
    /// `none`, `direct` or `relayed`.
    pub registry_mode: RegistryMode,
    /// The service resolved through the registry (null without one).
    pub service: Option<String>,
    /// Registry look-ups the client made (whole run: in direct mode, one).
    pub lookups: u64,
    /// Messages the client sent to and received from the controller in the measured window
    /// (in relayed mode every call's request and reply).
    pub registry_messages: u64,
    /// The binary's global allocator (`system`, `mimalloc`, `jemalloc`).
    pub global_allocator: &'static str,
    /// CPU time (user + system) of the whole process — client and, when in-process, server —
    /// in the measured window. On a shared machine this is steadier than calls/s: time the
    /// process spends waiting for a core does not count.
    pub cpu_seconds: f64,
    pub cpu_us_per_call: f64,
    /// Resident memory of the process (server and client) when measuring started (after the
    /// warm-up), at its end, and the most seen, sampled every second; growth from start to
    /// end in percent. For leaks: a steady load must not grow it.
    pub rss_start_kb: u64,
    pub rss_end_kb: u64,
    pub rss_max_kb: u64,
    pub rss_growth_pct: f64,
    /// Resident memory every ~10 s of the measured window (KiB), to tell a leak (steady
    /// growth) from an allocator settling (a step, then flat).
    pub rss_samples_kb: Vec<u64>,
    /// Heap bytes the program holds (allocated and not freed; glibc's `mallinfo2`, with the
    /// system allocator only), at the same moments as `rss_samples_kb`. Flat while resident
    /// memory grows means the allocator is keeping freed memory, not that the program leaks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub heap_samples_kb: Vec<u64>,
    /// The hostile client beside the callers in this measurement (null: none).
    pub hostile: Option<Hostile>,
    /// Bytes the hostile client wrote to the server (warm-up and measured window).
    pub hostile_bytes_sent: Option<u64>,
    /// CPU time of the in-process server's thread over the measured window, in percent of
    /// one core (with `--runtime split` only).
    pub server_cpu_pct: Option<f64>,
}

/// Every measurement (text, or one JSON object per line), then the summaries of the text form.
pub fn print_all(reports: &[Report], json: bool) -> Result<(), String> {
    if json {
        for report in reports {
            outln!("{}", serde_json::to_string(report).map_err(|e| e.to_string())?);
        }
        return Ok(());
    }
    reports.iter().for_each(print_report);
    let hostile = reports.iter().any(|r| r.hostile.is_some());
    if hostile {
        print_hostile_summary(reports);
    }
    if let [single, batch] = reports
        && !hostile
    {
        let ratio = batch.items_per_s / single.items_per_s.max(f64::MIN_POSITIVE);
        outln!("batch/single: {ratio:.1}x the requests per second");
    }
    let figures: Vec<Figure> = reports
        .iter()
        .map(|r| Figure { api: r.api, style: r.mode.name(), items_per_s: r.items_per_s })
        .collect();
    super::api::ratios(&figures).iter().for_each(|line| outln!("{line}"));
    Ok(())
}

fn print_report(r: &Report) {
    let batch = match r.mode {
        Style::Batch => format!(" of {} requests", r.batch_size),
        Style::Mix => format!(" (3 single, then a batch of {}, repeated)", r.batch_size),
        Style::Single => String::new(),
    };
    outln!(
        "{} echo, {} B payload, {} callers {}, runtime {:?}, {:?} calls{batch}, {:?} API, {:?} handler, round {}",
        r.transport,
        r.payload,
        r.concurrency,
        how_callers_connect(&r.transport, r.registry_mode),
        r.runtime,
        r.mode,
        r.api,
        r.handler,
        r.round
    );
    if let (Some(h), Some(sent)) = (r.hostile, r.hostile_bytes_sent) {
        outln!("  beside a hostile client ({h:?}) that wrote {:.1} MiB", sent as f64 / (1 << 20) as f64);
    }
    outln!("  {:.0} calls/s ({} calls in {:.2} s, {} errors)", r.calls_per_s, r.calls, r.seconds, r.errors);
    if let Some(cpu) = r.server_cpu_pct {
        outln!("  server thread CPU: {cpu:.1}% of a core");
    }
    if r.mode != Style::Single {
        outln!("  {:.0} requests/s; latency below is per call (a batch call counts once)", r.items_per_s);
    }
    outln!(
        "  resident memory: {} KiB after warm-up, {} KiB at the end ({:+.1}%), {} KiB at most",
        r.rss_start_kb,
        r.rss_end_kb,
        r.rss_growth_pct,
        r.rss_max_kb
    );
    if let (Some(first), Some(last)) = (r.heap_samples_kb.first(), r.heap_samples_kb.last()) {
        outln!("  heap in use: {first} KiB after warm-up, {last} KiB at the end");
    }
    outln!(
        "  latency us: p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        r.p50_us,
        r.p95_us,
        r.p99_us,
        r.p999_us,
        r.max_us
    );
    outln!(
        "  client sent {} messages in {} frames ({:.1} messages per frame)",
        r.messages_sent,
        r.frames_sent,
        r.messages_per_frame
    );
    if r.registry_mode != RegistryMode::None {
        outln!(
            "  registry: {:?} mode, service {}, {} look-ups, {} messages to and from the controller while measured",
            r.registry_mode,
            r.service.as_deref().unwrap_or("?"),
            r.lookups,
            r.registry_messages
        );
    }
}

/// How the callers reach the server, for the report's header.
fn how_callers_connect(transport: &str, registry: RegistryMode) -> &'static str {
    match registry {
        RegistryMode::Direct => "through the registry, one connection per instance",
        RegistryMode::Relayed => "relayed through the controller",
        RegistryMode::None if transport == "raw-tcp" => "each on its own connection",
        RegistryMode::None => "on one connection",
    }
}

/// With `--hostile`: the callers' figures without and with the hostile client, as medians of
/// the rounds, and their ratio.
fn print_hostile_summary(reports: &[Report]) {
    let median = |with: bool, f: fn(&Report) -> f64| {
        let mut v: Vec<f64> = reports.iter().filter(|r| r.hostile.is_some() == with).map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let Some(kind) = reports.iter().find_map(|r| r.hostile) else { return };
    let rounds = reports.iter().filter(|r| r.hostile.is_some()).count();
    let (clean, beside) = (median(false, |r| r.calls_per_s), median(true, |r| r.calls_per_s));
    let (p99_clean, p99_beside) = (median(false, |r| r.p99_us), median(true, |r| r.p99_us));
    let (max_clean, max_beside) = (median(false, |r| r.max_us), median(true, |r| r.max_us));
    outln!("hostile client ({kind:?}), medians of {rounds} interleaved rounds:");
    outln!(
        "  calls/s {clean:.0} without, {beside:.0} beside it: {:.1}%",
        beside / clean.max(f64::MIN_POSITIVE) * 100.0
    );
    outln!(
        "  p99 us {p99_clean:.1} without, {p99_beside:.1} beside it; max us {max_clean:.1} and {max_beside:.1}"
    );
    let cpu = |with| reports.iter().filter(|r| r.hostile.is_some() == with).find_map(|r| r.server_cpu_pct);
    if cpu(true).is_some() {
        let (a, b) = (
            median(false, |r| r.server_cpu_pct.unwrap_or(0.0)),
            median(true, |r| r.server_cpu_pct.unwrap_or(0.0)),
        );
        outln!("  server thread CPU {a:.1}% without, {b:.1}% beside it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_how_the_callers_connect() {
        assert_eq!(how_callers_connect("tcp", RegistryMode::None), "on one connection");
        assert_eq!(how_callers_connect("raw-tcp", RegistryMode::None), "each on its own connection");
        assert!(how_callers_connect("tcp", RegistryMode::Direct).contains("one connection per instance"));
        assert!(how_callers_connect("tcp", RegistryMode::Relayed).contains("through the controller"));
    }
}
