//! The crates' files form layers: no file imports a file that imports it back (directly or
//! around a longer circle), no top-level module (a folder, or a file beside `lib.rs`) imports
//! one that imports it back, top-level modules import only those below them in the order
//! docs/ARCHITECTURE.md states, and the client imports nothing from the server.
//!
//! An import is a `use` item or a `crate::`, `super::` or `self::` path in a file's code (not in
//! comments, not in its `#[cfg(test)]` module or a test module's file (`tests.rs`,
//! `*_tests.rs`), not `$crate::` in a macro body, which names the user's view of the crate). A path leads to the file that **defines** the name it reaches:
//! `crate::proto::Code` leads through `proto/mod.rs`'s `pub use code::Code` to `proto/code.rs`,
//! so a facade (`lib.rs`, a `mod.rs`) that only re-exports is no sink in which a circle could
//! hide. A re-export (`pub use`, `pub(crate) use`) is followed, not counted as an import of the
//! re-exporting file; a facade's own uses of its children are counted like any other file's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The crates whose sources are checked, each with its root file (relative to `crates/`).
const CRATES: [(&str, &str); 3] =
    [("volley/src", "lib.rs"), ("volley-cli/src", "main.rs"), ("volley-bench/src", "main.rs")];

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    for (dir, root) in CRATES {
        let graph = graph_of(read_crate(dir), root);
        assert!(graph.len() > 8, "{dir}: found only {} files: is the source directory right?", graph.len());
        let circles = circles(&graph);
        assert!(circles.is_empty(), "{dir}: import circles between files: {circles:#?}");
    }
}

#[test]
fn no_top_level_module_imports_one_that_imports_it_back() {
    for (dir, root) in CRATES {
        let modules = modules_of(&graph_of(read_crate(dir), root), root);
        let circles = circles(&modules);
        assert!(circles.is_empty(), "{dir}: import circles between top-level modules: {circles:#?}");
    }
}

#[test]
fn the_library_s_modules_import_downwards_in_the_stated_order() {
    let modules = modules_of(&graph_of(read_crate("volley/src"), "lib.rs"), "lib.rs");
    let order = stated_order();
    let rank = |m: &str| order.iter().position(|o| o == m);
    let unlisted: Vec<_> = modules.keys().filter(|m| rank(m).is_none()).collect();
    assert!(unlisted.is_empty(), "modules missing from the order in docs/ARCHITECTURE.md: {unlisted:?}");
    let upwards: Vec<_> = modules
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| (from, t)))
        .filter(|(from, to)| rank(to) >= rank(from))
        .collect();
    assert!(upwards.is_empty(), "imports that are not downwards in the stated order: {upwards:?}");
}

#[test]
fn the_client_imports_nothing_from_the_server() {
    let graph = graph_of(read_crate("volley/src"), "lib.rs");
    let wrong: Vec<_> = graph
        .iter()
        .filter(|(from, _)| from.starts_with("client/"))
        .flat_map(|(from, to)| to.iter().filter(|t| t.starts_with("server/")).map(move |t| (from, t)))
        .collect();
    assert!(wrong.is_empty(), "client files importing server files: {wrong:?}");
}

