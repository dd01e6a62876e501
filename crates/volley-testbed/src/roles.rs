//! The testbed's roles as Volley services (one `#[volley::service]` trait each), and their
//! messages.
//!
//! - **Document** (`document`): holds the corpus; `index` sends it through LA and into the
//!   Index shards, a chunk of documents at a time; `lengths` gives every document's length.
//! - **LA** (`la`): `analyze` turns a chunk of documents into term frequencies and lengths.
//! - **Index** (`index`, one instance per shard): `add` takes postings for many terms, `lookup`
//!   returns the postings of the requested terms it holds. Terms are routed to shards by key
//!   hash: a single posting with `add_keyed(term)`; a chunk grouped by the shard that owns
//!   each term on the registry's hash ring, one `add_keyed` per shard.
//! - **Main** (`main`): `search` answers a chunk of queries by a scatter-gather of one
//!   `lookup` to every shard (`lookup_scatter`), merging the posting lists and ranking by BM25.
//!
//! The traits are generic over the codec tier `C` (see [`crate::codec`]): every message is
//! `C::W<T>`, so one implementation serves both tiers and a run fixes its tier at compile
//! time; the generated clients and servers carry the parameter (`IndexClient<C, ServiceClient>`,
//! `IndexServer<C, _>`).
//!
//! Every role serves a `stats` method with its server's counters (messages and bytes), read by
//! the driver when the roles run in other processes.
//!
//! In single mode (`batch` = 1) every request carries one item — a document to LA, one
//! posting to a shard, one query to Main and from Main to each shard — and the requests of one
//! document (its postings) are sent concurrently. In batch mode a request carries up to
//! `batch` documents or queries (and a shard request all postings of those documents that it
//! owns): the seed's "batch request in the application layer".

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use volley::balance::{HashRing, hash_key};
use volley::codec::Json;
use volley::registry::{Registration, Registry};
use volley::service_client::{Mode, ServiceConfig};
use volley::{CallOptions, Code, ConcurrencyLimit, Method, Server, ServiceClient, Status};

use crate::analyzer;
use crate::codec::{Codec, Fast};
use crate::corpus::{CorpusSpec, DocText};
use crate::search::{self, CorpusStats, Hit, Posting, Query};

// The services' names, from their traits (a name does not depend on the codec tier).
pub const DOCUMENT: &str = <DocumentMethods<Fast>>::SERVICE;
pub const LA: &str = <LaMethods<Fast>>::SERVICE;
pub const INDEX: &str = <IndexMethods<Fast>>::SERVICE;
pub const MAIN: &str = <MainMethods<Fast>>::SERVICE;

/// Long enough for the slowest configuration's whole indexing run (one call).
pub const LONG_CALL: std::time::Duration = std::time::Duration::from_secs(600);

macro_rules! messages {
    ($($(#[$doc:meta])* pub struct $name:ident { $($field:ident : $ty:ty),* $(,)? })*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
        pub struct $name { $(pub $field: $ty),* }
    )*};
}

messages! {
    /// A request without arguments.
    pub struct Empty {}
    pub struct AnalyzeReq { docs: Vec<DocText> }
    /// One analyzed document: its length in terms and its distinct terms with frequencies.
    pub struct Analyzed { id: u32, len: u32, terms: Vec<(String, u32)> }
    pub struct AnalyzeResp { docs: Vec<Analyzed> }
    pub struct TermPostings { term: String, postings: Vec<Posting> }
    pub struct AddReq { terms: Vec<TermPostings> }
    pub struct AddResp { postings: u64 }
    pub struct LookupReq { terms: Vec<String> }
    pub struct LookupResp { terms: Vec<TermPostings> }
    pub struct IndexResp { docs: u32, postings: u64 }
    pub struct LengthsResp { lengths: Vec<u32> }
    pub struct SearchReq { queries: Vec<Query> }
    pub struct SearchResp { results: Vec<Vec<Hit>> }
}

/// A role's traffic: messages and bytes its server sent plus received, and the connections
/// its client opened through instances' same-host addresses (absent from a role that has no
/// client, or predates the field: 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub messages: u64,
    pub bytes: u64,
    #[serde(default)]
    pub local_connections: u64,
}

