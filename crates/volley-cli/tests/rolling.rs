//! `volley bench rolling` end to end, real processes: a rolling restart with SIGTERM loses no
//! call and runs none twice (counted at the handler); with SIGKILL the report's accounting
//! adds up, whatever it counts.

use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs `volley bench rolling` with small numbers (2 instances, 1 round, 8 callers) and `extra`
/// flags; returns its JSON report.
fn rolling(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_volley"))
        .args(["bench", "rolling", "--instances", "2", "--rounds", "1", "--concurrency", "8"])
        .args(["--steady", "0.3", "--grace", "0.3", "--json"])
        .args(extra)
        .env_remove("VOLLEY_TOKEN")
        .env_remove("VOLLEY_REGISTRY_TOKEN")
        .env_remove("VOLLEY_REGISTRATION_CREDENTIAL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "volley bench rolling {extra:?} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let line = stdout.lines().next().unwrap_or_else(|| panic!("no report; stderr: {stderr}"));
    serde_json::from_str(line).unwrap()
}

fn n(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("no {key} in {r}"))
}

/// What holds for any run: every call is counted once, as ok or as failed by its kind, and
/// every call that succeeded ran at its handler.
fn assert_accounting(r: &Value) {
    let (calls, ok, failed) = (n(r, "calls"), n(r, "ok"), n(r, "failed"));
    assert!(ok > 0, "{r}");
    assert_eq!(calls, ok + failed, "{r}");
    let by_kind: u64 = r["failed_by_kind"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_kind, failed, "{r}");
    assert!(n(r, "failed_that_ran") <= failed, "{r}");
    assert!(n(r, "executions") >= ok, "every call that succeeded ran: {r}");
    let restarts = r["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 2, "{r}");
    for x in restarts {
        assert!(x["stop_ms"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["replaced_ms"].as_f64().unwrap() >= x["stop_ms"].as_f64().unwrap(), "{x}");
    }
}

#[test]
fn a_rolling_restart_with_sigterm_fails_no_call_and_runs_none_twice() {
    let r = rolling(&[]);
    assert_eq!(r["stop"], "SIGTERM", "{r}");
    assert_accounting(&r);
    assert_eq!(n(&r, "failed"), 0, "{r}");
    assert_eq!(n(&r, "run_twice"), 0, "{r}");
    assert_eq!(n(&r, "unrecorded_runs"), 0, "{r}");
    // Not idempotent: nothing may be retried, only resent because it never ran.
    assert_eq!(n(&r, "retried"), 0, "{r}");
    for x in r["restarts"].as_array().unwrap() {
        // The instance deregistered itself: gone from the list long before its lease (10 s)
        // could have lapsed.
        let gone = x["gone_from_list_ms"].as_f64().unwrap_or_else(|| panic!("still listed: {x}"));
        assert!(gone < 5_000.0, "{x}");
        // Calls went on while it stopped, and after.
        assert!(n(&x["during"], "calls") > 0 && n(&x["after"], "calls") > 0, "{x}");
    }
}

#[test]
fn a_rolling_restart_with_sigkill_counts_its_failures_honestly() {
    let r = rolling(&["--kill"]);
    assert_eq!(r["stop"], "SIGKILL", "{r}");
    assert_accounting(&r);
    // Calls that may have run are not idempotent here: none is sent again, so none runs twice.
    assert_eq!(n(&r, "run_twice"), 0, "{r}");
    assert_eq!(n(&r, "retried"), 0, "{r}");
}
