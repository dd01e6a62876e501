//! `volley bench --api`: the echo benchmark through the `Method` layer or through the
//! `#[volley::service]` trait's generated client and server, and the two side by side.

use clap::ValueEnum;
use serde::Serialize;

/// The API one measurement calls and serves through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `Client::call(&ECHO, p)` against `ServerBuilder::handle_fn(&ECHO, closure)`.
    Method,
    /// `EchoClient::echo(p)` against `serve(EchoServer::new(Echoer))`.
    Generated,
}

/// `--api`: one API, or both in turn.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiChoice {
    Method,
    Generated,
    /// Two servers, one per API, in the same process; each round measures one, then the other.
    Both,
}

impl ApiChoice {
    pub fn apis(self) -> Vec<Api> {
        match self {
            ApiChoice::Method => vec![Api::Method],
            ApiChoice::Generated => vec![Api::Generated],
            ApiChoice::Both => vec![Api::Method, Api::Generated],
        }
    }
}

/// One measurement's figure for the comparison: its API, its call style and requests/s.
pub struct Figure<'a> {
    pub api: Api,
    pub style: &'a str,
    pub items_per_s: f64,
}

/// For every call style measured through both APIs: the median requests/s of each over the
/// rounds and their ratio (generated / method), one line each. Nothing if only one API ran.
pub fn ratios(figures: &[Figure]) -> Vec<String> {
    let mut styles: Vec<&str> = Vec::new();
    for f in figures {
        if !styles.contains(&f.style) {
            styles.push(f.style);
        }
    }
    let mut lines = Vec::new();
    for style in styles {
        let median_of = |api| {
            median(
                figures.iter().filter(|f| f.style == style && f.api == api).map(|f| f.items_per_s).collect(),
            )
        };
        if let (Some(method), Some(generated)) = (median_of(Api::Method), median_of(Api::Generated)) {
            let rounds = figures.iter().filter(|f| f.style == style && f.api == Api::Method).count();
            lines.push(format!(
                "generated/method, {style}: {:.3} ({generated:.0} against {method:.0} requests/s, medians of {rounds} rounds)",
                generated / method.max(f64::MIN_POSITIVE)
            ));
        }
    }
    lines
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(api: Api, style: &str, items_per_s: f64) -> Figure<'_> {
        Figure { api, style, items_per_s }
    }

    #[test]
    fn ratio_is_of_the_medians_per_style() {
        let figures = [
            fig(Api::Method, "single", 100.0),
            fig(Api::Generated, "single", 90.0),
            fig(Api::Method, "single", 300.0),
            fig(Api::Generated, "single", 110.0),
            fig(Api::Method, "single", 200.0),
            fig(Api::Generated, "single", 400.0),
            fig(Api::Method, "batch", 10.0),
        ];
        let lines = ratios(&figures);
        // single: medians 200 (method) and 110 (generated); batch ran through one API only.
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("generated/method, single: 0.550 (110 against 200"), "{}", lines[0]);
        assert!(lines[0].contains("medians of 3 rounds"), "{}", lines[0]);
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
