//! A histogram cheap enough to record on every call: log-linear buckets of atomic counters
//! (the `histogram` crate's `AtomicHistogram`: one relaxed `fetch_add` per record, no lock),
//! plus the sum of the values for Prometheus. Quantiles are read from a snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use histogram::{AtomicHistogram, Histogram as Counts};

/// The bucket layout of a histogram: relative precision and the largest value kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// 2^-grouping_power is the relative width of a bucket (4: 6.25 %).
    grouping_power: u8,
    /// Values up to 2^max_value_power; larger ones are recorded as the largest.
    max_value_power: u8,
    /// Quantiles are reported as their bucket's lowest value, not its highest: a batch of 64
    /// reads 64, where a latency is better overstated than understated.
    report_lowest: bool,
}

impl Shape {
    /// Latencies in nanoseconds: 6.25 % buckets up to 2^36 ns (68 s), 528 buckets.
    pub(crate) const LATENCY_NS: Shape =
        Shape { grouping_power: 4, max_value_power: 36, report_lowest: false };
    /// Counts per batch or per frame: exact below 64, 3 % buckets above, up to 2^17 (a chunk
    /// holds at most 65,536), 416 buckets.
    pub(crate) const COUNT: Shape = Shape { grouping_power: 5, max_value_power: 17, report_lowest: true };
}

/// A histogram recorded from any thread without a lock.
pub(crate) struct Histogram {
    counts: AtomicHistogram,
    sum: AtomicU64,
    max: u64,
    report_lowest: bool,
}

impl Histogram {
    pub(crate) fn new(shape: Shape) -> Histogram {
        let counts = AtomicHistogram::new(shape.grouping_power, shape.max_value_power)
            .expect("the shapes above are valid");
        let max = (1u64 << shape.max_value_power) - 1;
        Histogram { counts, sum: AtomicU64::new(0), max, report_lowest: shape.report_lowest }
    }

    /// Records `count` observations of `value`.
    #[inline]
    pub(crate) fn record(&self, value: u64, count: u64) {
        let value = value.min(self.max);
        // Cannot fail: the value was clamped into range.
        let _ = self.counts.add(value, count);
        self.sum.fetch_add(value.wrapping_mul(count), Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self.counts.load(),
            sum: self.sum.load(Relaxed),
            report_lowest: self.report_lowest,
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Clone)]
pub(crate) struct Snapshot {
    counts: Counts,
    sum: u64,
    report_lowest: bool,
}

impl Snapshot {
    pub(crate) fn count(&self) -> u64 {
        self.counts.as_slice().iter().sum()
    }

    pub(crate) fn sum(&self) -> u64 {
        self.sum
    }

    /// The bucket holding quantile `q` (0.0–1.0), by its highest value (or its lowest, for
    /// counts: see [`Shape`]); `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        let b = self.counts.quantile_bucket(q).ok().flatten()?;
        Some(if self.report_lowest { b.start() } else { b.end() })
    }

    /// What was recorded since `earlier` (a snapshot of the same histogram).
    pub(crate) fn since(&self, earlier: &Snapshot) -> Snapshot {
        let counts = self.counts.wrapping_sub(&earlier.counts).unwrap_or_else(|_| self.counts.clone());
        Snapshot { counts, sum: self.sum.wrapping_sub(earlier.sum), report_lowest: self.report_lowest }
    }

    /// For each bound in `bounds` (ascending), how many values were at most it: Prometheus's
    /// cumulative `le` buckets, from the buckets that end at or below the bound. Exact where a
    /// bucket ends at the bound: every count below 64 (their buckets hold one value each).
    /// Powers of two start buckets, so at a power-of-two bound on the latency shape the values
    /// equal to it count with the next bound: a nanosecond, not a bucket, off.
    pub(crate) fn cumulative(&self, bounds: &[u64]) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(bounds.len());
        let (mut buckets, mut below) = (self.counts.iter().peekable(), 0u64);
        for &bound in bounds {
            while let Some(b) = buckets.next_if(|b| b.end() <= bound) {
                below += b.count();
            }
            out.push((bound, below));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sums_and_quantiles_follow_what_was_recorded() {
        let h = Histogram::new(Shape::LATENCY_NS);
        for v in 1..=1000u64 {
            h.record(v * 1000, 1);
        }
        h.record(5, 10);
        let s = h.snapshot();
        assert_eq!(s.count(), 1010);
        assert_eq!(s.sum(), (1..=1000u64).map(|v| v * 1000).sum::<u64>() + 50);
        let p50 = s.quantile(0.5).unwrap();
        assert!((470_000..=540_000).contains(&p50), "p50 {p50}");
        let p999 = s.quantile(0.999).unwrap();
        assert!((990_000..=1_070_000).contains(&p999), "p99.9 {p999}");
        assert_eq!(s.quantile(0.0), Some(5));
    }

    #[test]
    fn a_snapshot_since_another_holds_only_what_came_between() {
        let h = Histogram::new(Shape::COUNT);
        h.record(4, 3);
        let before = h.snapshot();
        h.record(100, 2);
        let delta = h.snapshot().since(&before);
        assert_eq!(delta.count(), 2);
        assert_eq!(delta.sum(), 200);
        // Counts read as recorded: a batch of 100 is 100, not its bucket's top.
        assert_eq!(delta.quantile(0.5), Some(100));
    }

    #[test]
    fn cumulative_counts_are_exact_at_powers_of_two() {
        let h = Histogram::new(Shape::LATENCY_NS);
        h.record(1023, 1);
        h.record(1024, 1);
        h.record(1025, 1);
        h.record(1 << 40, 1); // over the top: kept as the largest value
        let c = h.snapshot().cumulative(&[1024, 2048, 1 << 36, u64::MAX]);
        assert_eq!(c, vec![(1024, 1), (2048, 3), (1 << 36, 4), (u64::MAX, 4)]);
    }

    #[test]
    fn a_count_bucket_holds_the_values_at_most_its_bound() {
        let h = Histogram::new(Shape::COUNT);
        for v in [0, 1, 1, 2, 3, 4, 5] {
            h.record(v, 1);
        }
        // Prometheus's `le`: a frame of one message is in the bucket `le="1"`.
        let c = h.snapshot().cumulative(&[1, 2, 4, 8]);
        assert_eq!(c, vec![(1, 3), (2, 4), (4, 6), (8, 7)]);
    }
}
