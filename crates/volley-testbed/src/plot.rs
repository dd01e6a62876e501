//! `--plot FILE.png`: the % cuts against the baseline as grouped bars, one group per measure,
//! one bar per configuration. Text is drawn with Noto Sans embedded in the binary (the
//! `ttf-noto-sans` crate), so no system font is needed.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, SEED_BYTES_PCT, SEED_INDEX_CUT, SEED_QUERY_CUT};

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
    let seed = [SEED_INDEX_CUT, SEED_QUERY_CUT.0, SEED_QUERY_CUT.0, f64::NAN, 100.0 - SEED_BYTES_PCT];
    let low = bars.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0f64, f64::min).floor().max(-200.0);

    let root = BitMapBackend::new(path, (1200, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "volley testbed: % cut against the baseline (relayed + single + general), {} docs, {} shards",
        report.docs, report.setup.shards
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..MEASURES.len() as f64, (low - 5.0)..135f64)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc("% cut vs baseline")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    let groups = bars.len().max(1) as f64;
    let width = 0.8 / groups;
    for (i, (name, values)) in bars.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(values.iter().enumerate().map(|(m, &v)| {
                let x0 = m as f64 + 0.1 + i as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], color.filled())
            }))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    // The seed's figures as black markers over each group (its query cut: the lower bound).
    chart
        .draw_series(seed.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(m, &v)| {
            PathElement::new(vec![(m as f64 + 0.05, v), (m as f64 + 0.95, v)], BLACK.stroke_width(2))
        }))?
        .label("seed (MF-full, new vs old)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(2)));
    chart.draw_series(MEASURES.iter().enumerate().map(|(m, name)| {
        Text::new(
            *name,
            (m as f64 + 0.5, low - 1.0),
            ("sans-serif", 16).into_font().into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Top)),
        )
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}
