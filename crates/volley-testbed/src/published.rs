//! The published cuts that the testbed reproduces, shown next to its own in the table, the JSON
//! object and the plot: the 2009 report on the "MF" message framework measured this search
//! engine testbed with MF's full mode (MF-full), its new design against its old one.

/// The report's figures.
pub const PUBLISHED: Published =
    Published { index_cut_pct: 82.9, query_cut_pct: (82.5, 91.0), bytes_pct_of_old: 10.74 };

/// What the published row of the table and the plot's legend are called.
pub const LABEL: &str = "2009 MF report";

/// Where the figures come from: the indexing and query cuts are the report's section 8.1.2
/// ("Experiment result", MF-full), the bytes its abstract (the serialization work).
pub const CITATION: &str = "Wei Cao and Peisheng Wang, \"Technical Report of MF optimization\", \
technical report on the MF message framework of the SF1 search engine, 27 July 2009: \
section 8.1.2 (indexing and query time, MF-full) and the abstract (bytes sent)";

/// What [`LABEL`]'s figures are, for a reader of the table.
pub const NOTE: &str = "\
(2009 MF report: the cuts published for the MF message framework's full mode, its new design
against its old; one range for all queries, as it depends on the query words, so both query
columns show it; bytes are % of the old design's. Source: Wei Cao and Peisheng Wang,
\"Technical Report of MF optimization\", SF1 search engine, 27 July 2009, section 8.1.2 and
the abstract)";

/// The figures of one design comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    /// Indexing time cut, %.
    pub index_cut_pct: f64,
    /// Query time cut, % (lowest, highest): the report gives a range over the query words, not
    /// a figure per query class.
    pub query_cut_pct: (f64, f64),
    /// Bytes sent, as % of the old design's.
    pub bytes_pct_of_old: f64,
}

impl Published {
    /// The cut per measure of the table and the plot — indexing, high- and low-frequency
    /// queries, messages, bytes — as (lowest, highest), equal for a single figure; `None` where
    /// the report gives none. Bytes as a cut: 100 − % of the old design's.
    pub fn cuts(&self) -> [Option<(f64, f64)>; 5] {
        let one = |v: f64| Some((v, v));
        [
            one(self.index_cut_pct),
            Some(self.query_cut_pct),
            Some(self.query_cut_pct),
            None,
            one(100.0 - self.bytes_pct_of_old),
        ]
    }
}

/// `82.9%` for a single figure, `82.5–91%` for a range.
pub fn range_text((low, high): (f64, f64)) -> String {
    if low == high { format!("{low}%") } else { format!("{low}–{high}%") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_cut_is_a_range_in_both_query_columns() {
        let cuts = PUBLISHED.cuts();
        assert_eq!(cuts[0], Some((82.9, 82.9)));
        assert_eq!(cuts[1], Some((82.5, 91.0)));
        assert_eq!(cuts[2], cuts[1], "one range for both query classes");
        assert_eq!(cuts[3], None);
        assert!((cuts[4].unwrap().0 - 89.26).abs() < 1e-9, "{:?}", cuts[4]);
        assert_eq!(range_text((82.5, 91.0)), "82.5–91%");
        assert_eq!(range_text((82.9, 82.9)), "82.9%");
    }
}
