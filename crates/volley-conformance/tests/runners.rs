//! The runners of `volley conformance` against the Rust server and client, on tcp and unix,
//! and against peers that break the protocol, which they must catch.

use std::time::Duration;

use bytes::Bytes;
use volley::{Client, Method, Server};
use volley_conformance::client_side::{CONTROL, ClientSide};
use volley_conformance::{Report, client_streams, driver, server_side, server_streams, wire};

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
// Generous: a shared 2-core machine can stall a task for seconds.
const PER_CASE: Duration = Duration::from_secs(60);

fn failures(report: &Report) -> Vec<&str> {
    report.cases.iter().filter(|(_, r)| r.is_err()).map(|(n, _)| n.as_str()).collect()
}

#[tokio::test]
async fn the_rust_server_passes_the_server_cases_on_tcp_and_unix() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_streams::serve_repeat(Server::builder().handle_fn(&ECHO, Ok)).build();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let unix = server.listen(&format!("unix://{}/s.sock", dir.path().display())).await.unwrap().to_string();
    for addr in [tcp, unix] {
        let report = server_side::play(&addr, PER_CASE).await;
        assert!(report.passed() && report.not_played.len() == 1, "{addr}:\n{}", report.render());
        let cases = wire()["echo_server"].as_array().unwrap().len() + server_streams::CASES.len();
        assert_eq!(report.cases.len(), cases);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_without_the_echo_service_fails_the_cases_that_call_it() {
    let server = Server::builder().build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let report = server_side::play(&addr, PER_CASE).await;
    let failed = failures(&report);
    assert!(failed.contains(&"an echo call") && failed.contains(&"a batch call"), "{}", report.render());
    assert!(!failed.contains(&"an unknown service"), "{}", report.render());
    server.shutdown().await;
}

#[tokio::test]
async fn the_rust_client_passes_the_client_cases_on_tcp_and_unix() {
    let dir = tempfile::tempdir().unwrap();
    for addr in ["tcp://127.0.0.1:0".to_string(), format!("unix://{}/c.sock", dir.path().display())] {
        let runner = ClientSide::bind(&addr).await.unwrap();
        let addr = runner.address();
        let serve = tokio::spawn(runner.serve(PER_CASE * 4));
        let refused = driver::drive(&addr, PER_CASE).await.unwrap();
        let report = serve.await.unwrap();
        assert!(refused.is_empty(), "{refused:?}");
        assert!(report.passed(), "{addr}:\n{}", report.render());
        let cases = wire()["client"].as_array().unwrap().len() + client_streams::cases().len();
        assert_eq!(report.cases.len(), cases);
    }
}

const NEXT: Method<Bytes, Bytes> = Method::new(CONTROL, "next");
const REPORT: Method<Bytes, Bytes> = Method::new(CONTROL, "report");

#[tokio::test]
async fn a_driver_that_reports_wrong_outcomes_or_skips_calls_fails_those_cases() {
    let runner = ClientSide::bind("tcp://127.0.0.1:0").await.unwrap();
    let addr = runner.address();
    let serve = tokio::spawn(runner.serve(PER_CASE * 4));
    let control = Client::connect(&addr).await.unwrap();
    // The first case is called but misreported, the second not called at all, the third
    // neither called nor reported; the rest are left to the timeout... which here is the
    // driver asking past them, so they count as never reported.
    control.call(&NEXT, Bytes::new()).await.unwrap();
    Client::connect(&addr).await.unwrap().call(&ECHO, Bytes::from_static(b"hi")).await.unwrap();
    let wrong = control.call(&REPORT, Bytes::from_static(br#"{"ok": "00"}"#)).await;
    assert_eq!(wrong.unwrap_err().code(), Some(volley::Code::Application));
    control.call(&NEXT, Bytes::new()).await.unwrap();
    let uncalled = control.call(&REPORT, Bytes::from_static(br#"{"ok": ""}"#)).await;
    assert!(uncalled.is_err());
    while !control.call(&NEXT, Bytes::new()).await.unwrap().is_empty() {}
    let report = serve.await.unwrap();
    assert!(report.cases.iter().all(|(_, r)| r.is_err()), "{}", report.render());
    let reasons: Vec<String> = report.cases.iter().map(|(_, r)| r.clone().unwrap_err()).collect();
    assert!(reasons[0].starts_with("expected the outcome"), "{}", reasons[0]);
    assert!(reasons[1].contains("without making the call"), "{}", reasons[1]);
    assert!(reasons[2].contains("without reporting"), "{}", reasons[2]);
}

#[tokio::test]
async fn the_rust_client_and_server_pass_the_interop_checks_on_tcp_and_unix() {
    let dir = tempfile::tempdir().unwrap();
    let server = volley_conformance::interop::reference_server(Some("s3cret"));
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let unix = server.listen(&format!("unix://{}/i.sock", dir.path().display())).await.unwrap().to_string();
    for addr in [tcp, unix] {
        let report = volley_conformance::interop::check(&addr, Some("s3cret")).await;
        assert!(report.passed(), "{addr}:\n{}", report.render());
        assert_eq!(report.cases.len(), 5, "{}", report.render());
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_that_fails_no_items_or_takes_any_token_fails_the_interop_checks() {
    let server =
        Server::builder().handle_fn(&ECHO, Ok).handle_fn(&volley_conformance::interop::FAIL_ODD, Ok).build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let report = volley_conformance::interop::check(&addr, Some("s3cret")).await;
    let failed = failures(&report);
    assert_eq!(failed, ["a batch of 10,000 with failures in place", "a bad token and none are refused"]);
    server.shutdown().await;
}
