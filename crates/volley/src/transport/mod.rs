//! Transports, chosen by address: `inproc://NAME`, `unix:///PATH`, `tcp://HOST:PORT`,
//! `tls://HOST:PORT` (feature `tls`), `shm:///PATH` or `shm://NAME` (Linux).
//!
//! - `inproc`: a process-wide table of named servers; calls hand request and reply values
//!   across with no encoding at all.
//! - `socket`: one seam for unix, tcp and tls sockets (connect, listen, accept, handshake);
//!   `stream`: the read and write halves a connection needs of them.
//! - `tls`: rustls sessions over tcp, behind the same trait (feature `tls`).
//! - `shm`: byte rings in memory shared with a process on the same host, set up over a unix
//!   socket, behind the same trait (Linux).
//! - `sim`: `tcp://` on a simulated host of a turmoil simulation (feature `sim`).
//! - `outbox`: the send side of a byte connection — callers append messages, one writer
//!   drains everything queued into one write.
//! - `reader`: the receive side — reads into one reusable buffer and hands up every complete
//!   message as one batch; `budget`: a server's bound on the buffers of large frames being
//!   received, over all its connections.

pub(crate) mod budget;
pub(crate) mod inproc;
pub(crate) mod outbox;
pub(crate) mod reader;
#[cfg(target_os = "linux")]
pub(crate) mod shm;
#[cfg(feature = "sim")]
pub(crate) mod sim;
#[cfg(feature = "sim")]
pub use sim::enable as enable_simulation;
pub(crate) mod socket;
pub(crate) mod stream;
#[cfg(feature = "tls")]
pub mod tls;

use std::path::PathBuf;

use crate::Error;

/// A parsed endpoint address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Address {
    /// `inproc://NAME`: a server in this process.
    Inproc(String),
    /// `unix:///PATH`: a Unix domain socket.
    Unix(PathBuf),
    /// `tcp://HOST:PORT`.
    Tcp(String),
    /// `tls://HOST:PORT`: tcp with TLS (feature `tls`; the server needs `ServerBuilder::tls`,
    /// the client `ClientConfig::tls`).
    Tls(String),
    /// `shm:///PATH` or `shm://NAME`: shared memory with a process on this host, set up over
    /// the unix socket at `PATH` or the abstract socket `volley-shm/NAME` (Linux). Holds what
    /// follows `shm://`.
    Shm(String),
}

impl Address {
    pub fn parse(s: &str) -> Result<Address, Error> {
        let bad = |reason: &str| Error::InvalidAddress { addr: s.to_string(), reason: reason.into() };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad(&missing_scheme(s)))?;
        match scheme {
            "inproc" if !rest.is_empty() => Ok(Address::Inproc(rest.to_string())),
            "inproc" => Err(bad("inproc:// needs a name")),
            "unix" if rest.starts_with('/') => Ok(Address::Unix(PathBuf::from(rest))),
            "unix" => Err(bad("unix:// needs an absolute path: unix:///run/x.sock")),
            "tcp" | "tls" => {
                let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("expected tcp://HOST:PORT"))?;
                if host.is_empty() || port.parse::<u16>().is_err() {
                    return Err(bad("expected tcp://HOST:PORT (or tls://HOST:PORT) with a numeric port"));
                }
                Ok(if scheme == "tcp" {
                    Address::Tcp(rest.to_string())
                } else {
                    Address::Tls(rest.to_string())
                })
            }
            "shm" => shm_rest(rest).map(|()| Address::Shm(rest.to_string())).map_err(bad),
            _ => Err(bad("unknown scheme; use inproc://, unix://, tcp://, tls:// or shm://")),
        }
    }

    /// Short name of the transport: `inproc`, `unix`, `tcp`, `tls` or `shm`.
    pub fn transport(&self) -> &'static str {
        match self {
            Address::Inproc(_) => "inproc",
            Address::Unix(_) => "unix",
            Address::Tcp(_) => "tcp",
            Address::Tls(_) => "tls",
            Address::Shm(_) => "shm",
        }
    }
}

