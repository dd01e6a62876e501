#![no_main]
//! See `volley::fuzzing::frame_decoder` for what this checks; `docs/TESTING.md` for how to run it.

libfuzzer_sys::fuzz_target!(|data: &[u8]| volley::fuzzing::frame_decoder(data));
