//! Queries and ranking: AND / OR of terms, top-k by BM25, the brute-force oracle that checks
//! the engine, and the comparison of two runs' results.
//!
//! Scores are computed the same way everywhere — one [`bm25`] function, a query's terms in
//! sorted order, a document's contributions added in that order — so the sharded engine and
//! the brute-force scan produce bit-identical `f64`s. They travel as `f64` through the codecs;
//! [`compare`] requires identical document ids in identical order and scores equal within a
//! relative 1e-9 (a text codec may round a float's last bit when parsing it back).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::analyzer;
use crate::corpus::{DocText, Rng};

/// BM25 parameters (the usual defaults).
pub const K1: f64 = 1.2;
pub const B: f64 = 0.75;
/// Hits per query.
pub const TOP_K: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
pub enum Op {
    And,
    Or,
}

/// A query as a user writes it: words, combined with AND or OR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
pub struct Query {
    pub text: String,
    pub op: Op,
}

impl Query {
    /// The distinct terms of the query, sorted: the order scores are summed in.
    pub fn terms(&self) -> Vec<String> {
        let mut t = analyzer::analyze(&self.text);
        t.sort_unstable();
        t.dedup();
        t
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = match self.op {
            Op::And => " AND ",
            Op::Or => " OR ",
        };
        f.write_str(&self.text.split(' ').collect::<Vec<_>>().join(op))
    }
}

/// One posting: a document and how often the term occurs in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
pub struct Posting {
    pub doc: u32,
    pub tf: u32,
}

/// A ranked document.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
pub struct Hit {
    pub doc: u32,
    pub score: f64,
}

/// Corpus-wide statistics BM25 needs: number of documents and their mean length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CorpusStats {
    pub docs: u32,
    pub avgdl: f64,
}

impl CorpusStats {
    pub fn from_lengths(lengths: &[u32]) -> CorpusStats {
        let total: u64 = lengths.iter().map(|&l| l as u64).sum();
        let docs = lengths.len() as u32;
        CorpusStats { docs, avgdl: if docs == 0 { 0.0 } else { total as f64 / docs as f64 } }
    }
}

/// The BM25 contribution of one term to one document: `idf × tf (k1 + 1) / (tf + k1 (1 − b +
/// b |D| / avgdl))`, with `idf = ln(1 + (N − df + 0.5) / (df + 0.5))`.
pub fn bm25(tf: u32, df: u32, doc_len: u32, stats: CorpusStats) -> f64 {
    let (tf, df, n) = (tf as f64, df as f64, stats.docs as f64);
    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
    let norm = if stats.avgdl > 0.0 { doc_len as f64 / stats.avgdl } else { 1.0 };
    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * norm))
}

/// Best first: higher score, then lower document id.
pub fn by_rank(a: &Hit, b: &Hit) -> std::cmp::Ordering {
    b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc))
}

/// Ranks the documents matching `query`, given each of its terms' postings (a term missing
/// from `postings` occurs nowhere) and every document's length; returns the `k` best.
pub fn rank(
    query: &Query,
    postings: &HashMap<String, Vec<Posting>>,
    lengths: &[u32],
    stats: CorpusStats,
    k: usize,
) -> Vec<Hit> {
    let terms = query.terms();
    // A dense accumulator per document (score, terms matched) and the documents touched:
    // cheaper than a hash map on long posting lists; the additions happen in term order either
    // way.
    let mut acc: Vec<(f64, u32)> = vec![(0.0, 0); lengths.len()];
    let mut touched: Vec<u32> = Vec::new();
    for term in &terms {
        let Some(list) = postings.get(term) else { continue };
        let df = list.len() as u32;
        for p in list {
            let e = &mut acc[p.doc as usize];
            if e.1 == 0 {
                touched.push(p.doc);
            }
            e.0 += bm25(p.tf, df, lengths[p.doc as usize], stats);
            e.1 += 1;
        }
    }
    let need = match query.op {
        Op::And => terms.len() as u32,
        Op::Or => 1,
    };
    let mut hits: Vec<Hit> = touched
        .into_iter()
        .filter(|&d| acc[d as usize].1 >= need)
        .map(|doc| Hit { doc, score: acc[doc as usize].0 })
        .collect();
    hits.sort_by(by_rank);
    hits.truncate(k);
    hits
}

