//! The `volley` binary, end to end.

use std::process::Command;
use std::time::Duration;

#[path = "../../volley/tests/support/wait.rs"]
mod wait;
use wait::{eventually_blocking, poll_blocking, try_poll_blocking};

fn volley() -> Command {
    Command::new(env!("CARGO_BIN_EXE_volley"))
}

#[test]
fn bench_json_has_the_documented_keys_on_every_transport() {
    for transport in ["inproc", "unix", "tcp"] {
        let out = volley()
            .args([
                "bench",
                "--transport",
                transport,
                "--duration",
                "0.3",
                "--warmup",
                "0.1",
                "--concurrency",
                "8",
            ])
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{transport}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in [
            "transport",
            "payload",
            "concurrency",
            "calls",
            "seconds",
            "calls_per_s",
            "p50_us",
            "p95_us",
            "p99_us",
            "p999_us",
            "errors",
            "frames_sent",
            "messages_sent",
            "global_allocator",
            "cpu_us_per_call",
            "rss_start_kb",
            "rss_end_kb",
            "rss_growth_pct",
        ] {
            assert!(v.get(key).is_some(), "{transport}: missing {key} in {v}");
        }
        assert_eq!(v["transport"], transport);
        assert_eq!(v["payload"], 64);
        assert_eq!(v["errors"], 0);
        assert!(v["calls"].as_u64().unwrap() > 0, "{v}");
        assert!(v["p50_us"].as_f64().unwrap() <= v["p99_us"].as_f64().unwrap(), "{v}");
        if transport != "inproc" {
            assert!(v["messages_sent"].as_u64().unwrap() >= v["calls"].as_u64().unwrap(), "{v}");
        }
        // Heap in use next to resident memory (glibc's mallinfo2, system allocator): one sample
        // after warm-up and one at the end, each non-zero (the server and client hold buffers).
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            let heap = v["heap_samples_kb"].as_array().unwrap_or_else(|| panic!("no heap samples in {v}"));
            assert!(heap.len() >= 2, "{v}");
            assert!(heap.iter().all(|h| h.as_u64().is_some_and(|kb| kb > 0)), "{v}");
        }
    }
}

#[test]
fn bench_drives_a_running_serve_echo() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("tcp://127.0.0.1:{port}");
    let mut server = volley().args(["serve-echo", "--listen", &addr]).spawn().unwrap();
    // Until serve-echo is up (checked at the end, once the server is killed).
    let ok = eventually_blocking(Duration::from_secs(30), || {
        let out = volley()
            .args([
                "bench",
                "--connect",
                &addr,
                "--duration",
                "0.2",
                "--warmup",
                "0",
                "--json",
                "--payload",
                "100",
            ])
            .output()
            .unwrap();
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["payload"], 100);
            assert!(v["calls"].as_u64().unwrap() > 0);
            return true;
        }
        false
    });
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(ok, "bench never reached serve-echo at {addr}");
}

