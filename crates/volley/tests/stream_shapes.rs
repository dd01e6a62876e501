//! The three stream shapes through the service macro — a server stream (`ItemStream` reply), a
//! client stream (`RequestStream` argument) and both ways (both) — on every transport: inproc
//! (items handed over as values), unix, tcp, shm, and tls when the crate is built with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use volley::service::{ItemStream, RequestStream};
use volley::{Client, ClientConfig, Code, Error, Server, Status, StreamOptions};

/// A value that counts its own decodes: over inproc none may happen.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Item(u64);
volley::wire!(Item);

#[volley::service(name = "shapes")]
pub trait Shapes {
    /// `0..n`, one item each.
    async fn count(&self, n: u64) -> Result<ItemStream<Item>, Status>;
    /// The sum of the client's items; an item `u64::MAX` is refused mid-stream.
    async fn sum(&self, items: RequestStream<Item>) -> Result<u64, Status>;
    /// Each of the client's items back, doubled, in order.
    async fn double(&self, items: RequestStream<Item>) -> Result<ItemStream<Item>, Status>;
    /// `0..` without end, a tick every millisecond.
    async fn ticks(&self) -> Result<ItemStream<Item>, Status>;
}

#[derive(Default)]
struct Impl {
    /// Items the handlers took from the client.
    taken: AtomicU64,
    /// Producers of `ticks` dropped (the stream ended, whatever the reason).
    dropped: Arc<AtomicU64>,
    /// Runs of `sum` that ended (whatever the reason), and those that answered a sum.
    sums_ended: Arc<AtomicU64>,
    sums_answered: AtomicU64,
}