/// The oracle: answers `queries` by scanning every document's terms, with no index at all.
pub fn brute_force(docs: &[Vec<String>], queries: &[Query], k: usize) -> Vec<Vec<Hit>> {
    let lengths: Vec<u32> = docs.iter().map(|d| d.len() as u32).collect();
    let stats = CorpusStats::from_lengths(&lengths);
    // Each document's term counts, counted from its terms (no index: every query scans every
    // document).
    let counts: Vec<HashMap<&str, u32>> = docs
        .iter()
        .map(|d| {
            let mut m = HashMap::new();
            for t in d {
                *m.entry(t.as_str()).or_insert(0) += 1;
            }
            m
        })
        .collect();
    queries
        .iter()
        .map(|q| {
            let terms = q.terms();
            let tf = |doc: &HashMap<&str, u32>, term: &str| doc.get(term).copied().unwrap_or(0);
            let df: Vec<u32> =
                terms.iter().map(|t| counts.iter().filter(|d| tf(d, t) > 0).count() as u32).collect();
            let mut hits = Vec::new();
            for (id, doc) in counts.iter().enumerate() {
                let (mut score, mut matched) = (0.0, 0);
                for (term, &df) in terms.iter().zip(&df) {
                    let f = tf(doc, term);
                    if f > 0 {
                        score += bm25(f, df, lengths[id], stats);
                        matched += 1;
                    }
                }
                let ok = match q.op {
                    Op::And => matched == terms.len() && matched > 0,
                    Op::Or => matched > 0,
                };
                if ok {
                    hits.push(Hit { doc: id as u32, score });
                }
            }
            hits.sort_by(by_rank);
            hits.truncate(k);
            hits
        })
        .collect()
}

/// The two query classes of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryClass {
    /// Terms among the corpus's most frequent: long posting lists.
    High,
    /// Terms from the long tail: a few postings each.
    Low,
}

/// `count` queries of a class, drawn deterministically from the corpus: two or three words,
/// alternating OR and AND. High-frequency words are the 30 terms with the highest document
/// frequency; low-frequency words come from the terms ranked between the middle and three
/// quarters of the term list (by document frequency).
pub fn make_queries(docs: &[DocText], class: QueryClass, count: usize, seed: u64) -> Vec<Query> {
    // Document frequency of each term, and a surface word for it (the query's text).
    let mut df: HashMap<String, (u32, String)> = HashMap::new();
    for d in docs {
        let mut seen = std::collections::HashSet::new();
        for (word, term) in analyzer::tokens(&d.text) {
            if seen.insert(term.clone()) {
                df.entry(term).or_insert((0, word)).0 += 1;
            }
        }
    }
    let mut terms: Vec<(String, u32, String)> = df.into_iter().map(|(t, (n, w))| (t, n, w)).collect();
    terms.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    // A surface word must analyze back to its own term (true for nearly all words).
    terms.retain(|(t, _, w)| analyzer::analyze(w) == [t.clone()]);
    if terms.is_empty() {
        return Vec::new();
    }
    let pool: &[(String, u32, String)] = match class {
        QueryClass::High => &terms[..terms.len().min(30)],
        QueryClass::Low => {
            let (from, to) = (terms.len() / 2, (terms.len() * 3 / 4).max(terms.len() / 2 + 1));
            &terms[from.min(terms.len() - 1)..to.min(terms.len())]
        }
    };
    let mut rng = Rng::new(seed ^ if class == QueryClass::High { 0x41 } else { 0x10 });
    (0..count)
        .map(|i| {
            let words = 2 + rng.below(2) as usize;
            let text: Vec<&str> =
                (0..words).map(|_| pool[rng.below(pool.len() as u64) as usize].2.as_str()).collect();
            Query { text: text.join(" "), op: if i % 2 == 0 { Op::Or } else { Op::And } }
        })
        .collect()
}

/// Where two runs' results first differ.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Index of the query in its list.
    pub query: usize,
    pub expected: Vec<Hit>,
    pub got: Vec<Hit>,
}