impl Counts {
    pub fn of(server: &Server, client: Option<&ServiceClient>) -> Counts {
        let s = server.counters();
        Counts {
            messages: s.messages_sent + s.messages_received,
            bytes: s.bytes_sent + s.bytes_received,
            local_connections: client.map_or(0, |c| c.stats().local_connections),
        }
    }

    pub fn add(&mut self, o: &Counts) {
        self.messages += o.messages;
        self.bytes += o.bytes;
        self.local_connections += o.local_connections;
    }
}

/// LA: analysis of a chunk of documents.
#[volley::service(name = "la")]
pub trait La<C: Codec> {
    /// Each document's length in terms and its distinct terms with frequencies.
    #[sync]
    fn analyze(&self, req: C::W<AnalyzeReq>) -> Result<C::W<AnalyzeResp>, Status>;
}

/// An Index shard: an inverted index over the terms routed to it.
#[volley::service(name = "index")]
pub trait Index<C: Codec> {
    /// Adds postings; returns how many.
    #[sync]
    fn add(&self, req: C::W<AddReq>) -> Result<C::W<AddResp>, Status>;
    /// The postings of the requested terms this shard holds.
    #[sync]
    fn lookup(&self, req: C::W<LookupReq>) -> Result<C::W<LookupResp>, Status>;
}

/// Document: holds the corpus and sends it through LA into the shards.
#[volley::service(name = "document")]
pub trait Document<C: Codec> {
    /// Indexes the whole corpus (one call for the whole run).
    async fn index(&self, req: C::W<Empty>) -> Result<C::W<IndexResp>, Status>;
    /// Every document's length, once indexed.
    #[sync]
    fn lengths(&self, req: C::W<Empty>) -> Result<C::W<LengthsResp>, Status>;
}

/// Main: answers queries by scatter-gather over the shards.
#[volley::service(name = "main")]
pub trait Main<C: Codec> {
    /// Fetches the document lengths from Document (once, before the queries).
    async fn prepare(&self, req: C::W<Empty>) -> Result<C::W<Empty>, Status>;
    /// Answers a chunk of queries.
    async fn search(&self, req: C::W<SearchReq>) -> Result<C::W<SearchResp>, Status>;
}

/// The counters of a role's server (always in the JSON tier, whatever the run's: it is the
/// driver's, not the testbed's traffic, and a role written in another language answers it
/// too). The same method under every role's service name, so it is declared at the level
/// below the traits: a `Method` per service name.
pub fn stats(service: &'static str) -> Method<Json<Empty>, Json<Counts>> {
    Method::new(service, "stats")
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, e.to_string())
}

/// A role of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Document,
    La,
    /// An Index shard (its number only names it).
    Index(u32),
    Main,
}

impl Role {
    pub fn service(self) -> &'static str {
        match self {
            Role::Document => DOCUMENT,
            Role::La => LA,
            Role::Index(_) => INDEX,
            Role::Main => MAIN,
        }
    }

    pub fn name(self) -> String {
        match self {
            Role::Index(i) => format!("index{i}"),
            r => r.service().to_string(),
        }
    }

    /// Every role of a testbed with `shards` Index shards.
    pub fn all(shards: u32) -> Vec<Role> {
        let mut v = vec![Role::Document, Role::La];
        v.extend((0..shards).map(Role::Index));
        v.push(Role::Main);
        v
    }
}

/// What every role of one configuration shares.
#[derive(Debug, Clone)]
pub struct RoleSettings {
    /// The registry controller's address.
    pub registry: String,
    pub mode: Mode,
    /// Items per request (1: single calls).
    pub batch: usize,
    /// The Document role's corpus.
    pub corpus: CorpusSpec,
    /// Connect to instances on this host through their same-host (shm) addresses.
    pub prefer_local: bool,
    /// The roles' servers shed load beyond this adaptive concurrency limit (`None`: they do
    /// not).
    pub concurrency_limit: Option<ConcurrencyLimit>,
}

