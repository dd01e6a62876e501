//! The load generator, shared by every framework: closed-loop callers, fixed-rate callers, and
//! a windowed run of N unary calls. Frameworks plug in through [`Caller`].
//!
//! Latency goes into one HDR histogram per caller task (merged at the end), so recording costs
//! no lock or atomic; payloads are static buffers, so cloning a request costs no reference
//! counting and the figures measure the framework rather than the load generator.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

/// One framework's client as the load generator drives it. Every caller task owns a clone
/// (clones share the framework's one connection), so a framework whose call needs `&mut self`
/// (tonic) pays no extra clone per call.
pub trait Caller: Clone + Send + Sync + 'static {
    /// One echo call; returns the reply's length so the caller can check it.
    fn call(&mut self, payload: Bytes) -> impl Future<Output = Result<usize, String>> + Send;
}

/// What one measurement produced.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Calls (requests) completed in the measured window.
    pub calls: u64,
    pub calls_per_s: f64,
    /// Latency percentiles; `None` where a per-call latency does not exist (a batch stream).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub max_us: Option<f64>,
    pub errors: u64,
    /// Fixed-rate mode: scheduled calls that could not even be sent before the run gave up
    /// (counted in the histogram at a lower bound of their latency).
    pub missed: u64,
    /// CPU time of the whole process (server and client threads) per completed call, in µs:
    /// what a call costs, largely independent of how much of the cores other processes took.
    /// `None` in fixed-rate mode (the pacer's waiting would count) and where unsupported.
    pub cpu_us_per_call: Option<f64>,
    pub first_error: Option<String>,
}

/// User + system CPU time used by this process so far.
#[cfg(unix)]
pub fn cpu_time() -> Option<Duration> {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid `rusage`.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return None;
    }
    let tv =
        |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    Some(tv(u.ru_utime) + tv(u.ru_stime))
}

#[cfg(not(unix))]
pub fn cpu_time() -> Option<Duration> {
    None
}

/// Measures the process's CPU time over a stretch of work.
#[derive(Clone, Copy)]
pub struct CpuMeter(Option<Duration>);

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter(cpu_time())
    }

    /// µs of CPU per call since `start`.
    pub fn per_call(self, calls: u64) -> Option<f64> {
        let used = cpu_time()?.checked_sub(self.0?)?;
        (calls > 0).then(|| used.as_secs_f64() * 1e6 / calls as f64)
    }
}

/// A static payload of `n` bytes (one leaked buffer per size, shared by every measurement).
pub fn payload(n: usize) -> Bytes {
    static CACHE: OnceLock<Mutex<HashMap<usize, &'static [u8]>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    Bytes::from_static(cache.entry(n).or_insert_with(|| Vec::leak(vec![0xA5u8; n])))
}

pub fn new_histogram() -> Histogram<u64> {
    // Nanoseconds up to 60 s at 2 significant digits (as `volley bench`): ~28 KB each, small
    // enough for one per caller even with 1024 callers.
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds")
}

/// How a latency/throughput scenario is driven.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    pub concurrency: usize,
    pub payload: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// `Some(calls/s)`: fixed-rate (open-loop) mode; `None`: closed loop.
    pub rate: Option<f64>,
}

/// One caller task's tally.
struct Tally {
    hist: Histogram<u64>,
    calls: u64,
    errors: u64,
    missed: u64,
    last_done: Option<Instant>,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally { hist: new_histogram(), calls: 0, errors: 0, missed: 0, last_done: None, first_error: None }
    }

    fn check(&mut self, outcome: Result<usize, String>, len: usize) -> bool {
        let err = match outcome {
            Ok(n) if n == len => return true,
            Ok(n) => format!("reply of {n} bytes, sent {len}"),
            Err(e) => e,
        };
        self.errors += 1;
        self.first_error.get_or_insert(err);
        false
    }
}

fn merge(tallies: Vec<Tally>, seconds: f64) -> Result<Sample, String> {
    let mut hist = new_histogram();
    let mut s = Sample::default();
    for t in tallies {
        hist.add(&t.hist).map_err(|e| e.to_string())?;
        s.calls += t.calls;
        s.errors += t.errors;
        s.missed += t.missed;
        s.first_error = s.first_error.or(t.first_error);
    }
    s.calls_per_s = s.calls as f64 / seconds.max(f64::MIN_POSITIVE);
    percentiles(&mut s, &hist);
    Ok(s)
}

/// Fills the sample's latency percentiles from a histogram of nanoseconds (none if empty).
pub fn percentiles(s: &mut Sample, hist: &Histogram<u64>) {
    if !hist.is_empty() {
        let us = |q: f64| Some(hist.value_at_quantile(q) as f64 / 1000.0);
        (s.p50_us, s.p99_us, s.p999_us) = (us(0.5), us(0.99), us(0.999));
        s.max_us = Some(hist.max() as f64 / 1000.0);
    }
}

async fn join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Result<Vec<T>, String> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

