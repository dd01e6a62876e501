//! `volley call` and `volley describe` as real processes against a Rust server: the README's
//! example service and a JSON service, by address and by name through a registry; one call,
//! a batch of 1,000 lines, an error.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use volley::{Server, Status};

#[path = "support/volley_run.rs"]
mod volley_run;
use volley_run::{run, volley};

/// The README's example service.
#[volley::service]
trait Echo {
    async fn say(&self, s: String) -> Result<String, Status>;
}

struct Loud;
impl Echo for Loud {
    async fn say(&self, s: String) -> Result<String, Status> {
        Ok(s.to_uppercase())
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    item: String,
    count: u32,
}
#[derive(Serialize, Deserialize)]
struct Receipt {
    item: String,
    total: u64,
}
volley::wire!(json: Order);
volley::wire!(msgpack: Receipt);

#[derive(Serialize, Deserialize)]
struct Opaque {
    x: u64,
}
volley::wire!(Opaque);

#[volley::service(name = "shop")]
trait Shop {
    /// A receipt, or an application error for an order of nothing.
    async fn buy(&self, o: Order) -> Result<Receipt, Status>;
    #[batch]
    async fn square(&self, xs: Vec<u64>) -> Vec<Result<u64, Status>>;
    #[sync]
    fn fast(&self, o: Opaque) -> Result<Opaque, Status>;
}

struct Till;
impl Shop for Till {
    async fn buy(&self, o: Order) -> Result<Receipt, Status> {
        if o.count == 0 {
            return Err(Status::app(format!("nothing to buy of {}", o.item)));
        }
        Ok(Receipt { total: u64::from(o.count) * 3, item: o.item })
    }
    async fn square(&self, xs: Vec<u64>) -> Vec<Result<u64, Status>> {
        xs.into_iter().map(|x| Ok(x * x)).collect()
    }
    fn fast(&self, o: Opaque) -> Result<Opaque, Status> {
        Ok(o)
    }
}

/// A runtime serving the README's service and the shop on tcp; returns it, the server and
/// its address.
fn serve() -> (tokio::runtime::Runtime, Server, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = Server::builder().serve(EchoServer::new(Loud)).serve(ShopServer::new(Till)).build();
    let addr = rt.block_on(server.listen("tcp://127.0.0.1:0")).unwrap().to_string();
    (rt, server, addr)
}

#[test]
fn a_call_a_batch_of_1000_and_an_error_by_address() {
    let (rt, server, addr) = serve();
    let (ok, out, err) = run(&["call", "--connect", &addr, "echo", "say", r#""hello, volley""#], "");
    assert!(ok, "{err}");
    assert_eq!(out, "\"HELLO, VOLLEY\"\n");

    let (ok, out, err) = run(&["call", "--connect", &addr, "shop", "buy", r#"{"item":"tea","count":2}"#], "");
    assert!(ok, "{err}");
    let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reply, serde_json::json!({"item": "tea", "total": 6}));

    let lines: String = (0..1000).map(|i| format!("{i}\n")).collect();
    let (ok, out, err) = run(&["call", "--connect", &addr, "shop", "square", "--batch"], &lines);
    assert!(ok, "{err}");
    let got: Vec<u64> = out.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got, (0..1000u64).map(|i| i * i).collect::<Vec<_>>());

    let (ok, out, err) = run(&["call", "--connect", &addr, "shop", "buy", r#"{"item":"air","count":0}"#], "");
    assert!(!ok, "an application error fails the command: {out}");
    assert!(err.contains("Application (4): nothing to buy of air"), "{err}");

    // A batch with one failing item: every line in order, the failure in its place, status 1.
    let (ok, out, _) = run(
        &["call", "--connect", &addr, "shop", "buy", "--batch"],
        "{\"item\":\"a\",\"count\":1}\n{\"item\":\"b\",\"count\":0}\n{\"item\":\"c\",\"count\":2}\n",
    );
    assert!(!ok);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0]["total"], 3);
    assert_eq!(lines[1]["error"]["number"], 4);
    assert_eq!(lines[2]["total"], 6);

    // What JSON cannot describe is refused before anything is sent, with the reason.
    let (ok, _, err) = run(&["call", "--connect", &addr, "shop", "fast", r#"{"x":1}"#], "");
    assert!(!ok && err.contains("no field names"), "{err}");
    let (ok, _, err) = run(&["call", "--connect", &addr, "shop", "buy", "{not json"], "");
    assert!(!ok && err.contains("not JSON"), "{err}");
    let (ok, _, err) = run(&["call", "--connect", &addr, "shop", "sell", "1"], "");
    assert!(!ok && err.contains("no method \"sell\""), "{err}");

    let (ok, out, err) = run(&["describe", &addr], "");
    assert!(ok, "{err}");
    assert!(
        out.contains("buy") && out.contains("Order (general json) -> Receipt (general msgpack)"),
        "{out}"
    );
    assert!(out.contains("square") && out.contains("batch"), "{out}");
    let (ok, out, _) = run(&["describe", &addr, "--json"], "");
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> =
        v["services"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "shop", "volley.health", "volley.reflect"]);
    rt.block_on(server.shutdown());
}

#[test]
fn by_name_through_a_registry_with_a_key() {
    let mut controller = volley()
        .args(["controller", "--listen", "tcp://127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(controller.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let registry_addr = line.trim().to_string();
    let (rt, server, _) = serve();
    let registry = rt.block_on(volley::Registry::connect(&registry_addr)).unwrap();
    let second = rt.block_on(server.listen_and_register("tcp://127.0.0.1:0", &registry)).unwrap();
    drop(second);

    let r = &registry_addr;
    let (ok, out, err) = run(&["call", "--registry", r, "echo", "say", r#""by name""#], "");
    assert!(ok, "{err}");
    assert_eq!(out, "\"BY NAME\"\n");
    let (ok, out, err) = run(&["call", "--registry", r, "--key", "user-7", "shop", "square", "12"], "");
    assert!(ok, "{err}");
    assert_eq!(out, "144\n");
    let lines: String = (0..1000).map(|i| format!("{i}\n")).collect();
    let (ok, out, err) = run(&["call", "--registry", r, "shop", "square", "--batch"], &lines);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1000);
    assert_eq!(out.lines().nth(999), Some("998001"));

    let (ok, out, err) = run(&["describe", "--registry", r, "shop"], "");
    assert!(ok, "{err}");
    assert!(out.contains("shop") && !out.contains("echo"), "{out}");
    let (ok, out, err) = run(&["ls", "--registry", r, "--methods"], "");
    assert!(ok, "{err}");
    assert!(out.contains("methods:") && out.contains("say") && out.contains("square"), "{out}");
    let (ok, out, _) = run(&["ls", "--registry", r, "--methods", "--json"], "");
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shop = v["services"].as_array().unwrap().iter().find(|s| s["name"] == "shop").unwrap();
    assert_eq!(shop["methods"].as_array().unwrap().len(), 3, "{shop}");

    rt.block_on(server.shutdown());
    let _ = controller.kill();
    let _ = controller.wait();
}
