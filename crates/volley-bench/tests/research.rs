//! `volley-research` end to end on tiny sizes: every benchmark prints the rows and keys its
//! documentation names, and bad arguments end it with a clear error. These runs check what is
//! measured and reported, not how fast (no figure is compared with a time).

use std::process::Command;

fn research() -> Command {
    Command::new(env!("CARGO_BIN_EXE_volley-research"))
}

/// One JSON object per line of a successful run's output.
fn json_lines(out: std::process::Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object per line: {l}: {e}")))
        .collect()
}

#[test]
fn codec_json_prints_one_row_per_codec_with_the_documented_keys() {
    let rows = json_lines(
        research()
            .args(["codec", "--json", "--count", "3000", "--elements", "100", "--runs", "1"])
            .output()
            .unwrap(),
    );
    let cases = ["string", "vec_i32", "vec_quad", "map_string_i32", "map_i32_i32", "hash_insert"];
    for case in cases {
        let of_case: Vec<_> = rows.iter().filter(|r| r["case"] == case).collect();
        assert!(of_case.len() >= 6, "{case}: {} rows", of_case.len());
        for tier in ["fast", "general"] {
            assert!(of_case.iter().any(|r| r["tier"] == tier), "{case}: no {tier} row");
        }
    }
    for r in &rows {
        for key in ["case", "tier", "codec", "encode_s", "decode_s", "bytes", "ops", "runs"] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert!(r["encode_s"].as_f64().unwrap() > 0.0 && r["decode_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let find = |case: &str, codec: &str| {
        rows.iter()
            .find(|r| r["case"] == case && r["codec"] == codec)
            .unwrap_or_else(|| panic!("{case}/{codec}"))
    };
    // The memcpy rows copy exactly the bytes the pod tier sends.
    assert_eq!(find("vec_i32", "memcpy")["bytes"], 400);
    assert_eq!(find("vec_i32", "Vec<T>")["bytes"], 400);
    assert_eq!(find("vec_quad", "Vec<T>")["bytes"], 1600);
    assert_eq!(find("vec_quad", "memcpy")["bytes"], 1600);
    assert_eq!(find("string", "memcpy")["bytes"], 9);
    assert_eq!(find("string", "json")["bytes"], 11, "\"izenesoft\" with its quotes");
    assert_eq!(find("hash_insert", "StableHash (xxh3)")["ops"], 3000);
}

#[test]
fn codec_text_runs_only_the_chosen_case_and_ends_with_the_ratios() {
    let out =
        research().args(["codec", "--case", "string", "--count", "100", "--runs", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("memcpy") && text.contains("ratios"), "{text}");
    assert!(!text.contains("vec_i32"), "--case string printed other cases: {text}");
}

#[test]
fn pools_json_rows_cover_every_allocator() {
    let rows = json_lines(
        research().args(["pools", "--json", "--rounds", "1", "--case", "arena"]).output().unwrap(),
    );
    let allocators: Vec<&str> = rows.iter().map(|r| r["allocator"].as_str().unwrap()).collect();
    assert_eq!(allocators, ["system", "mimalloc", "jemalloc", "volley arena (bumpalo)"]);
    for r in &rows {
        assert_eq!(r["case"], "arena-4-bytes");
        assert_eq!(r["threads"], 1);
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["speedup_vs_system"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn idle_reports_the_servers_resident_memory() {
    let out =
        research().args(["idle", "--connections", "200", "--settle", "0.2", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["connections"], 200);
    let rss = v["rss_bytes"].as_u64().unwrap();
    assert!(rss > 1 << 20 && rss < 100 << 20, "rss {rss}");
    assert!(v["rss_before_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn large_json_has_inline_and_offload_with_the_ratio_on_the_offload_line() {
    let out = research()
        .args(["large", "--codec", "fast", "--payload-bytes", "100000", "--offload-min-bytes", "16384"])
        .args(["--rounds", "1", "--duration", "0.5", "--concurrency", "2", "--json"])
        .output()
        .unwrap();
    let lines = json_lines(out);
    let modes: Vec<&str> = lines.iter().map(|l| l["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["inline", "offload"]);
    for l in &lines {
        assert_eq!(l["codec"], "fast", "{l}");
        assert_eq!(l["rounds"], 1, "{l}");
        assert_eq!(l["concurrency"], 2, "{l}");
        // The payload is built from whole rows: about the size asked for.
        let bytes = l["payload_bytes"].as_u64().unwrap();
        assert!((50_000..200_000).contains(&bytes), "{l}");
        assert!(l["calls_per_s"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["mib_per_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    assert!(lines[0].get("ratio").is_none(), "{}", lines[0]);
    let ratio = lines[1]["ratio"].as_f64().unwrap();
    let expect = lines[1]["calls_per_s"].as_f64().unwrap() / lines[0]["calls_per_s"].as_f64().unwrap();
    assert!((ratio - expect).abs() < 1e-9 * expect, "ratio {ratio}, calls/s give {expect}");
}

#[test]
fn bad_arguments_end_with_a_clear_error() {
    for (args, expect) in [
        (&["codec", "--case", "nothing-like-this"][..], "no case matches"),
        (&["codec", "--runs", "0"][..], "--runs must be at least 1"),
        (&["pools", "--case", "nothing-like-this", "--rounds", "1"][..], "no case matches --case"),
        (&["large", "--rounds", "0"][..], "must be positive"),
    ] {
        let out = research().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("volley-research: ") && stderr.contains(expect), "{args:?}: {stderr}");
    }
}
