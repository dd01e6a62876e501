//! Medians over rounds, the best runtime (and method) per framework, the table with ratios to
//! Volley, the goal check, and the JSON lines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::json;

use crate::load::Sample;
use crate::runner::{Flavor, Method, Target};
use crate::scenario::{Kind, Scenario};

/// Key of one series of samples (one per round).
pub type Key = (Target, Scenario, Method, Flavor);

#[derive(Default)]
pub struct Results {
    pub samples: BTreeMap<Key, Vec<Sample>>,
}

/// Medians of one series.
#[derive(Debug, Clone, Copy)]
pub struct Median {
    /// Calls (requests) completed in one measurement.
    pub calls: f64,
    pub calls_per_s: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub cpu_us_per_call: Option<f64>,
    pub errors: u64,
    pub missed: u64,
    pub rounds: usize,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

impl Results {
    pub fn add(&mut self, key: Key, s: Sample) {
        self.samples.entry(key).or_default().push(s);
    }

    pub fn median(&self, key: &Key) -> Option<Median> {
        let v = self.samples.get(key)?;
        let of = |f: fn(&Sample) -> Option<f64>| median(v.iter().filter_map(f).collect());
        Some(Median {
            calls: of(|s| Some(s.calls as f64))?,
            calls_per_s: of(|s| Some(s.calls_per_s))?,
            p50_us: of(|s| s.p50_us),
            p99_us: of(|s| s.p99_us),
            p999_us: of(|s| s.p999_us),
            cpu_us_per_call: of(|s| s.cpu_us_per_call),
            errors: v.iter().map(|s| s.errors).sum(),
            missed: v.iter().map(|s| s.missed).sum(),
            rounds: v.len(),
        })
    }

    /// The best (method, runtime) of `target` for one metric of the scenario `sel` picks.
    pub fn best(&self, target: Target, sel: Sel, metric: Metric) -> Option<Best> {
        self.samples
            .keys()
            .filter(|(t, sc, m, _)| *t == target && sel.takes(target, *sc, *m))
            .filter_map(|key| {
                let m = self.median(key)?;
                Some(Best { value: metric.of(&m)?, method: key.2, flavor: key.3 })
            })
            .reduce(|a, b| if metric.better(b.value, a.value) { b } else { a })
    }
}

/// Which measurements a row of the table compares.
#[derive(Debug, Clone, Copy)]
pub enum Sel {
    /// Every method of one scenario.
    Scenario(Scenario),
    /// A batch scenario: Volley sending with method `volley`, the peers with method `peer`.
    Batch { sc: Scenario, volley: Method, peer: Method },
}

impl Sel {
    fn takes(self, target: Target, sc: Scenario, m: Method) -> bool {
        match self {
            Sel::Scenario(s) => s == sc,
            Sel::Batch { sc: s, volley, peer } => {
                s == sc && m == if target.framework() == "volley" { volley } else { peer }
            }
        }
    }
}

/// How a Volley batch method reads in a row label.
fn volley_way(m: Method) -> &'static str {
    match m {
        Method::BatchHandler => "call_batch_stream to a batch handler",
        _ => "call_batch_stream",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    CallsPerS,
    P50,
    P99,
    /// CPU time of server and client together per call.
    Cpu,
}

impl Metric {
    fn of(self, m: &Median) -> Option<f64> {
        match self {
            Metric::CallsPerS => Some(m.calls_per_s),
            Metric::P50 => m.p50_us,
            Metric::P99 => m.p99_us,
            Metric::Cpu => m.cpu_us_per_call,
        }
    }

    fn better(self, a: f64, b: f64) -> bool {
        match self {
            Metric::CallsPerS => a > b,
            _ => a < b,
        }
    }

