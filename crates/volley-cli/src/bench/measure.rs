//! The measurements of one `volley bench` run, and the order they run in. One measurement:
//! callers in a closed loop (or paced), a warm-up, then a measured window in which the
//! process's CPU time and memory are read, and the callers' histograms merged into a report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::task::JoinHandle;
use volley::BatchOptions;
use volley::bytes::Bytes;

use super::api::Api;
use super::args::{BenchArgs, RegistryMode, Style, plan};
use super::caller::{Outcome, Side};
use super::hostile::{self, Hostile};
use super::local::Target;
use super::raw;
use super::report::Report;
use super::resources::{heap_in_use_kb, process_cpu_seconds, rss_kb, server_cpu};
use crate::echo::ECHO;

/// The phases every caller reads before and after each call.
const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// Every round, call style and API of the run, interleaved: round 1 of each style through
/// each API, then round 2, so that a change in the machine's load falls on all alike. The
/// APIs take turns going first (A B, B A, ...), so neither always runs right after the other.
pub async fn drive(targets: Vec<(Api, Target)>, args: BenchArgs) -> Result<Vec<Report>, String> {
    let (_, styles) = plan(&args)?;
    let mut sides = Vec::new();
    for (api, target) in targets {
        sides.push(Side::connect(api, target, &args).await?);
    }
    let mut reports = Vec::new();
    let kinds: &[Option<Hostile>] = match &args.hostile {
        Some(h) => &[None, Some(*h)],
        None => &[None],
    };
    for round in 1..=args.rounds.max(1) {
        for &style in &styles {
            let mut order: Vec<&Side> = sides.iter().collect();
            if round % 2 == 0 {
                order.reverse();
            }
            for side in order {
                for &hostile in kinds {
                    reports.push(measure(side, &args, Run { style, round, hostile }).await?);
                }
            }
        }
    }
    Ok(reports)
}

/// What one measurement varies.
#[derive(Clone, Copy)]
struct Run {
    style: Style,
    round: usize,
    hostile: Option<Hostile>,
}

/// One measurement: warm up, measure, gather the callers' histograms.
async fn measure(side: &Side, args: &BenchArgs, run: Run) -> Result<Report, String> {
    let hostile = match (run.hostile, &side.target) {
        (Some(kind), Target::Plain(addr)) => {
            Some(hostile::Running::start(kind, addr, &args.service, ECHO.name())?)
        }
        _ => None,
    };
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let callers = spawn_callers(side, args, run.style, &phase).await?;
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let window = Window::open(side);
    phase.store(MEASURE, Ordering::Relaxed);
    let memory = Memory::sample_until(window.start + Duration::from_secs_f64(args.duration)).await;
    phase.store(STOP, Ordering::Relaxed);
    let spent = window.close(side);
    let mut tally = CallerResult::new();
    for c in callers {
        tally.add(c.await.map_err(|e| e.to_string())?)?;
    }
    if let Some(e) = &tally.first_error {
        eprintln!("first error: {e}");
    }
    let hostile_bytes_sent = hostile.map(|h| h.stop().0);
    Ok(report(side, args, run, tally, spent, memory, hostile_bytes_sent))
}

/// Requests per call in this style.
fn batch_size(style: Style, args: &BenchArgs) -> usize {
    if style == Style::Single { 1 } else { args.batch_size.max(1) }
}