#[test]
fn the_checker_sees_a_circle_and_follows_re_exports() {
    let files = [
        ("lib.rs", "mod a; mod b; mod c; pub use a::A;"),
        ("a.rs", "use crate::b::B; pub struct A;"),
        ("b.rs", "use super::a::A; // crate::c is a comment\npub struct B;"),
        ("c/mod.rs", "mod d; pub use self::d::D; use crate::A;"),
        ("c/d.rs", "use super::super::a::A; macro_rules! m { () => { $crate::b::B } }"),
    ];
    let graph = graph_of(files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect(), "lib.rs");
    assert_eq!(graph["a.rs"], set(&["b.rs"]));
    assert_eq!(graph["b.rs"], set(&["a.rs"]));
    assert_eq!(graph["c/mod.rs"], set(&["a.rs"]), "crate::A is followed through lib.rs to a.rs");
    assert_eq!(graph["c/d.rs"], set(&["a.rs"]), "$crate in a macro is left out");
    assert_eq!(graph["lib.rs"], set(&[]), "a re-export is not an import");
    assert_eq!(circles(&graph), vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
}

/// The knot the old check missed: two folders whose files reach each other's names through the
/// other folder's facade.
#[test]
fn the_checker_sees_a_circle_through_another_folder_s_facade() {
    let files = [
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a/mod.rs", "mod x; pub use x::X;"),
        ("a/x.rs", "use crate::b::{B, Other as O}; pub struct X;"),
        ("b/mod.rs", "mod y; mod z; pub(crate) use self::{y::B, z::*};"),
        ("b/y.rs", "pub struct B; fn f() -> crate::a::X { todo!() }"),
        ("b/z.rs", "pub struct Other;"),
        ("c.rs", "use crate::b::Other; use crate::a;"),
    ];
    let graph = graph_of(files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect(), "lib.rs");
    assert_eq!(graph["a/x.rs"], set(&["b/y.rs", "b/z.rs"]), "names followed through b's facade, a glob too");
    assert_eq!(graph["b/y.rs"], set(&["a/x.rs"]));
    assert_eq!(graph["c.rs"], set(&["b/z.rs", "a/mod.rs"]), "a module itself is its facade");
    assert_eq!(circles(&graph), vec![vec!["a/x.rs".to_string(), "b/y.rs".to_string()]]);
    let modules = modules_of(&graph, "lib.rs");
    assert_eq!(modules["a"], set(&["b"]));
    assert_eq!(modules["c"], set(&["a", "b"]));
    assert_eq!(circles(&modules), vec![vec!["a".to_string(), "b".to_string()]]);
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The order of the library's top-level modules, lowest first, from the line of
/// docs/ARCHITECTURE.md that starts with `Layering order:`.
fn stated_order() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(doc).unwrap();
    let line =
        text.lines().find_map(|l| l.strip_prefix("Layering order:")).expect("a `Layering order:` line");
    line.split('<')
        .map(|m| m.trim().trim_matches('`').trim_end_matches(".rs").trim_end_matches('/').to_string())
        .collect()
}

fn read_crate(dir: &str) -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut files = BTreeMap::new();
    read_dir(&src, &src, &mut files);
    // A binary under src/bin/ is a crate of its own; `tests.rs` and `*_tests.rs` are test
    // modules (`#[cfg(test)]`), which may reach anywhere.
    files.retain(|name, _| !name.starts_with("bin/") && !name.ends_with("tests.rs"));
    files
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

/// The module path of a file: `proto/code.rs` is `[proto, code]`, `proto/mod.rs` is `[proto]`,
/// the crate's root file is `[]`.
fn module_of(file: &str, root: &str) -> Vec<String> {
    if file == root {
        return Vec::new();
    }
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// One `use` item's leaves: the path of each imported name, `*` for a glob.
struct UseItem {
    reexport: bool,
    leaves: Vec<(Vec<String>, Option<String>)>,
}

/// What one file re-exports: names (name → the path it re-exports), and globs.
type Reexports = (BTreeMap<String, Vec<String>>, Vec<Vec<String>>);

struct Crate {
    modules: BTreeMap<Vec<String>, String>,
    reexports: BTreeMap<String, Reexports>,
    /// Per file: its code without `use` items.
    code: BTreeMap<String, String>,
}

impl Crate {
    /// The file of the longest module prefix of `path`, and the segments after it.
    fn file_of<'p>(&self, path: &'p [String]) -> Option<(String, &'p [String])> {
        (0..=path.len()).rev().find_map(|n| self.modules.get(&path[..n]).map(|f| (f.clone(), &path[n..])))
    }

    /// The files that define what `path` names, following re-exports.
    fn defining(&self, path: &[String], depth: usize) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some((file, rest)) = self.file_of(path) else { return out };
        let Some(name) = rest.first().filter(|_| depth < 16) else {
            out.insert(file);
            return out;
        };
        let (named, globs) = &self.reexports[&file];
        if name == "*" {
            out.insert(file.clone());
            for target in named.values().chain(globs) {
                out.extend(self.defining(target, depth + 1));
            }
            return out;
        }
        if let Some(target) = named.get(name) {
            return self.defining(target, depth + 1);
        }
        if !defines(&self.code[&file], name) {
            for glob in globs {
                let mut candidate = glob.clone();
                candidate.push(name.clone());
                let from_glob = self.file_of(&candidate).is_some_and(|(f, r)| {
                    r.is_empty() || defines(&self.code[&f], &r[0]) || self.reexports[&f].0.contains_key(&r[0])
                });
                if from_glob {
                    return self.defining(&candidate, depth + 1);
                }
            }
        }
        out.insert(file);
        out
    }
}