    /// Volley's advantage over a peer: above 1 means Volley is ahead.
    fn ratio(self, volley: f64, peer: f64) -> f64 {
        match self {
            Metric::CallsPerS => volley / peer,
            _ => peer / volley,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::CallsPerS => "calls/s",
            Metric::P50 => "p50 µs",
            Metric::P99 => "p99 µs",
            Metric::Cpu => "CPU µs/call",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Best {
    pub value: f64,
    pub method: Method,
    pub flavor: Flavor,
}

fn size(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn cell(b: Option<Best>, metric: Metric) -> String {
    let Some(b) = b else { return "—".into() };
    let v = match metric {
        Metric::CallsPerS => thousands(b.value),
        Metric::Cpu => format!("{:.2}", b.value),
        _ => format!("{:.1}", b.value),
    };
    let method = match b.method {
        Method::BidiStream => " stream",
        Method::BatchHandler => " bh",
        Method::Unary
        | Method::CallBatchStream
        | Method::ServerStream
        | Method::Bundled
        | Method::PingPong => "",
    };
    format!("{v} {}{method}", b.flavor.short())
}

fn ratio_cell(volley: Option<Best>, peer: Option<Best>, metric: Metric) -> String {
    match (volley, peer) {
        (Some(v), Some(p)) if v.value > 0.0 && p.value > 0.0 => {
            format!("{:.2}×", metric.ratio(v.value, p.value))
        }
        _ => "—".into(),
    }
}

/// Volley as a share of the raw ceiling: calls/s Volley ÷ raw; latency and CPU raw ÷ Volley.
fn share_cell(volley: Option<Best>, raw: Option<Best>, metric: Metric) -> String {
    match (volley, raw) {
        (Some(v), Some(r)) if v.value > 0.0 && r.value > 0.0 => {
            let pct = 100.0 * metric.ratio(v.value, r.value);
            // Two significant digits down to 1%, and a small share does not read as zero.
            if pct < 10.0 { format!("{pct:.1}%") } else { format!("{pct:.0}%") }
        }
        _ => "—".into(),
    }
}

/// The rows of the table: (label, what they compare, metric).
fn rows(scenarios: &[Scenario]) -> Vec<(String, Sel, Metric)> {
    let mut rows = Vec::new();
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::Latency) {
        for m in [Metric::P50, Metric::P99] {
            rows.push((
                format!("latency, {} caller, {}", sc.concurrency, size(sc.payload)),
                Sel::Scenario(sc),
                m,
            ));
        }
    }
    for m in [Metric::CallsPerS, Metric::P99] {
        for &sc in scenarios.iter().filter(|s| s.kind == Kind::Throughput) {
            rows.push((format!("{} callers, {}", sc.concurrency, size(sc.payload)), Sel::Scenario(sc), m));
        }
    }
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::Batch) {
        let n = thousands(sc.requests as f64);
        for (peer, peer_way) in [
            (Method::Unary, format!("{} concurrent unary calls", sc.concurrency)),
            (Method::BidiStream, "one gRPC bidi stream".into()),
        ] {
            for volley in [Method::CallBatchStream, Method::BatchHandler] {
                rows.push((
                    format!("{n} × {}: {} vs {peer_way}", size(sc.payload), volley_way(volley)),
                    Sel::Batch { sc, volley, peer },
                    Metric::CallsPerS,
                ));
            }
        }
    }
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::ServerStream) {
        rows.push((server_stream_label(sc), Sel::Scenario(sc), Metric::CallsPerS));
    }
    rows
}

fn server_stream_label(sc: Scenario) -> String {
    let streams = match sc.concurrency {
        1 => "one server stream".to_string(),
        n => format!("{n} server streams at once"),
    };
    format!("{} × {}: {streams}", thousands(sc.requests as f64), size(sc.payload))
}

/// The markdown table: every framework at its best runtime (ct = current-thread, mt = one
/// worker multi-thread), ratios as Volley's advantage (above 1: Volley ahead).
pub fn table(r: &Results, scenarios: &[Scenario]) -> String {
    render(r, rows(scenarios))
}

/// CPU time (server + client threads, µs) per call at each framework's most frugal runtime:
/// what a call costs, which a machine shared with other work distorts far less than
/// calls/s. Ratios: peer ÷ Volley.
pub fn cpu_table(r: &Results, scenarios: &[Scenario]) -> String {
    let rows = rows(scenarios)
        .into_iter()
        .filter(|(_, sel, m)| {
            *m == Metric::CallsPerS && !matches!(sel, Sel::Scenario(s) if s.kind == Kind::Latency)
        })
        .map(|(label, sel, _)| (label, sel, Metric::Cpu))
        .collect();
    render(r, rows)
}

fn render(r: &Results, rows: Vec<(String, Sel, Metric)>) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | metric | volley tcp | raw tcp | % of raw | tonic tcp | tarpc tcp | vs tonic \
         | vs tarpc | volley unix | raw unix | % of raw | volley inproc | tarpc inproc | vs tarpc inproc |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (label, sel, m) in rows {
        let b = |t| r.best(t, sel, m);
        let (vt, nt, pt) = (b(Target::VolleyTcp), b(Target::TonicTcp), b(Target::TarpcTcp));
        let (vu, vi, pi) = (b(Target::VolleyUnix), b(Target::VolleyInproc), b(Target::TarpcInproc));
        let (rt, ru) = (b(Target::RawTcp), b(Target::RawUnix));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            match (sel, m) {
                (Sel::Scenario(sc), Metric::CallsPerS) if sc.kind == Kind::ServerStream => "items/s",
                (Sel::Scenario(_), _) | (_, Metric::Cpu) => m.name(),
                _ => "requests/s",
            },
            cell(vt, m),
            cell(rt, m),
            share_cell(vt, rt, m),
            cell(nt, m),
            cell(pt, m),
            ratio_cell(vt, nt, m),
            ratio_cell(vt, pt, m),
            cell(vu, m),
            cell(ru, m),
            share_cell(vu, ru, m),
            cell(vi, m),
            cell(pi, m),
            ratio_cell(vi, pi, m),
        );
    }
    out
}

