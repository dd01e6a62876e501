//! `--plot FILE.png`: the % cuts against the baseline as grouped bars, one group per measure,
//! one bar per configuration. Text is drawn with Noto Sans embedded in the binary (the
//! `ttf-noto-sans` crate), so no system font is needed.

use std::path::Path;
use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::published::{self, PUBLISHED};
use crate::report::Report;

const MEASURES: [&str; 5] =
    ["indexing time", "high-freq. query time", "low-freq. query time", "messages", "bytes"];
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR);
    });
}

/// Draws the report's cuts (every configuration but the baseline) to a PNG at `path`.
pub fn draw(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    register_font();
    let rows: Vec<_> = report.rows().into_iter().filter(|r| !r.baseline).collect();
    // Each configuration's cut per measure (bytes: 100 − % of baseline).
    let bars: Vec<(String, [f64; 5])> = rows
        .iter()
        .map(|r| {
            let v = |x: Option<f64>| x.unwrap_or(0.0);
            (
                r.name.clone(),
                [
                    v(r.index_cut_pct),
                    v(r.query_high_cut_pct),
                    v(r.query_low_cut_pct),
                    v(r.messages_cut_pct),
                    100.0 - r.bytes_pct_of_baseline.unwrap_or(100.0),
                ],
            )
        })
        .collect();
    let (low, high) = y_range(&bars);

    // The legend goes under the chart, not over the bars: a cut is at most 100%, so the axis
    // ends there and leaves no empty band at the top for it.
    let legend_rows = (bars.len() + 1).div_ceil(LEGEND_COLUMNS) as u32;
    let legend_height = 20 + 26 * legend_rows;
    let root = BitMapBackend::new(path, (1200, 600 + legend_height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(600);
    let title = format!(
        "volley testbed: % cut against the baseline (relayed + single + general), {} docs, {} shards",
        report.docs, report.setup.shards
    );
    let mut chart = ChartBuilder::on(&upper)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..MEASURES.len() as f64, low..high)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc("% cut vs baseline")
        .y_label_formatter(&|v| format!("{v:.0}%"))
        .label_style(("sans-serif", 15))
        .draw()?;
    let groups = bars.len().max(1) as f64;
    let width = 0.8 / groups;
    for (i, (_, values)) in bars.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart.draw_series(values.iter().enumerate().map(|(m, &v)| {
            let x0 = m as f64 + 0.1 + i as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], color.filled())
        }))?;
    }
    draw_published(&mut chart)?;
    chart.draw_series(MEASURES.iter().enumerate().map(|(m, name)| {
        Text::new(
            *name,
            (m as f64 + 0.5, low + 4.0),
            ("sans-serif", 16).into_font().into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Top)),
        )
    }))?;
    draw_legend(&lower, &bars)?;
    root.present()?;
    Ok(())
}

/// Legend entries per row under the chart.
const LEGEND_COLUMNS: usize = 3;

/// The y axis, in % cut: from a little under the lowest cut (0 when none is negative, never
/// under -200) up to 100%, the most a cut can be.
pub fn y_range(bars: &[(String, [f64; 5])]) -> (f64, f64) {
    let low = bars.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0f64, f64::min).floor().max(-200.0);
    (low - 5.0, 100.0)
}

/// The legend under the chart: a swatch and the name of each configuration, then the published
/// figures' line.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    bars: &[(String, [f64; 5])],
) -> Result<(), Box<dyn std::error::Error>> {
    let font = ("sans-serif", 15).into_font();
    let at = |i: usize| (70 + (i % LEGEND_COLUMNS) as i32 * 380, 10 + (i / LEGEND_COLUMNS) as i32 * 26);
    for (i, (name, _)) in bars.iter().enumerate() {
        let (x, y) = at(i);
        let color = COLORS[i % COLORS.len()];
        area.draw(&Rectangle::new([(x, y + 2), (x + 14, y + 16)], color.filled()))?;
        area.draw(&Text::new(name.as_str(), (x + 22, y), font.clone()))?;
    }
    let (x, y) = at(bars.len());
    area.draw(&PathElement::new(vec![(x, y + 9), (x + 14, y + 9)], BLACK.stroke_width(2)))?;
    let label = format!(
        "{} (queries: the range {})",
        published::LABEL,
        published::range_text(PUBLISHED.query_cut_pct)
    );
    area.draw(&Text::new(label, (x + 22, y), font))?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The published figures over each measure's group: a line for a single figure, a grey band
/// between two lines for a range (the query cut).
fn draw_published(chart: &mut Chart<'_, '_>) -> Result<(), Box<dyn std::error::Error>> {
    let marks = published_marks();
    chart.draw_series(marks.iter().filter(|m| m.low < m.high).map(|m| {
        Rectangle::new(
            [(m.measure as f64 + 0.05, m.low), (m.measure as f64 + 0.95, m.high)],
            BLACK.mix(0.15).filled(),
        )
    }))?;
    chart.draw_series(
        marks
            .iter()
            .flat_map(|m| [m.low, m.high].map(|v| (m.measure as f64, v)))
            .map(|(x, v)| PathElement::new(vec![(x + 0.05, v), (x + 0.95, v)], BLACK.stroke_width(2))),
    )?;
    Ok(())
}

/// A published figure drawn over a measure's group: from `low` to `high` (equal for a single
/// figure), in % cut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    /// Index into the plot's measures.
    pub measure: usize,
    pub low: f64,
    pub high: f64,
}

