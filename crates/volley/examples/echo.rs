//! A server and a client in one program, over TCP. Run: `cargo run --example echo`.

use volley::{Client, Server, Status};

/// A service is a trait: the attribute writes the typed client (`EchoClient`) and the server
/// glue (`EchoServer`).
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> volley::Result<()> {
    let server = Server::builder().serve(EchoServer::new(Loud)).build();
    let addr = server.listen("tcp://127.0.0.1:0").await?;

    let echo = EchoClient::new(Client::connect(&addr.to_string()).await?);
    println!("{}", echo.say("hello, volley".to_string()).await?);

    server.shutdown().await;
    Ok(())
}