/// The goals, checked against this run's medians.
pub fn goals(r: &Results, scenarios: &[Scenario]) -> String {
    let mut out = String::new();
    let value = |t: Target, sel: Sel, m: Metric| r.best(t, sel, m).map(|b| b.value);
    let ratio = |sel: Sel, m: Metric, volley: Target, peer: Target| -> Option<f64> {
        Some(m.ratio(value(volley, sel, m)?, value(peer, sel, m)?))
    };
    let verdict = |got: Option<f64>, goal: f64| match got {
        None => "not measured".to_string(),
        Some(x) if x >= goal => format!("{x:.2}× — met"),
        Some(x) => format!("{x:.2}× — NOT met ({:.0}% of the goal)", 100.0 * x / goal),
    };
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::Throughput && s.concurrency == 256) {
        let sel = Sel::Scenario(sc);
        let what = format!("{} callers, {}", sc.concurrency, size(sc.payload));
        let _ = writeln!(
            out,
            "- {what}, calls/s vs tarpc (goal ≥ 2×): {}",
            verdict(ratio(sel, Metric::CallsPerS, Target::VolleyTcp, Target::TarpcTcp), 2.0)
        );
        let _ = writeln!(
            out,
            "- {what}, calls/s vs tonic (goal ≥ 10×): {}",
            verdict(ratio(sel, Metric::CallsPerS, Target::VolleyTcp, Target::TonicTcp), 10.0)
        );
    }
    // A peer's best way with concurrent unary calls: the fastest of its batch run and its
    // throughput rows with the same payload (16, 256, 1024 calls in flight) — so the window
    // chosen for the batch run cannot flatter Volley.
    let best_unary = |peer: Target, batch: Scenario| -> Option<f64> {
        let mut sels = vec![Sel::Batch { sc: batch, volley: Method::CallBatchStream, peer: Method::Unary }];
        sels.extend(
            scenarios
                .iter()
                .filter(|s| s.kind == Kind::Throughput && s.payload == batch.payload)
                .map(|&s| Sel::Scenario(s)),
        );
        sels.into_iter().filter_map(|sel| value(peer, sel, Metric::CallsPerS)).reduce(f64::max)
    };
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::Batch) {
        let n = thousands(sc.requests as f64);
        let best_tcp = [Target::TonicTcp, Target::TarpcTcp]
            .into_iter()
            .filter_map(|p| best_unary(p, sc))
            .reduce(f64::max);
        let stream_sel = Sel::Batch { sc, volley: Method::CallBatchStream, peer: Method::BidiStream };
        let stream = value(Target::TonicTcp, stream_sel, Metric::CallsPerS);
        for m in [Method::CallBatchStream, Method::BatchHandler] {
            let sel = Sel::Batch { sc, volley: m, peer: Method::Unary };
            let volley = |t| value(t, sel, Metric::CallsPerS);
            let way = volley_way(m);
            let _ = writeln!(
                out,
                "- {n} requests over tcp, {way} vs the best peer's concurrent unary calls (goal ≥ 10×): {}",
                verdict(volley(Target::VolleyTcp).zip(best_tcp).map(|(v, p)| v / p), 10.0)
            );
            let _ = writeln!(
                out,
                "- {n} requests over tcp, {way} vs one gRPC bidi stream (tonic's own bulk path; same goal): {}",
                verdict(volley(Target::VolleyTcp).zip(stream).map(|(v, p)| v / p), 10.0)
            );
            let _ = writeln!(
                out,
                "- {n} requests in-process, {way} vs tarpc's channel with concurrent unary calls (goal ≥ 10×): {}",
                verdict(
                    volley(Target::VolleyInproc).zip(best_unary(Target::TarpcInproc, sc)).map(|(v, p)| v / p),
                    10.0
                )
            );
        }
    }
    for &sc in scenarios.iter().filter(|s| s.kind == Kind::Throughput && s.concurrency == 1024) {
        let sel = Sel::Scenario(sc);
        let best_peer = [Target::TonicTcp, Target::TarpcTcp]
            .into_iter()
            .filter_map(|p| value(p, sel, Metric::P99))
            .reduce(f64::min);
        let _ = writeln!(
            out,
            "- 1024 callers, {}, p99 vs the best peer's (goal: at most half, i.e. ≥ 2×): {}",
            size(sc.payload),
            verdict(value(Target::VolleyTcp, sel, Metric::P99).zip(best_peer).map(|(v, p)| p / v), 2.0)
        );
    }
    let streams: Vec<Scenario> = scenarios.iter().copied().filter(|s| s.kind == Kind::ServerStream).collect();
    for &sc in &streams {
        let sel = Sel::Scenario(sc);
        let _ = writeln!(
            out,
            "- {} over tcp, items/s vs tonic's server streaming (goal ≥ 5×): {}",
            server_stream_label(sc),
            verdict(ratio(sel, Metric::CallsPerS, Target::VolleyTcp, Target::TonicTcp), 5.0)
        );
    }
    let one = streams.iter().find(|s| s.concurrency == 1);
    for &sc in streams.iter().filter(|s| s.concurrency == 256) {
        let share = one.and_then(|&one| {
            let v = |sc| value(Target::VolleyTcp, Sel::Scenario(sc), Metric::CallsPerS);
            Some(v(sc)? / v(one)?)
        });
        let _ = writeln!(
            out,
            "- {} over tcp, items/s as a share of one stream's (goal ≥ 80%): {}",
            server_stream_label(sc),
            match share {
                Some(x) => format!("{:.0}% — {}", 100.0 * x, if x >= 0.8 { "met" } else { "NOT met" }),
                None => "not measured".into(),
            }
        );
    }
    // "Ahead of both peers on every row."
    // A ratio within half a percent of 1 is a tie, not a lead: HDR percentiles have two
    // significant digits, so equal latencies often land in the same bucket.
    let (mut behind, mut level) = (Vec::new(), Vec::new());
    let mut compared = 0;
    for (label, sel, m) in rows(scenarios) {
        let pairs: &[(Target, Target)] = match sel {
            Sel::Batch { peer: Method::BidiStream, .. } => &[(Target::VolleyTcp, Target::TonicTcp)],
            _ => &[
                (Target::VolleyTcp, Target::TonicTcp),
                (Target::VolleyTcp, Target::TarpcTcp),
                (Target::VolleyInproc, Target::TarpcInproc),
            ],
        };
        for &(volley, peer) in pairs {
            if let Some(x) = ratio(sel, m, volley, peer) {
                compared += 1;
                let what = format!("{label}, {} vs {}: {x:.2}×", m.name(), peer.label());
                if x < 0.995 {
                    behind.push(what);
                } else if x <= 1.005 {
                    level.push(what);
                }
            }
        }
    }
    let list = |name: &str, v: &[String]| {
        if v.is_empty() { String::new() } else { format!("; {name}: {}", v.join("; ")) }
    };
    let _ = writeln!(
        out,
        "- ahead of both peers on every row: ahead in {} of {compared} comparisons{}{}",
        compared - behind.len() - level.len(),
        list("level", &level),
        list("behind", &behind)
    );
    out.push_str(&ceiling_goals(r, scenarios));
    out
}

