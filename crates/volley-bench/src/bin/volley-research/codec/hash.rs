//! The `hash_insert` case (the MF report's table 3): a hash table whose hash function encodes
//! the key with a codec tier and hashes the bytes, against hashing the integer itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::hint::black_box;
use std::marker::PhantomData;
use std::time::Instant;

use volley::Wire;
use volley::bytes::BytesMut;
use volley::codec::hash::xxh3_64;
use volley::codec::{Bitcode, BitcodeSerde, Json, MsgPack, StableHash};

use super::{Job, row};

/// Every hash function of the case, each inserting and looking up `n` keys.
pub fn jobs(n: usize) -> Vec<Job> {
    vec![
        hash_job::<StdSip>(n),
        hash_job::<Stable>(n),
        hash_job::<Mf37>(n),
        hash_job::<ViaWire<BitcodeSerde<i32>>>(n),
        hash_job::<ViaWire<Bitcode<i32>>>(n),
        hash_job::<ViaWire<Json<i32>>>(n),
        hash_job::<ViaWire<MsgPack<i32>>>(n),
    ]
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

/// The MF report's `sdb_hashing`: `h = 37·h + byte` over the encoded bytes, 32-bit.
struct Mf37;
impl KeyHash for Mf37 {
    const TIER: &'static str = "pod";
    const CODEC: &'static str = "MF report 37·h+b";
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
