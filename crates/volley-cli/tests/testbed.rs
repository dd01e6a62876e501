//! `volley testbed`, end to end: a small matrix in one process and one with a process per
//! role; the JSON report's fields; a corpus directory; a failed role process.

use std::process::Command;

fn volley() -> Command {
    Command::new(env!("CARGO_BIN_EXE_volley"))
}

fn testbed_json(args: &[&str]) -> serde_json::Value {
    let out = volley()
        .args(["testbed", "--docs", "60", "--queries", "12", "--shards", "3", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check_report(v: &serde_json::Value, transport: &str, configs: usize) {
    assert_eq!(v["results_agree"], true, "{v}");
    assert_eq!(v["oracle_checked"], true, "{v}");
    let rows = v["configs"].as_array().unwrap();
    assert_eq!(rows.len(), configs, "{v}");
    for r in rows {
        for key in
            ["name", "mode", "batch_size", "transport", "codec", "index_s", "query_s", "messages", "bytes"]
        {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert_eq!(r["transport"], transport);
        assert!(r["index_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["postings"].as_u64().unwrap() > 0, "{r}");
        if transport != "inproc" {
            assert!(r["messages"].as_u64().unwrap() > 0 && r["bytes"].as_u64().unwrap() > 0, "{r}");
        }
    }
    // The same postings were indexed by every configuration.
    assert!(rows.iter().all(|r| r["postings"] == rows[0]["postings"]), "{v}");
    let base = &rows[0];
    assert_eq!(
        (base["mode"].as_str(), base["batch_size"].as_u64(), base["codec"].as_str()),
        (Some("relayed"), Some(1), Some("general"))
    );
    assert_eq!(base["baseline"], true);
}

#[test]
fn the_default_matrix_agrees_in_one_process_over_unix() {
    let v = testbed_json(&[]);
    check_report(&v, "unix", 5);
    // The report's figures are under `published`, with their source; `seed` is gone.
    let published = &v["published"];
    assert_eq!(published["index_cut_pct"], 82.9, "{v}");
    assert_eq!(published["query_cut_pct"], serde_json::json!([82.5, 91.0]), "{v}");
    assert_eq!(published["bytes_pct_of_old"], 10.74, "{v}");
    let source = published["source"].as_str().unwrap();
    assert!(source.contains("Technical Report of MF optimization") && source.contains("Wei Cao"), "{source}");
    assert!(v.get("seed").is_none(), "{v}");
    let rows = v["configs"].as_array().unwrap();
    let best = rows.iter().find(|r| r["mode"] == "direct" && r["codec"] == "fast").unwrap();
    // Messages: batches of 128 against one item per request, four messages per relayed call.
    assert!(best["messages"].as_u64().unwrap() * 10 < rows[0]["messages"].as_u64().unwrap(), "{v}");
    assert!(best["bytes"].as_u64().unwrap() < rows[0]["bytes"].as_u64().unwrap(), "{v}");
    let relayed_single = rows[0]["messages"].as_u64().unwrap();
    let direct_single = rows.iter().find(|r| r["mode"] == "direct" && r["batch_size"] == 1).unwrap();
    // Relayed calls take four messages, direct two (plus a little registry traffic).
    let ratio = relayed_single as f64 / direct_single["messages"].as_u64().unwrap() as f64;
    assert!((1.7..2.3).contains(&ratio), "relayed/direct messages {ratio}: {v}");
}

#[test]
fn inproc_agrees_and_counts_no_bytes() {
    let v = testbed_json(&["--transport", "inproc", "--mode", "direct", "--batch", "16", "--codec", "fast"]);
    check_report(&v, "inproc", 2);
}

#[test]
fn a_process_per_role_over_tcp_agrees_and_cleans_up() {
    let v = testbed_json(&["--processes", "--transport", "tcp", "--mode", "direct", "--batch", "32"]);
    check_report(&v, "tcp", 2);
    assert_eq!(v["processes"], true);
    // The baseline went through the controller: more messages than direct batches.
    let rows = v["configs"].as_array().unwrap();
    assert!(rows[0]["messages"].as_u64().unwrap() > rows[1]["messages"].as_u64().unwrap());
}

#[test]
#[cfg(target_os = "linux")]
fn a_process_per_role_over_shm_agrees() {
    let v = testbed_json(&["--processes", "--transport", "shm", "--mode", "direct", "--batch", "32"]);
    check_report(&v, "shm", 2);
}

/// `tcp+shm`: the roles register tcp addresses with shm ones beside them, and every client —
/// the driver's, Document's and Main's — reaches every instance it calls over shm, found
/// through the registry. Relayed calls go through the controller, whose relay uses tcp.
#[test]
#[cfg(target_os = "linux")]
fn a_process_per_role_over_shm_found_through_the_registry_agrees() {
    let v = testbed_json(&["--processes", "--transport", "tcp+shm", "--mode", "direct", "--batch", "32"]);
    check_report(&v, "tcp+shm", 2);
    let rows = v["configs"].as_array().unwrap();
    assert_eq!(rows[0]["local_connections"], 0, "the relayed baseline: {v}");
    // The driver to Document and Main; Document to LA and 3 shards; Main to Document and 3 shards.
    let pairs = 2 + 4 + 4;
    assert!(rows[1]["local_connections"].as_u64().unwrap() >= pairs, "{v}");
}

#[test]
fn a_process_per_role_over_unix_agrees() {
    let v = testbed_json(&["--processes", "--single", "--mode", "direct", "--codec", "general"]);
    check_report(&v, "unix", 2);
}

#[test]
fn a_corpus_directory_is_indexed_and_configurations_agree() {
    let dir = tempfile::tempdir().unwrap();
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Foxes and dogs: a study of quick animals.",
        "Searching the index quickly finds the documents.",
        "Lazy dogs sleep; quick foxes run.",
    ];
    for (i, t) in texts.iter().enumerate() {
        std::fs::write(dir.path().join(format!("{i}.txt")), t).unwrap();
    }
    let out = volley()
        .args(["testbed", "--queries", "6", "--shards", "2", "--json", "--corpus"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results_agree"], true, "{v}");
    assert_eq!(v["oracle_checked"], false, "{v}");
    assert_eq!(v["docs"], 4);
}

#[test]
fn the_table_names_the_baseline_and_the_seed() {
    let out = volley()
        .args(["testbed", "--docs", "40", "--queries", "4", "--shards", "2", "--mode", "direct"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("relayed+single+general") && text.contains("base"), "{text}");
    assert!(text.contains("direct+batch128+fast"), "{text}");
    assert!(text.contains("82.9%") && text.contains("10.74%"), "{text}");
    // The published row's source, named under the table.
    assert!(text.contains("\"Technical Report of MF optimization\"") && text.contains("Wei Cao"), "{text}");
    assert!(text.contains("all configurations agree") && text.contains("brute-force scan"), "{text}");
}

#[test]
fn plot_writes_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("cuts.png");
    let out = volley()
        .args(["testbed", "--docs", "40", "--queries", "4", "--shards", "2", "--mode", "direct", "--plot"])
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 1000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} bytes", bytes.len());
}

#[test]
fn a_missing_corpus_fails_with_a_message() {
    let out = volley()
        .args(["testbed", "--processes", "--queries", "2", "--corpus", "/nonexistent/volley-testbed-corpus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/volley-testbed-corpus"), "{err}");
}