/// Goals against the raw ceiling (64 B over tcp): Volley's share of the bundled echo's
/// calls/s at 256 and 1024 callers, its CPU per call at 256, and a lone call's p50 against
/// the bare tokio ping-pong's.
fn ceiling_goals(r: &Results, scenarios: &[Scenario]) -> String {
    let mut out = String::new();
    let value = |t: Target, sc: Scenario, m: Metric| r.best(t, Sel::Scenario(sc), m).map(|b| b.value);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    for &sc in
        scenarios.iter().filter(|s| s.payload == 64 && matches!(s.kind, Kind::Latency | Kind::Throughput))
    {
        let what =
            format!("{} caller{}, 64 B over tcp", sc.concurrency, if sc.concurrency == 1 { "" } else { "s" });
        let both = |m| value(Target::VolleyTcp, sc, m).zip(value(Target::RawTcp, sc, m));
        let line = match (sc.kind, sc.concurrency) {
            (Kind::Latency, _) => both(Metric::P50).map(|(v, raw)| {
                let x = v / raw;
                format!(
                    "p50 vs the bare tokio ping-pong (goal ≤ 1.05×): {x:.2}× ({v:.1} µs vs {raw:.1} µs) — {}",
                    met(x <= 1.05)
                )
            }),
            (_, 256 | 1024) => both(Metric::CallsPerS).map(|(v, raw)| {
                format!(
                    "calls/s as a share of the raw bundled ceiling (goal ≥ 50%): {:.0}% — {}",
                    100.0 * v / raw,
                    met(v >= 0.5 * raw)
                )
            }),
            _ => continue,
        };
        let _ = writeln!(out, "- {what}, {}", line.unwrap_or_else(|| "against raw: not measured".into()));
        if sc.concurrency == 256 {
            let raw =
                value(Target::RawTcp, sc, Metric::Cpu).map_or(String::new(), |c| format!(" (raw {c:.2} µs)"));
            let cpu = value(Target::VolleyTcp, sc, Metric::Cpu)
                .map_or("not measured".into(), |v| format!("{v:.2} µs{raw} — {}", met(v <= 0.4)));
            let _ = writeln!(out, "- {what}, CPU per call, server and client (goal ≤ 0.4 µs): {cpu}");
        }
    }
    out
}