/// Whether `code` defines an item called `name`.
fn defines(code: &str, name: &str) -> bool {
    ["struct", "enum", "fn", "trait", "type", "const", "static", "union", "mod", "macro_rules!"]
        .iter()
        .any(|kw| has_word(code, &format!("{kw} {name}")))
}

/// Whether `name` occurs in `code` by itself, not at the end of a path.
fn used_bare(code: &str, name: &str) -> bool {
    occurs(code, name, |before| !before.ends_with([':', '.']) && !before.ends_with("fn "))
}

/// Whether `word` occurs in `code` with no identifier character right before or after it.
fn has_word(code: &str, word: &str) -> bool {
    occurs(code, word, |_| true)
}

/// Whether `word` occurs in `code` as a whole word whose preceding text `before_ok` accepts.
fn occurs(code: &str, word: &str, before_ok: impl Fn(&str) -> bool) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = &code[..at];
        !before.ends_with(ident) && before_ok(before) && !code[at + word.len()..].starts_with(ident)
    })
}

fn graph_of(files: BTreeMap<String, String>, root: &str) -> Graph {
    let modules: BTreeMap<Vec<String>, String> =
        files.keys().map(|f| (module_of(f, root), f.clone())).collect();
    let mut krate = Crate { modules, reexports: BTreeMap::new(), code: BTreeMap::new() };
    let mut uses = BTreeMap::new();
    for (file, text) in &files {
        let me = module_of(file, root);
        let (items, rest) = use_items(&code_of(text));
        let mut named = BTreeMap::new();
        let mut globs = Vec::new();
        let mut imports = Vec::new();
        for item in items {
            for (path, alias) in item.leaves {
                let Some(abs) = resolve(&me, &path, &krate.modules) else { continue };
                if abs.last().is_some_and(|l| l == "*") {
                    if item.reexport {
                        globs.push(abs[..abs.len() - 1].to_vec());
                    } else {
                        imports.push(abs);
                    }
                    continue;
                }
                let name = alias.unwrap_or_else(|| abs.last().cloned().unwrap_or_default());
                // A re-exported name that the file's own code uses (by itself, not at the end of
                // a path such as a macro's `$crate::m::Name`) is an import as well.
                if !item.reexport || used_bare(&rest, &name) {
                    imports.push(abs.clone());
                }
                if item.reexport {
                    named.insert(name, abs);
                }
            }
        }
        imports.extend(paths(&rest).iter().filter_map(|p| resolve(&me, p, &krate.modules)));
        krate.reexports.insert(file.clone(), (named, globs));
        krate.code.insert(file.clone(), rest);
        uses.insert(file.clone(), imports);
    }
    let mut graph = Graph::new();
    for (file, imports) in uses {
        let edges = graph.entry(file.clone()).or_default();
        for path in imports {
            edges.extend(krate.defining(&path, 0).into_iter().filter(|to| *to != file));
        }
    }
    graph
}