/// Why an address without `SCHEME://` is refused, with the likely meaning when the text has
/// the shape of one: `HOST:PORT` or a bare port is tcp, an absolute path a unix socket.
fn missing_scheme(s: &str) -> String {
    const EXPECTED: &str = "expected SCHEME://..., with scheme inproc, unix, tcp, tls or shm";
    let port = |p: &str| p.parse::<u16>().is_ok();
    let guess = if port(s) {
        Some(format!("tcp://127.0.0.1:{s}"))
    } else if s.rsplit_once(':').is_some_and(|(host, p)| !host.is_empty() && !host.contains('/') && port(p)) {
        Some(format!("tcp://{s}"))
    } else if s.starts_with('/') {
        Some(format!("unix://{s}"))
    } else {
        None
    };
    match guess {
        Some(g) => format!("no scheme: did you mean {g}? ({EXPECTED})"),
        None => EXPECTED.to_string(),
    }
}

#[cfg(target_os = "linux")]
fn shm_rest(rest: &str) -> Result<(), &'static str> {
    shm::check_rest(rest)
}

#[cfg(not(target_os = "linux"))]
fn shm_rest(_: &str) -> Result<(), &'static str> {
    Err("shm:// (shared memory) needs Linux")
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Inproc(n) => write!(f, "inproc://{n}"),
            Address::Unix(p) => write!(f, "unix://{}", p.display()),
            Address::Tcp(a) => write!(f, "tcp://{a}"),
            Address::Tls(a) => write!(f, "tls://{a}"),
            Address::Shm(a) => write!(f, "shm://{a}"),
        }
    }
}

impl std::str::FromStr for Address {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Address::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_scheme_and_rejects_nonsense() {
        assert_eq!(Address::parse("inproc://a").unwrap(), Address::Inproc("a".into()));
        assert_eq!(Address::parse("unix:///tmp/s").unwrap(), Address::Unix("/tmp/s".into()));
        assert_eq!(Address::parse("tcp://127.0.0.1:80").unwrap(), Address::Tcp("127.0.0.1:80".into()));
        assert_eq!(Address::parse("tcp://[::1]:80").unwrap(), Address::Tcp("[::1]:80".into()));
        assert_eq!(Address::parse("tls://localhost:443").unwrap(), Address::Tls("localhost:443".into()));
        assert_eq!(Address::parse("tls://localhost:443").unwrap().to_string(), "tls://localhost:443");
        for bad in [
            "",
            "tcp://x",
            "tcp://:1",
            "tcp://h:99999",
            "tls://x",
            "udp://h:1",
            "unix://rel",
            "inproc://",
            "x",
            "shm://",
            "shm://a b",
            "shm://../x",
        ] {
            assert!(matches!(Address::parse(bad), Err(Error::InvalidAddress { .. })), "{bad}");
        }
        assert_eq!(Address::parse("unix:///tmp/s").unwrap().to_string(), "unix:///tmp/s");
        #[cfg(target_os = "linux")]
        for (text, rest) in [("shm:///tmp/s", "/tmp/s"), ("shm://echo-1.a_b", "echo-1.a_b")] {
            assert_eq!(Address::parse(text).unwrap(), Address::Shm(rest.into()));
            assert_eq!(Address::parse(text).unwrap().to_string(), text);
        }
        assert!(Address::parse(&format!("shm://{}", "a".repeat(91))).is_err());
        let no_scheme = Address::parse("127.0.0.1:80").unwrap_err().to_string();
        assert!(["inproc", "unix", "tcp", "tls", "shm"].iter().all(|s| no_scheme.contains(s)), "{no_scheme}");
    }

    /// An address that lacks only its scheme gets the likely one named; other text does not.
    #[test]
    fn a_missing_scheme_is_guessed_from_the_addresss_shape() {
        let hint = |s: &str| Address::parse(s).unwrap_err().to_string();
        for (text, meant) in [
            ("127.0.0.1:5000", "tcp://127.0.0.1:5000"),
            ("localhost:80", "tcp://localhost:80"),
            ("[::1]:7000", "tcp://[::1]:7000"),
            ("5000", "tcp://127.0.0.1:5000"),
            ("/run/echo.sock", "unix:///run/echo.sock"),
        ] {
            let e = hint(text);
            assert!(e.contains(&format!("did you mean {meant}?")), "{text}: {e}");
            // The guess parses: following the hint works.
            assert!(Address::parse(meant).is_ok(), "{meant}");
        }
        for text in ["x", "", "host:port", "a/b:1", ":80"] {
            assert!(!hint(text).contains("did you mean"), "{text}: {}", hint(text));
        }
    }
}
