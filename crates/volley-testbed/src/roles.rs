//! The testbed's roles as Volley services, and their messages.
//!
//! - **Document** (`document`): holds the corpus; `index` sends it through LA and into the
//!   Index shards, a chunk of documents at a time; `lengths` gives every document's length.
//! - **LA** (`la`): `analyze` turns a chunk of documents into term frequencies and lengths.
//! - **Index** (`index`, one instance per shard): `add` takes postings for many terms, `lookup`
//!   returns the postings of the requested terms it holds. Terms are routed to shards by key
//!   hash: a single posting with `call_keyed(term)`; a chunk grouped by the shard that owns
//!   each term on the registry's hash ring, one `call_keyed` per shard.
//! - **Main** (`main`): `search` answers a chunk of queries by a scatter-gather of one
//!   `lookup` to every shard, merging the posting lists and ranking by BM25.
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
use volley::codec::Bitcode;
use volley::registry::{
    HashRing, InstanceSpec, LeaseConfig, Mode, Registration, Registry, ServiceConfig, hash_key,
};
use volley::{CallOptions, Code, Method, Server, ServerBuilder, ServiceClient, Status};

use crate::analyzer;
use crate::codec::Codec;
use crate::corpus::{CorpusSpec, DocText};
use crate::search::{self, CorpusStats, Hit, Posting, Query};

pub const DOCUMENT: &str = "document";
pub const LA: &str = "la";
pub const INDEX: &str = "index";
pub const MAIN: &str = "main";

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
    /// A server's traffic: messages and bytes sent plus received.
    pub struct Counts { messages: u64, bytes: u64 }
}

impl Counts {
    pub fn of(server: &Server) -> Counts {
        let s = server.counters();
        Counts { messages: s.messages_sent + s.messages_received, bytes: s.bytes_sent + s.bytes_received }
    }

    pub fn add(&mut self, o: &Counts) {
        self.messages += o.messages;
        self.bytes += o.bytes;
    }
}

pub type M<C, Req, Resp> = Method<<C as Codec>::W<Req>, <C as Codec>::W<Resp>>;

pub fn analyze<C: Codec>() -> M<C, AnalyzeReq, AnalyzeResp> {
    Method::new(LA, "analyze")
}
pub fn add<C: Codec>() -> M<C, AddReq, AddResp> {
    Method::new(INDEX, "add")
}
pub fn lookup<C: Codec>() -> M<C, LookupReq, LookupResp> {
    Method::new(INDEX, "lookup")
}
pub fn index<C: Codec>() -> M<C, Empty, IndexResp> {
    Method::new(DOCUMENT, "index")
}
pub fn lengths<C: Codec>() -> M<C, Empty, LengthsResp> {
    Method::new(DOCUMENT, "lengths")
}
pub fn prepare<C: Codec>() -> M<C, Empty, Empty> {
    Method::new(MAIN, "prepare")
}
pub fn search<C: Codec>() -> M<C, SearchReq, SearchResp> {
    Method::new(MAIN, "search")
}
/// The counters of a role's server (always in the fast tier: it is the driver's, not the
/// testbed's traffic).
pub fn stats(service: &'static str) -> Method<Bitcode<Empty>, Bitcode<Counts>> {
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
}

