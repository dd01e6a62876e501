//! `volley bench codec`: the seed's serialization tables 1–3 (seeds/000 §6.2.1), with Volley's
//! codec tiers in place of boost, febird and memcpy (serde_json stands in for boost).
//!
//! - `string`: "izenesoft" encoded `--count` times, then decoded `--count` times (table 1).
//! - `vec_i32`, `vec_quad`, `map_string_i32`, `map_i32_i32`: containers of `--elements`
//!   entries, each encoded and decoded `--count / --elements` times, so every row moves
//!   `--count` elements (table 2).
//! - `hash_insert`: `--count` int → string items inserted into a hash table whose hash function
//!   encodes the key with the tier and hashes the bytes (the seed's `sdb_hashing`), then every
//!   key looked up (table 3). `encode_s` is the insert time, `decode_s` the lookup time.
//!
//! Every case has a `memcpy` row: the same bytes as the pod or custom encoding, copied into the
//! reused send buffer (encode) and into a fresh allocation (decode), so the plain-data tier's
//! distance from a bare copy is visible. Each row is run `--runs` times, interleaved with the
//! other rows of its case, and the median is reported; a run repeats its batch of operations
//! for at least 50 ms and reports the time per batch. Every codec's output is decoded and
//! compared with the input before timing. Decoding is timed from a `Bytes` payload whose
//! clone costs nothing, as in Volley the reader has already made it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::hint::black_box;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::output::outln;
use clap::Args;
use serde::{Deserialize, Serialize};
use volley::bytes::{Bytes, BytesMut};
use volley::codec::hash::xxh3_64;
use volley::codec::{Bitcode, BitcodeSerde, Json, MsgPack, PodVec, StableHash};
use volley::{ByteString, CodecError, Wire};

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

/// Table 2's POD: `struct { int a; int b; int c; int d; }`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    bytemuck::Pod,
    bytemuck::Zeroable,
    Serialize,
    Deserialize,
    bitcode::Encode,
    bitcode::Decode,
)]
#[repr(C)]
struct Quad {
    a: i32,
    b: i32,
    c: i32,
    d: i32,
}

/// The custom tier for `map<string, int>`: u32 LE key length, key bytes, i32 LE value, per
/// entry (what the seed's memcpy column did for maps).
#[derive(Debug, PartialEq)]
struct StrIntMap(HashMap<String, i32>);

impl Wire for StrIntMap {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        // Size the whole encoding first and fill it in place: one capacity check instead of
        // three per entry.
        let size: usize = self.0.keys().map(|k| 8 + k.len()).sum();
        let start = out.len();
        out.resize(start + size, 0);
        let mut at = &mut out[start..];
        for (k, v) in &self.0 {
            let (len, rest) = at.split_at_mut(4);
            len.copy_from_slice(&(k.len() as u32).to_le_bytes());
            let (key, rest) = rest.split_at_mut(k.len());
            key.copy_from_slice(k.as_bytes());
            let (value, rest) = rest.split_at_mut(4);
            value.copy_from_slice(&v.to_le_bytes());
            at = rest;
        }
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        let bad = || CodecError("truncated map entry".into());
        let mut map = HashMap::with_capacity(bytes.len() / 16);
        let mut rest = &bytes[..];
        while let Some((len, after)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            if after.len() < len + 4 {
                return Err(bad());
            }
            let (key, after) = after.split_at(len);
            let (value, after) = after.split_at(4);
            let key = std::str::from_utf8(key).map_err(|e| CodecError(e.to_string()))?;
            map.insert(key.to_owned(), i32::from_le_bytes(value.try_into().unwrap()));
            rest = after;
        }
        if !rest.is_empty() {
            return Err(bad());
        }
        Ok(StrIntMap(map))
    }
}

/// The custom tier for `map<int, int>`: the entries as (i32, i32) little-endian pairs.
#[derive(Debug, PartialEq)]
struct IntIntMap(HashMap<i32, i32>);

impl Wire for IntIntMap {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        let start = out.len();
        out.resize(start + self.0.len() * 8, 0);
        for (pair, (k, v)) in out[start..].chunks_exact_mut(8).zip(&self.0) {
            pair[..4].copy_from_slice(&k.to_le_bytes());
            pair[4..].copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        let pairs = volley::codec::pod::decode_vec::<[i32; 2]>(&bytes)?;
        Ok(IntIntMap(pairs.into_iter().map(|[k, v]| (k, v)).collect()))
    }
}

