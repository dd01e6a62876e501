//! `volley-research codec`: the serialization tables 1–3 of the MF report (the 2009
//! message-framework report whose search-engine testbed `volley testbed` rebuilds), with
//! Volley's codec tiers in place of the report's three columns: boost (serde_json and
//! MessagePack stand in), Febird (bitcode) and memory (the plain-data tier, hand-written
//! encodings and a bare memcpy), and protobuf (prost, `wire!(proto: …)`) beside them.
//!
//! - `string`: "izenesoft" encoded `--count` times, then decoded `--count` times (table 1).
//! - `vec_i32`, `vec_quad`, `map_string_i32`, `map_i32_i32`: containers of `--elements`
//!   entries, each encoded and decoded `--count / --elements` times, so every row moves
//!   `--count` elements (table 2).
//! - `hash_insert`: `--count` int → string items inserted into a hash table whose hash function
//!   encodes the key with the tier and hashes the bytes (the report's `sdb_hashing`), then
//!   every key looked up (table 3). `encode_s` is the insert time, `decode_s` the lookup time.
//!
//! Every case has a `memcpy` row: the same bytes as the pod or custom encoding, copied into the
//! reused send buffer (encode) and into a fresh allocation (decode), so the plain-data tier's
//! distance from a bare copy is visible. Each row is run `--runs` times, interleaved with the
//! other rows of its case, and the median is reported; a run repeats its batch of operations
//! for at least 50 ms and reports the time per batch. Every codec's output is decoded and
//! compared with the input before timing. Decoding is timed from a `Bytes` payload whose
//! clone costs nothing, as in Volley the reader has already made it.

mod hash;
mod values;

use std::collections::HashMap;
use std::hash::Hash;
use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};
use volley::bytes::{Bytes, BytesMut};
use volley::codec::{Bitcode, BitcodeSerde, Json, MsgPack, PodVec};
use volley::{ByteString, Wire};

use crate::output::outln;
use values::{IntIntMap, Quad, StrIntMap, pb, value};

#[derive(Args, Debug, Clone)]
pub struct CodecArgs {
    /// Operations per case: encodes of the string, elements through each container row,
    /// items inserted into the hash table.
    #[arg(long, default_value_t = 1_000_000)]
    count: usize,
    /// Elements per container in the Vec and HashMap cases.
    #[arg(long, default_value_t = 1000)]
    elements: usize,
    /// Runs of every row; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Only the cases whose name contains this (string, vec_i32, vec_quad, map_string_i32,
    /// map_i32_i32, hash_insert).
    #[arg(long)]
    case: Option<String>,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Row {
    case: &'static str,
    tier: &'static str,
    codec: &'static str,
    /// Encoded size of one value (for hash_insert: of one key).
    bytes: usize,
    /// Encodes and decodes per run (for hash_insert: inserts and lookups).
    ops: usize,
    /// Elements per value (1 for the string and hash cases).
    elements: usize,
    encode_s: f64,
    decode_s: f64,
    runs: usize,
}

pub fn run(args: CodecArgs) -> Result<(), String> {
    if args.count == 0 || args.elements == 0 || args.runs == 0 {
        return Err("--count, --elements and --runs must be at least 1".into());
    }
    let mut b = Bench { args: args.clone(), rows: Vec::new() };
    let wanted = |name: &str| args.case.as_deref().is_none_or(|c| name.contains(c));
    if wanted("string") {
        b.string_case()?;
    }
    if wanted("vec_i32") {
        b.vec_i32_case()?;
    }
    if wanted("vec_quad") {
        b.vec_quad_case()?;
    }
    if wanted("map_string_i32") {
        b.map_string_case()?;
    }
    if wanted("map_i32_i32") {
        b.map_int_case()?;
    }
    if wanted("hash_insert") {
        b.hash_case();
    }
    if b.rows.is_empty() {
        return Err(format!("no case matches {:?}", args.case.unwrap_or_default()));
    }
    if !args.json {
        print_summary(&b.rows);
    }
    Ok(())
}

/// One row to measure: a closure that runs the encode loop and the decode loop once and
/// returns their times.
struct Job {
    row: Row,
    run: Box<dyn FnMut() -> (Duration, Duration)>,
}

struct Bench {
    args: CodecArgs,
    rows: Vec<Row>,
}

/// Seconds with about four significant digits.
fn seconds(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3}"),
        s if s >= 0.01 => format!("{s:.4}"),
        s => format!("{s:.6}"),
    }
}

