//! `volley bench --raw`, the floor Volley's latency is compared against: a bare tokio TCP echo
//! with a 4-byte length prefix, one connection per caller.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use volley::bytes::Bytes;

/// Starts the echo server; returns its `tcp://` address.
pub async fn listen() -> Result<String, String> {
    let l = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Ok(n) = s.read_u32_le().await else { return };
                    buf.resize(n as usize + 4, 0);
                    buf[..4].copy_from_slice(&n.to_le_bytes());
                    if s.read_exact(&mut buf[4..]).await.is_err() || s.write_all(&buf).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(format!("tcp://{addr}"))
}

/// One caller's connection: one call at a time.
pub struct Conn(Arc<Mutex<TcpStream>>);

pub async fn connect(addr: &str) -> Result<Conn, String> {
    let s = TcpStream::connect(addr.trim_start_matches("tcp://")).await.map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(Conn(Arc::new(Mutex::new(s))))
}

impl Conn {
    pub fn call(&self, p: Bytes) -> impl std::future::Future<Output = Result<Bytes, String>> + use<> {
        let s = self.0.clone();
        async move {
            let mut s = s.lock().await;
            let mut msg = Vec::with_capacity(p.len() + 4);
            msg.extend_from_slice(&(p.len() as u32).to_le_bytes());
            msg.extend_from_slice(&p);
            s.write_all(&msg).await.map_err(|e| e.to_string())?;
            let n = s.read_u32_le().await.map_err(|e| e.to_string())?;
            let mut reply = vec![0; n as usize];
            s.read_exact(&mut reply).await.map_err(|e| e.to_string())?;
            Ok(reply.into())
        }
    }
}
