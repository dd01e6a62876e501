//! `volley stats ADDR` and `volley top ADDR`: a process's admin endpoint (`/vars.json`) read
//! from a terminal, once or refreshed every second.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::output::{out, outln};

/// Largest answer read (a process with a thousand methods stays well under it).
const MAX_BODY: u64 = 16 << 20;

/// `volley stats ADDR [--json]`: the methods once, as a table or as the endpoint's JSON.
pub fn stats(addr: &str, json: bool) -> Result<(), String> {
    let v = runtime()?.block_on(fetch(addr))?;
    if json {
        outln!("{v}");
    } else {
        out!("{}", render(&v));
    }
    Ok(())
}

/// `volley top ADDR`: the table, redrawn every `interval` until Ctrl-C (or `count` times).
pub fn top(addr: &str, interval: Duration, count: Option<u64>) -> Result<(), String> {
    let terminal = crate::terminal::stdout_is_terminal();
    runtime()?.block_on(async {
        let mut shown = 0;
        loop {
            let screen = match fetch(addr).await {
                Ok(v) => render(&v),
                Err(e) => format!("{e}\n"),
            };
            // On a terminal: clear the screen and move to its top, then draw. Elsewhere (a file,
            // a pipe) no escape codes: each reading follows the one before, a blank line apart.
            let start = match (terminal, shown) {
                (true, _) => "\x1b[2J\x1b[H",
                (false, 0) => "",
                (false, _) => "\n",
            };
            out!("{start}{addr}, every {:.0?}\n{screen}", interval);
            shown += 1;
            if count.is_some_and(|c| shown >= c) {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(()),
                _ = tokio::time::sleep(interval) => {}
            }
        }
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

/// `GET /vars.json` from `addr` (`HOST:PORT`, `http://HOST:PORT` or a bare port on 127.0.0.1).
pub(crate) async fn fetch(addr: &str) -> Result<Value, String> {
    if let Some((scheme, _)) = addr.split_once("://").filter(|(s, _)| *s != "http") {
        return Err(format!(
            "{addr} is a {scheme}:// address, which serves RPC: stats and top read a process's admin \
             endpoint, the HTTP address given to its --admin (HOST:PORT, http://HOST:PORT or PORT)"
        ));
    }
    let host = addr.trim_start_matches("http://").trim_end_matches('/');
    let host = if host.parse::<u16>().is_ok() { format!("127.0.0.1:{host}") } else { host.to_string() };
    let get = async {
        let mut s = tokio::net::TcpStream::connect(&host).await?;
        s.write_all(
            format!("GET /vars.json HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut body = Vec::new();
        s.take(MAX_BODY).read_to_end(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .map_err(|_| format!("{host}: no answer within 5 s"))?
        .map_err(|e| format!("{host}: {e}"))?;
    if let Some(why) = not_http(&raw) {
        return Err(format!("{host}: {why}"));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{host}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("{host}: {status} (is this a Volley admin endpoint?)"));
    }
    serde_json::from_str(body).map_err(|e| format!("{host}: the answer is not the JSON expected: {e}"))
}

/// What is wrong with an answer that is not HTTP at all, naming the likely mistake: a Volley
/// server's RPC port opens with its preamble, the magic `VLLY` (docs/PROTOCOL.md, section 4).
fn not_http(raw: &[u8]) -> Option<String> {
    const HINT: &str = "stats and top read a process's admin endpoint, the HTTP address given to its --admin \
                        (the line `admin endpoint on http://...` it prints), not its RPC address";
    if raw.starts_with(b"HTTP/") {
        None
    } else if raw.starts_with(b"VLLY") {
        Some(format!("this is a Volley RPC port (it answered with the Volley protocol's preamble): {HINT}"))
    } else if raw.is_empty() {
        Some(format!("the connection closed without an answer: {HINT}"))
    } else {
        Some(format!("not an HTTP answer: {HINT}"))
    }
}

/// The methods (served, then called) with their recent rates, as a table.
fn render(v: &Value) -> String {
    let mut s = String::new();
    let sv = &v["server"];
    let c = &sv["connections"];
    s += &format!(
        "up {:.0} s · connections {} open, {} accepted, {} refused · messages per frame {} in, {} out · overload refusals {}\n",
        v["uptime_s"].as_f64().unwrap_or(0.0),
        c["open"],
        c["accepted"],
        c["refused"],
        fmt(&sv["messages_per_frame"]["read"], 1.0),
        fmt(&sv["messages_per_frame"]["written"], 1.0),
        sv["overload_refusals"],
    );
    let expired = &sv["deadline_expired"];
    s += &format!(
        "deadline expired {} before / {} in handler · cancelled while running {} · queued {} · reader wake-ups per batch {}\n",
        expired["before_handler"],
        expired["in_handler"],
        sv["cancelled_requests"],
        sv["queued_requests"],
        fmt2(&sv["reader_wakeups"]["per_batch"]),
    );
    for (title, methods) in [("served", &sv["methods"]), ("called", &v["client"]["methods"])] {
        let Some(list) = methods.as_array().filter(|l| !l.is_empty()) else { continue };
        s += &format!(
            "\n{:<34} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>12}\n",
            format!("{title} (last seconds)"),
            "calls/s",
            "errors/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "batch avg",
            "in fl.",
            "calls"
        );
        for m in list {
            let r = &m["recent"];
            s += &format!(
                "{:<34} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>12}\n",
                format!("{}/{}", m["service"].as_str().unwrap_or("?"), m["method"].as_str().unwrap_or("?")),
                fmt(&r["calls_per_s"], 1.0),
                fmt(&r["errors_per_s"], 1.0),
                fmt(&r["latency_us"]["p50"], 1.0),
                fmt(&r["latency_us"]["p99"], 1.0),
                fmt(&r["latency_us"]["p999"], 1.0),
                fmt(&r["batch"]["mean"], 1.0),
                m["in_flight"].to_string(),
                m["calls"].to_string(),
            );
        }
    }
    if let Some(services) = v["registry"]["services"].as_array() {
        let instances: usize = services.iter().map(|s| s["instances"].as_array().map_or(0, Vec::len)).sum();
        s += &format!("\nregistry: {} services, {instances} instances\n", services.len());
    }
    s
}

/// A number with two decimals, or `-` when there is none.
fn fmt2(v: &Value) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.2}"))
}

/// A number with one decimal, or `-` when there is none (nothing recorded yet).
fn fmt(v: &Value, scale: f64) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{:.1}", x * scale))
}

#[cfg(test)]
mod tests {
    /// An RPC port, a closed connection or another protocol gets an error naming the admin
    /// endpoint; an HTTP answer passes.
    #[test]
    fn an_answer_that_is_not_http_names_the_likely_mistake() {
        let rpc = not_http(b"VLLY\x01\x01\x00\x00").unwrap();
        assert!(rpc.contains("Volley RPC port") && rpc.contains("--admin"), "{rpc}");
        let closed = not_http(b"").unwrap();
        assert!(closed.contains("closed without an answer") && closed.contains("--admin"), "{closed}");
        let other = not_http(b"SSH-2.0-OpenSSH\r\n").unwrap();
        assert!(other.contains("not an HTTP answer") && other.contains("--admin"), "{other}");
        assert_eq!(not_http(b"HTTP/1.1 200 OK\r\n\r\n{}"), None);
    }

    use super::*;

    #[test]
    fn the_table_shows_each_method_with_its_recent_rate() {
        let v = serde_json::json!({
            "uptime_s": 12.0,
            "server": {
                "connections": {"open": 1, "accepted": 3, "refused": 0},
                "messages_per_frame": {"read": 2.5, "written": null},
                "overload_refusals": 0,
                "deadline_expired": {"before_handler": 4, "in_handler": 1},
                "cancelled_requests": 2,
                "queued_requests": 3,
                "reader_wakeups": {"batches": 8, "wakeups": 6, "per_batch": 0.75},
                "methods": [{"service": "echo", "method": "echo", "calls": 900, "in_flight": 2,
                    "recent": {"calls_per_s": 150.0, "errors_per_s": 0.0,
                        "latency_us": {"p50": 12.5, "p99": 80.0, "p999": 120.0}, "batch": {"mean": 3.0}}}]
            },
            "client": {"methods": []},
            "registry": null
        });
        let t = render(&v);
        assert!(t.contains("served (last seconds)"), "{t}");
        let line = t.lines().find(|l| l.starts_with("echo/echo")).unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols, ["echo/echo", "150.0", "0.0", "12.5", "80.0", "120.0", "3.0", "2", "900"]);
        assert!(!t.contains("called"), "no client methods, no table");
        assert!(t.contains("messages per frame 2.5 in, - out"));
        assert!(
            t.contains("deadline expired 4 before / 1 in handler · cancelled while running 2 · queued 3 · reader wake-ups per batch 0.75"),
            "{t}"
        );
    }
}
