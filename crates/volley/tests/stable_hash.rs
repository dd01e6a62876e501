//! The stable key hash matches the test vectors of docs/PROTOCOL.md §15, in this process and
//! in a separate one.
//!
//! The expected values were computed with the reference xxHash C library (0.8.4, through
//! Python's `xxhash` package: `xxhash.xxh3_64_intdigest(canonical_bytes)`), not with the
//! crate under test, so a wrong algorithm, seed or key encoding fails here.

use std::process::Command;

use volley::codec::{StableHash, stable_hash};
use volley::{ByteString, PodVec};

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Quad {
    a: i32,
    b: i32,
    c: i32,
    d: i32,
}
volley::wire!(pod: Quad);

fn seq(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// (name as in PROTOCOL.md, the key's canonical bytes, its hash, the expected hash)
type Vector = (&'static str, Vec<u8>, u64, u64);

fn key_bytes<K: StableHash + ?Sized>(k: &K) -> Vec<u8> {
    let mut v = Vec::new();
    k.write_key(&mut v);
    v
}

fn vector<K: StableHash + ?Sized>(name: &'static str, k: &K, expected: u64) -> Vector {
    (name, key_bytes(k), stable_hash(k), expected)
}

fn vectors() -> Vec<Vector> {
    vec![
        vector(r#""""#, "", 0x2d06800538d394c2),
        vector("true", &true, 0xe12ef9d2eb86ceeb),
        vector("42u32", &42u32, 0x2132b64814a1ad5d),
        vector("-1i32", &-1i32, 0xcd6b1c920d3f662c),
        vector("42u64", &42u64, 0xd5a6f8c838df27c8),
        vector(r#""izenesoft""#, "izenesoft", 0x0ca123a0da7e99dc),
        vector("u128::MAX", &u128::MAX, 0x722a202f07a4b313),
        vector("Quad { a: 1, b: 2, c: 3, d: 4 }", &Quad { a: 1, b: 2, c: 3, d: 4 }, 0x6fc1ebd4f4d6ea31),
        vector(r#"("user", 7u32)"#, &("user", 7u32), 0x1472a0a50db24f0e),
        vector(
            r#""The quick brown fox jumps over the lazy dog""#,
            "The quick brown fox jumps over the lazy dog",
            0xce7d19a5418fb365,
        ),
        vector("seq(200)", &seq(200), 0xf42a8864feaf0703),
        vector("seq(1000)", &seq(1000), 0x33ef703fb2b20ed1),
        vector(r#""héllo, wörld""#, "héllo, wörld", 0x2e287e15f60788b8),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn hashes_match_the_vectors() {
    for (name, bytes, got, expected) in vectors() {
        // Read by the separate-process test below, which runs this test in a child.
        println!("VECTOR\t{name}\t{got:016x}");
        assert_eq!(got, expected, "{name}: got {got:#018x}, expected {expected:#018x}");
        assert_eq!(volley::codec::hash::xxh3_64(&bytes), expected, "{name}: canonical bytes {}", hex(&bytes));
    }
}

#[test]
fn keys_of_the_same_bytes_hash_alike_whatever_their_type() {
    let quad = Quad { a: 1, b: 2, c: 3, d: 4 };
    let h = stable_hash(&quad);
    assert_eq!(stable_hash(&vec![1i32, 2, 3, 4]), h);
    assert_eq!(stable_hash(&PodVec::from(vec![quad])), h);
    assert_eq!(stable_hash(&[1i32, 2, 3, 4][..]), h);
    let s = stable_hash("izenesoft");
    assert_eq!(stable_hash(&String::from("izenesoft")), s);
    assert_eq!(stable_hash(&ByteString::from("izenesoft")), s);
    assert_eq!(stable_hash(&volley::bytes::Bytes::from_static(b"izenesoft")), s);
    assert_eq!(stable_hash(&b"izenesoft".to_vec()), s);
}

/// The hash is a pure function of the key: the same in a fresh process (no per-process seed,
/// no address-dependent state). The child is this test binary, running `hashes_match_the_vectors`.
#[test]
fn hashes_match_the_vectors_in_a_separate_process() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hashes_match_the_vectors", "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let child: Vec<(String, u64)> = stdout
        .lines()
        // libtest may print its own "test … " prefix on the same line as the first vector.
        .filter_map(|l| l.split_once("VECTOR\t").map(|(_, rest)| rest))
        .map(|l| {
            let (name, h) = l.rsplit_once('\t').unwrap();
            (name.to_string(), u64::from_str_radix(h, 16).unwrap())
        })
        .collect();
    let vectors = vectors();
    assert_eq!(child.len(), vectors.len(), "child printed: {stdout}");
    for ((name, _, _, expected), (child_name, child_hash)) in vectors.iter().zip(&child) {
        assert_eq!(name, child_name);
        assert_eq!(*child_hash, *expected, "{name} in the child process: {child_hash:#018x}");
    }
}

/// Every vector appears in docs/PROTOCOL.md with its canonical bytes and hash, so the document
/// cannot drift from the code.
#[test]
fn protocol_md_lists_the_vectors() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/PROTOCOL.md")).unwrap();
    let section = &doc[doc.find("### 15.3").expect("PROTOCOL.md has §15.3 test vectors")..];
    for (name, bytes, _, expected) in vectors() {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("no row for `{name}` in PROTOCOL.md §15.3"));
        assert!(row.contains(&format!("`{expected:016x}`")), "{name}: hash missing in {row}");
        if bytes.len() <= 48 {
            assert!(
                row.contains(&format!("`{}`", hex(&bytes))) || bytes.is_empty(),
                "{name}: bytes in {row}"
            );
        }
    }
}
