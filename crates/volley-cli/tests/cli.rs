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
