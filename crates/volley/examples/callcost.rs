//! What one call costs, counted in instructions rather than timed: a fixed number of echo calls
//! by many callers on one current-thread runtime (client and server on the same thread), meant
//! to run under `valgrind --tool=callgrind`, whose instruction count does not depend on how
//! loaded the machine is. `scripts/callcost.py` builds it, runs it and divides.
//!
//! `cargo run --release --example callcost -- [CALLERS] [CALLS_PER_CALLER] [TRANSPORT] [MODE] [METRICS]`
//! (defaults: 256, 1000, tcp, single, metrics; MODE `batch` makes each call a `call_batch` of
//! 128; METRICS `nometrics` turns the library's metrics off on both sides).

use volley::bytes::Bytes;
use volley::{Client, ClientConfig, Method, Server};

const ECHO: Method<Bytes, Bytes> = Method::new("bench", "echo");
const BATCH: usize = 128;

#[tokio::main(flavor = "current_thread")]
async fn main() -> volley::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let callers: usize = arg(0, "256").parse().expect("CALLERS: a number");
    let per_caller: usize = arg(1, "1000").parse().expect("CALLS_PER_CALLER: a number");
    let transport = arg(2, "tcp");
    let batch = match arg(3, "single").as_str() {
        "single" => false,
        "batch" => true,
        other => panic!("MODE: single or batch, not {other}"),
    };
    let metrics = match arg(4, "metrics").as_str() {
        "metrics" => true,
        "nometrics" => false,
        other => panic!("METRICS: metrics or nometrics, not {other}"),
    };
    let listen = match transport.as_str() {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        "unix" => format!("unix:///tmp/volley-callcost-{}.sock", std::process::id()),
        "inproc" => format!("inproc://callcost-{}", std::process::id()),
        "shm" => format!("shm://callcost-{}", std::process::id()),
        other => panic!("TRANSPORT: tcp, unix, shm or inproc, not {other}"),
    };
    let server = Server::builder().metrics(metrics).handle_fn(&ECHO, |b: Bytes| Ok(b)).build();
    let addr = server.listen(&listen).await?;
    let client = Client::connect_with(&addr.to_string(), ClientConfig::default().metrics(metrics)).await?;
    let payload = Bytes::from(vec![7u8; 64]);
    client.call(&ECHO, payload.clone()).await?;

    let mut tasks = Vec::with_capacity(callers);
    for _ in 0..callers {
        let (client, payload) = (client.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            for _ in 0..per_caller {
                if batch {
                    let out = client.call_batch(&ECHO, std::iter::repeat_n(payload.clone(), BATCH)).await;
                    n += out.iter().filter(|r| r.is_ok()).count();
                } else {
                    client.call(&ECHO, payload.clone()).await?;
                    n += 1;
                }
            }
            Ok::<_, volley::Error>(n)
        }));
    }
    let mut items = 0;
    for t in tasks {
        items += t.await.expect("a caller panicked")?;
    }
    println!("{items}");
    server.shutdown().await;
    Ok(())
}
