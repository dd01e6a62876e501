//! `volley call` as a real process against a protobuf service (crates/volley-proto-example,
//! types generated from a `.proto` file): the request built from JSON through the descriptor
//! set the server's reflection hands out, the reply printed in protobuf's JSON mapping; one
//! call, a batch of 1,000 lines, errors.

use serde_json::{Value, json};

#[path = "support/volley_run.rs"]
mod volley_run;
use volley_run::run;

fn json_lines(out: &str) -> Vec<Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))).collect()
}

#[test]
fn a_protobuf_method_called_with_json() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = volley_proto_example::server();
    let addr = rt.block_on(server.listen("tcp://127.0.0.1:0")).unwrap().to_string();
    let call = |json: &str| run(&["call", "--connect", &addr, "shop.v1", "buy", json], "");

    // Reflection names the tier and the message.
    let (ok, out, err) = run(&["describe", &addr], "");
    assert!(ok, "{err}");
    assert!(
        out.contains("buy") && out.contains("Order (general protobuf) -> Receipt (general protobuf)"),
        "{out}"
    );

    // One call. The reply is protobuf's JSON: lowerCamelCase names, a uint64 as a string, a
    // field at its default ("" for the note) left out.
    let (ok, out, err) = call(r#"{"id":7,"sku":"tea","qty":2}"#);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!({"id": 7, "totalCents": "700"}));
    // The .proto's own field names are read as well; the added field (coupon) reaches the handler.
    let (ok, out, err) = call(r#"{"id":8,"sku":"cake","qty":2,"coupon":"HALF"}"#);
    assert!(ok, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"id": 8, "totalCents": "420", "note": "coupon HALF applied"})
    );

    // A batch of 1,000 lines: one result per line, in order.
    let lines: String =
        (1..=1000).map(|i| format!("{{\"id\":{i},\"sku\":\"tea\",\"qty\":{}}}\n", i % 5 + 1)).collect();
    let (ok, out, err) = run(&["call", "--connect", &addr, "shop.v1", "buy", "--batch"], &lines);
    assert!(ok, "{err}");
    let got = json_lines(&out);
    assert_eq!(got.len(), 1000);
    for (i, r) in (1..=1000u64).zip(&got) {
        assert_eq!(r, &json!({"id": i, "totalCents": (350 * (i % 5 + 1)).to_string()}), "line {i}");
    }

    // A batch with a refused item: every line in order, the failure in its place, status 1.
    let (ok, out, _) = run(
        &["call", "--connect", &addr, "shop.v1", "buy", "--batch"],
        "{\"id\":1,\"sku\":\"tea\",\"qty\":1}\n{\"id\":2,\"sku\":\"gin\",\"qty\":1}\n{\"id\":3,\"sku\":\"tea\",\"qty\":1}\n",
    );
    assert!(!ok);
    let got = json_lines(&out);
    assert_eq!(got.len(), 3, "{out}");
    assert_eq!((got[0]["id"].clone(), got[2]["id"].clone()), (json!(1), json!(3)));
    assert_eq!(got[1]["error"]["code"], "BadRequest", "{out}");
    assert!(got[1]["error"]["message"].as_str().unwrap().contains("unknown sku \"gin\""), "{out}");

    // The handler's error: status 1, its code and message.
    let (ok, out, err) = call(r#"{"id":1,"sku":"tea","qty":0}"#);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("BadRequest") && err.contains("qty must be at least 1"), "{err}");

    // JSON that is not an Order is refused before anything is sent, naming the message.
    for bad in [r#"{"sku":5}"#, r#"{"sku":"tea","size":"L"}"#, r#"{"qty":-1}"#, "[1,2]"] {
        let (ok, out, err) = call(bad);
        assert!(!ok && out.is_empty(), "{bad}: {out}");
        assert!(err.contains("not a shop.v1.Order"), "{bad}: {err}");
    }
    let (ok, _, err) = call("{not json");
    assert!(!ok && err.contains("not JSON"), "{err}");
    // In a batch, a bad line stops the whole batch before any call, and names the line.
    let (ok, out, err) = run(
        &["call", "--connect", &addr, "shop.v1", "buy", "--batch"],
        "{\"id\":1,\"sku\":\"tea\",\"qty\":1}\n{\"id\":2,\"sku\":\"tea\",\"qty\":1}\n{\"id\":\"three\"}\n",
    );
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("line 3") && err.contains("not a shop.v1.Order"), "{err}");
    // A method or service the server does not have.
    let (ok, _, err) = run(&["call", "--connect", &addr, "shop.v1", "sell", "{}"], "");
    assert!(!ok && err.contains("no method \"sell\""), "{err}");
    let (ok, _, err) = run(&["call", "--connect", &addr, "shop.v2", "buy", "{}"], "");
    assert!(!ok && err.contains("no service \"shop.v2\""), "{err}");

    rt.block_on(server.shutdown());
}
