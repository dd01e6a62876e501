//! The search-engine testbed of the 2009 report on the "MF" message framework, rebuilt from
//! Volley services: a Document role reads a corpus and sends it through LA (linguistic
//! analysis) into an inverted index sharded over Index instances by term; a Main role answers
//! AND/OR queries, top-k by BM25, by scatter-gather over the shards. A registry controller ties them together.
//!
//! [`report::run`] runs a list of [`run::Config`]s (relayed or direct, single calls or batches,
//! codec tier, transport, one process or one per role) on the same corpus and queries, times
//! indexing and each query class, counts messages and bytes from Volley's counters, checks that
//! every configuration gives the same answers (and, on the synthetic corpus, the answers of a
//! brute-force scan), and reports the cuts against the baseline next to the report's published
//! ones ([`published`]).
//! `volley testbed` is its command line.

pub mod analyzer;
pub mod codec;
pub mod corpus;
pub mod plot;
pub mod published;
pub mod report;
pub mod roles;
pub mod run;
pub mod search;

pub use codec::CodecKind;
pub use corpus::CorpusSpec;
pub use report::{Report, run};
pub use run::{Config, Setup, TestbedError, Transport};