/// `--concurrency` callers, calling until the phase is `STOP`.
async fn spawn_callers(
    side: &Side,
    args: &BenchArgs,
    style: Style,
    phase: &Arc<AtomicU8>,
) -> Result<Vec<JoinHandle<CallerResult>>, String> {
    // A static payload: cloning it costs no reference counting, so the figures measure Volley
    // rather than the load generator (the server's replies are still real buffers).
    let payload = Bytes::from_static(Vec::leak(vec![0xA5u8; args.payload]));
    let batch_size = batch_size(style, args);
    let opts = BatchOptions::default().chunk_size(args.chunk_size);
    let pace = Duration::from_millis(args.pace_ms);
    let mut callers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (payload, phase) = (payload.clone(), phase.clone());
        callers.push(match (&side.caller, &side.target) {
            (Some(c), _) => {
                let c = c.clone();
                let mut turn = 0u64;
                tokio::spawn(caller_loop(
                    pace,
                    move || {
                        let (c, p) = (c.clone(), payload.clone());
                        turn += 1;
                        let batch = style == Style::Batch || (style == Style::Mix && turn.is_multiple_of(4));
                        async move {
                            if batch { c.call_batch(p, batch_size, opts).await } else { c.call(p).await }
                        }
                    },
                    phase,
                ))
            }
            (None, Target::Plain(addr)) => {
                let conn = Arc::new(raw::connect(addr).await?);
                tokio::spawn(caller_loop(
                    pace,
                    move || {
                        let (conn, p) = (conn.clone(), payload.clone());
                        async move {
                            let len = p.len();
                            Outcome::of(std::iter::once(conn.call(p).await), len)
                        }
                    },
                    phase,
                ))
            }
            (None, Target::Registry(..)) => unreachable!("registry targets always have a caller"),
        });
    }
    Ok(callers)
}

async fn caller_loop<F, Fut>(pace: Duration, mut call: F, phase: Arc<AtomicU8>) -> CallerResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let mut r = CallerResult::new();
    // One clock read per call: each call's end is the next one's start.
    let mut t0 = Instant::now();
    loop {
        let p = phase.load(Ordering::Relaxed);
        if p == STOP {
            return r;
        }
        let outcome = call().await;
        let t1 = Instant::now();
        let ns = (t1 - t0).as_nanos() as u64;
        if pace.is_zero() {
            t0 = t1;
        } else {
            tokio::time::sleep(pace).await;
            t0 = Instant::now();
        }
        if outcome.failed > 0 {
            r.errors += outcome.failed;
            r.first_error = r.first_error.or(outcome.error);
        }
        if p == MEASURE && phase.load(Ordering::Relaxed) == MEASURE {
            r.hist.saturating_record(ns.max(1));
            r.calls += 1;
            r.items += outcome.ok;
        }
    }
}

/// One caller's figures over the measured window, or all callers' merged.
struct CallerResult {
    hist: Histogram<u64>,
    calls: u64,
    items: u64,
    errors: u64,
    first_error: Option<String>,
}

impl CallerResult {
    fn new() -> CallerResult {
        // Nanoseconds up to 60 s at 2 significant digits: small enough to keep one per caller.
        let hist = Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds");
        CallerResult { hist, calls: 0, items: 0, errors: 0, first_error: None }
    }

    fn add(&mut self, r: CallerResult) -> Result<(), String> {
        self.hist.add(&r.hist).map_err(|e| e.to_string())?;
        self.calls += r.calls;
        self.items += r.items;
        self.errors += r.errors;
        self.first_error = self.first_error.take().or(r.first_error);
        Ok(())
    }
}

/// The counters read when the measured window opens.
struct Window {
    start: Instant,
    frames_sent: u64,
    messages_sent: u64,
    registry_messages: u64,
    cpu_seconds: f64,
    server_cpu_seconds: Option<f64>,
}

/// What the measured window cost: its length, CPU time, messages.
struct Spent {
    seconds: f64,
    cpu_seconds: f64,
    server_cpu_pct: Option<f64>,
    frames_sent: u64,
    messages_sent: u64,
    lookups: u64,
    registry_messages: u64,
}

impl Window {
    fn open(side: &Side) -> Window {
        let counters = side.caller.as_ref().map(|c| c.counters()).unwrap_or_default();
        let registry = side.caller.as_ref().map(|c| c.registry()).unwrap_or_default();
        Window {
            frames_sent: counters.frames_sent,
            messages_sent: counters.messages_sent,
            registry_messages: registry.1,
            cpu_seconds: process_cpu_seconds(),
            server_cpu_seconds: server_cpu::seconds(),
            start: Instant::now(),
        }
    }