impl RoleSettings {
    /// The settings of the roles' (and the driver's) service clients.
    pub fn service_config(&self) -> ServiceConfig {
        ServiceConfig::default().mode(self.mode).prefer_local(self.prefer_local)
    }
}

/// A role serving and registered.
pub struct RunningRole {
    pub role: Role,
    pub server: Server,
    /// The role's client of the other roles (Document and Main).
    pub client: Option<ServiceClient>,
    /// The server, as its own `stats` handler sees it (emptied at shutdown to break the cycle).
    stats_slot: Arc<Mutex<Option<Server>>>,
    _registration: Registration,
}

impl RunningRole {
    pub async fn shutdown(self) {
        self.server.shutdown().await;
        self.stats_slot.lock().unwrap().take();
    }

    /// Stops `roles` callers first (Main, Document), so no client is left watching a service
    /// whose instances are going away.
    pub async fn shutdown_all(mut roles: Vec<RunningRole>) {
        roles.sort_by_key(|r| match r.role {
            Role::Main => 0,
            Role::Document => 1,
            Role::La => 2,
            Role::Index(_) => 3,
        });
        for r in roles {
            r.shutdown().await;
        }
    }
}

/// Starts `role` in tier `C`: builds its server, listens on `listen` and on the same-host
/// addresses `local`, registers it with both.
pub async fn start<C: Codec>(
    role: Role,
    settings: &RoleSettings,
    listen: &str,
    local: &[&str],
) -> Result<RunningRole, volley::Error> {
    let connect = || ServiceClient::connect_with(&settings.registry, settings.service_config());
    let (builder, client) = match role {
        Role::La => (Server::builder().serve(LaServer::<C, _>::new(LaRole)), None),
        Role::Index(_) => (Server::builder().serve(IndexServer::<C, _>::new(Shard::default())), None),
        Role::Document => {
            let corpus = settings.corpus.load().map_err(|e| volley::Error::Usage(format!("corpus: {e}")))?;
            let client = connect().await?;
            let role = DocumentRole {
                corpus,
                lengths: Mutex::default(),
                la: LaClient::new(client.clone()),
                index: IndexClient::new(client.clone()),
                batch: settings.batch.max(1),
            };
            (Server::builder().serve(DocumentServer::<C, _>::new(role)), Some(client))
        }
        Role::Main => {
            let client = connect().await?;
            let role = MainRole {
                document: DocumentClient::new(client.clone()),
                index: IndexClient::new(client.clone()),
                lengths: OnceLock::new(),
            };
            (Server::builder().serve(MainServer::<C, _>::new(role)), Some(client))
        }
    };
    let builder = match settings.concurrency_limit {
        Some(limit) => builder.concurrency_limit(limit),
        None => builder,
    };
    let slot: Arc<Mutex<Option<Server>>> = Arc::default();
    let server = {
        let (slot, client) = (slot.clone(), client.clone());
        builder
            .handle_fn(&stats(role.service()), move |_| {
                let server = slot.lock().unwrap().clone();
                Ok(Json(server.map(|s| Counts::of(&s, client.as_ref())).unwrap_or_default()))
            })
            .build()
    };
    *slot.lock().unwrap() = Some(server.clone());
    let registry = Registry::connect(&settings.registry).await?;
    let (_, registration) = server.listen_and_register_with(listen, local, &registry).await?;
    Ok(RunningRole { role, server, client, stats_slot: slot, _registration: registration })
}

struct LaRole;

impl<C: Codec> La<C> for LaRole {
    fn analyze(&self, req: C::W<AnalyzeReq>) -> Result<C::W<AnalyzeResp>, Status> {
        let docs = C::unwrap(req)
            .docs
            .iter()
            .map(|d| {
                let (terms, len) = analyzer::term_frequencies(&d.text);
                Analyzed { id: d.id, len, terms }
            })
            .collect();
        Ok(AnalyzeResp { docs }.into())
    }
}