pub async fn run<C: Caller>(client: C, spec: LoadSpec) -> Result<Sample, String> {
    match spec.rate {
        None => closed_loop(client, spec).await,
        Some(rate) => fixed_rate(client, spec, rate).await,
    }
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// `concurrency` callers, each calling again as soon as its reply arrives. Calls completed
/// inside the measured window give calls/s; each call's latency is recorded.
async fn closed_loop<C: Caller>(client: C, spec: LoadSpec) -> Result<Sample, String> {
    let body = payload(spec.payload);
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let mut tasks = Vec::with_capacity(spec.concurrency);
    for _ in 0..spec.concurrency.max(1) {
        let (mut client, body, phase) = (client.clone(), body.clone(), phase.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let len = body.len();
            // One clock read per call: each call's end is the next one's start.
            let mut t0 = Instant::now();
            loop {
                let p = phase.load(Ordering::Relaxed);
                if p == STOP {
                    return t;
                }
                let outcome = client.call(body.clone()).await;
                let t1 = Instant::now();
                let ok = t.check(outcome, len);
                // Only calls that started and ended inside the window count.
                if ok && p == MEASURE && phase.load(Ordering::Relaxed) == MEASURE {
                    t.hist.saturating_record(((t1 - t0).as_nanos() as u64).max(1));
                    t.calls += 1;
                }
                t0 = t1;
            }
        }));
    }
    drop(client);
    tokio::time::sleep(spec.warmup).await;
    phase.store(MEASURE, Ordering::Relaxed);
    let start = Instant::now();
    let cpu = CpuMeter::start();
    tokio::time::sleep(spec.duration).await;
    phase.store(STOP, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let mut s = merge(join(tasks).await?, seconds)?;
    // Read after the join: the callers' last calls (outside the window) add a little; over a
    // one-second window it is noise.
    s.cpu_us_per_call = cpu.per_call(s.calls);
    Ok(s)
}

/// Open loop at `rate` calls/s in total: call `i` is due at `t0 + i / rate`, and its latency
/// is measured from that scheduled time, not from when it was actually sent. A caller that is
/// still waiting for an earlier reply sends late, and the wait counts — a slow server cannot
/// hide its queueing by slowing the load down (no coordinated omission). `concurrency` bounds
/// the calls in flight.
async fn fixed_rate<C: Caller>(client: C, spec: LoadSpec, rate: f64) -> Result<Sample, String> {
    let body = payload(spec.payload);
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let t0 = Instant::now() + Duration::from_millis(5);
    let measure_from = t0 + spec.warmup;
    let end = measure_from + spec.duration;
    // Past this, a run that fell hopelessly behind stops sending; what it did not send is
    // counted as missed, at the latency it had reached by then (a lower bound).
    let give_up = end + spec.duration.max(Duration::from_secs(1));
    let due = move |i: u64| t0 + interval.mul_f64(i as f64);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(spec.concurrency);
    for _ in 0..spec.concurrency.max(1) {
        let (mut client, body, next) = (client.clone(), body.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let len = body.len();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let at = due(i);
                if at >= end {
                    return t;
                }
                if Instant::now() >= give_up {
                    if at >= measure_from {
                        t.missed += 1;
                        t.hist.saturating_record((give_up - at).as_nanos() as u64);
                    }
                    return t;
                }
                wait_until(at).await;
                let outcome = client.call(body.clone()).await;
                let done = Instant::now();
                if t.check(outcome, len) && at >= measure_from {
                    t.hist.saturating_record(((done - at).as_nanos() as u64).max(1));
                    t.calls += 1;
                    t.last_done = Some(done);
                }
            }
        }));
    }
    drop(client);
    let mut tallies = join(tasks).await?;
    // Calls never claimed by any caller (all of them gave up first) were missed too.
    let claimed = next.load(Ordering::Relaxed);
    if let Some(first) = tallies.first_mut() {
        let mut i = claimed;
        while due(i) < end {
            if due(i) >= measure_from {
                first.missed += 1;
                first.hist.saturating_record((give_up - due(i)).as_nanos() as u64);
            }
            i += 1;
        }
    }
    // Throughput: calls scheduled in the window over the time until the last of them came
    // back (the window itself when the framework kept up).
    let last = tallies.iter().filter_map(|t| t.last_done).max().unwrap_or(end).max(end);
    merge(tallies, (last - measure_from).as_secs_f64())
}