/// The graph of top-level modules: a folder, or a file beside the root; the root itself (the
/// crate's facade) is left out.
fn modules_of(graph: &Graph, root: &str) -> Graph {
    let top = |f: &str| f.split('/').next().unwrap().trim_end_matches(".rs").to_string();
    let mut out = Graph::new();
    for (from, to) in graph.iter().filter(|(f, _)| *f != root) {
        let edges = out.entry(top(from)).or_default();
        edges.extend(to.iter().filter(|t| *t != root && top(t) != top(from)).map(|t| top(t)));
    }
    out
}

/// The text of a file without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The `use` items of `code` (at any nesting), and the code without them.
fn use_items(code: &str) -> (Vec<UseItem>, String) {
    let mut items = Vec::new();
    let mut rest = String::new();
    let mut i = 0;
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        let at_word = i == 0 || !ident(bytes[i - 1]);
        let found = at_word.then(|| use_at(&code[i..])).flatten();
        match found {
            Some((reexport, tree, len)) => {
                let mut leaves = Vec::new();
                use_tree(tree, Vec::new(), &mut leaves);
                items.push(UseItem { reexport, leaves });
                i += len;
            }
            None => {
                let ch = code[i..].chars().next().unwrap();
                rest.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    (items, rest)
}

/// A `use` item starting at the front of `s`: whether it is a re-export, its tree, its length.
fn use_at(s: &str) -> Option<(bool, &str, usize)> {
    let (reexport, after_vis) = if let Some(r) = s.strip_prefix("pub") {
        let r = match r.trim_start().strip_prefix('(') {
            Some(inner) => &inner[inner.find(')')? + 1..],
            None => r,
        };
        (true, r.trim_start())
    } else {
        (false, s)
    };
    let tree_start = after_vis.strip_prefix("use")?;
    if !tree_start.starts_with(char::is_whitespace) {
        return None;
    }
    let end = tree_start.find(';')?;
    let tree = tree_start[..end].trim();
    // Words in a string or a macro are not a use item.
    if !tree.chars().all(|c| c.is_ascii_alphanumeric() || "_:{},* \n\t".contains(c)) {
        return None;
    }
    let len = s.len() - tree_start.len() + end + 1;
    Some((reexport, tree, len))
}

/// Flattens a use tree (`a::{b, c::{d as e}, f::*}`) into its leaves' paths and aliases.
fn use_tree(tree: &str, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        for part in split_top(inner) {
            use_tree(part, prefix.clone(), out);
        }
        return;
    }
    if let Some(brace) = tree.find("::{") {
        let mut p = prefix;
        p.extend(tree[..brace].split("::").map(|s| s.trim().to_string()));
        use_tree(&tree[brace + 2..], p, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    if path.is_empty() {
        return;
    }
    let mut p = prefix;
    p.extend(path.split("::").map(|s| s.trim().to_string()));
    if p.last().is_some_and(|l| l == "self") {
        p.pop();
    }
    let alias = alias.filter(|a| a != "_");
    out.push((p, alias));
}

/// Splits at the commas that are not inside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// Every `crate::`/`super::`/`self::` path in `code`, as its segments.
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
            if j > start && code[j..].starts_with("::") && !code[j..].starts_with("::<") {
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

/// A path's absolute module path, seen from module `me`: `crate::`, `super::` and `self::`
/// paths, and a path whose first segment is a child module of `me`; `None` for another crate.
fn resolve(me: &[String], path: &[String], modules: &BTreeMap<Vec<String>, String>) -> Option<Vec<String>> {
    let mut segs = path.iter();
    let first = segs.next()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => me.to_vec(),
        "super" => me[..me.len().checked_sub(1)?].to_vec(),
        child => {
            let mut m = me.to_vec();
            m.push(child.to_string());
            if !modules.contains_key(&m) {
                return None;
            }
            me.to_vec()
        }
    };
    let mut rest: Vec<&String> = if matches!(first.as_str(), "crate" | "self" | "super") {
        segs.collect()
    } else {
        path.iter().collect()
    };
    while rest.first().is_some_and(|s| *s == "super") {
        base.pop()?;
        rest.remove(0);
    }
    base.extend(rest.into_iter().cloned());
    Some(base)
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
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