/// Counts its own drop.
struct OnDrop(Arc<AtomicU64>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Shapes for Arc<Impl> {
    async fn count(&self, n: u64) -> Result<ItemStream<Item>, Status> {
        Ok(futures_util::stream::iter((0..n).map(|i| Ok(Item(i)))).boxed())
    }

    async fn sum(&self, mut items: RequestStream<Item>) -> Result<u64, Status> {
        let _ended = OnDrop(self.sums_ended.clone());
        let mut total = 0u64;
        while let Some(item) = items.next().await {
            let Item(v) = item?;
            self.taken.fetch_add(1, Ordering::SeqCst);
            if v == u64::MAX {
                return Err(Status::new(Code::BadRequest, "no such item"));
            }
            total += v;
        }
        self.sums_answered.fetch_add(1, Ordering::SeqCst);
        Ok(total)
    }

    async fn ticks(&self) -> Result<ItemStream<Item>, Status> {
        let guard = OnDrop(self.dropped.clone());
        Ok(futures_util::stream::iter(0..)
            .then(move |i| {
                let _keep = &guard;
                async move {
                    // A stream that ticks, on every transport (real sockets among them).
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok(Item(i))
                }
            })
            .boxed())
    }

    async fn double(&self, items: RequestStream<Item>) -> Result<ItemStream<Item>, Status> {
        let me = self.clone();
        Ok(items
            .map(move |r| {
                me.taken.fetch_add(1, Ordering::SeqCst);
                r.map(|Item(v)| Item(v * 2))
            })
            .boxed())
    }
}

#[path = "support/wait.rs"]
mod wait;
use wait::eventually;

/// Where to serve: every transport this build has, each with the client config it needs.
fn transports(tag: &str) -> Vec<(String, Option<ClientConfig>)> {
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("volley-shapes-{tag}-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    #[allow(unused_mut)]
    let mut all = vec![
        (format!("inproc://shapes-{tag}-{pid}"), None),
        (format!("unix://{}", dir.join("s.sock").display()), None),
        ("tcp://127.0.0.1:0".to_string(), None),
        (format!("shm://volley-shapes-{tag}-{pid}"), None),
    ];
    #[cfg(feature = "tls")]
    all.push(("tls://127.0.0.1:0".to_string(), Some(tls::client_config())));
    all
}

fn server(imp: &Arc<Impl>) -> Server {
    let b = Server::builder().serve(ShapesServer::new(imp.clone()));
    #[cfg(feature = "tls")]
    let b = b.tls(tls::server());
    b.build()
}

async fn connect(server: &Server, addr: &str, config: Option<ClientConfig>) -> ShapesClient {
    let addr = server.listen(addr).await.unwrap().to_string();
    let config = config.unwrap_or_default().connect_timeout(Duration::from_secs(20));
    ShapesClient::new(Client::connect_with(&addr, config).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_works_on_every_transport() {
    const N: u64 = 10_000;
    for (addr, config) in transports("all") {
        let imp = Arc::new(Impl::default());
        let server = server(&imp);
        let c = connect(&server, &addr, config).await;

        let got: Vec<Item> = c.count(N).await.unwrap().map(Result::unwrap).collect().await;
        assert_eq!(got, (0..N).map(Item).collect::<Vec<_>>(), "{addr}: server stream");

        let items = futures_util::stream::iter((0..N).map(Item));
        assert_eq!(c.sum(items).await.unwrap(), N * (N - 1) / 2, "{addr}: client stream");
        assert_eq!(c.sum(futures_util::stream::empty()).await.unwrap(), 0, "{addr}: no items");

        let back: Vec<Item> = c
            .double(futures_util::stream::iter((0..N).map(Item)))
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(back, (0..N).map(|i| Item(i * 2)).collect::<Vec<_>>(), "{addr}: both ways");
        assert_eq!(imp.taken.load(Ordering::SeqCst), 2 * N, "{addr}");
        server.shutdown().await;
    }
}

/// A client stream's handler that fails mid-stream answers with its error, even though the
/// client had more items to send (they are not sent); a both-way stream's window bounds what
/// the server reads ahead of a client that does not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_windows_hold_on_every_transport() {
    for (addr, config) in transports("errors") {
        let imp = Arc::new(Impl::default());
        let server = server(&imp);
        let c = connect(&server, &addr, config).await;

        // The handler refuses the third item: the other items after it are never taken.
        let items = futures_util::stream::iter([1, 2, u64::MAX].into_iter().chain(3..100_000).map(Item));
        let r = c.sum(items).await;
        assert!(matches!(&r, Err(Error::Remote(s)) if s.code == Code::BadRequest), "{addr}: {r:?}");
        assert!(imp.taken.load(Ordering::SeqCst) == 3, "{addr}: the handler read past its error");

        // Both ways, with a reader that takes nothing: the server takes no more than the
        // client's window of replies plus what its own credit lets the client send ahead.
        imp.taken.store(0, Ordering::SeqCst);
        let opts = StreamOptions::default().window(8);
        let s = c.double_with(futures_util::stream::iter((0..1_000_000).map(Item)), opts).await.unwrap();
        // A window of real time in which a server ignoring the window would read on (real
        // sockets, whose buffers would take the items).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let taken = imp.taken.load(Ordering::SeqCst);
        assert!(taken <= 8 + 64 + 64, "{addr}: the server took {taken} items for a reader that reads none");
        drop(s);
        server.shutdown().await;
    }
}

/// A reader that drops its stream mid-way, and one whose stream outlives its timeout, stop
/// the server's producer: on every transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_and_a_deadline_stop_the_producer_on_every_transport() {
    for (addr, config) in transports("cancel") {
        let imp = Arc::new(Impl::default());
        let server = server(&imp);
        let c = connect(&server, &addr, config).await;

        let first: Vec<Item> = c.ticks().await.unwrap().take(10).map(Result::unwrap).collect().await;
        assert_eq!(first, (0..10).map(Item).collect::<Vec<_>>(), "{addr}");
        assert!(
            eventually(Duration::from_secs(30), || imp.dropped.load(Ordering::SeqCst) == 1).await,
            "{addr}: the cancel left the producer running"
        );

        let opts = StreamOptions::default().timeout(Duration::from_millis(300));
        let mut s = c.ticks_with(opts).await.unwrap();
        let mut items = 0;
        let end = loop {
            match s.next().await {
                Some(Ok(_)) => items += 1,
                other => break other,
            }
        };
        assert!(
            matches!(end, Some(Err(Error::Timeout(_)))),
            "{addr}: the stream ended with {end:?} after {items} items"
        );
        assert!(
            eventually(Duration::from_secs(30), || imp.dropped.load(Ordering::SeqCst) == 2).await,
            "{addr}: the deadline left the producer running"
        );
        server.shutdown().await;
    }
}

/// A client stream given up mid-way (the caller dropped it) is not taken for a whole one: its
/// handler ends without answering a sum, on every transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_upload_is_not_taken_for_a_whole_one_on_every_transport() {
    for (addr, config) in transports("dropped") {
        let imp = Arc::new(Impl::default());
        let server = server(&imp);
        let c = connect(&server, &addr, config).await;
        // Three items, then nothing more, ever: the caller gives up once the handler has them.
        let items = futures_util::stream::iter((1..=3).map(Item)).chain(futures_util::stream::pending());
        let mut upload = Box::pin(c.sum(items));
        let taken = tokio::select! {
            r = &mut upload => panic!("{addr}: the upload ended with {r:?}"),
            taken = eventually(Duration::from_secs(30), || imp.taken.load(Ordering::SeqCst) == 3) => taken,
        };
        assert!(taken, "{addr}: the handler did not get the items");
        drop(upload);
        assert!(
            eventually(Duration::from_secs(30), || imp.sums_ended.load(Ordering::SeqCst) == 1).await,
            "{addr}: the handler ran on"
        );
        assert_eq!(imp.sums_answered.load(Ordering::SeqCst), 0, "{addr}: a dropped upload was summed");
        server.shutdown().await;
    }
}

#[cfg(feature = "tls")]
mod tls {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    use std::sync::LazyLock;
    use volley::ClientConfig;
    use volley::transport::tls::{TlsClient, TlsServer};

    /// A CA and a server certificate for 127.0.0.1, made once: (CA PEM, chain PEM, key PEM).
    static CERTS: LazyLock<(Vec<u8>, Vec<u8>, Vec<u8>)> = LazyLock::new(|| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca = p.self_signed(&ca_key).unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &ca, &ca_key).unwrap();
        (ca.pem().into_bytes(), cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    });

    pub fn server() -> TlsServer {
        TlsServer::from_pem(&CERTS.1, &CERTS.2, None).unwrap()
    }

    pub fn client_config() -> ClientConfig {
        ClientConfig::default().tls(TlsClient::from_pem(&CERTS.0, None).unwrap())
    }
}