#[test]
fn bad_addresses_are_reported_clearly() {
    let out = volley().args(["serve-echo", "--listen", "udp://x:1"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scheme"), "{err}");
    // An address without its scheme: the error names the one likely meant.
    let out = volley().args(["serve-echo", "--listen", "127.0.0.1:5000"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean tcp://127.0.0.1:5000?"), "{err}");
}

/// Without the `etcd` feature, `--store etcd://...` says how to rebuild; a store that is
/// neither memory nor etcd is refused.
#[test]
fn controller_store_flag_is_checked() {
    let out = volley()
        .args(["controller", "--listen", "tcp://127.0.0.1:0", "--store", "zookeeper://h:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected memory or etcd://"), "{err}");
    if cfg!(not(feature = "etcd")) {
        let out = volley()
            .args(["controller", "--listen", "tcp://127.0.0.1:0", "--store", "etcd://127.0.0.1:1"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--features etcd"), "{err}");
    }
}

#[test]
fn bench_mode_both_compares_single_and_batch_in_one_run() {
    for transport in ["inproc", "tcp"] {
        let out = volley()
            .args([
                "bench",
                "--transport",
                transport,
                "--mode",
                "both",
                "--batch-size",
                "64",
                "--chunk-size",
                "16",
            ])
            .args(["--duration", "0.3", "--warmup", "0.1", "--concurrency", "4", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{transport}: {}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{transport}: one object per mode");
        assert_eq!(lines[0]["mode"], "single");
        assert_eq!(lines[0]["batch_size"], 1);
        assert_eq!(lines[1]["mode"], "batch");
        assert_eq!(lines[1]["batch_size"], 64);
        for v in &lines {
            assert_eq!(v["errors"], 0, "{v}");
            let items = v["items"].as_u64().unwrap();
            assert_eq!(items, v["calls"].as_u64().unwrap() * v["batch_size"].as_u64().unwrap(), "{v}");
            assert!(v["items_per_s"].as_f64().unwrap() > 0.0, "{v}");
        }
        if transport == "tcp" {
            // 64 requests in chunks of 16: four batch messages per call.
            let v = &lines[1];
            assert!(v["messages_sent"].as_u64().unwrap() >= v["calls"].as_u64().unwrap() * 4, "{v}");
        }
    }
}

#[test]
fn bench_subcommands_do_not_take_echo_flags() {
    let out = volley().args(["bench", "--json", "registry", "pollution"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"), "{out:?}");
    // The benchmarks of Volley's parts are `volley-research` (crates/volley-bench), not the
    // product's.
    for research in ["codec", "pools", "idle", "large"] {
        let out = volley().args(["bench", research]).output().unwrap();
        assert!(!out.status.success(), "volley bench {research} ran");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"), "{out:?}");
    }
}

/// A free tcp port on loopback (bound and released; good enough for a test).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the child when dropped, so a failed assertion leaves no process behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `volley` with `args` until it succeeds (up to 5 s: the servers may still be
/// starting), and returns its stdout.
fn retry_until_ok(args: &[&str]) -> Vec<u8> {
    let mut last = String::new();
    let out = try_poll_blocking(Duration::from_secs(10), || {
        let out = volley().args(args).output().unwrap();
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        out.status.success().then_some(out.stdout)
    });
    out.unwrap_or_else(|| panic!("volley {args:?} kept failing: {last}"))
}

#[test]
fn controller_serve_echo_ls_and_bench_through_the_registry() {
    // The controller prints the address it bound (the real port for :0).
    let mut controller = Child(
        volley()
            .args(["controller", "--listen", "tcp://127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(controller.0.stdout.take().unwrap()), &mut line)
        .unwrap();
    let registry = line.trim().to_string();
    assert!(registry.starts_with("tcp://127.0.0.1:"), "{registry:?}");
    let name = format!("echo-cli-{}", std::process::id());
    let echo_addr = format!("tcp://127.0.0.1:{}", free_port());
    let mut echo = Child(
        volley()
            .args(["serve-echo", "--listen", &echo_addr, "--registry", &registry, "--name", &name])
            .spawn()
            .unwrap(),
    );

    // `volley ls --json` lists the instance once it registered.
    let listed = poll_blocking(Duration::from_secs(30), "the echo server to register", || {
        let v: serde_json::Value =
            serde_json::from_slice(&retry_until_ok(&["ls", "--registry", &registry, "--json"])).unwrap();
        let found = v["services"].as_array().unwrap().iter().any(|s| s["name"] == name.as_str());
        found.then_some(v)
    });
    let service = listed["services"]
        .as_array()
        .expect("the echo server never registered")
        .iter()
        .find(|s| s["name"] == name.as_str())
        .unwrap()
        .clone();
    assert_eq!(service["instances"][0]["address"], echo_addr.as_str(), "{listed}");
    assert!(service["instances"][0]["expires_in_ms"].as_u64().unwrap() > 0);
    let text = String::from_utf8(retry_until_ok(&["ls", "--registry", &registry])).unwrap();
    assert!(text.contains(&name) && text.contains(&echo_addr), "{text}");

    for mode in ["direct", "relayed"] {
        let out = retry_until_ok(&[
            "bench",
            "--registry",
            &registry,
            "--service",
            &name,
            "--mode",
            mode,
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--concurrency",
            "8",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["registry_mode"], mode, "{v}");
        assert_eq!(v["service"], name.as_str(), "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        let calls = v["calls"].as_u64().unwrap();
        assert!(calls > 0, "{v}");
        match mode {
            "direct" => {
                assert_eq!(v["lookups"], 1, "{v}");
                assert_eq!(v["registry_messages"], 0, "{v}");
            }
            _ => {
                assert_eq!(v["lookups"], 0, "{v}");
                // Every measured call is a request and a reply (calls in flight at the window's
                // edges add a few).
                assert!(v["registry_messages"].as_u64().unwrap() >= 2 * calls, "{v}");
            }
        }
    }

    // Killing the server (no graceful shutdown) leaves its lease to lapse; ls still answers.
    let _ = echo.0.kill();
    let _ = echo.0.wait();
    retry_until_ok(&["ls", "--registry", &registry]);
}

#[test]
fn bench_modes_embedded_registry_and_errors() {
    for (mode, transport) in [("relayed", "inproc"), ("direct,single", "unix")] {
        let out = volley()
            .args([
                "bench",
                "--mode",
                mode,
                "--transport",
                transport,
                "--duration",
                "0.2",
                "--warmup",
                "0.05",
            ])
            .args(["--concurrency", "4", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let expected = mode.split(',').next().unwrap();
        assert_eq!(v["registry_mode"], expected, "{v}");
        assert_eq!(v["transport"], transport, "{v}");
        assert!(v["calls"].as_u64().unwrap() > 0, "{v}");
    }
    let plain = volley().args(["bench", "--duration", "0.1", "--warmup", "0", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(
        (v["registry_mode"].as_str(), v["lookups"].as_u64(), v["registry_messages"].as_u64()),
        (Some("none"), Some(0), Some(0))
    );

    for (args, expect) in [
        (&["--mode", "batch", "--raw"][..], "single calls only"),
        (&["--mode", "single", "--mode", "both"][..], "two call styles"),
        (&["--mode", "direct,relayed"][..], "two registry modes"),
        (&["--mode", "relayed", "--connect", "tcp://127.0.0.1:1"][..], "do not go with --connect"),
        (&["--mode", "sideways"][..], "invalid value"),
    ] {
        assert_bench_refuses(args, expect);
    }
}

/// `--mode mix`: single calls and batch calls from every caller in one measurement, with the
/// process's resident memory sampled (the soak test's load, on a tiny duration).
#[test]
fn bench_mode_mix_makes_single_and_batch_calls_and_reports_memory() {
    let out = volley()
        .args(["bench", "--mode", "mix", "--duration", "0.5", "--warmup", "0.1", "--concurrency", "8"])
        .args(["--batch-size", "16", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "mix");
    assert_eq!(v["errors"], 0);
    let (calls, items) = (v["calls"].as_u64().unwrap(), v["items"].as_u64().unwrap());
    // One call in four is a batch of 16: items = 3/4 calls + 1/4 calls x 16, roughly.
    assert!(items > calls * 2 && items < calls * 16, "calls {calls}, items {items}");
    if std::path::Path::new("/proc/self/statm").exists() {
        assert!(v["rss_start_kb"].as_u64().unwrap() > 0, "{v}");
        assert!(v["rss_end_kb"].as_u64().unwrap() > 0, "{v}");
    }
}

#[test]
fn bench_api_both_interleaves_the_generated_and_method_forms_and_gives_their_ratio() {
    let quick = ["--duration", "0.2", "--warmup", "0.05", "--concurrency", "8"];
    let out = volley()
        .args(["bench", "--api", "both", "--rounds", "2", "--mode", "both", "--transport", "unix", "--json"])
        .args(quick)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let order: Vec<(u64, &str, &str)> = lines
        .iter()
        .map(|v| (v["round"].as_u64().unwrap(), v["mode"].as_str().unwrap(), v["api"].as_str().unwrap()))
        .collect();
    let mut expected = Vec::new();
    for mode in ["single", "batch"] {
        expected.extend([(1, mode, "method"), (1, mode, "generated")]);
    }
    for mode in ["single", "batch"] {
        expected.extend([(2, mode, "generated"), (2, mode, "method")]);
    }
    assert_eq!(order, expected, "rounds, call styles and APIs interleaved; the APIs take turns going first");
    for v in &lines {
        assert_eq!(v["errors"], 0, "{v}");
        assert!(v["calls"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["transport"], "unix", "{v}");
    }

    let text =
        volley().args(["bench", "--api", "both", "--transport", "inproc"]).args(quick).output().unwrap();
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("generated/method, single: "), "{text}");
    assert!(text.contains("medians of 1 rounds"), "{text}");

    // The generated client through the registry: direct mode, one look-up.
    let out = volley()
        .args(["bench", "--api", "generated", "--mode", "direct", "--transport", "inproc", "--json"])
        .args(quick)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["api"].as_str(), v["registry_mode"].as_str(), v["lookups"].as_u64()),
        (Some("generated"), Some("direct"), Some(1))
    );
    assert!(v["calls"].as_u64().unwrap() > 0, "{v}");

    for (args, expect) in [
        (&["--api", "both", "--mode", "relayed"][..], "a server for each API"),
        (&["--api", "generated", "--service", "other"][..], "calls the `Echo` trait's service"),
        (&["--rounds", "0"][..], "at least 1"),
    ] {
        assert_bench_refuses(args, expect);
    }
}

/// `volley bench ARGS` fails, saying `expect`.
fn assert_bench_refuses(args: &[&str], expect: &str) {
    let out = volley().arg("bench").args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expect), "{args:?}: {err}");
}

/// Reads `child`'s stderr until a line starts with `prefix`; returns that line's rest and every
/// line read. The reading thread keeps draining afterwards, so the child never blocks on it.
fn stderr_until(child: &mut std::process::Child, prefix: &'static str) -> (String, Vec<String>) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no line starting {prefix:?} ({e}); stderr so far: {seen:?}"));
        seen.push(line.clone());
        if let Some(rest) = line.strip_prefix(prefix) {
            return (rest.to_string(), seen);
        }
    }
}

/// Output to a pipe carries no escape codes: the log lines on stderr (coloured on a terminal)
/// and `volley top`, which on a terminal clears the screen before each reading.
#[test]
fn output_to_a_pipe_has_no_escape_codes() {
    let mut server = Child(
        volley()
            .args(["serve-echo", "--listen", "tcp://127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .env("VOLLEY_LOG", "info")
            .env_remove("NO_COLOR")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (admin, lines) = stderr_until(&mut server.0, "admin endpoint on http://");
    let admin = admin.split('/').next().unwrap().to_string();
    // The library's log line for the listener is there (VOLLEY_LOG=info), without colour.
    assert!(lines.iter().any(|l| l.contains("INFO") && l.contains("listening")), "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains('\x1b')), "escape codes in the log: {lines:?}");

    let out = volley().args(["top", &admin, "--count", "2", "--interval", "0.1"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\x1b'), "escape codes in top's output: {text:?}");
    assert_eq!(text.matches(&format!("{admin}, every")).count(), 2, "{text}");
}

/// `volley stats` pointed at the RPC address instead of the admin endpoint says so.
#[test]
fn stats_at_an_rpc_port_names_the_admin_endpoint() {
    let mut server = Child(
        volley()
            .args(["serve-echo", "--listen", "tcp://127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (rpc, _) = stderr_until(&mut server.0, "serving echo on ");
    let rpc = rpc.split(' ').next().unwrap().to_string();
    let host_port = rpc.strip_prefix("tcp://").unwrap();
    for (addr, expect) in [(host_port, "Volley RPC port"), (rpc.as_str(), "serves RPC")] {
        let out = volley().args(["stats", addr]).output().unwrap();
        assert!(!out.status.success(), "{addr}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect) && err.contains("--admin"), "{addr}: {err}");
    }
}

/// `serve-echo --adaptive-limit` and `controller --adaptive-limit` turn the adaptive
/// concurrency limit on: the admin endpoint shows the limit
/// (`volley_server_concurrency_limit`); without the flag there is none.
#[test]
fn adaptive_limit_turns_the_limit_on() {
    use std::io::{Read, Write};
    for (command, on) in
        [("serve-echo", true), ("serve-echo", false), ("controller", true), ("controller", false)]
    {
        let mut args = vec![command, "--listen", "tcp://127.0.0.1:0", "--admin", "127.0.0.1:0"];
        if on {
            args.push("--adaptive-limit");
        }
        let mut server = Child(volley().args(&args).stderr(std::process::Stdio::piped()).spawn().unwrap());
        let (admin, _) = stderr_until(&mut server.0, "admin endpoint on http://");
        let admin = admin.split('/').next().unwrap().to_string();
        let mut s = std::net::TcpStream::connect(&admin).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let limit = text.lines().find_map(|l| l.strip_prefix("volley_server_concurrency_limit "));
        match on {
            true => assert_eq!(limit, Some("256"), "{command}: the default initial limit: {text}"),
            false => assert_eq!(limit, None, "{command}: no limit without the flag"),
        }
    }
}
