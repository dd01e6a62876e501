//! The report: one row per configuration with its cuts against the baseline, as a table (next
//! to the published figures, see [`crate::published`]) or one JSON object; the agreement check.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Instant;

use serde::Serialize;

use crate::corpus::CorpusSpec;
use crate::published::{self, PUBLISHED};
use crate::run::{self, Config, Outcome, Setup, TestbedError, Workload, mode_name};
use crate::search::{self, Hit, QueryClass};

/// A run of the testbed: every configuration's outcome and whether they agree.
pub struct Report {
    pub setup: Setup,
    pub docs: usize,
    pub outcomes: Vec<Outcome>,
    /// Whether the answers were also checked against the brute-force scan.
    pub oracle_checked: bool,
    /// The first disagreement, described (`None`: all agree).
    pub mismatch: Option<String>,
    pub wall_s: f64,
}

/// Runs `configs` one after the other, each from a fresh start, and checks their answers.
/// Ctrl-C stops the run (role processes are killed, sockets removed).
pub fn run(setup: &Setup, configs: &[Config]) -> Result<Report, TestbedError> {
    let started = Instant::now();
    let work = Workload::new(setup)?;
    let rt = tokio::runtime::Runtime::new()?;
    let bar = progress_bar(setup.progress, configs.len());
    let outcomes = rt.block_on(async {
        let all = async {
            let mut out = Vec::new();
            for &c in configs {
                bar.set_message(c.name());
                out.push(run::run_config(setup, &work, c).await?);
                bar.inc(1);
            }
            Ok::<_, TestbedError>(out)
        };
        tokio::select! {
            r = all => r,
            _ = tokio::signal::ctrl_c() => Err(TestbedError::Interrupted),
        }
    })?;
    bar.finish_and_clear();
    let mismatch = check(&work, &outcomes);
    Ok(Report {
        setup: setup.clone(),
        docs: work.docs.len(),
        oracle_checked: work.oracle.is_some(),
        outcomes,
        mismatch,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

fn progress_bar(enabled: bool, len: usize) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} configurations  {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// The first disagreement among the outcomes: each is compared with the brute-force scan when
/// there is one, else with the first configuration.
pub fn check(work: &Workload, outcomes: &[Outcome]) -> Option<String> {
    let (reference, against): (&HashMap<QueryClass, Vec<Vec<Hit>>>, String) = match &work.oracle {
        Some(o) => (o, "the brute-force scan".into()),
        None => (&outcomes.first()?.results, format!("configuration {}", outcomes[0].config.name())),
    };
    for o in outcomes {
        for (class, queries) in &work.queries {
            let empty = Vec::new();
            let got = o.results.get(class).unwrap_or(&empty);
            if let Some(m) = search::compare(&reference[class], got) {
                let text = queries.get(m.query).map(|q| q.to_string()).unwrap_or_default();
                return Some(format!(
                    "configuration {} disagrees with {against} on {class:?}-frequency query #{} `{text}`: expected {}, got {}",
                    o.config.name(),
                    m.query,
                    hits(&m.expected),
                    hits(&m.got)
                ));
            }
        }
    }
    None
}

fn hits(h: &[Hit]) -> String {
    let v: Vec<String> = h.iter().map(|h| format!("{}:{:.6}", h.doc, h.score)).collect();
    format!("[{}]", v.join(", "))
}

fn cut(base: f64, v: f64) -> Option<f64> {
    (base > 0.0).then(|| 100.0 * (1.0 - v / base))
}

fn pct_of(base: f64, v: f64) -> Option<f64> {
    (base > 0.0).then(|| 100.0 * v / base)
}

/// One configuration in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    pub mode: &'static str,
    pub batch_size: usize,
    pub transport: &'static str,
    pub codec: &'static str,
    pub processes: bool,
    pub baseline: bool,
    pub index_s: f64,
    /// Both query classes together.
    pub query_s: f64,
    pub query_high_s: f64,
    pub query_low_s: f64,
    pub messages: u64,
    pub bytes: u64,
    pub postings: u64,
    /// Connections the driver and the roles opened through the shm addresses the roles
    /// registered beside their tcp ones (transport `tcp+shm`; 0 otherwise).
    pub local_connections: u64,
    /// % cut against the baseline (positive: less than the baseline).
    pub index_cut_pct: Option<f64>,
    pub query_high_cut_pct: Option<f64>,
    pub query_low_cut_pct: Option<f64>,
    pub messages_cut_pct: Option<f64>,
    /// Bytes as % of the baseline's (the published figure is 10.74%).
    pub bytes_pct_of_baseline: Option<f64>,
}

impl Report {
    pub fn baseline(&self) -> Option<&Outcome> {
        self.outcomes.iter().find(|o| o.config.is_baseline())
    }

    pub fn rows(&self) -> Vec<Row> {
        let base = self.baseline();
        self.outcomes
            .iter()
            .map(|o| {
                let q = |c| o.query_s.get(&c).copied().unwrap_or(0.0);
                let bq = |c| base.and_then(|b| b.query_s.get(&c).copied()).unwrap_or(0.0);
                let c = o.config;
                Row {
                    name: c.name(),
                    mode: mode_name(c.mode),
                    batch_size: c.batch,
                    transport: c.transport.name(),
                    codec: c.codec.name(),
                    processes: self.setup.processes,
                    baseline: c.is_baseline(),
                    index_s: o.index_s,
                    query_s: q(QueryClass::High) + q(QueryClass::Low),
                    query_high_s: q(QueryClass::High),
                    query_low_s: q(QueryClass::Low),
                    messages: o.messages,
                    bytes: o.bytes,
                    postings: o.postings,
                    local_connections: o.local_connections,
                    index_cut_pct: base.and_then(|b| cut(b.index_s, o.index_s)),
                    query_high_cut_pct: cut(bq(QueryClass::High), q(QueryClass::High)),
                    query_low_cut_pct: cut(bq(QueryClass::Low), q(QueryClass::Low)),
                    messages_cut_pct: base.and_then(|b| cut(b.messages as f64, o.messages as f64)),
                    bytes_pct_of_baseline: base.and_then(|b| pct_of(b.bytes as f64, o.bytes as f64)),
                }
            })
            .collect()
    }

    /// The fastest configuration (least indexing plus query time).
    pub fn best(&self) -> Option<Row> {
        self.rows().into_iter().min_by(|a, b| (a.index_s + a.query_s).total_cmp(&(b.index_s + b.query_s)))
    }

    fn corpus_desc(&self) -> String {
        match &self.setup.corpus {
            CorpusSpec::Synthetic { docs, seed } => format!("{docs} synthetic documents (Zipf, seed {seed})"),
            CorpusSpec::Dir(d) => format!("{} documents from {}", self.docs, d.display()),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "corpus": self.corpus_desc(),
            "docs": self.docs,
            "shards": self.setup.shards,
            "queries_per_class": self.setup.queries,
            "processes": self.setup.processes,
            "configs": self.rows(),
            "baseline": self.baseline().map(|b| b.config.name()),
            "best": self.best().map(|b| b.name),
            "results_agree": self.mismatch.is_none(),
            "oracle_checked": self.oracle_checked,
            "mismatch": self.mismatch,
            // The published figures. The key was `seed` until it clashed with the corpus's
            // random seed; `seed` is gone, not kept as an alias (README.md says so).
            "published": {
                "label": published::LABEL,
                "source": published::CITATION,
                "index_cut_pct": PUBLISHED.index_cut_pct,
                "query_cut_pct": [PUBLISHED.query_cut_pct.0, PUBLISHED.query_cut_pct.1],
                "bytes_pct_of_old": PUBLISHED.bytes_pct_of_old,
            },
            "wall_s": self.wall_s,
        })
    }

    pub fn table(&self) -> String {
        let mut s = String::new();
        let transport = self.outcomes.first().map(|o| o.config.transport.name()).unwrap_or("-");
        let where_ = if self.setup.processes { "one process per role" } else { "one process" };
        let _ = writeln!(
            s,
            "volley testbed: {}, {} index shards, {} + {} queries (high-/low-frequency terms), {where_} over {transport}",
            self.corpus_desc(),
            self.setup.shards,
            self.setup.queries,
            self.setup.queries
        );
        let _ = writeln!(
            s,
            "cuts are against the baseline, the old design's way: every call relayed through the controller,\n\
             one item per call, the general codec (JSON), same transport\n"
        );
        table_line(&mut s, "configuration", COLUMNS.map(|(title, _)| title.to_string()));
        let pct = |v: Option<f64>, baseline: bool| match (v, baseline) {
            (_, true) => "base".to_string(),
            (Some(v), _) if v.abs() < 99.9 => format!("{v:.1}%"),
            (Some(v), _) => format!("{v:.2}%"),
            (None, _) => "-".to_string(),
        };
        for r in self.rows() {
            let cells = [
                format!("{:.3}", r.index_s),
                pct(r.index_cut_pct, r.baseline),
                format!("{:.3}", r.query_high_s),
                pct(r.query_high_cut_pct, r.baseline),
                format!("{:.3}", r.query_low_s),
                pct(r.query_low_cut_pct, r.baseline),
                r.messages.to_string(),
                pct(r.messages_cut_pct, r.baseline),
                r.bytes.to_string(),
                pct(r.bytes_pct_of_baseline, r.baseline),
            ];
            table_line(&mut s, &r.name, cells);
        }
        table_line(&mut s, published::LABEL, published_cells());
        let _ = writeln!(s, "{}", published::NOTE);
        if let Some(b) = self.best() {
            let _ = writeln!(s, "\nfastest: {}", b.name);
        }
        if transport == "inproc" {
            let _ =
                writeln!(s, "inproc hands values over without encoding: no messages or bytes are counted");
        }
        let what = if self.oracle_checked { " and match the brute-force scan" } else { "" };
        let n = self.setup.queries * 2;
        match &self.mismatch {
            None => {
                let _ = writeln!(s, "results: all configurations agree on {n} queries{what}");
            }
            Some(m) => {
                let _ = writeln!(s, "results DISAGREE: {m}");
            }
        }
        let _ = writeln!(s, "wall time {:.1} s", self.wall_s);
        s
    }
}

/// The table's columns after the configuration's name: title and width.
pub(crate) const COLUMNS: [(&str, usize); 10] = [
    ("index s", 8),
    ("cut", 8),
    ("high-q s", 9),
    ("cut", 8),
    ("low-q s", 9),
    ("cut", 8),
    ("messages", 10),
    ("cut", 7),
    ("bytes", 12),
    ("of base", 8),
];

fn table_line(s: &mut String, name: &str, cells: [String; 10]) {
    let _ = write!(s, "{name:<26}");
    for (cell, (_, width)) in cells.iter().zip(COLUMNS) {
        let _ = write!(s, " {cell:>width$}");
    }
    s.push('\n');
}

/// The published row's cells: the cuts under the cut columns (the query cut as its range),
/// bytes as % of the old design's under "of base".
fn published_cells() -> [String; 10] {
    let [index, high, low, _messages, _bytes] =
        PUBLISHED.cuts().map(|c| c.map(published::range_text).unwrap_or_default());
    let none = String::new;
    [
        none(),
        index,
        none(),
        high,
        none(),
        low,
        none(),
        none(),
        none(),
        format!("{}%", PUBLISHED.bytes_pct_of_old),
    ]
}