/// Values spread over 0..1,000,000: neither tiny (which flatters varint formats) nor
/// full-width.
fn value(i: usize) -> i32 {
    (i as u64 * 2_654_435_761 % 1_000_000) as i32
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
        let jobs = Self::pod_vec_jobs("vec_i32", v, self.reps())?;
        self.measure(jobs);
        Ok(())
    }

    fn vec_quad_case(&mut self) -> Result<(), String> {
        let v: Vec<Quad> = (0..self.args.elements)
            .map(|i| Quad { a: value(i), b: value(i + 1), c: value(i + 2), d: value(i + 3) })
            .collect();
        let jobs = Self::pod_vec_jobs("vec_quad", v, self.reps())?;
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
        let jobs = Self::map_jobs("map_string_i32", m.clone(), StrIntMap(m), self.reps())?;
        self.measure(jobs);
        Ok(())
    }

    fn map_int_case(&mut self) -> Result<(), String> {
        let m: HashMap<i32, i32> = (0..self.args.elements).map(|i| (value(i), i as i32)).collect();
        let jobs = Self::map_jobs("map_i32_i32", m.clone(), IntIntMap(m), self.reps())?;
        self.measure(jobs);
        Ok(())
    }

    fn hash_case(&mut self) {
        let n = self.args.count;
        self.measure(vec![
            hash_job::<StdSip>(n),
            hash_job::<Stable>(n),
            hash_job::<Seed37>(n),
            hash_job::<ViaWire<BitcodeSerde<i32>>>(n),
            hash_job::<ViaWire<Bitcode<i32>>>(n),
            hash_job::<ViaWire<Json<i32>>>(n),
            hash_job::<ViaWire<MsgPack<i32>>>(n),
        ]);
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

/// Inserts `n` (int, string) items into a table hashed by `K` (timed as "encode"), then looks
/// every key up (timed as "decode"). The table is sized up front, so no key is hashed twice
/// by a resize; building the values and dropping the table are not timed.
fn hash_job<K: KeyHash>(n: usize) -> Job {
    let run = move || {
        let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let mut table: HashMap<Key<K>, String, BuildHasherDefault<PassThrough>> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        let t = Instant::now();
        for (i, v) in values.into_iter().enumerate() {
            table.insert(Key(i as i32, PhantomData), v);
        }
        let insert = t.elapsed();
        let t = Instant::now();
        for i in 0..n {
            black_box(table.get(&Key(black_box(i as i32), PhantomData)));
        }
        let lookup = t.elapsed();
        assert_eq!(table.len(), n);
        (insert, lookup)
    };
    Job { row: row("hash_insert", K::TIER, K::CODEC, K::len(123_456), n, 1), run: Box::new(run) }
}

/// How a hash table key is hashed: encode it with a tier, hash the bytes.
trait KeyHash: 'static {
    const TIER: &'static str;
    const CODEC: &'static str;
    fn hash(k: i32) -> u64;
    fn len(k: i32) -> usize;
}

/// Baseline without serialization: std's SipHash of the integer.
struct StdSip;
impl KeyHash for StdSip {
    const TIER: &'static str = "none";
    const CODEC: &'static str = "std SipHash (no encode)";
    fn hash(k: i32) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    }
    fn len(_: i32) -> usize {
        4
    }
}

/// Volley's stable hash: xxh3-64 of the pod encoding, hashed in place.
struct Stable;
impl KeyHash for Stable {
    const TIER: &'static str = "pod";
    const CODEC: &'static str = "StableHash (xxh3)";
    fn hash(k: i32) -> u64 {
        k.stable_hash()
    }
    fn len(_: i32) -> usize {
        4
    }
}

/// The seed's `sdb_hashing`: `h = 37·h + byte` over the encoded bytes, 32-bit.
struct Seed37;
impl KeyHash for Seed37 {
    const TIER: &'static str = "pod";
    const CODEC: &'static str = "seed 37·h+b";
    fn hash(k: i32) -> u64 {
        k.to_le_bytes().iter().fold(0u32, |h, &b| h.wrapping_mul(37).wrapping_add(b as u32)) as u64
    }
    fn len(_: i32) -> usize {
        4
    }
}

/// Encodes the key with `W` into a reused per-thread buffer, then xxh3-64 of the bytes.
struct ViaWire<W>(PhantomData<W>);

thread_local! {
    static KEY_BUF: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::with_capacity(64));
}

impl<W: Wire + From<i32> + Label> KeyHash for ViaWire<W> {
    const TIER: &'static str = W::TIER.name();
    const CODEC: &'static str = W::LABEL;
    fn hash(k: i32) -> u64 {
        KEY_BUF.with_borrow_mut(|buf| {
            buf.clear();
            W::from(k).encode(buf).unwrap();
            xxh3_64(buf)
        })
    }
    fn len(k: i32) -> usize {
        let mut b = BytesMut::new();
        W::from(k).encode(&mut b).unwrap();
        b.len()
    }
}

/// Row labels of the key encodings.
trait Label {
    const LABEL: &'static str;
}
impl Label for BitcodeSerde<i32> {
    const LABEL: &'static str = "bitcode serde + xxh3";
}
impl Label for Bitcode<i32> {
    const LABEL: &'static str = "bitcode derive + xxh3";
}
impl Label for Json<i32> {
    const LABEL: &'static str = "json + xxh3";
}
impl Label for MsgPack<i32> {
    const LABEL: &'static str = "msgpack + xxh3";
}

/// The key of the hash-insert table: hashed by `K`, compared as an integer.
struct Key<K>(i32, PhantomData<K>);

impl<K> PartialEq for Key<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<K> Eq for Key<K> {}

impl<K: KeyHash> Hash for Key<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(K::hash(self.0));
    }
}

/// A hasher that passes the one u64 it is given through: the table's hash function is the
/// key's `KeyHash`, nothing added.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("Key hashes with write_u64 only")
    }
    fn write_u64(&mut self, h: u64) {
        self.0 = h;
    }
}

/// The ratios the codec issue sets goals for, under the table.
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
    }
    if !lines.is_empty() {
        outln!("\nratios (medians of {} runs):", rows[0].runs);
        for l in lines {
            outln!("  {l}");
        }
    }
}
