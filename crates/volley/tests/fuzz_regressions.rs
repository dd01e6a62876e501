//! Every saved fuzz input (`fuzz/regressions/<target>/*`, crashes the fuzzer found, and the
//! seed corpus `fuzz/corpus/<target>/*`) is replayed through its decoder checks: each must end
//! in a value or a typed error, never a panic (`volley::fuzzing` holds the checks themselves).

use std::path::{Path, PathBuf};

use volley::bytes::{Bytes, BytesMut};
use volley::proto::{Decoder, Limits, ProtocolError, decode_frame};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Inputs of `target` under `fuzz/regressions` and `fuzz/corpus`.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["regressions", "corpus"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else { continue };
        for e in entries {
            let path = e.unwrap().path();
            if path.is_file() {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let inputs = inputs(target);
    for (path, data) in &inputs {
        if std::panic::catch_unwind(|| check(data)).is_err() {
            panic!("{target}: {} panics", path.display());
        }
    }
    inputs.len()
}

#[test]
fn every_saved_input_of_every_target_passes_its_checks() {
    let n = replay("frame_decoder", volley::fuzzing::frame_decoder)
        + replay("preamble", volley::fuzzing::preamble)
        + replay("codec_pod", volley::fuzzing::codec_pod)
        + replay("codec_fast", volley::fuzzing::codec_fast)
        + replay("codec_general", volley::fuzzing::codec_general)
        + replay_shm_ring();
    // The seed corpus alone holds more than 30 inputs: finding none means the path is wrong.
    assert!(n >= 30, "only {n} fuzz inputs found under {}", fuzz_dir().display());
}

#[cfg(target_os = "linux")]
fn replay_shm_ring() -> usize {
    replay("shm_ring", volley::fuzzing::shm_ring)
}

#[cfg(not(target_os = "linux"))]
fn replay_shm_ring() -> usize {
    0
}

/// Decodes a whole stream (preamble first) and returns the error that ended it.
fn stream_error(stream: &[u8]) -> Option<ProtocolError> {
    let limits = Limits::default();
    let mut d = Decoder::new(limits);
    let mut buf = BytesMut::from(stream);
    let mut out = Vec::new();
    loop {
        match d.next_frame(&mut buf) {
            Ok(Some(body)) => {
                if let Err(e) = decode_frame(&body, &limits, &mut out) {
                    return Some(e);
                }
            }
            Ok(None) => return None,
            Err(e) => return Some(e),
        }
    }
}

/// The hostile inputs in `fuzz/regressions/frame_decoder` each end in the typed error they
/// were saved for (the file name says which), not just "no panic".
#[test]
fn frame_regressions_end_in_their_typed_errors() {
    let mut checked = 0;
    for (path, data) in inputs("frame_decoder") {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(expect) = name.strip_prefix("err-") else { continue };
        let stream = &data[1 + (data[0] as usize % 16).min(data.len() - 1)..];
        let err = stream_error(stream).unwrap_or_else(|| panic!("{name}: decoded without error"));
        let kind = format!("{err:?}");
        assert!(
            kind.to_lowercase().starts_with(&expect.split('.').next().unwrap().replace('_', "")),
            "{name}: got {kind}"
        );
        checked += 1;
    }
    assert!(checked >= 3, "expected the err-* regression inputs, found {checked}");
    // And the one thing a fuzzer must never get: a body decoding partially.
    let mut out = Vec::new();
    let bad = Bytes::from_static(&[0x05, 1, 0, 0, 0, 0, 0, 0, 0, 0x05, 1]);
    assert!(decode_frame(&bad, &Limits::default(), &mut out).is_err());
    assert!(out.is_empty());
}

/// Without a fuzzer at hand, the ring's checks run on seeded random scripts: positions near the
/// real ones (the interesting boundaries) as often as arbitrary 64-bit garbage.
#[cfg(target_os = "linux")]
#[test]
fn the_shm_ring_survives_random_hostile_scripts() {
    let mut rng = fastrand::Rng::with_seed(19);
    for _ in 0..20_000 {
        let mut script = Vec::new();
        for _ in 0..rng.usize(1..60) {
            let value = match rng.u8(0..3) {
                0 => rng.u64(..),
                1 => rng.u64(0..3 * 4096),
                _ => u64::MAX - rng.u64(0..4096),
            };
            script.push(rng.u8(..));
            script.push(rng.u8(..));
            script.extend_from_slice(&value.to_le_bytes());
        }
        volley::fuzzing::shm_ring(&script);
    }
}