/// One JSON object per (framework, transport, scenario, method): the medians of its best
/// runtime (by calls/s; by p50 for the latency scenario), and every runtime's medians.
pub fn json_lines(r: &Results, rate: Option<f64>) -> Vec<serde_json::Value> {
    let mut groups: BTreeMap<(Target, Scenario, Method), Vec<Flavor>> = BTreeMap::new();
    for (t, sc, m, f) in r.samples.keys() {
        groups.entry((*t, *sc, *m)).or_default().push(*f);
    }
    let mut out = Vec::new();
    for ((t, sc, method), flavors) in groups {
        let primary = if sc.kind == Kind::Latency { Metric::P50 } else { Metric::CallsPerS };
        let meds: Vec<(Flavor, Median)> =
            flavors.iter().filter_map(|&f| Some((f, r.median(&(t, sc, method, f))?))).collect();
        let Some(&(best_flavor, best)) =
            meds.iter().reduce(|a, b| match (primary.of(&b.1), primary.of(&a.1)) {
                (Some(x), Some(y)) if primary.better(x, y) => b,
                // A runtime that completed no call in the window has no p50: never the best.
                (Some(_), None) => b,
                _ => a,
            })
        else {
            continue;
        };
        let by_runtime: serde_json::Map<String, serde_json::Value> = meds
            .iter()
            .map(|(f, m)| {
                let name = serde_json::to_value(f).ok().and_then(|v| v.as_str().map(String::from));
                (
                    name.unwrap_or_default(),
                    json!({
                        "calls_per_s": m.calls_per_s,
                        "p50_us": m.p50_us,
                        "p99_us": m.p99_us,
                        "p999_us": m.p999_us,
                        "cpu_us_per_call": m.cpu_us_per_call,
                    }),
                )
            })
            .collect();
        // One caller for Volley's stream and tonic's bidi stream; the in-flight window for
        // unary batch runs; the callers otherwise.
        let concurrency =
            if matches!(method, Method::CallBatchStream | Method::BidiStream) { 1 } else { sc.concurrency };
        out.push(json!({
            "framework": t.framework(),
            "transport": t.transport(),
            "scenario": sc.kind,
            "payload": sc.payload,
            "concurrency": concurrency,
            "method": method,
            "requests": if matches!(sc.kind, Kind::Batch | Kind::ServerStream) { Some(sc.requests) } else { None },
            "rate": if matches!(sc.kind, Kind::Batch | Kind::ServerStream) { None } else { rate },
            "runtime": best_flavor,
            "calls": best.calls,
            "calls_per_s": best.calls_per_s,
            "p50_us": best.p50_us,
            "p99_us": best.p99_us,
            "p999_us": best.p999_us,
            "cpu_us_per_call": best.cpu_us_per_call,
            "errors": best.errors,
            "missed": best.missed,
            "rounds": best.rounds,
            "by_runtime": by_runtime,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(calls: u64, p50_us: Option<f64>) -> Sample {
        Sample { calls, calls_per_s: calls as f64 * 10.0, p50_us, p99_us: p50_us, ..Sample::default() }
    }

    /// A runtime whose window held no completed call (no p50) is never reported as the best,
    /// whichever order the runtimes come in.
    #[test]
    fn a_runtime_without_calls_is_not_the_best() {
        let sc = Scenario { kind: Kind::Latency, concurrency: 1, payload: 64, requests: 0 };
        for (current, multi1) in
            [(sample(0, None), sample(3, Some(900.0))), (sample(3, Some(900.0)), sample(0, None))]
        {
            let mut r = Results { samples: BTreeMap::new() };
            r.samples.insert((Target::VolleyTcp, sc, Method::Unary, Flavor::Current), vec![current.clone()]);
            r.samples.insert((Target::VolleyTcp, sc, Method::Unary, Flavor::Multi1), vec![multi1.clone()]);
            let rows = json_lines(&r, None);
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0]["calls"], 3.0, "{}", rows[0]);
            assert_eq!(rows[0]["p50_us"], 900.0, "{}", rows[0]);
        }
    }
}