/// Sleeps until `at` with sub-millisecond precision: tokio's timer has a 1 ms granularity, so
/// the last stretch is spent yielding to the runtime (which keeps polling IO meanwhile). The
/// cost is client CPU while waiting, which is the price of sending on time.
async fn wait_until(at: Instant) {
    let early = Duration::from_micros(1500);
    if at > Instant::now() + early {
        tokio::time::sleep_until((at - Duration::from_millis(1)).into()).await;
    }
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

/// Up to `n` unary calls with `window` of them in flight at any moment: the way to send many
/// requests with a framework that has no batch API. Callers stop taking new requests at
/// `until`, so a slow framework's run is bounded in time; requests/s is what was completed
/// over the time it took (a steady state either way).
pub async fn unary_window<C: Caller>(
    client: C,
    n: u64,
    window: usize,
    size: usize,
    until: Instant,
) -> Result<Sample, String> {
    let body = payload(size);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let mut tasks = Vec::with_capacity(window);
    for _ in 0..window.max(1) {
        let (mut client, body, next) = (client.clone(), body.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let len = body.len();
            while Instant::now() < until && next.fetch_add(1, Ordering::Relaxed) < n {
                let outcome = client.call(body.clone()).await;
                if t.check(outcome, len) {
                    t.calls += 1;
                }
            }
            t
        }));
    }
    drop(client);
    let tallies = join(tasks).await?;
    let mut s = merge(tallies, start.elapsed().as_secs_f64())?;
    s.cpu_us_per_call = cpu.per_call(s.calls);
    // The per-call latency of a windowed run only restates the window size; leave it out so
    // every framework's batch row means the same thing.
    (s.p50_us, s.p99_us, s.p999_us, s.max_us) = (None, None, None, None);
    Ok(s)
}

/// A batch run's result from a count of good replies, errors and the elapsed time.
pub fn batch_sample(
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    cpu: CpuMeter,
) -> Sample {
    Sample {
        calls: ok,
        cpu_us_per_call: cpu.per_call(ok),
        calls_per_s: ok as f64 / seconds.max(f64::MIN_POSITIVE),
        errors,
        first_error,
        ..Sample::default()
    }
}

/// Runs `streams` stream readers at once (`read(i)` gives the i-th one's tally of items of the
/// right size, other outcomes and the first of those) and makes one sample of their items per
/// second, from the first open to the last end; a stream that ended short counts its missing
/// items as errors.
pub async fn streams<F, Fut>(streams: usize, per_stream: u64, read: F) -> Sample
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = (u64, u64, Option<String>)> + Send + 'static,
{
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let tasks: Vec<_> = (0..streams.max(1)).map(|i| tokio::spawn(read(i))).collect();
    let (mut ok, mut errors, mut first_error) = (0, 0, None);
    for t in tasks {
        let (o, e, f) = t.await.unwrap_or_else(|e| (0, per_stream, Some(e.to_string())));
        let short = per_stream.saturating_sub(o + e);
        ok += o;
        errors += e + short;
        if first_error.is_none() {
            first_error = f.or_else(|| {
                (short > 0).then(|| format!("a stream ended after {} of {per_stream} items", o + e))
            });
        }
    }
    batch_sample(ok, errors, first_error, start.elapsed().as_secs_f64(), cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that takes `delay` per call, one call at a time.
    #[derive(Clone)]
    struct Slow {
        delay: Duration,
        busy: Arc<tokio::sync::Mutex<()>>,
    }

    impl Caller for Slow {
        async fn call(&mut self, payload: Bytes) -> Result<usize, String> {
            let _one_at_a_time = self.busy.lock().await;
            // No timer for a zero delay: tokio rounds any sleep up to its 1 ms tick.
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            Ok(payload.len())
        }
    }

    fn spec(rate: Option<f64>) -> LoadSpec {
        LoadSpec {
            concurrency: 1,
            payload: 8,
            warmup: Duration::ZERO,
            duration: Duration::from_millis(200),
            rate,
        }
    }

    fn slow(delay_ms: u64) -> Slow {
        Slow { delay: Duration::from_millis(delay_ms), busy: Default::default() }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn fixed_rate_counts_queueing_behind_a_slow_server() {
        // 1000 calls/s offered to a server that serves 100/s: a closed loop would report
        // ~10 ms per call; measured from the scheduled send times, the backlog shows.
        let closed = run(slow(10), spec(None)).await.unwrap();
        assert!(closed.p50_us.unwrap() < 30_000.0, "{closed:?}");
        let open = run(slow(10), spec(Some(1000.0))).await.unwrap();
        assert!(open.p50_us.unwrap() > 100_000.0, "{open:?}");
        assert!(open.missed > 0, "calls it never sent count too: {open:?}");
        assert!(open.calls_per_s < 200.0, "{open:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn fixed_rate_holds_the_rate_when_the_server_keeps_up() {
        let s = run(slow(0), LoadSpec { concurrency: 4, ..spec(Some(1000.0)) }).await.unwrap();
        assert_eq!((s.errors, s.missed), (0, 0), "{s:?}");
        // 200 calls scheduled in the window; timers on a loaded machine may lose a few.
        assert!((150..=200).contains(&s.calls), "{s:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn unary_window_stops_at_its_time_bound() {
        let until = Instant::now() + Duration::from_millis(100);
        let s = unary_window(slow(1), 1_000_000, 4, 8, until).await.unwrap();
        assert!(s.calls > 0 && s.calls < 1_000, "{s:?}");
        assert_eq!(s.p99_us, None);
    }
}