/// Batches are repeated until this much time has passed: the cheap rows (a memcpy of 1,000
/// 4-byte elements 1,000 times takes ~50 µs) are otherwise too short to time on a shared
/// machine.
const MIN_TIME: Duration = Duration::from_millis(50);

/// The time of one `batch` (all `ops` operations of a row), averaged over as many batches as
/// fit in [`MIN_TIME`] (at least one).
fn per_batch(mut batch: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        batch();
        n += 1;
        let elapsed = start.elapsed();
        if elapsed >= MIN_TIME {
            return elapsed / n;
        }
    }
}

fn median(mut t: Vec<Duration>) -> f64 {
    t.sort();
    t[t.len() / 2].as_secs_f64()
}

/// A payload whose clones cost nothing: a static `Bytes` has no reference count. In Volley the
/// reader makes each payload's `Bytes` (one reference-count increment per message); decode
/// timing should not include that, for any codec. The few bytes leaked per row are the price.
fn static_payload(bytes: &[u8]) -> Bytes {
    Bytes::from_static(Box::leak(bytes.to_vec().into_boxed_slice()))
}

impl Bench {
    /// Runs every job of a case `--runs` times, interleaved (run 1 of every row, then run 2 ...)
    /// so that a noisy moment on this shared machine does not land on one row only, and
    /// reports the medians.
    fn measure(&mut self, jobs: Vec<Job>) {
        let runs = self.args.runs;
        let mut jobs: Vec<(Job, Vec<Duration>, Vec<Duration>)> =
            jobs.into_iter().map(|j| (j, Vec::with_capacity(runs), Vec::with_capacity(runs))).collect();
        for _ in 0..runs {
            for (job, enc, dec) in &mut jobs {
                let (e, d) = (job.run)();
                enc.push(e);
                dec.push(d);
            }
        }
        for (job, enc, dec) in jobs {
            let row = Row { encode_s: median(enc), decode_s: median(dec), runs, ..job.row };
            self.push(row);
        }
    }

    fn push(&mut self, row: Row) {
        if self.args.json {
            outln!("{}", serde_json::to_string(&row).expect("a row serializes"));
        } else {
            if self.rows.last().is_none_or(|r| r.case != row.case) {
                outln!(
                    "\n{:<15} {:<7} {:<22} {:>9} {:>10} {:>10}",
                    "case",
                    "tier",
                    "codec",
                    "bytes",
                    "encode s",
                    "decode s"
                );
            }
            outln!(
                "{:<15} {:<7} {:<22} {:>9} {:>10} {:>10}",
                row.case,
                row.tier,
                row.codec,
                row.bytes,
                seconds(row.encode_s),
                seconds(row.decode_s)
            );
        }
        self.rows.push(row);
    }