#[derive(Default)]
struct Shard {
    index: Mutex<HashMap<String, Vec<Posting>>>,
}

impl<C: Codec> Index<C> for Shard {
    fn add(&self, req: C::W<AddReq>) -> Result<C::W<AddResp>, Status> {
        let mut index = self.index.lock().unwrap();
        let mut n = 0;
        for tp in C::unwrap(req).terms {
            n += tp.postings.len() as u64;
            index.entry(tp.term).or_default().extend(tp.postings);
        }
        Ok(AddResp { postings: n }.into())
    }

    fn lookup(&self, req: C::W<LookupReq>) -> Result<C::W<LookupResp>, Status> {
        let index = self.index.lock().unwrap();
        let terms = C::unwrap(req)
            .terms
            .into_iter()
            .filter_map(|t| index.get(&t).map(|p| TermPostings { postings: p.clone(), term: t }))
            .collect();
        Ok(LookupResp { terms }.into())
    }
}

struct DocumentRole<C: Codec> {
    corpus: Vec<DocText>,
    lengths: Mutex<Vec<u32>>,
    la: LaClient<C, ServiceClient>,
    index: IndexClient<C, ServiceClient>,
    batch: usize,
}

impl<C: Codec> Document<C> for DocumentRole<C> {
    async fn index(&self, _: C::W<Empty>) -> Result<C::W<IndexResp>, Status> {
        self.index_corpus().await.map(Into::into).map_err(internal)
    }

    fn lengths(&self, _: C::W<Empty>) -> Result<C::W<LengthsResp>, Status> {
        Ok(LengthsResp { lengths: self.lengths.lock().unwrap().clone() }.into())
    }
}

impl<C: Codec> DocumentRole<C> {
    /// Sends the corpus through LA into the shards, a chunk of `batch` documents at a time.
    async fn index_corpus(&self) -> Result<IndexResp, volley::Error> {
        let mut lengths = vec![0u32; self.corpus.len()];
        let mut postings = 0u64;
        // Batch mode groups a chunk's terms by the shard that owns them on the registry's hash
        // ring (the ring key routing uses), then sends each group keyed by one of its terms.
        let ring = if self.batch > 1 {
            let instances = self.index.inner().instances(INDEX).await?;
            Some(HashRing::new(instances.iter().map(|i| (i.address.as_str(), i.weight))))
        } else {
            None
        };
        for chunk in self.corpus.chunks(self.batch) {
            let analyzed = C::unwrap(self.la.analyze(AnalyzeReq { docs: chunk.to_vec() }.into()).await?);
            for d in &analyzed.docs {
                let slot = lengths
                    .get_mut(d.id as usize)
                    .ok_or_else(|| volley::Error::Usage(format!("LA returned unknown document {}", d.id)))?;
                *slot = d.len;
            }
            let groups = match &ring {
                None => single_postings(analyzed.docs),
                Some(ring) => postings_by_shard(analyzed.docs, ring),
            };
            let calls = groups.into_iter().map(|g| {
                let key = g[0].term.clone();
                async move { self.index.add_keyed(&key, AddReq { terms: g }.into()).await }
            });
            for r in futures_util::future::join_all(calls).await {
                postings += C::unwrap(r?).postings;
            }
        }
        let docs = self.corpus.len() as u32;
        *self.lengths.lock().unwrap() = lengths;
        Ok(IndexResp { docs, postings })
    }
}

/// Single mode: one posting per request, the requests of a chunk sent concurrently.
fn single_postings(docs: Vec<Analyzed>) -> Vec<Vec<TermPostings>> {
    docs.into_iter()
        .flat_map(|d| {
            d.terms
                .into_iter()
                .map(move |(term, tf)| vec![TermPostings { postings: vec![Posting { doc: d.id, tf }], term }])
        })
        .collect()
}

