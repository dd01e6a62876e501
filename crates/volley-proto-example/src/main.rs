//! Serves `shop.v1/buy` (protobuf) on the address given, `tcp://127.0.0.1:7400` by default,
//! until Ctrl-C: `volley describe ADDR` lists it, `volley call --connect ADDR shop.v1 buy …`
//! calls it.

#[tokio::main]
async fn main() -> volley::Result<()> {
    let at = std::env::args().nth(1).unwrap_or_else(|| "tcp://127.0.0.1:7400".into());
    let server = volley_proto_example::server();
    let addr = server.listen(&at).await?;
    println!("serving shop.v1/buy (protobuf) on {addr}");
    let _ = tokio::signal::ctrl_c().await;
    server.shutdown().await;
    Ok(())
}
