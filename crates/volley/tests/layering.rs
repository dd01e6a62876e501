//! The library's files form layers: no file imports a file that imports it back (directly or
//! around a longer circle), and the client imports nothing from the server.
//!
//! An import is any `crate::`, `super::` or `self::` path in a file's code (not in comments,
//! not in its `#[cfg(test)]` module, not `$crate::` in a macro body, which names the user's
//! view of the crate). A path leads to the file of the longest module prefix it names, so
//! `crate::proto::Code` leads to `proto/mod.rs` and `crate::proto::code::Code` to
//! `proto/code.rs`. A facade (`lib.rs`, a `mod.rs`) declaring and re-exporting its own
//! submodules is containment, not an import: those edges are left out, and files beneath may
//! import what their facade re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let graph = import_graph();
    assert!(graph.len() > 40, "found only {} files: is the source directory right?", graph.len());
    let circles = circles(&graph);
    assert!(circles.is_empty(), "import circles between files: {circles:#?}");
}

#[test]
fn the_client_imports_nothing_from_the_server() {
    let graph = import_graph();
    let wrong: Vec<_> = graph
        .iter()
        .filter(|(from, _)| from.starts_with("client/"))
        .flat_map(|(from, to)| to.iter().filter(|t| t.starts_with("server/")).map(move |t| (from, t)))
        .collect();
    assert!(wrong.is_empty(), "client files importing server files: {wrong:?}");
}

#[test]
fn the_checker_sees_a_circle_and_a_facade() {
    let files = [
        ("lib.rs", "mod a; mod b; pub use a::A;"),
        ("a.rs", "use crate::b::B; pub struct A;"),
        ("b.rs", "use super::a::A; // crate::c is a comment\npub struct B;"),
        ("c/mod.rs", "mod d; pub use self::d::D; use crate::A;"),
        ("c/d.rs", "use super::super::a::A; macro_rules! m { () => { $crate::b::B } }"),
    ];
    let graph = graph_of(files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect());
    assert_eq!(graph["a.rs"], set(&["b.rs"]));
    assert_eq!(graph["b.rs"], set(&["a.rs"]));
    assert_eq!(graph["c/mod.rs"], set(&["lib.rs"]), "the facade's own submodule is left out");
    assert_eq!(graph["c/d.rs"], set(&["a.rs"]), "$crate in a macro is left out");
    assert_eq!(circles(&graph), vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_dir(&src, &src, &mut files);
    graph_of(files)
}

fn read_dir(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            read_dir(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The module path of a file: `proto/code.rs` is `[proto, code]`, `proto/mod.rs` is `[proto]`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn graph_of(files: BTreeMap<String, String>) -> Graph {
    let modules: BTreeMap<Vec<String>, String> = files.keys().map(|f| (module_of(f), f.clone())).collect();
    let file_of = |path: &[String]| (0..=path.len()).rev().find_map(|n| modules.get(&path[..n])).cloned();
    let mut graph = Graph::new();
    for (file, text) in &files {
        let me = module_of(file);
        let facade = file == "lib.rs" || file.ends_with("/mod.rs");
        let edges = graph.entry(file.clone()).or_default();
        for path in paths(&code_of(text)) {
            let target = resolve(&me, &path).and_then(|p| file_of(&p).map(|f| (p, f)));
            let Some((_, to)) = target else { continue };
            let beneath = facade && module_of(&to).starts_with(&me);
            if to != *file && !beneath {
                edges.insert(to);
            }
        }
    }
    graph
}

/// The text of a file without line comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// Every `crate::`/`super::`/`self::` path in `code`, as its segments; a group
/// `a::{b, c::d}` gives `a`, `a::b` and `a::c::d`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == b'$' || bytes[i - 1] == b':');
        let head =
            ["crate::", "super::", "self::"].into_iter().find(|h| bytes[i..].starts_with(h.as_bytes()));
        let (true, Some(head)) = (starts_word, head) else {
            i += 1;
            continue;
        };
        let mut segs = vec![head.trim_end_matches("::").to_string()];
        let mut j = i + head.len();
        loop {
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            if j > start {
                segs.push(code[start..j].to_string());
            }
            if code[j..].starts_with("::{") {
                let end = code[j..].find('}').map_or(bytes.len(), |e| j + e);
                for item in code[j + 3..end].split(',') {
                    let first = item.trim().split("::").next().unwrap_or("").trim();
                    if !first.is_empty() && first != "self" && first.bytes().all(ident) {
                        out.push([segs.clone(), vec![first.to_string()]].concat());
                    }
                }
                j = end;
                break;
            }
            if j > start && code[j..].starts_with("::") {
                j += 2;
                continue;
            }
            break;
        }
        out.push(segs);
        i = j.max(i + 1);
    }
    out
}

/// A path's absolute module path, seen from module `me`.
fn resolve(me: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut segs = path.iter();
    let mut base = match segs.next()?.as_str() {
        "crate" => Vec::new(),
        "self" => me.to_vec(),
        _ => me[..me.len().checked_sub(1)?].to_vec(),
    };
    let mut rest: Vec<&String> = segs.collect();
    while rest.first().is_some_and(|s| *s == "super") {
        base.pop()?;
        rest.remove(0);
    }
    base.extend(rest.into_iter().cloned());
    Some(base)
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    self.low.insert(v, self.low[v].min(lw));
                } else if self.stack.contains(&w.as_str()) {
                    let iw = self.index[w.as_str()];
                    self.low.insert(v, self.low[v].min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|x| *x == v).unwrap();
                let mut component: Vec<String> = self.stack.drain(at..).map(String::from).collect();
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk =
        Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}