/// What the plot draws of the published figures: the same cuts as the table's published row.
pub fn published_marks() -> Vec<Mark> {
    let cuts = PUBLISHED.cuts().into_iter().enumerate();
    cuts.filter_map(|(measure, cut)| cut.map(|(low, high)| Mark { measure, low, high })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::CorpusSpec;
    use crate::report::COLUMNS;
    use crate::run::Setup;

    /// The table's published row, cell by cell (by the columns' widths), as numbers per measure:
    /// each cut column, and bytes as a cut (100 − the "of base" cell).
    fn table_figures() -> [Option<(f64, f64)>; 5] {
        let setup = Setup {
            corpus: CorpusSpec::Synthetic { docs: 10, seed: 1 },
            shards: 1,
            queries: 1,
            query_seed: 1,
            processes: false,
            exe: None,
            role_commands: Vec::new(),
            progress: false,
            adaptive_limit: false,
        };
        let report = Report {
            setup,
            docs: 10,
            outcomes: Vec::new(),
            oracle_checked: false,
            mismatch: None,
            wall_s: 0.0,
        };
        let table = report.table();
        let row: Vec<char> =
            table.lines().find(|l| l.starts_with(published::LABEL)).unwrap().chars().collect();
        let mut at = 26;
        let cells: Vec<String> = COLUMNS
            .iter()
            .map(|(_, width)| {
                let cell: String = row.get(at + 1..at + 1 + width).unwrap_or_default().iter().collect();
                at += 1 + width;
                cell.trim().trim_end_matches('%').to_string()
            })
            .collect();
        let number = |s: &str| s.parse::<f64>().unwrap_or_else(|e| panic!("{s:?}: {e}\n{table}"));
        let range = |cell: &String| {
            (!cell.is_empty()).then(|| match cell.split_once('–') {
                Some((low, high)) => (number(low), number(high)),
                None => (number(cell), number(cell)),
            })
        };
        let bytes = range(&cells[9]).map(|(low, high)| (100.0 - high, 100.0 - low));
        [range(&cells[1]), range(&cells[3]), range(&cells[5]), range(&cells[7]), bytes]
    }

    /// A cut is at most 100%: the axis ends there, whatever the bars; it starts under the
    /// lowest (negative) cut.
    #[test]
    fn the_percentage_axis_ends_at_100() {
        let bars = |v: [f64; 5]| vec![("a".to_string(), v)];
        assert_eq!(y_range(&bars([87.2, 82.1, 94.9, 99.9, 75.9])), (-5.0, 100.0));
        assert_eq!(y_range(&bars([-31.5, 20.0, 10.0, 50.0, 100.0])), (-37.0, 100.0));
        assert_eq!(y_range(&bars([-900.0, 0.0, 0.0, 0.0, 0.0])), (-205.0, 100.0));
    }

    #[test]
    fn the_plot_draws_the_published_figures_of_the_table() {
        let table = table_figures();
        let mut drawn = [None; 5];
        for m in published_marks() {
            drawn[m.measure] = Some((m.low, m.high));
        }
        for (measure, (t, d)) in MEASURES.iter().zip(table.iter().zip(drawn)) {
            let same = match (t, d) {
                (Some(t), Some(d)) => (t.0 - d.0).abs() < 1e-9 && (t.1 - d.1).abs() < 1e-9,
                (t, d) => t.is_none() && d.is_none(),
            };
            assert!(same, "{measure}: the table shows {t:?}, the plot draws {d:?}");
        }
        // The query cut is drawn as a range over both query groups.
        assert!(drawn[1].is_some_and(|(low, high)| low < high), "{drawn:?}");
        assert_eq!(drawn[1], drawn[2]);
    }
}
