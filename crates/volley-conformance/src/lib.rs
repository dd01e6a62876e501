//! The wire-protocol conformance suite: the language-neutral cases of `tests/conformance/`
//! (their README says what each file holds) and the runners that play them over a socket
//! against any implementation, which `volley conformance server|client ADDR` runs:
//!
//! - [`server_side::play`] connects to a server under test and plays the `echo_server` cases,
//!   then (against a server that announced `STREAMS`) the stream cases of [`server_streams`];
//! - [`client_side::serve`] listens, and plays the server's side of the `client` cases
//!   against a client under test, whose driver asks it for each call to make and reports
//!   what the call ended with, then the stream cases of [`client_streams`], whose server side
//!   answers the client's stream messages as they come;
//! - [`going_away::check`] streams a batch through a server that is made to go away mid-batch,
//!   and checks that every call ended exactly once;
//! - [`evolution`] serves and calls with an old or a new release of a type in each tier other
//!   languages read, for the cross-language evolution tests.
//!
//! This crate's tests check the Rust implementation against every case, and run both
//! runners against the Rust server and client.

pub mod client_side;
pub mod client_streams;
pub mod driver;
pub mod evolution;
pub mod going_away;
pub mod interop;
pub mod json;
pub mod server_side;
pub mod server_streams;
mod stream;

use serde_json::Value;

/// The wire cases, built into the runner so that it needs no checkout to run.
pub const WIRE_JSON: &str = include_str!("../../../tests/conformance/wire.json");
/// The routing cases (stable hash and ring).
pub const ROUTING_JSON: &str = include_str!("../../../tests/conformance/routing.json");

/// The cases of `wire.json`.
pub fn wire() -> Value {
    serde_json::from_str(WIRE_JSON).expect("tests/conformance/wire.json is JSON")
}

/// The cases of `routing.json`.
pub fn routing() -> Value {
    serde_json::from_str(ROUTING_JSON).expect("tests/conformance/routing.json is JSON")
}

/// The reference XXH3-64 of `data` with `seed`: with seed 0 it is the stable key hash of
/// PROTOCOL.md §15.2 as the volley crate computes it, otherwise the seeded form the hash ring
/// places its points with (§16.6).
pub fn xxh3(data: &[u8], seed: u64) -> u64 {
    if seed == 0 { volley::balance::key_hash(data) } else { xxhash_rust::xxh3::xxh3_64_with_seed(data, seed) }
}

/// What a run of the cases found: one line per case, `Err` with what went wrong; and the
/// cases not played, each with why (an optional feature the peer does not have, say).
#[derive(Debug, Default)]
pub struct Report {
    pub cases: Vec<(String, Result<(), String>)>,
    pub not_played: Vec<(String, String)>,
}

impl Report {
    /// Whether every case passed (and there was at least one).
    pub fn passed(&self) -> bool {
        !self.cases.is_empty() && self.cases.iter().all(|(_, r)| r.is_ok())
    }

    /// One line per case, `ok` or `FAILED` with the reason, one per case not played (`n/a`
    /// with why), then a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, result) in &self.cases {
            match result {
                Ok(()) => out.push_str(&format!("ok      {name}\n")),
                Err(e) => out.push_str(&format!("FAILED  {name}: {e}\n")),
            }
        }
        for (name, why) in &self.not_played {
            out.push_str(&format!("n/a     {name}: {why}\n"));
        }
        let failed = self.cases.iter().filter(|(_, r)| r.is_err()).count();
        out.push_str(&format!("{} cases, {failed} failed", self.cases.len()));
        if !self.not_played.is_empty() {
            out.push_str(&format!(", {} not played", self.not_played.len()));
        }
        out.push('\n');
        out
    }
}
