//! Running the `volley` binary of this build from a test, as a user's shell would.
#![allow(dead_code)] // each test binary uses the helpers it needs

use std::io::Write;
use std::process::{Command, Stdio};

/// The `volley` binary, without the caller's `VOLLEY_TOKEN`.
pub fn volley() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_volley"));
    c.env_remove("VOLLEY_TOKEN");
    c
}

/// Runs `volley args` with `stdin`; returns whether it succeeded, its stdout and its stderr.
pub fn run(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = volley()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}
