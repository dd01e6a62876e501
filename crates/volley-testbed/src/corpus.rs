//! The corpus the Document role reads: a directory of text files, or a deterministic synthetic
//! corpus whose words follow a Zipf distribution (a few very frequent words, a long tail of
//! rare ones — the shape of real text, and what makes high- and low-frequency queries differ).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One document: its id (its position in the corpus) and its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
pub struct DocText {
    pub id: u32,
    pub text: String,
}

/// Where the corpus comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum CorpusSpec {
    /// `docs` synthetic documents from `seed`.
    Synthetic { docs: u32, seed: u64 },
    /// Every regular file directly in a directory, in name order.
    Dir(std::path::PathBuf),
}

impl CorpusSpec {
    pub fn load(&self) -> std::io::Result<Vec<DocText>> {
        match self {
            CorpusSpec::Synthetic { docs, seed } => Ok(synthetic(*docs, *seed)),
            CorpusSpec::Dir(dir) => from_dir(dir).map_err(|e| {
                std::io::Error::new(e.kind(), format!("corpus directory {}: {e}", dir.display()))
            }),
        }
    }

    pub fn is_synthetic(&self) -> bool {
        matches!(self, CorpusSpec::Synthetic { .. })
    }
}

/// SplitMix64: a tiny generator whose output is fixed by its definition, so a seed gives the
/// same corpus on every machine and in every version.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Words in the synthetic vocabulary.
pub const VOCABULARY: usize = 5000;
/// Share of tokens that are stop words (the analyzer drops them).
const STOP_SHARE: f64 = 0.25;

/// The synthetic vocabulary: distinct pronounceable words, rank 0 the most frequent.
pub fn vocabulary(seed: u64) -> Vec<String> {
    const ONSETS: &[&str] =
        &["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z", "br", "st", "tr"];
    const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ou"];
    let mut rng = Rng::new(seed ^ 0x05ee_d0f7_0c4b);
    let mut seen = std::collections::HashSet::new();
    let mut words = Vec::with_capacity(VOCABULARY);
    while words.len() < VOCABULARY {
        let syllables = 2 + rng.below(3);
        let mut w = String::new();
        for _ in 0..syllables {
            w.push_str(ONSETS[rng.below(ONSETS.len() as u64) as usize]);
            w.push_str(VOWELS[rng.below(VOWELS.len() as u64) as usize]);
        }
        if !crate::analyzer::is_stop_word(&w) && seen.insert(w.clone()) {
            words.push(w);
        }
    }
    words
}

/// `docs` documents of 40 to 160 words drawn from a Zipf (s = 1) distribution over the
/// vocabulary, with stop words mixed in, some capitalized sentence starts and punctuation.
pub fn synthetic(docs: u32, seed: u64) -> Vec<DocText> {
    let vocab = vocabulary(seed);
    // Cumulative Zipf weights: P(rank r) ∝ 1 / (r + 1).
    let mut cdf = Vec::with_capacity(vocab.len());
    let mut total = 0.0;
    for r in 0..vocab.len() {
        total += 1.0 / (r as f64 + 1.0);
        cdf.push(total);
    }
    let stops = crate::analyzer::STOP_WORDS;
    let mut rng = Rng::new(seed);
    (0..docs)
        .map(|id| {
            let words = 40 + rng.below(121);
            let mut text = String::new();
            let mut sentence_start = true;
            for i in 0..words {
                let word = if rng.unit() < STOP_SHARE {
                    stops[rng.below(stops.len() as u64) as usize]
                } else {
                    let x = rng.unit() * total;
                    &vocab[cdf.partition_point(|&c| c <= x).min(vocab.len() - 1)]
                };
                if i > 0 {
                    text.push(' ');
                }
                if sentence_start {
                    let mut chars = word.chars();
                    if let Some(c) = chars.next() {
                        text.extend(c.to_uppercase());
                        text.push_str(chars.as_str());
                    }
                } else {
                    text.push_str(word);
                }
                sentence_start = rng.below(12) == 0;
                if sentence_start {
                    text.push('.');
                }
            }
            DocText { id, text }
        })
        .collect()
}

/// Every regular file directly in `dir`, in name order, read as UTF-8 (invalid bytes
/// replaced).
pub fn from_dir(dir: &Path) -> std::io::Result<Vec<DocText>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.path())
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no files in corpus directory {}", dir.display()),
        ));
    }
    paths
        .iter()
        .enumerate()
        .map(|(id, p)| {
            let bytes = std::fs::read(p)?;
            Ok(DocText { id: id as u32, text: String::from_utf8_lossy(&bytes).into_owned() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_corpus_is_deterministic_and_zipf_shaped() {
        let a = synthetic(200, 7);
        assert_eq!(a, synthetic(200, 7));
        assert_ne!(a, synthetic(200, 8));
        assert_eq!(a.len(), 200);
        assert!(a.iter().enumerate().all(|(i, d)| d.id == i as u32));
        // The most frequent vocabulary word is far more frequent than a mid-rank one.
        let vocab = vocabulary(7);
        let count = |w: &str| {
            a.iter()
                .map(|d| d.text.split(' ').filter(|t| t.trim_end_matches('.') == w).count())
                .sum::<usize>()
        };
        let (top, mid) = (count(&vocab[0]), count(&vocab[2000]));
        assert!(top > 20 * mid.max(1), "top {top}, mid {mid}");
    }

    #[test]
    fn a_directory_corpus_is_read_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "second").unwrap();
        std::fs::write(dir.path().join("a.txt"), "first").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let docs = from_dir(dir.path()).unwrap();
        assert_eq!(
            docs,
            vec![DocText { id: 0, text: "first".into() }, DocText { id: 1, text: "second".into() }]
        );
        assert!(from_dir(&dir.path().join("sub")).is_err());
    }
}