/// Through the registry: a `ServiceClient` opens client and both-way streams on an instance
/// (every item of one stream goes to that instance, which answers for all of them), and in
/// relayed mode refuses them with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_client_opens_client_and_both_way_streams() {
    use volley::ServiceClient;
    use volley::controller::{Controller, ControllerConfig};
    use volley::registry::Registry;
    use volley::service_client::{Mode, ServiceConfig};
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let caddr = controller.listen("tcp://127.0.0.1:0").await.unwrap();
    let registry = Registry::connect(&caddr.to_string()).await.unwrap();
    let imps: Vec<Arc<Impl>> = (0..2).map(|_| Arc::default()).collect();
    let mut servers = Vec::new();
    for imp in &imps {
        let server = Server::builder().serve(ShapesServer::new(imp.clone())).build();
        server.listen_and_register("tcp://127.0.0.1:0", &registry).await.unwrap();
        servers.push(server);
    }
    let c = ShapesClient::new(ServiceClient::with_registry(registry.clone(), ServiceConfig::default()));
    for round in 1..=6u64 {
        let before: Vec<u64> = imps.iter().map(|i| i.taken.load(Ordering::SeqCst)).collect();
        assert_eq!(c.sum(futures_util::stream::iter((0..100).map(Item))).await.unwrap(), 4950);
        let back: Vec<Item> = c
            .double(futures_util::stream::iter((0..100).map(Item)))
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(back, (0..100).map(|i| Item(i * 2)).collect::<Vec<_>>(), "round {round}");
        // Each stream's 100 items went to one instance.
        let grew: Vec<u64> =
            imps.iter().zip(&before).map(|(i, b)| i.taken.load(Ordering::SeqCst) - b).collect();
        assert!(
            grew.iter().all(|g| g % 100 == 0) && grew.iter().sum::<u64>() == 200,
            "round {round}: {grew:?}"
        );
    }
    assert!(imps.iter().all(|i| i.taken.load(Ordering::SeqCst) > 0), "the opens were balanced over both");

    let relayed = ShapesClient::new(ServiceClient::with_registry(
        registry,
        ServiceConfig::default().mode(Mode::Relayed),
    ));
    let r = relayed.sum(futures_util::stream::iter([Item(1)])).await;
    assert!(matches!(&r, Err(Error::Usage(m)) if m.contains("relay")), "{r:?}");
    let r = relayed.double(futures_util::stream::iter([Item(1)])).await;
    assert!(matches!(&r, Err(Error::Usage(m)) if m.contains("relay")), "{r:?}");
    for s in servers {
        s.shutdown().await;
    }
}
