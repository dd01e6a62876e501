#![no_main]
//! See `volley::fuzzing::codec_pod` for what this checks; `docs/TESTING.md` for how to run it.

libfuzzer_sys::fuzz_target!(|data: &[u8]| volley::fuzzing::codec_pod(data));
