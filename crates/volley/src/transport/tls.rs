//! TLS over tcp (`tls://HOST:PORT`), with rustls and the ring provider (feature `tls`).
//!
//! The Volley protocol runs unchanged inside the TLS session: preamble, frames, auth. A server
//! gets a certificate chain and key ([`TlsServer`]), and optionally the CA that client
//! certificates must chain to (mutual TLS: a client without a valid certificate is refused in
//! the handshake). A client gets the CA that the server's certificate must chain to, and
//! optionally its own certificate ([`TlsClient`]).
//!
//! Reading: the connection reader works by readiness (`readable` + `try_read_buf`), so an idle
//! connection holds no buffer. A TLS stream only offers `poll_read`, so [`TlsReadHalf`] reads
//! decrypted bytes into a small staging buffer when asked for readiness and hands them over on
//! the next `try_read_buf`: one copy of the plaintext, next to decryption. The staging buffer
//! (16 KiB, one TLS record) stays with the connection; rustls keeps buffers of its own too.

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::stream::{ByteStream, ReadHalf, WriteHalf};
use crate::Error;

/// How much plaintext one staged read takes (a TLS record holds at most 16 KiB).
const STAGE: usize = 16 * 1024;

fn tls_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("TLS configuration: {what}: {e}"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error("reading certificates", e))?;
    if certs.is_empty() {
        return Err(tls_error("reading certificates", "no certificate in the PEM data"));
    }
    Ok(certs)
}

fn key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| tls_error("reading the private key", e))
}

fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca_pem)? {
        roots.add(c).map_err(|e| tls_error("adding a CA certificate", e))?;
    }
    Ok(roots)
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| tls_error(&format!("reading {}", path.display()), e))
}

/// A server's TLS settings: certificate chain and key, and for mutual TLS the CA that client
/// certificates must chain to.
#[derive(Clone)]
pub struct TlsServer {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

impl TlsServer {
    /// From PEM data: the certificate chain (leaf first), its private key, and optionally the
    /// CA certificates client certificates must chain to (then every client must present one).
    pub fn from_pem(cert_chain: &[u8], key_pem: &[u8], client_ca: Option<&[u8]>) -> Result<TlsServer, Error> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("protocol versions", e))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| tls_error("client certificate verifier", e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(certs(cert_chain)?, key(key_pem)?)
            .map_err(|e| tls_error("certificate and key", e))?;
        Ok(TlsServer::from_config(Arc::new(config)))
    }

    /// From PEM files (what `volley echo --tls-cert --tls-key [--tls-client-ca]` takes).
    pub fn from_pem_files(
        cert_chain: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> Result<TlsServer, Error> {
        let ca = client_ca.map(read).transpose()?;
        TlsServer::from_pem(&read(cert_chain)?, &read(key)?, ca.as_deref())
    }

    /// From a rustls configuration built by the application.
    pub fn from_config(config: Arc<rustls::ServerConfig>) -> TlsServer {
        TlsServer { acceptor: tokio_rustls::TlsAcceptor::from(config) }
    }
}

/// A client's TLS settings: the CA the server's certificate must chain to, optionally a
/// client certificate (for servers that require one), and the name to verify the server's
/// certificate against (default: the host of the address).
#[derive(Clone)]
pub struct TlsClient {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) server_name: Option<String>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("server_name", &self.server_name).finish()
    }
}

