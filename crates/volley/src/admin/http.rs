//! Just enough HTTP/1.1 for the admin endpoint: read one `GET` request head, answer it, close.
//!
//! Hand-written rather than hyper: the endpoint serves three read-only pages to a browser, a
//! Prometheus scraper or `volley top`, one request per connection, and this is about a hundred
//! lines. hyper with hyper-util and http-body-util would put an HTTP stack into every build of
//! the library for that. Everything a hostile client could stretch is bounded: the request head
//! (8 KiB), the time to send it (2 s) and to take the answer (5 s), and the connections served
//! at once (32; the oldest still sending its head makes room for a newcomer), so a slow or
//! hostile client costs the RPC server nothing but one small task on the endpoint's thread.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head read (request line and headers).
pub(super) const MAX_HEAD: usize = 8 << 10;
/// Time a client has to send its request head: a scraper sends it at once.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to take the answer.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// What a client asked for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Request {
    /// `GET` (or `HEAD`, answered without a body) of this path, without its query.
    Get { path: String, head_only: bool },
    /// Another method: answered 405.
    OtherMethod,
    /// Not HTTP, or a head over the limit: answered 400.
    Bad,
}

/// An answer: status, content type, body.
pub(super) struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub(super) fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Response { status, content_type, body: body.into() }
    }

    pub(super) fn text(status: u16, body: &str) -> Self {
        Response::new(status, "text/plain; charset=utf-8", body)
    }
}

/// Reads the request head (up to the blank line), within the size and time bounds.
pub(super) async fn read_request(stream: &mut TcpStream) -> Request {
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() > MAX_HEAD {
                return false;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(true) => parse(&head),
        _ => Request::Bad,
    }
}

/// Parses the request line of a head.
pub(super) fn parse(head: &[u8]) -> Request {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else { return Request::Bad };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() || !target.starts_with('/') {
        return Request::Bad;
    }
    let path = target.split(['?', '#']).next().unwrap_or("/").to_string();
    match method {
        "GET" => Request::Get { path, head_only: false },
        "HEAD" => Request::Get { path, head_only: true },
        _ => Request::OtherMethod,
    }
}

/// Writes the answer and closes the connection (one request per connection).
pub(super) async fn respond(stream: &mut TcpStream, r: Response, head_only: bool) {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         Connection: close\r\n{}\r\n",
        r.status,
        r.content_type,
        r.body.len(),
        if r.status == 405 { "Allow: GET, HEAD\r\n" } else { "" },
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        if !head_only {
            stream.write_all(&r.body).await?;
        }
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(IO_TIMEOUT, write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse_to_paths_without_queries() {
        let get = |p: &str| Request::Get { path: p.into(), head_only: false };
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), get("/metrics"));
        assert_eq!(parse(b"GET /vars.json?x=1 HTTP/1.0\r\n\r\n"), get("/vars.json"));
        assert_eq!(parse(b"HEAD / HTTP/1.1\r\n\r\n"), Request::Get { path: "/".into(), head_only: true });
        assert_eq!(parse(b"POST / HTTP/1.1\r\n\r\n"), Request::OtherMethod);
        assert_eq!(parse(b"GET metrics HTTP/1.1\r\n\r\n"), Request::Bad);
        assert_eq!(parse(b"\x16\x03\x01 binary"), Request::Bad);
        assert_eq!(parse(b"GET / SPDY/3\r\n\r\n"), Request::Bad);
    }
}
