//! The `volley` binary against a registry: a refusal that retrying cannot fix ends a command at
//! once with one line naming the flag that fixes it; a controller that takes registrations from
//! anyone says so; output into a closed pipe ends quietly.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../volley/tests/support/wait.rs"]
mod wait;
use wait::{poll_blocking, wait_until_blocking};

fn volley() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_volley"));
    // Settings from the environment would change what is tested.
    for var in ["VOLLEY_TOKEN", "VOLLEY_REGISTRY_TOKEN", "VOLLEY_REGISTRATION_CREDENTIAL"] {
        c.env_remove(var);
    }
    c
}

/// Kills the child when dropped, so a failed assertion leaves no process behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A controller on a free port with `flags`; returns it, its address and the first line it
/// wrote to stderr (a warning, if it has one to give).
fn controller(flags: &[&str]) -> (Child, String, String) {
    let mut child = Child(
        volley()
            .args(["controller", "--listen", "tcp://127.0.0.1:0"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    stderr.read_line(&mut first).unwrap();
    let mut line = String::new();
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    // Keep reading, so the controller's later logs never meet a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let addr = line.trim().to_string();
    assert!(addr.starts_with("tcp://127.0.0.1:"), "{addr:?}");
    (child, addr, first)
}

/// Runs `volley args` to its end (killed after 30 s); returns whether it succeeded, its stderr
/// and how long it ran.
fn run(args: &[&str]) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let mut child = Child(volley().args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    let mut stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = poll_blocking(Duration::from_secs(30), &format!("volley {args:?} to exit"), || {
        child.0.try_wait().unwrap()
    });
    (status.success(), reader.join().unwrap(), t0.elapsed())
}

/// A command refused for good: it failed, soon, with one `volley:` line that names `flag`.
fn assert_refused(args: &[&str], flag: &str, cause: &str) {
    let (ok, stderr, took) = run(args);
    assert!(!ok, "volley {args:?} succeeded: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("volley: ")).collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(errors[0].contains(flag) && errors[0].contains(cause), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The goal is 2 s (release build, idle machine); a debug build on a loaded one gets room.
    assert!(took < Duration::from_secs(10), "volley {args:?} took {took:?}");
    eprintln!("volley {} refused after {took:?}: {}", args[0], errors[0]);
}

#[test]
fn serve_echo_with_a_wrong_registration_credential_exits_at_once_naming_the_flag() {
    let (_c, registry, _) = controller(&["--registration-credential", "right"]);
    for credential in [None, Some("wrong")] {
        let mut args = vec!["serve-echo", "--listen", "tcp://127.0.0.1:0", "--registry", &registry];
        if let Some(c) = credential {
            args.extend(["--registration-credential", c]);
        }
        let cause =
            if credential.is_some() { "wrong registration credential" } else { "no registration credential" };
        assert_refused(&args, "--registration-credential", cause);
    }
}

#[test]
fn a_wrong_token_ends_serve_echo_ls_and_bench_at_once_naming_the_flag() {
    let (_c, registry, _) = controller(&["--token", "right", "--registration-credential", "cred"]);
    let serve = ["serve-echo", "--listen", "tcp://127.0.0.1:0", "--registry", &registry];
    assert_refused(&[&serve[..], &["--registry-token", "wrong"]].concat(), "--registry-token", "token");
    assert_refused(&serve, "--registry-token", "requires a token");
    assert_refused(&["ls", "--registry", &registry, "--token", "wrong"], "--token", "not accepted");
    assert_refused(&["ls", "--registry", &registry], "--token", "requires a token");
    let (ok, stderr, _) = run(&["ls", "--registry", &registry, "--token", "right"]);
    assert!(ok, "{stderr}");
    let bench = ["bench", "--registry", &registry, "--duration", "0.2", "--warmup", "0", "--token", "wrong"];
    assert_refused(&bench, "--token", "not accepted");

    // A server that requires a token, benchmarked by address.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("tcp://127.0.0.1:{port}");
    let _echo = Child(
        volley()
            .args(["serve-echo", "--listen", &addr, "--token", "right"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let bench = ["bench", "--connect", &addr, "--duration", "0.2", "--warmup", "0", "--token", "wrong"];
    // The server may still be starting: a refused connection is not what is tested.
    wait_until_blocking(Duration::from_secs(20), "bench to be refused for its token", || {
        let (ok, stderr, _) = run(&bench);
        assert!(!ok, "{stderr}");
        stderr.contains("--token")
    });
    assert_refused(&bench, "--token", "not accepted");
}

#[test]
fn the_controller_and_ls_warn_when_anyone_may_register() {
    let (_open, open_addr, warning) = controller(&[]);
    assert!(warning.starts_with("warning: no registration credential"), "{warning}");
    let out = volley().args(["ls", "--registry", &open_addr]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && text.contains("warning: no registration credential"), "{text}");
    let out = volley().args(["ls", "--registry", &open_addr, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["registration_open"], true, "{v}");

    let (_guarded, guarded_addr, first) = controller(&["--registration-credential", "cred"]);
    assert!(!first.contains("warning"), "{first}");
    let out = volley().args(["ls", "--registry", &guarded_addr]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && !text.contains("warning"), "{text}");
    let out = volley().args(["ls", "--registry", &guarded_addr, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["registration_open"], false, "{v}");
}

/// `volley ls | head -n 1` with the reader gone before the first line: the write fails with a
/// broken pipe, and `volley` ends with status 0 and no panic.
#[test]
fn ls_into_a_closed_pipe_exits_0_without_a_panic() {
    let (_c, registry, _) = controller(&[]);
    for json in [false, true] {
        let mut args = vec!["ls", "--registry", &registry];
        if json {
            args.push("--json");
        }
        let mut child = volley().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
        assert!(out.status.success(), "{:?}: {stderr}", out.status);
    }
    // And through a shell pipeline, as an operator types it.
    let cmd =
        format!("set -o pipefail; {} ls --registry {registry} | head -n 1", env!("CARGO_BIN_EXE_volley"));
    let out = Command::new("bash").args(["-c", &cmd]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("registry "));
}

/// `serve-echo --listen-local` registers a shm address beside its tcp one; `ls` shows both;
/// `bench --prefer-local` (a client on this host) calls over shm, `bench` without it over tcp.
#[test]
#[cfg(target_os = "linux")]
fn serve_echo_advertises_a_shm_address_and_bench_prefer_local_takes_it() {
    let (_c, registry, _) = controller(&[]);
    let (name, local) =
        (format!("echo-local-{}", std::process::id()), format!("shm://cli-{}", std::process::id()));
    let serve = ["serve-echo", "--listen", "tcp://127.0.0.1:0", "--listen-local", &local, "--name", &name];
    let _echo =
        Child(volley().args(serve).args(["--registry", &registry]).stderr(Stdio::null()).spawn().unwrap());
    let instance = poll_blocking(Duration::from_secs(30), "serve-echo to register", || {
        let out = volley().args(["ls", "--registry", &registry, "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let listed = v["services"].as_array().unwrap().iter().find(|s| s["name"] == name.as_str()).cloned();
        listed.map(|s| s["instances"][0].clone())
    });
    assert!(instance["address"].as_str().unwrap().starts_with("tcp://127.0.0.1:"), "{instance}");
    assert_eq!(instance["local_addresses"], serde_json::json!([local]), "{instance}");
    assert!(instance["host_id"].as_str().is_some_and(|h| h.contains("/net:[")), "{instance}");
    let text =
        String::from_utf8(volley().args(["ls", "--registry", &registry]).output().unwrap().stdout).unwrap();
    assert!(
        text.contains(&format!("for clients on host {}: {local}", instance["host_id"].as_str().unwrap())),
        "{text}"
    );

    for (prefer, transport) in [(true, "shm"), (false, "tcp")] {
        let mut bench = vec!["bench", "--registry", &registry, "--service", &name, "--json"];
        bench.extend(["--duration", "0.2", "--warmup", "0.05", "--concurrency", "4"]);
        if prefer {
            bench.push("--prefer-local");
        }
        let out = volley().args(&bench).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["transport"], transport, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        assert!(v["calls"].as_u64().unwrap() > 0, "{v}");
    }
    // In one process: the server adds a shm address beside its tcp one, and the calls take it.
    let bench = ["bench", "--mode", "direct", "--transport", "tcp", "--prefer-local", "--json"];
    let out = volley().args(bench).args(["--duration", "0.2", "--warmup", "0.05"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["transport"], &v["registry_mode"], &v["errors"]),
        (&"shm".into(), &"direct".into(), &0.into())
    );
    assert_refused(&["bench", "--prefer-local", "--duration", "0.1"], "--prefer-local", "--mode direct");
}

/// The instances of `name` that `ls` lists now.
fn listed(registry: &str, name: &str) -> usize {
    let out = volley().args(["ls", "--registry", registry, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let service = v["services"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned();
    service.map_or(0, |s| s["instances"].as_array().map_or(0, Vec::len))
}

/// Sends `signal` (`TERM`, `INT`) to `child`.
fn signal(child: &std::process::Child, signal: &str) {
    let ok = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
}

/// `serve-echo` stops gracefully on SIGTERM and on SIGINT: it leaves the registry at once (not
/// when its lease lapses), serves through its grace, and exits 0.
#[test]
fn serve_echo_leaves_the_registry_and_exits_0_on_sigterm_and_sigint() {
    let (_c, registry, _) = controller(&[]);
    for sig in ["TERM", "INT"] {
        let name = format!("echo-stop-{sig}-{}", std::process::id());
        let serve = ["serve-echo", "--listen", "tcp://127.0.0.1:0", "--name", &name, "--grace", "0.5"];
        let mut echo = Child(
            volley().args(serve).args(["--registry", &registry]).stderr(Stdio::piped()).spawn().unwrap(),
        );
        wait_until_blocking(Duration::from_secs(30), "serve-echo to register", || {
            listed(&registry, &name) > 0
        });
        signal(&echo.0, sig);
        // The lease is 10 s: gone well before it means it deregistered itself.
        let gone =
            wait_until_blocking(Duration::from_secs(5), &format!("SIG{sig}: the instance to leave"), || {
                listed(&registry, &name) == 0
            });
        let status =
            poll_blocking(Duration::from_secs(30) - gone, &format!("SIG{sig}: serve-echo to exit"), || {
                echo.0.try_wait().unwrap()
            });
        let mut stderr = String::new();
        echo.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        assert!(status.success(), "SIG{sig}: {status:?}\n{stderr}");
        assert!(stderr.contains("stopping gracefully") && stderr.contains("stopped"), "{stderr}");
    }
}

/// `volley health`: every instance a registry lists answers `serving` (exit 0); a watch sees
/// the instance turn `draining` on SIGTERM, and ends (exit 2) when the instance is gone.
#[test]
fn volley_health_asks_through_the_registry_and_a_watch_sees_the_drain() {
    let (_c, registry, _) = controller(&[]);
    let name = format!("echo-health-{}", std::process::id());
    // A long grace: the instance stays draining while the watch is read.
    let serve = ["serve-echo", "--listen", "tcp://127.0.0.1:0", "--name", &name, "--grace", "60"];
    let mut echo =
        Child(volley().args(serve).args(["--registry", &registry]).stderr(Stdio::piped()).spawn().unwrap());
    let mut first = String::new();
    let mut echo_err = BufReader::new(echo.0.stderr.take().unwrap());
    echo_err.read_line(&mut first).unwrap();
    std::thread::spawn(move || std::io::copy(&mut echo_err, &mut std::io::sink()));
    let addr = first.split_whitespace().find(|w| w.starts_with("tcp://")).expect(&first).to_string();
    wait_until_blocking(Duration::from_secs(30), "serve-echo to register", || listed(&registry, &name) > 0);

    let out = volley().args(["health", "--registry", &registry, &name]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&addr) && text.contains("serving"), "{text}");
    let out = volley().args(["health", "--connect", &addr, "no-such-service"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UnknownService"));

    let mut watch = Child(
        volley()
            .args(["health", "--connect", &addr, &name, "--watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    let status = |line: String| serde_json::from_str::<serde_json::Value>(&line).unwrap()["status"].clone();
    assert_eq!(status(lines.next().unwrap().unwrap()), "serving");
    signal(&echo.0, "TERM");
    assert_eq!(status(lines.next().unwrap().unwrap()), "draining");
    let out = volley().args(["health", "--connect", &addr, &name]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "draining is not serving");
    // A second signal stops the instance at once; the watch's connection ends, and so does it.
    signal(&echo.0, "INT");
    let code = poll_blocking(Duration::from_secs(30), "the watch to end with its server", || {
        watch.0.try_wait().unwrap()
    })
    .code();
    assert_eq!(code, Some(2));
}