impl TlsClient {
    /// From PEM data: the trusted CA certificates, and optionally a client certificate chain
    /// and its key.
    pub fn from_pem(ca: &[u8], client_cert: Option<(&[u8], &[u8])>) -> Result<TlsClient, Error> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("protocol versions", e))?
            .with_root_certificates(roots(ca)?);
        let config = match client_cert {
            None => builder.with_no_client_auth(),
            Some((chain, k)) => builder
                .with_client_auth_cert(certs(chain)?, key(k)?)
                .map_err(|e| tls_error("client certificate and key", e))?,
        };
        Ok(TlsClient::from_config(Arc::new(config)))
    }

    /// From PEM files.
    pub fn from_pem_files(ca: &Path, client_cert: Option<(&Path, &Path)>) -> Result<TlsClient, Error> {
        let cc = client_cert.map(|(c, k)| Ok::<_, Error>((read(c)?, read(k)?))).transpose()?;
        TlsClient::from_pem(&read(ca)?, cc.as_ref().map(|(c, k)| (&c[..], &k[..])))
    }

    /// From a rustls configuration built by the application.
    pub fn from_config(config: Arc<rustls::ClientConfig>) -> TlsClient {
        TlsClient { connector: tokio_rustls::TlsConnector::from(config), server_name: None }
    }

    /// Verifies the server's certificate against `name` instead of the address's host.
    pub fn server_name(mut self, name: impl Into<String>) -> TlsClient {
        self.server_name = Some(name.into());
        self
    }

    /// Connects to `host_port` (`HOST:PORT`) and runs the handshake.
    pub(crate) async fn connect(&self, host_port: &str) -> Result<TlsStream, Error> {
        let tcp = TcpStream::connect(host_port)
            .await
            .map_err(|e| Error::io(&format!("connect to tls://{host_port}"), e))?;
        let _ = tcp.set_nodelay(true);
        let peer = format!("tls://{}", tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into()));
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
                host.trim_start_matches('[').trim_end_matches(']').to_string()
            }
        };
        let name = ServerName::try_from(host.clone()).map_err(|e| Error::InvalidAddress {
            addr: format!("tls://{host_port}"),
            reason: e.to_string(),
        })?;
        let stream = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| Error::Connection(format!("TLS handshake with tls://{host_port}: {e}")))?;
        Ok(TlsStream { inner: tokio_rustls::TlsStream::Client(stream), peer })
    }
}

impl TlsServer {
    /// Runs the server side of the handshake on an accepted tcp connection.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> io::Result<TlsStream> {
        let peer = format!("tls://{}", tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into()));
        let stream = self.acceptor.accept(tcp).await?;
        Ok(TlsStream { inner: tokio_rustls::TlsStream::Server(stream), peer })
    }
}

/// An established TLS session over tcp.
pub struct TlsStream {
    inner: tokio_rustls::TlsStream<TcpStream>,
    peer: String,
}

/// The read half of a TLS stream, by readiness (see the module documentation).
pub struct TlsReadHalf {
    rd: tokio::sync::Mutex<tokio::io::ReadHalf<tokio_rustls::TlsStream<TcpStream>>>,
    staged: Mutex<Staged>,
}

#[derive(Default)]
struct Staged {
    buf: BytesMut,
    eof: bool,
    err: Option<io::Error>,
}

impl ReadHalf for TlsReadHalf {
    async fn readable(&self) -> io::Result<()> {
        let mut buf = {
            let mut st = self.staged.lock();
            if !st.buf.is_empty() || st.eof || st.err.is_some() {
                return Ok(());
            }
            std::mem::take(&mut st.buf)
        };
        buf.reserve(STAGE);
        // Cancel-safe: a cancelled read has taken no bytes from the session.
        let r = self.rd.lock().await.read_buf(&mut buf).await;
        let mut st = self.staged.lock();
        match r {
            Ok(0) => st.eof = true,
            Ok(_) => {}
            Err(e) => st.err = Some(e),
        }
        st.buf = buf;
        Ok(())
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut st = self.staged.lock();
        if !st.buf.is_empty() {
            let n = st.buf.len();
            buf.extend_from_slice(&st.buf);
            st.buf.clear();
            return Ok(n);
        }
        if let Some(e) = st.err.take() {
            st.eof = true;
            return Err(e);
        }
        if st.eof {
            return Ok(0);
        }
        Err(io::ErrorKind::WouldBlock.into())
    }
}

/// Written by the writer task only: a write into the session may leave records in it that
/// only a later poll sends, and a write from any other task would have nobody to make that poll.
impl WriteHalf for tokio::io::WriteHalf<tokio_rustls::TlsStream<TcpStream>> {}

impl ByteStream for TlsStream {
    type Read = TlsReadHalf;
    type Write = tokio::io::WriteHalf<tokio_rustls::TlsStream<TcpStream>>;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        let (rd, wr) = tokio::io::split(self.inner);
        (TlsReadHalf { rd: tokio::sync::Mutex::new(rd), staged: Mutex::new(Staged::default()) }, wr)
    }
    fn peer(&self) -> String {
        self.peer.clone()
    }
}
