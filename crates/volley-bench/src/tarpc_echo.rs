//! The echo service in tarpc, in its best configuration for this job: bincode over a
//! length-delimited TCP stream with `TCP_NODELAY` (tarpc's own `serde_transport::tcp` leaves
//! Nagle on), `Bytes` payloads serialized as one byte string, client and server in-flight
//! limits raised above 1024 callers. The in-process variant uses tarpc's own channel
//! transport (`tarpc::transport::channel::unbounded`), with no serialization at all.

use std::net::SocketAddr;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::transport::channel::UnboundedChannel;
use tarpc::{ClientMessage, Response, client, context, server};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::load::Caller;

#[tarpc::service]
pub trait Echo {
    /// Returns its payload.
    async fn echo(payload: Bytes) -> Bytes;
}

#[derive(Clone)]
struct EchoImpl;

impl Echo for EchoImpl {
    async fn echo(self, _: context::Context, payload: Bytes) -> Bytes {
        payload
    }
}

type Req = ClientMessage<EchoRequest>;
type Resp = Response<EchoResponse>;

/// The client half of an in-process channel, handed from the server's thread to the client's.
pub type ClientChannel = UnboundedChannel<Resp, Req>;

/// bincode over a length-delimited stream: what `tarpc::serde_transport::tcp` builds, on a
/// socket we configured ourselves.
fn transport<In, Out>(s: TcpStream) -> tarpc::serde_transport::Transport<TcpStream, In, Out, Bincode<In, Out>>
where
    In: for<'de> Deserialize<'de>,
    Out: Serialize,
{
    let codec = LengthDelimitedCodec::builder().max_frame_length(64 << 20).new_codec();
    tarpc::serde_transport::new(Framed::new(s, codec), Bincode::default())
}

/// Serves one connection. tarpc's documented way spawns a task per request; for a handler
/// that completes at once (an echo), running the handlers inside the connection's task
/// (`for_each_concurrent`) measured 1.3–1.8x faster here, so that is what is measured.
async fn serve_channel(t: impl tarpc::Transport<Resp, Req> + Send + 'static) {
    // Responses queued towards the connection before handlers wait (default 100).
    let config = server::Config { pending_response_buffer: 4096 };
    BaseChannel::new(config, t).execute(EchoImpl.serve()).for_each_concurrent(None, |r| r).await;
}

pub async fn serve_tcp() -> Result<(JoinHandle<()>, SocketAddr), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(serve_channel(transport::<Req, Resp>(s)));
        }
    });
    Ok((task, addr))
}

/// Starts a server on an in-process channel and returns the client's half.
pub fn serve_inproc() -> (JoinHandle<()>, ClientChannel) {
    let (client, server) = tarpc::transport::channel::unbounded::<Resp, Req>();
    (tokio::spawn(serve_channel(server)), client)
}

#[derive(Clone)]
pub struct TarpcCaller(EchoClient);

fn client_config() -> client::Config {
    let mut config = client::Config::default();
    // Defaults are 1000 in flight (more wait) and a 100-request queue to the dispatch task.
    config.max_in_flight_requests = 1 << 16;
    config.pending_request_buffer = 4096;
    config
}

pub async fn connect_tcp(addr: SocketAddr) -> Result<TarpcCaller, String> {
    let s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(TarpcCaller(EchoClient::new(client_config(), transport::<Resp, Req>(s)).spawn()))
}

pub fn connect_inproc(channel: ClientChannel) -> TarpcCaller {
    TarpcCaller(EchoClient::new(client_config(), channel).spawn())
}

impl Caller for TarpcCaller {
    async fn call(&mut self, payload: Bytes) -> Result<usize, String> {
        self.0.echo(context::current(), payload).await.map(|r| r.len()).map_err(|e| e.to_string())
    }
}