    fn close(self, side: &Side) -> Spent {
        let seconds = self.start.elapsed().as_secs_f64();
        let cpu_seconds = process_cpu_seconds() - self.cpu_seconds;
        let server_cpu_pct =
            server_cpu::seconds().zip(self.server_cpu_seconds).map(|(a, b)| (a - b) / seconds * 100.0);
        let counters = side.caller.as_ref().map(|c| c.counters()).unwrap_or_default();
        let registry = side.caller.as_ref().map(|c| c.registry()).unwrap_or_default();
        Spent {
            seconds,
            cpu_seconds,
            server_cpu_pct,
            frames_sent: counters.frames_sent - self.frames_sent,
            messages_sent: counters.messages_sent - self.messages_sent,
            lookups: registry.0,
            registry_messages: registry.1 - self.registry_messages,
        }
    }
}

/// Resident memory (KiB) over the measured window: at its start, the most seen (read every
/// second), at its end, and every ~10 s with the heap in use beside it.
struct Memory {
    rss_start: u64,
    rss_end: u64,
    rss_max: u64,
    rss_samples: Vec<u64>,
    heap_samples: Vec<u64>,
}

impl Memory {
    async fn sample_until(end: Instant) -> Memory {
        let rss_start = rss_kb();
        let mut rss_max = rss_start;
        let mut rss_samples = vec![rss_start];
        let mut heap_samples: Vec<u64> = heap_in_use_kb().into_iter().collect();
        let mut tick = 0u64;
        while Instant::now() < end {
            tokio::time::sleep((end - Instant::now()).min(Duration::from_secs(1))).await;
            let rss = rss_kb();
            rss_max = rss_max.max(rss);
            tick += 1;
            if tick.is_multiple_of(10) {
                rss_samples.push(rss);
                heap_samples.extend(heap_in_use_kb());
            }
        }
        let rss_end = rss_kb();
        heap_samples.extend(heap_in_use_kb());
        Memory { rss_start, rss_end, rss_max: rss_max.max(rss_end), rss_samples, heap_samples }
    }
}

fn report(
    side: &Side,
    args: &BenchArgs,
    run: Run,
    tally: CallerResult,
    spent: Spent,
    memory: Memory,
    hostile_bytes_sent: Option<u64>,
) -> Report {
    let (hist, calls, seconds) = (&tally.hist, tally.calls, spent.seconds);
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let Memory { rss_start, rss_end, .. } = memory;
    Report {
        api: side.api,
        round: run.round,
        handler: args.handler,
        transport: side.transport.clone(),
        runtime: args.runtime,
        mode: run.style,
        batch_size: batch_size(run.style, args),
        payload: args.payload,
        concurrency: args.concurrency,
        calls,
        items: tally.items,
        seconds,
        calls_per_s: calls as f64 / seconds,
        items_per_s: tally.items as f64 / seconds,
        p50_us: us(0.5),
        p95_us: us(0.95),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: hist.max() as f64 / 1000.0,
        errors: tally.errors,
        frames_sent: spent.frames_sent,
        messages_sent: spent.messages_sent,
        messages_per_frame: if spent.frames_sent == 0 {
            0.0
        } else {
            spent.messages_sent as f64 / spent.frames_sent as f64
        },
        registry_mode: side.registry_mode,
        service: (side.registry_mode != RegistryMode::None).then(|| args.service.clone()),
        lookups: spent.lookups,
        registry_messages: spent.registry_messages,
        global_allocator: crate::GLOBAL_ALLOCATOR,
        cpu_seconds: spent.cpu_seconds,
        cpu_us_per_call: if calls == 0 { 0.0 } else { spent.cpu_seconds * 1e6 / calls as f64 },
        rss_start_kb: rss_start,
        rss_end_kb: rss_end,
        rss_max_kb: memory.rss_max,
        rss_samples_kb: memory.rss_samples,
        heap_samples_kb: memory.heap_samples,
        rss_growth_pct: if rss_start == 0 { 0.0 } else { (rss_end as f64 / rss_start as f64 - 1.0) * 100.0 },
        hostile: hostile_bytes_sent.and(run.hostile),
        hostile_bytes_sent,
        server_cpu_pct: spent.server_cpu_pct,
    }
}
