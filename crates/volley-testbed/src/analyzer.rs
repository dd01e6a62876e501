//! Linguistic analysis (the LA role's work): split text into words, lower-case them, drop stop
//! words, and reduce each word to a stem with a small suffix-stripping stemmer.
//!
//! The stemmer is deliberately simple (a handful of English suffix rules, never shortening a
//! word below three letters): the testbed needs analysis that is deterministic and costs
//! something per token, not a linguistically complete one.

/// Words too common to index. Sorted, for a binary search.
pub const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by",
    "can", "could", "do", "for", "from", "had", "has", "have", "he", "her", "his", "if", "in", "into", "is",
    "it", "its", "no", "not", "of", "on", "one", "or", "our", "she", "so", "some", "than", "that", "the",
    "their", "them", "then", "there", "these", "they", "this", "to", "up", "was", "we", "were", "what",
    "when", "which", "who", "will", "with", "would", "you",
];

pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.binary_search(&word).is_ok()
}

/// The stem of a lower-case word: strips one inflectional suffix (`-ies` → `-y`, `-sses` →
/// `-ss`, `-ing`, `-ed`, `-ly`, `-es` after a sibilant, a plural `-s`), keeping at least three
/// letters.
pub fn stem(word: &str) -> String {
    const MIN: usize = 3;
    let long_enough = |suffix: &str| word.len() >= suffix.len() + MIN;
    if word.ends_with("ies") && long_enough("ies") {
        return format!("{}y", &word[..word.len() - 3]);
    }
    if word.ends_with("sses") {
        return word[..word.len() - 2].to_string();
    }
    for suffix in ["ing", "ed", "ly"] {
        if word.ends_with(suffix) && long_enough(suffix) {
            return word[..word.len() - suffix.len()].to_string();
        }
    }
    for sibilant in ["ches", "shes", "xes", "zes"] {
        if word.ends_with(sibilant) && long_enough("es") {
            return word[..word.len() - 2].to_string();
        }
    }
    if word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") && long_enough("s") {
        return word[..word.len() - 1].to_string();
    }
    word.to_string()
}

/// Every indexable token of `text`, in order, as (the lower-cased word, its term): words are
/// maximal runs of alphanumeric characters; stop words are dropped.
pub fn tokens(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).filter_map(|w| {
        let lower = w.to_lowercase();
        if is_stop_word(&lower) {
            return None;
        }
        let term = stem(&lower);
        Some((lower, term))
    })
}

/// The terms of `text`, in order (stop words dropped, stems kept).
pub fn analyze(text: &str) -> Vec<String> {
    tokens(text).map(|(_, term)| term).collect()
}

/// The distinct terms of `text` with their frequencies, sorted by term, and the document's
/// length in terms (what BM25 calls |D|).
pub fn term_frequencies(text: &str) -> (Vec<(String, u32)>, u32) {
    let mut terms = analyze(text);
    let len = terms.len() as u32;
    terms.sort_unstable();
    let mut out: Vec<(String, u32)> = Vec::new();
    for t in terms {
        match out.last_mut() {
            Some((last, n)) if *last == t => *n += 1,
            _ => out.push((t, 1)),
        }
    }
    (out, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted_and_dropped() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]), "STOP_WORDS must stay sorted");
        assert!(is_stop_word("the") && is_stop_word("with") && !is_stop_word("volley"));
        assert_eq!(analyze("The cat and THE hat"), vec!["cat", "hat"]);
    }

    #[test]
    fn the_stemmer_strips_one_suffix_and_keeps_three_letters() {
        for (word, want) in [
            ("running", "runn"),
            ("jumped", "jump"),
            ("quickly", "quick"),
            ("ponies", "pony"),
            ("classes", "class"),
            ("boxes", "box"),
            ("churches", "church"),
            ("cats", "cat"),
            ("glass", "glass"),
            ("status", "status"),
            ("is", "is"),
            ("bed", "bed"),
            ("sing", "sing"),
            ("ties", "tie"),
        ] {
            assert_eq!(stem(word), want, "stem({word})");
        }
    }

    #[test]
    fn analysis_lower_cases_splits_and_counts() {
        assert_eq!(analyze("Searching, searched; SEARCHES!"), vec!["search", "search", "search"]);
        let (tf, len) = term_frequencies("Cats chase cats. The dog watches the cats");
        assert_eq!(len, 6);
        assert_eq!(tf, vec![("cat".into(), 3), ("chase".into(), 1), ("dog".into(), 1), ("watch".into(), 1)]);
        let surface: Vec<_> = tokens("Cats ran").collect();
        assert_eq!(surface, vec![("cats".into(), "cat".into()), ("ran".into(), "ran".into())]);
    }
}
