//! The `volley` binary, end to end.

use std::process::Command;

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
    let mut ok = false;
    for _ in 0..50 {
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
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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
    for _ in 0..50 {
        let out = volley().args(args).output().unwrap();
        if out.status.success() {
            return out.stdout;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("volley {args:?} kept failing: {last}");
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
    let mut listed = serde_json::Value::Null;
    for _ in 0..50 {
        let v: serde_json::Value =
            serde_json::from_slice(&retry_until_ok(&["ls", "--registry", &registry, "--json"])).unwrap();
        let found = v["services"].as_array().unwrap().iter().any(|s| s["name"] == name.as_str());
        if found {
            listed = v;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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
        (&["--mode", "batch"][..], "not implemented yet"),
        (&["--mode", "single", "--mode", "both"][..], "two call styles"),
        (&["--mode", "direct,relayed"][..], "two registry modes"),
        (&["--mode", "relayed", "--connect", "tcp://127.0.0.1:1"][..], "do not go with --connect"),
        (&["--mode", "sideways"][..], "invalid value"),
    ] {
        let out = volley().arg("bench").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}
