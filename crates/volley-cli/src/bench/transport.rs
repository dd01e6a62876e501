//! The transports `volley bench` can start its server on, and what each needs: the address to
//! listen on, TLS settings on both ends, whether the hostile client can reach it. A transport
//! is added here and nowhere else.

use std::sync::OnceLock;

use clap::ValueEnum;
use serde::Serialize;
use volley::ServerBuilder;
use volley::transport::tls::{TlsClient, TlsServer};

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Inproc,
    Unix,
    Tcp,
    /// tcp with TLS: a certificate generated for the run (rcgen), verified by the client.
    Tls,
    /// Shared memory (Linux), set up over a unix socket in the temporary directory.
    Shm,
}

impl Transport {
    /// Where the in-process server (or controller) of `role` listens.
    pub fn listen_address(self, role: &str) -> String {
        match self {
            Transport::Inproc => format!("inproc://bench-{role}"),
            Transport::Unix => format!(
                "unix://{}/volley-bench-{role}-{}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            ),
            Transport::Tcp => "tcp://127.0.0.1:0".into(),
            Transport::Tls => "tls://127.0.0.1:0".into(),
            Transport::Shm => format!(
                "shm://{}/volley-bench-{role}-{}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            ),
        }
    }

    /// Whether `--hostile` can reach a server on it: the hostile client writes the wire
    /// protocol by hand on a plain socket.
    pub fn hostile_can_reach(self) -> bool {
        matches!(self, Transport::Unix | Transport::Tcp)
    }

    /// The server's settings for this transport (TLS: the run's certificate).
    pub fn server_settings(self, b: ServerBuilder) -> ServerBuilder {
        match self {
            Transport::Tls => b.tls(tls().0.clone()),
            _ => b,
        }
    }
}

/// A client's settings for `addr`, presenting `token` (TLS: trusting the run's certificate).
pub fn client_config(addr: &str, token: Option<&str>) -> volley::ClientConfig {
    let mut config = volley::ClientConfig::default();
    config.token = token.map(|t| t.as_bytes().to_vec());
    if addr.starts_with("tls://") {
        config = config.tls(tls().1.clone());
    }
    config
}

/// The transport of an address, for the report (`tcp` of `tcp://127.0.0.1:7411`).
pub fn scheme(addr: &str) -> String {
    addr.split("://").next().unwrap_or("?").to_string()
}

/// The run's TLS settings: a self-signed certificate for 127.0.0.1 made at start-up, and a
/// client that trusts exactly it (so the handshake verifies as in production).
fn tls() -> &'static (TlsServer, TlsClient) {
    static TLS: OnceLock<(TlsServer, TlsClient)> = OnceLock::new();
    TLS.get_or_init(|| {
        let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("generate a certificate");
        let (cert, key) = (c.cert.pem(), c.key_pair.serialize_pem());
        let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes(), None).expect("server TLS settings");
        let client = TlsClient::from_pem(cert.as_bytes(), None).expect("client TLS settings");
        (server, client)
    })
}
