//! A server and a client in one program, over TCP. Run: `cargo run --example echo`.

use volley::{Client, Method, Server};

/// A method is a service name, a method name and the request and reply types.
const SAY: Method<String, String> = Method::new("echo", "say");

#[tokio::main(flavor = "current_thread")]
async fn main() -> volley::Result<()> {
    let server = Server::builder().handle(&SAY, |s: String| async move { Ok(s.to_uppercase()) }).build();
    let addr = server.listen("tcp://127.0.0.1:0").await?;

    let client = Client::connect(&addr.to_string()).await?;
    println!("{}", client.call(&SAY, "hello, volley".to_string()).await?);

    server.shutdown().await;
    Ok(())
}
