//! TLS over tcp (`tls://`), with certificates generated at test time: a CA, a server
//! certificate for `localhost`/127.0.0.1, client certificates from the CA and from a stranger.

use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use volley::transport::tls::{TlsClient, TlsServer};
use volley::{Client, ClientConfig, Error, Method, Server};

const ECHO: Method<String, String> = Method::new("tls-test", "echo");

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> Vec<u8> {
        self.cert.pem().into_bytes()
    }

    /// A leaf certificate for `names`, signed by this CA: (chain PEM, key PEM).
    fn issue(&self, names: &[&str]) -> (Vec<u8>, Vec<u8>) {
        let p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }
}

fn echo_server(tls: TlsServer) -> Server {
    Server::builder().handle_fn(&ECHO, Ok).tls(tls).build()
}

fn client_config(tls: TlsClient) -> ClientConfig {
    ClientConfig::default().tls(tls).connect_timeout(Duration::from_secs(20))
}

/// Server-authenticated TLS: a client trusting the CA is served (also with a token inside the
/// session, and many calls); one trusting another CA fails the handshake with a connection
/// error; a plain tcp client on the TLS port gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_servers_ca() {
    let ca = Ca::new("volley test CA");
    let (chain, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let server = echo_server(TlsServer::from_pem(&chain, &key, None).unwrap());
    let addr = server.listen("tls://127.0.0.1:0").await.unwrap();
    assert!(addr.to_string().starts_with("tls://127.0.0.1:"));

    let tls = TlsClient::from_pem(&ca.pem(), None).unwrap();
    let c = Client::connect_with(&addr.to_string(), client_config(tls.clone())).await.unwrap();
    for i in 0..200 {
        assert_eq!(c.call(&ECHO, format!("secret {i}")).await.unwrap(), format!("secret {i}"));
    }
    // A large payload spans several TLS records.
    let big = "x".repeat(200_000);
    assert_eq!(c.call(&ECHO, big.clone()).await.unwrap(), big);
    // By name, too.
    let port = addr.to_string().rsplit_once(':').unwrap().1.to_string();
    let by_name = Client::connect_with(&format!("tls://localhost:{port}"), client_config(tls)).await.unwrap();
    assert_eq!(by_name.call(&ECHO, "named".into()).await.unwrap(), "named");

    let stranger = Ca::new("another CA");
    let wrong = TlsClient::from_pem(&stranger.pem(), None).unwrap();
    let r = Client::connect_with(&addr.to_string(), client_config(wrong)).await;
    assert!(matches!(&r, Err(Error::Connection(m)) if m.contains("TLS handshake")), "{:?}", r.err());

    // Plain tcp against the TLS port: no Volley answer comes back.
    let plain = ClientConfig::default().timeout(Duration::from_secs(3));
    let r = match Client::connect_with(&format!("tcp://127.0.0.1:{port}"), plain).await {
        Ok(c) => c.call(&ECHO, "plain".into()).await,
        Err(e) => Err(e),
    };
    assert!(r.is_err(), "a plain tcp client was served on a TLS port");
    server.shutdown().await;
}

/// Mutual TLS: a client without a certificate, or with one from another CA, is refused and
/// never served; a client with a certificate from the client CA is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (chain, key) = server_ca.issue(&["localhost", "127.0.0.1"]);
    let server = echo_server(TlsServer::from_pem(&chain, &key, Some(&client_ca.pem())).unwrap());
    let addr = server.listen("tls://127.0.0.1:0").await.unwrap().to_string();
    let quick = |tls| client_config(tls).timeout(Duration::from_secs(10));

    // Without a certificate: refused (in TLS 1.3 the client learns it on its first read).
    let anonymous = TlsClient::from_pem(&server_ca.pem(), None).unwrap();
    let r = match Client::connect_with(&addr, quick(anonymous)).await {
        Ok(c) => c.call(&ECHO, "let me in".into()).await,
        Err(e) => Err(e),
    };
    // Refused: never run if the refusal came before the request was written.
    assert!(matches!(&r, Err(Error::Connection(_) | Error::NotRun(_))), "{r:?}");

    // With a certificate from a CA the server does not trust: refused too.
    let stranger = Ca::new("stranger CA");
    let (sc, sk) = stranger.issue(&["intruder"]);
    let intruder = TlsClient::from_pem(&server_ca.pem(), Some((&sc, &sk))).unwrap();
    let r = match Client::connect_with(&addr, quick(intruder)).await {
        Ok(c) => c.call(&ECHO, "let me in".into()).await,
        Err(e) => Err(e),
    };
    // Refused: never run if the refusal came before the request was written.
    assert!(matches!(&r, Err(Error::Connection(_) | Error::NotRun(_))), "{r:?}");
    assert_eq!(server.counters().messages_received, 0, "a refused client reached the server");

    // With one from the client CA: served.
    let (cc, ck) = client_ca.issue(&["good client"]);
    let member = TlsClient::from_pem(&server_ca.pem(), Some((&cc, &ck))).unwrap();
    let c = Client::connect_with(&addr, quick(member)).await.unwrap();
    assert_eq!(c.call(&ECHO, "hello".into()).await.unwrap(), "hello");
    assert_eq!(server.counters().messages_received, 1);
    server.shutdown().await;
}

/// A `tls://` listener needs a certificate; a `tls://` client needs TLS settings.
#[tokio::test]
async fn tls_without_settings_is_a_usage_error() {
    let server = Server::builder().handle_fn(&ECHO, Ok).build();
    assert!(matches!(server.listen("tls://127.0.0.1:0").await, Err(Error::Usage(_))));
    let r = Client::connect("tls://127.0.0.1:1").await;
    assert!(matches!(r, Err(Error::Usage(_))), "{:?}", r.err());
}
