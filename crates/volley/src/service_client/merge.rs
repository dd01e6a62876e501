//! Merging the gathered results of a scatter-gather.

use std::cmp::Ordering;

/// Merges lists that are each sorted by `cmp` (best first) into the `k` best overall, in
/// order: the merge step of a scatter-gather over shards that each return their top k
/// (the MF report's merge of shard results). Takes O(k × number of lists) comparisons; the lists are few (one per
/// instance).
pub fn merge_sorted<T>(lists: Vec<Vec<T>>, k: usize, mut cmp: impl FnMut(&T, &T) -> Ordering) -> Vec<T> {
    let mut heads: Vec<std::vec::IntoIter<T>> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(k.min(heads.iter().map(|h| h.len()).sum()));
    while out.len() < k {
        let mut best: Option<(usize, &T)> = None;
        for (i, head) in heads.iter().enumerate() {
            let Some(candidate) = head.as_slice().first() else { continue };
            if best.is_none_or(|(_, b)| cmp(candidate, b) == Ordering::Less) {
                best = Some((i, candidate));
            }
        }
        let Some((b, _)) = best else { break };
        out.push(heads[b].next().expect("has a head"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sorted_takes_the_k_best_in_order() {
        let lists = vec![vec![9, 5, 1], vec![8, 7, 2], vec![], vec![10]];
        assert_eq!(merge_sorted(lists.clone(), 4, |a, b| b.cmp(a)), vec![10, 9, 8, 7]);
        assert_eq!(merge_sorted(lists.clone(), 100, |a, b| b.cmp(a)), vec![10, 9, 8, 7, 5, 2, 1]);
        assert_eq!(merge_sorted(lists, 0, |a, b| b.cmp(a)), Vec::<i32>::new());
    }
}