/// A role serving and registered.
pub struct RunningRole {
    pub role: Role,
    pub server: Server,
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

/// Starts `role` in tier `C`: builds its server, listens on `listen`, registers it.
pub async fn start<C: Codec>(
    role: Role,
    settings: &RoleSettings,
    listen: &str,
) -> Result<RunningRole, volley::Error> {
    let connect = || async {
        ServiceClient::connect_with(
            &settings.registry,
            ServiceConfig { mode: settings.mode, ..Default::default() },
        )
        .await
    };
    let builder = match role {
        Role::La => la::<C>(),
        Role::Index(_) => shard::<C>(),
        Role::Document => {
            let corpus = settings.corpus.load().map_err(|e| volley::Error::Usage(format!("corpus: {e}")))?;
            document::<C>(Arc::new(DocumentState {
                corpus,
                lengths: Mutex::default(),
                client: connect().await?,
                batch: settings.batch.max(1),
            }))
        }
        Role::Main => {
            main_role::<C>(Arc::new(MainState { client: connect().await?, lengths: OnceLock::new() }))
        }
    };
    let slot: Arc<Mutex<Option<Server>>> = Arc::default();
    let server = {
        let slot = slot.clone();
        builder
            .handle_fn(&stats(role.service()), move |_| {
                Ok(Bitcode(slot.lock().unwrap().as_ref().map(Counts::of).unwrap_or_default()))
            })
            .build()
    };
    *slot.lock().unwrap() = Some(server.clone());
    let bound = server.listen(listen).await?;
    let registry = Registry::connect(&settings.registry).await?;
    let registration = registry
        .register(&server, vec![InstanceSpec::new(role.service(), bound.to_string())], LeaseConfig::default())
        .await?;
    Ok(RunningRole { role, server, stats_slot: slot, _registration: registration })
}

/// LA: analysis of a chunk of documents.
fn la<C: Codec>() -> ServerBuilder {
    Server::builder().handle_fn(&analyze::<C>(), |req| {
        let req = C::unwrap(req);
        let docs = req
            .docs
            .iter()
            .map(|d| {
                let (terms, len) = analyzer::term_frequencies(&d.text);
                Analyzed { id: d.id, len, terms }
            })
            .collect();
        Ok(AnalyzeResp { docs }.into())
    })
}

/// An Index shard: an inverted index over the terms routed to it.
fn shard<C: Codec>() -> ServerBuilder {
    let index: Arc<Mutex<HashMap<String, Vec<Posting>>>> = Arc::default();
    let i2 = index.clone();
    Server::builder()
        .handle_fn(&add::<C>(), move |req| {
            let req = C::unwrap(req);
            let mut index = i2.lock().unwrap();
            let mut n = 0;
            for tp in req.terms {
                n += tp.postings.len() as u64;
                index.entry(tp.term).or_default().extend(tp.postings);
            }
            Ok(AddResp { postings: n }.into())
        })
        .handle_fn(&lookup::<C>(), move |req| {
            let req = C::unwrap(req);
            let index = index.lock().unwrap();
            let terms = req
                .terms
                .into_iter()
                .filter_map(|t| index.get(&t).map(|p| TermPostings { postings: p.clone(), term: t }))
                .collect();
            Ok(LookupResp { terms }.into())
        })
}

struct DocumentState {
    corpus: Vec<DocText>,
    lengths: Mutex<Vec<u32>>,
    client: ServiceClient,
    batch: usize,
}

fn document<C: Codec>(st: Arc<DocumentState>) -> ServerBuilder {
    let s2 = st.clone();
    Server::builder()
        .handle(&index::<C>(), move |_| {
            let st = st.clone();
            async move { index_corpus::<C>(&st).await.map(Into::into).map_err(internal) }
        })
        .handle_fn(&lengths::<C>(), move |_| {
            Ok(LengthsResp { lengths: s2.lengths.lock().unwrap().clone() }.into())
        })
}

/// Sends the corpus through LA into the shards, a chunk of `batch` documents at a time.
async fn index_corpus<C: Codec>(st: &DocumentState) -> Result<IndexResp, volley::Error> {
    let client = &st.client;
    let mut lengths = vec![0u32; st.corpus.len()];
    let mut postings = 0u64;
    // Batch mode groups a chunk's terms by the shard that owns them on the registry's hash
    // ring (the ring key routing uses), then sends each group keyed by one of its terms.
    let ring = if st.batch > 1 {
        let instances = client.instances(INDEX).await?;
        Some(HashRing::new(instances.iter().map(|i| (i.address.as_str(), i.weight))))
    } else {
        None
    };
    let check = |results: Vec<Result<C::W<AddResp>, volley::Error>>| -> Result<u64, volley::Error> {
        results.into_iter().map(|r| r.map(|a| C::unwrap(a).postings)).sum()
    };
    for chunk in st.corpus.chunks(st.batch) {
        let analyzed =
            C::unwrap(client.call(&analyze::<C>(), AnalyzeReq { docs: chunk.to_vec() }.into()).await?);
        for d in &analyzed.docs {
            let slot = lengths
                .get_mut(d.id as usize)
                .ok_or_else(|| volley::Error::Usage(format!("LA returned unknown document {}", d.id)))?;
            *slot = d.len;
        }
        match &ring {
            None => {
                for d in analyzed.docs {
                    let calls = d.terms.into_iter().map(|(term, tf)| async move {
                        let req = AddReq {
                            terms: vec![TermPostings { postings: vec![Posting { doc: d.id, tf }], term }],
                        };
                        let key = req.terms[0].term.clone();
                        client.call_keyed(&add::<C>(), &key, req.into()).await
                    });
                    postings += check(futures_util::future::join_all(calls).await)?;
                }
            }
            Some(ring) => {
                let mut by_term: BTreeMap<String, Vec<Posting>> = BTreeMap::new();
                for d in analyzed.docs {
                    for (term, tf) in d.terms {
                        by_term.entry(term).or_default().push(Posting { doc: d.id, tf });
                    }
                }
                let mut groups: Vec<Vec<TermPostings>> = vec![Vec::new(); ring.len()];
                for (term, list) in by_term {
                    let owner = ring.node(hash_key(&term)).unwrap_or(0);
                    groups[owner].push(TermPostings { term, postings: list });
                }
                let calls = groups.into_iter().filter(|g| !g.is_empty()).map(|g| async move {
                    let key = g[0].term.clone();
                    client.call_keyed(&add::<C>(), &key, AddReq { terms: g }.into()).await
                });
                postings += check(futures_util::future::join_all(calls).await)?;
            }
        }
    }
    let docs = st.corpus.len() as u32;
    *st.lengths.lock().unwrap() = lengths;
    Ok(IndexResp { docs, postings })
}

struct MainState {
    client: ServiceClient,
    lengths: OnceLock<(Vec<u32>, CorpusStats)>,
}

fn main_role<C: Codec>(st: Arc<MainState>) -> ServerBuilder {
    let s2 = st.clone();
    Server::builder()
        .handle(&prepare::<C>(), move |_| {
            let st = s2.clone();
            async move {
                let r = st.client.call(&lengths::<C>(), Empty {}.into()).await.map_err(internal)?;
                let lengths = C::unwrap(r).lengths;
                let stats = CorpusStats::from_lengths(&lengths);
                let _ = st.lengths.set((lengths, stats));
                Ok(Empty {}.into())
            }
        })
        .handle(&search::<C>(), move |req| {
            let st = st.clone();
            async move { answer::<C>(&st, C::unwrap(req).queries).await.map(Into::into).map_err(internal) }
        })
}

/// Main's scatter-gather: one lookup of every term of the chunk to every shard, merged, ranked.
async fn answer<C: Codec>(st: &MainState, queries: Vec<Query>) -> Result<SearchResp, volley::Error> {
    let (lengths, stats) =
        st.lengths.get().ok_or_else(|| volley::Error::Usage("search before prepare".into()))?;
    let terms: BTreeSet<String> = queries.iter().flat_map(|q| q.terms()).collect();
    let req = LookupReq { terms: terms.into_iter().collect() };
    let gathered = st.client.scatter(&lookup::<C>(), req.into()).await?;
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

/// The driver's side: index the corpus, then answer queries, through a [`ServiceClient`].
pub struct Driver<C: Codec> {
    pub client: ServiceClient,
    pub batch: usize,
    _c: std::marker::PhantomData<C>,
}

impl<C: Codec> Driver<C> {
    pub fn new(client: ServiceClient, batch: usize) -> Self {
        Driver { client, batch: batch.max(1), _c: std::marker::PhantomData }
    }

    pub async fn index(&self) -> Result<IndexResp, volley::Error> {
        let opts = CallOptions::default().timeout(LONG_CALL);
        Ok(C::unwrap(self.client.call_with(&index::<C>(), Empty {}.into(), opts).await?))
    }

    pub async fn prepare(&self) -> Result<(), volley::Error> {
        self.client.call(&prepare::<C>(), Empty {}.into()).await.map(|_| ())
    }

    /// Answers `queries` a chunk at a time, one chunk after the other.
    pub async fn search(&self, queries: &[Query]) -> Result<Vec<Vec<Hit>>, volley::Error> {
        let mut out = Vec::with_capacity(queries.len());
        for chunk in queries.chunks(self.batch) {
            let r = self.client.call(&search::<C>(), SearchReq { queries: chunk.to_vec() }.into()).await?;
            let r = C::unwrap(r).results;
            if r.len() != chunk.len() {
                return Err(volley::Error::Usage(format!("{} answers for {} queries", r.len(), chunk.len())));
            }
            out.extend(r);
        }
        Ok(out)
    }
}
