//! Cutting a sequence into owned chunks: batch calls into messages, a handler's batch into parts
//! of at most `max_batch`.

/// Cuts `items` into chunks of `size` (the last may be shorter; none is empty). Each item is
/// moved once, and only as the chunks are taken, so an iterator of any length passes through
/// in bounded memory.
pub(crate) fn chunks<T>(items: impl IntoIterator<Item = T>, size: usize) -> impl Iterator<Item = Vec<T>> {
    let size = size.max(1);
    let mut items = items.into_iter();
    std::iter::from_fn(move || {
        let chunk: Vec<T> = items.by_ref().take(size).collect();
        (!chunk.is_empty()).then_some(chunk)
    })
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_keep_order_and_size() {
        let c: Vec<Vec<u32>> = chunks(0..10, 4).collect();
        assert_eq!(c, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(chunks(Vec::<u32>::new(), 4).count(), 0);
        assert_eq!(chunks(0..3, 0).count(), 3, "a size of 0 is taken as 1");
    }
}
