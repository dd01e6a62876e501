//! The built-in echo service.

use volley::bytes::Bytes;
use volley::{Method, Server};

/// `echo/echo`: returns its payload.
pub const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

pub fn server() -> Server {
    Server::builder().handle(&ECHO, |b: Bytes| async move { Ok(b) }).build()
}

/// `volley serve-echo`: serves until Ctrl-C, then shuts down gracefully.
pub fn serve(listen: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let server = server();
        let bound = server.listen(listen).await.map_err(|e| e.to_string())?;
        eprintln!("serving echo on {bound} (Ctrl-C to stop)");
        tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
        eprintln!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}