/// Compares two runs' results, query by query: the same documents in the same order, and
/// scores equal within a relative 1e-9. Returns the first query that differs.
pub fn compare(expected: &[Vec<Hit>], got: &[Vec<Hit>]) -> Option<Mismatch> {
    let same = |a: &Hit, b: &Hit| {
        a.doc == b.doc && (a.score - b.score).abs() <= 1e-9 * a.score.abs().max(b.score.abs()).max(1e-300)
    };
    let n = expected.len().max(got.len());
    (0..n).find_map(|i| {
        let (e, g) = (expected.get(i), got.get(i));
        let equal = match (e, g) {
            (Some(e), Some(g)) => e.len() == g.len() && e.iter().zip(g).all(|(a, b)| same(a, b)),
            _ => false, // one run answered fewer queries
        };
        (!equal).then(|| Mismatch {
            query: i,
            expected: e.cloned().unwrap_or_default(),
            got: g.cloned().unwrap_or_default(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn postings_of(docs: &[Vec<String>]) -> HashMap<String, Vec<Posting>> {
        let mut m: HashMap<String, Vec<Posting>> = HashMap::new();
        for (id, d) in docs.iter().enumerate() {
            let mut counts: HashMap<&str, u32> = HashMap::new();
            for t in d {
                *counts.entry(t).or_default() += 1;
            }
            for (t, tf) in counts {
                m.entry(t.to_string()).or_default().push(Posting { doc: id as u32, tf });
            }
        }
        m
    }

    #[test]
    fn bm25_matches_a_hand_computed_case() {
        // Three documents of lengths 2, 4 and 6 (avgdl 4); "cat" in docs 0 (tf 1) and 1 (tf 2).
        let docs: Vec<Vec<String>> = [vec!["cat", "dog"], vec!["cat", "cat", "eel", "fox"], vec!["dog"; 6]]
            .iter()
            .map(|d| d.iter().map(|s| s.to_string()).collect())
            .collect();
        let stats = CorpusStats::from_lengths(&[2, 4, 6]);
        assert_eq!(stats, CorpusStats { docs: 3, avgdl: 4.0 });
        // idf = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1.6)
        let idf = 1.6f64.ln();
        // doc 0: tf 1, |D|/avgdl = 0.5: 1 × 2.2 / (1 + 1.2 × (0.25 + 0.375)) = 2.2 / 1.75
        let d0 = idf * 2.2 / 1.75;
        // doc 1: tf 2, |D|/avgdl = 1: 2 × 2.2 / (2 + 1.2) = 4.4 / 3.2
        let d1 = idf * 4.4 / 3.2;
        assert!((bm25(1, 2, 2, stats) - d0).abs() < 1e-12);
        assert!((bm25(2, 2, 4, stats) - d1).abs() < 1e-12);
        let q = Query { text: "cats".into(), op: Op::Or };
        let hits = rank(&q, &postings_of(&docs), &[2, 4, 6], stats, 10);
        assert_eq!(hits.iter().map(|h| h.doc).collect::<Vec<_>>(), vec![1, 0]);
        assert!((hits[0].score - d1).abs() < 1e-12 && (hits[1].score - d0).abs() < 1e-12);
        // AND needs every term; OR adds the contributions.
        let and =
            rank(&Query { text: "cat dog".into(), op: Op::And }, &postings_of(&docs), &[2, 4, 6], stats, 10);
        assert_eq!(and.iter().map(|h| h.doc).collect::<Vec<_>>(), vec![0]);
        let or =
            rank(&Query { text: "cat dog".into(), op: Op::Or }, &postings_of(&docs), &[2, 4, 6], stats, 10);
        assert_eq!(or.len(), 3);
        assert_eq!(brute_force(&docs, &[q], 10), vec![hits]);
    }

    #[test]
    fn rank_agrees_with_brute_force_bit_for_bit() {
        let corpus = crate::corpus::synthetic(300, 3);
        let docs: Vec<Vec<String>> = corpus.iter().map(|d| analyzer::analyze(&d.text)).collect();
        let lengths: Vec<u32> = docs.iter().map(|d| d.len() as u32).collect();
        let stats = CorpusStats::from_lengths(&lengths);
        let index = postings_of(&docs);
        for class in [QueryClass::High, QueryClass::Low] {
            let queries = make_queries(&corpus, class, 20, 9);
            assert_eq!(queries.len(), 20);
            let engine: Vec<_> = queries.iter().map(|q| rank(q, &index, &lengths, stats, TOP_K)).collect();
            let oracle = brute_force(&docs, &queries, TOP_K);
            assert_eq!(engine, oracle, "{class:?}");
            assert!(engine.iter().any(|h| !h.is_empty()));
        }
    }

    #[test]
    fn compare_finds_the_first_differing_query() {
        let a = vec![vec![Hit { doc: 1, score: 2.0 }], vec![Hit { doc: 2, score: 1.0 }], vec![]];
        assert_eq!(compare(&a, &a), None);
        let mut b = a.clone();
        b[1][0].score += 1e-12; // within tolerance
        assert_eq!(compare(&a, &b), None);
        b[1][0].doc = 3;
        assert_eq!(compare(&a, &b).map(|m| m.query), Some(1));
        let mut c = a.clone();
        c[0][0].score = 2.5;
        assert_eq!(compare(&a, &c).map(|m| m.query), Some(0));
        assert_eq!(compare(&a, &a[..2]).map(|m| m.query), Some(2), "a missing answer is a difference");
        let mut d = a.clone();
        d[2].push(Hit { doc: 9, score: 0.1 });
        assert_eq!(compare(&a, &d).map(|m| m.query), Some(2));
    }
}