/// Batch mode: every posting of the chunk, grouped by the shard that owns its term.
fn postings_by_shard(docs: Vec<Analyzed>, ring: &HashRing) -> Vec<Vec<TermPostings>> {
    let mut by_term: BTreeMap<String, Vec<Posting>> = BTreeMap::new();
    for d in docs {
        for (term, tf) in d.terms {
            by_term.entry(term).or_default().push(Posting { doc: d.id, tf });
        }
    }
    let mut groups: Vec<Vec<TermPostings>> = vec![Vec::new(); ring.len()];
    for (term, list) in by_term {
        let owner = ring.node(hash_key(&term)).unwrap_or(0);
        groups[owner].push(TermPostings { term, postings: list });
    }
    groups.retain(|g| !g.is_empty());
    groups
}

struct MainRole<C: Codec> {
    document: DocumentClient<C, ServiceClient>,
    index: IndexClient<C, ServiceClient>,
    lengths: OnceLock<(Vec<u32>, CorpusStats)>,
}

impl<C: Codec> Main<C> for MainRole<C> {
    async fn prepare(&self, _: C::W<Empty>) -> Result<C::W<Empty>, Status> {
        let lengths = C::unwrap(self.document.lengths(Empty {}.into()).await?).lengths;
        let stats = CorpusStats::from_lengths(&lengths);
        let _ = self.lengths.set((lengths, stats));
        Ok(Empty {}.into())
    }

    async fn search(&self, req: C::W<SearchReq>) -> Result<C::W<SearchResp>, Status> {
        self.answer(C::unwrap(req).queries).await.map(Into::into).map_err(internal)
    }
}

impl<C: Codec> MainRole<C> {
    /// Main's scatter-gather: one lookup of every term of the chunk to every shard, merged,
    /// ranked.
    async fn answer(&self, queries: Vec<Query>) -> Result<SearchResp, volley::Error> {
        let (lengths, stats) =
            self.lengths.get().ok_or_else(|| volley::Error::Usage("search before prepare".into()))?;
        let terms: BTreeSet<String> = queries.iter().flat_map(|q| q.terms()).collect();
        let req = LookupReq { terms: terms.into_iter().collect() };
        let gathered = self.index.lookup_scatter(req.into()).await?;
        let mut postings: HashMap<String, Vec<Posting>> = HashMap::new();
        for g in gathered {
            for tp in C::unwrap(g.result?).terms {
                // A term lives on one shard; were it on two, its postings would add up and the
                // results would no longer match the oracle, which the testbed checks.
                postings.entry(tp.term).or_default().extend(tp.postings);
            }
        }
        let results =
            queries.iter().map(|q| search::rank(q, &postings, lengths, *stats, search::TOP_K)).collect();
        Ok(SearchResp { results })
    }
}

/// The driver's side: index the corpus, then answer queries, through a [`ServiceClient`].
pub struct Driver<C: Codec> {
    document: DocumentClient<C, ServiceClient>,
    main: MainClient<C, ServiceClient>,
    pub batch: usize,
}

impl<C: Codec> Driver<C> {
    pub fn new(client: ServiceClient, batch: usize) -> Self {
        Driver {
            document: DocumentClient::new(client.clone()),
            main: MainClient::new(client),
            batch: batch.max(1),
        }
    }

    pub async fn index(&self) -> Result<IndexResp, volley::Error> {
        let opts = CallOptions::default().timeout(LONG_CALL);
        Ok(C::unwrap(self.document.index_with(Empty {}.into(), opts).await?))
    }

    pub async fn prepare(&self) -> Result<(), volley::Error> {
        self.main.prepare(Empty {}.into()).await.map(|_| ())
    }

    /// Answers `queries` a chunk at a time, one chunk after the other.
    pub async fn search(&self, queries: &[Query]) -> Result<Vec<Vec<Hit>>, volley::Error> {
        let mut out = Vec::with_capacity(queries.len());
        for chunk in queries.chunks(self.batch) {
            let r = C::unwrap(self.main.search(SearchReq { queries: chunk.to_vec() }.into()).await?).results;
            if r.len() != chunk.len() {
                return Err(volley::Error::Usage(format!("{} answers for {} queries", r.len(), chunk.len())));
            }
            out.extend(r);
        }
        Ok(out)
    }
}
