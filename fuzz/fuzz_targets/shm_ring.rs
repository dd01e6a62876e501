#![no_main]
//! See `volley::fuzzing::shm_ring` for what this checks; `docs/TESTING.md` for how to run it.

libfuzzer_sys::fuzz_target!(|data: &[u8]| volley::fuzzing::shm_ring(data));