    /// `ops` encodes of `value` into a reused buffer, and `ops` decodes of its encoding.
    fn wire<W: Wire + PartialEq + 'static>(
        case: &'static str,
        codec: &'static str,
        value: W,
        ops: usize,
        elements: usize,
    ) -> Result<Job, String> {
        let mut sample = BytesMut::new();
        value.encode(&mut sample).map_err(|e| e.to_string())?;
        let back = W::decode(sample.clone().freeze()).map_err(|e| format!("{case}/{codec}: {e}"))?;
        if back != value {
            return Err(format!("{case}/{codec}: the value did not survive a round trip"));
        }
        let encoded = static_payload(&sample);
        let bytes = encoded.len();
        let mut out = BytesMut::with_capacity(bytes * 2);
        let run = move || {
            let encode = per_batch(|| {
                for _ in 0..ops {
                    out.clear();
                    black_box(&value).encode(&mut out).unwrap();
                    black_box(&out);
                }
            });
            let decode = per_batch(|| {
                for _ in 0..ops {
                    black_box(W::decode(black_box(encoded.clone())).unwrap());
                }
            });
            (encode, decode)
        };
        let tier = W::TIER.name();
        Ok(Job { row: row(case, tier, codec, bytes, ops, elements), run: Box::new(run) })
    }

    /// The floor: the same bytes copied into the reused send buffer, and into a new `Vec`.
    fn memcpy(case: &'static str, src: &[u8], ops: usize, elements: usize) -> Job {
        let src = src.to_vec();
        let received = static_payload(&src);
        let bytes = received.len();
        let mut out = BytesMut::with_capacity(src.len() * 2);
        let run = move || {
            let encode = per_batch(|| {
                for _ in 0..ops {
                    out.clear();
                    out.extend_from_slice(black_box(&src));
                    black_box(&out);
                }
            });
            let decode = per_batch(|| {
                for _ in 0..ops {
                    black_box(black_box(&received[..]).to_vec());
                }
            });
            (encode, decode)
        };
        Job { row: row(case, "memcpy", "memcpy", bytes, ops, elements), run: Box::new(run) }
    }

    fn reps(&self) -> usize {
        (self.args.count / self.args.elements).max(1)
    }

    fn string_case(&mut self) -> Result<(), String> {
        const S: &str = "izenesoft";
        let (case, n) = ("string", self.args.count);
        self.measure(vec![
            Self::memcpy(case, S.as_bytes(), n, 1),
            Self::wire(case, "String (utf-8)", S.to_string(), n, 1)?,
            Self::wire(case, "ByteString (zero-copy)", ByteString::from(S), n, 1)?,
            Self::wire(case, "bitcode serde", BitcodeSerde(S.to_string()), n, 1)?,
            Self::wire(case, "bitcode derive", Bitcode(S.to_string()), n, 1)?,
            Self::wire(case, "json", Json(S.to_string()), n, 1)?,
            Self::wire(case, "msgpack", MsgPack(S.to_string()), n, 1)?,
            Self::wire(case, "protobuf", pb::Text { s: S.to_string() }, n, 1)?,
        ]);
        Ok(())
    }

    /// Vec<T> of plain data through every tier.
    fn pod_vec_jobs<T>(case: &'static str, v: Vec<T>, n: usize) -> Result<Vec<Job>, String>
    where
        T: bytemuck::Pod + PartialEq + Serialize + for<'de> Deserialize<'de> + bitcode::Encode,
        T: bitcode::DecodeOwned + Send + Sync,
    {
        let e = v.len();
        Ok(vec![
            Self::memcpy(case, bytemuck::cast_slice(&v), n, e),
            Self::wire(case, "Vec<T>", v.clone(), n, e)?,
            Self::wire(case, "PodVec<T> (zero-copy)", PodVec::from(v.clone()), n, e)?,
            Self::wire(case, "bitcode serde", BitcodeSerde(v.clone()), n, e)?,
            Self::wire(case, "bitcode derive", Bitcode(v.clone()), n, e)?,
            Self::wire(case, "json", Json(v.clone()), n, e)?,
            Self::wire(case, "msgpack", MsgPack(v), n, e)?,
        ])
    }

    fn vec_i32_case(&mut self) -> Result<(), String> {
        let v: Vec<i32> = (0..self.args.elements).map(value).collect();
        let (e, n) = (v.len(), self.reps());
        let mut jobs = Self::pod_vec_jobs("vec_i32", v.clone(), n)?;
        jobs.push(Self::wire("vec_i32", "protobuf", pb::Ints { v }, n, e)?);
        self.measure(jobs);
        Ok(())
    }

    fn vec_quad_case(&mut self) -> Result<(), String> {
        let v: Vec<Quad> = (0..self.args.elements)
            .map(|i| Quad { a: value(i), b: value(i + 1), c: value(i + 2), d: value(i + 3) })
            .collect();
        let (e, n) = (v.len(), self.reps());
        let quads = v.iter().map(|q| pb::Quad { a: q.a, b: q.b, c: q.c, d: q.d }).collect();
        let mut jobs = Self::pod_vec_jobs("vec_quad", v, n)?;
        jobs.push(Self::wire("vec_quad", "protobuf", pb::Quads { v: quads }, n, e)?);
        self.measure(jobs);
        Ok(())
    }

    /// A map through its hand-written encoding, every serde tier, and a memcpy of the
    /// hand-written bytes.
    fn map_jobs<K, C>(case: &'static str, m: HashMap<K, i32>, custom: C, n: usize) -> Result<Vec<Job>, String>
    where
        K: Eq + Hash + Clone + Send + Sync + 'static + Serialize + for<'de> Deserialize<'de>,
        K: bitcode::Encode + bitcode::DecodeOwned,
        C: Wire + PartialEq,
    {
        let e = m.len();
        let mut raw = BytesMut::new();
        custom.encode(&mut raw).map_err(|e| e.to_string())?;
        Ok(vec![
            Self::memcpy(case, &raw, n, e),
            Self::wire(case, "hand-written", custom, n, e)?,
            Self::wire(case, "bitcode serde", BitcodeSerde(m.clone()), n, e)?,
            Self::wire(case, "bitcode derive", Bitcode(m.clone()), n, e)?,
            Self::wire(case, "json", Json(m.clone()), n, e)?,
            Self::wire(case, "msgpack", MsgPack(m), n, e)?,
        ])
    }

    fn map_string_case(&mut self) -> Result<(), String> {
        let m: HashMap<String, i32> =
            (0..self.args.elements).map(|i| (format!("term-{}", value(i)), i as i32)).collect();
        let (e, n) = (m.len(), self.reps());
        let mut jobs = Self::map_jobs("map_string_i32", m.clone(), StrIntMap(m.clone()), n)?;
        jobs.push(Self::wire("map_string_i32", "protobuf", pb::StrInt { m }, n, e)?);
        self.measure(jobs);
        Ok(())
    }

    fn map_int_case(&mut self) -> Result<(), String> {
        let m: HashMap<i32, i32> = (0..self.args.elements).map(|i| (value(i), i as i32)).collect();
        let (e, n) = (m.len(), self.reps());
        let mut jobs = Self::map_jobs("map_i32_i32", m.clone(), IntIntMap(m.clone()), n)?;
        jobs.push(Self::wire("map_i32_i32", "protobuf", pb::IntInt { m }, n, e)?);
        self.measure(jobs);
        Ok(())
    }

    fn hash_case(&mut self) {
        self.measure(hash::jobs(self.args.count));
    }
}

fn row(
    case: &'static str,
    tier: &'static str,
    codec: &'static str,
    bytes: usize,
    ops: usize,
    elements: usize,
) -> Row {
    Row { case, tier, codec, bytes, ops, elements, encode_s: 0.0, decode_s: 0.0, runs: 0 }
}

/// Under the table, the ratios the codec tiers are judged by (docs/BENCHMARKS.md, "Codec
/// tiers"): plain data against memcpy, the general tier against the fast one.
fn print_summary(rows: &[Row]) {
    let find = |case: &str, codec: &str| rows.iter().find(|r| r.case == case && r.codec == codec);
    let mut lines = Vec::new();
    for case in ["string", "vec_i32", "vec_quad"] {
        let Some(m) = find(case, "memcpy") else { continue };
        for r in rows.iter().filter(|r| r.case == case && (r.tier == "pod" || r.codec.starts_with("String")))
        {
            lines.push(format!(
                "{case:<15} {:<22} / memcpy: encode {:.2}x, decode {:.2}x",
                r.codec,
                r.encode_s / m.encode_s,
                r.decode_s / m.decode_s
            ));
        }
    }
    for case in ["string", "map_string_i32", "map_i32_i32", "vec_i32", "vec_quad"] {
        let Some(j) = find(case, "json") else { continue };
        for fast in ["bitcode serde", "bitcode derive"] {
            let Some(f) = find(case, fast) else { continue };
            lines.push(format!(
                "{case:<15} json / {fast:<14}: encode {:.1}x, decode {:.1}x slower",
                j.encode_s / f.encode_s,
                j.decode_s / f.decode_s
            ));
        }
        // The protobuf tier beside the fast tier and JSON (time ratios: above 1, protobuf is
        // slower).
        let Some(p) = find(case, "protobuf") else { continue };
        for other in ["bitcode derive", "json"] {
            let Some(o) = find(case, other) else { continue };
            lines.push(format!(
                "{case:<15} protobuf / {other:<10}: encode {:.2}x, decode {:.2}x",
                p.encode_s / o.encode_s,
                p.decode_s / o.decode_s
            ));
        }
    }
    if !lines.is_empty() {
        outln!("\nratios (medians of {} runs):", rows[0].runs);
        for l in lines {
            outln!("  {l}");
        }
    }
}
