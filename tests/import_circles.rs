//! No file imports another that imports it back, directly or through others.
//!
//! Within each crate, file `a` depends on file `b` when `a` names a path that
//! resolves to `b`'s module: a `use` (re-exports included), a qualified path in
//! code (`crate::x::f()`), or a macro path (`crate::x::m!`, `$crate::x::T`). A
//! bare `mod x;` declaration is not a dependency: the parent owns the child, it
//! does not import from it. The test fails on every strongly connected group of
//! files and prints its edges. Shared nouns belong one floor below their users
//! (ARCHITECTURE.md, "Architecture invariants").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges that close a known circle, waiting for their fix. Each names why.
const KNOWN: &[(&str, &str)] = &[];

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Module path of each file under `src` (`lib.rs`/`main.rs` are the root).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut map = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts == ["lib"] || parts == ["main"] {
            if parts == ["main"] && map.contains_key(&Vec::new()) {
                continue;
            }
            parts.clear();
        } else if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        map.insert(parts, file);
    }
    map
}

/// The code of a file without comments, string contents and char literals.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // Raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\''), else a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Expands a use tree (`a::{b, c::{d as e}}`) into paths.
fn expand_use(tree: &str) -> Vec<String> {
    // Drop the renames (`as e`), keeping the punctuation after the new name.
    let mut compact = String::new();
    let mut tokens = tree.split_whitespace();
    while let Some(token) = tokens.next() {
        if token == "as" {
            let renamed = tokens.next().unwrap_or("");
            compact.extend(renamed.chars().filter(|&c| !(c.is_alphanumeric() || c == '_')));
        } else {
            compact.push_str(token);
        }
    }
    expand_compact(&compact)
}

fn expand_compact(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else { return vec![tree.to_owned()] };
    let prefix = tree[..open].trim_end_matches("::").to_owned();
    let inner = tree[open + 1..].strip_suffix('}').unwrap_or(&tree[open + 1..]);
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        if part == "self" {
            out.push(prefix.clone());
        } else {
            out.extend(expand_compact(&part).into_iter().map(|p| format!("{prefix}::{p}")));
        }
    }
    out
}

/// The module `path` (as written in module `here`) resolves to: the longest
/// prefix that is a file of the crate.
fn resolve(path: &str, here: &Module, mods: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Module = match *segs.first()? {
        "crate" | "$crate" => {
            segs.remove(0);
            Vec::new()
        }
        "super" => {
            let mut base = here.clone();
            while segs.first() == Some(&"super") {
                base.pop();
                segs.remove(0);
            }
            base
        }
        "self" => {
            segs.remove(0);
            here.clone()
        }
        first => {
            let mut child = here.clone();
            child.push(first.to_owned());
            if !mods.contains_key(&child) {
                return None;
            }
            here.clone()
        }
    };
    for seg in segs {
        base.push(seg.to_owned());
        if !mods.contains_key(&base) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// The crate-internal paths a file names, with the inline-module depth at which
/// each appears (`mod tests { use super::*; }` is one level down).
fn named_paths(code: &str) -> Vec<(String, usize)> {
    let inline: Vec<usize> = find_all(code, "mod ")
        .into_iter()
        .filter(|&i| i == 0 || !is_ident(code.as_bytes()[i - 1]))
        .filter(|&i| {
            let rest = &code[i + 4..];
            let name_len = rest.bytes().take_while(|&c| is_ident(c)).count();
            rest[name_len..].trim_start().starts_with('{')
        })
        .collect();
    let depth = |pos: usize| inline.iter().filter(|&&i| i <= pos).count();
    let mut out = Vec::new();
    for start in find_all(code, "use ") {
        if start > 0 && is_ident(code.as_bytes()[start - 1]) {
            continue;
        }
        if let Some(end) = code[start..].find(';') {
            for p in expand_use(&code[start + 4..start + end]) {
                out.push((p, depth(start)));
            }
        }
    }
    for root in ["crate::", "$crate::", "super::", "self::"] {
        for start in find_all(code, root) {
            if start > 0 && (is_ident(code.as_bytes()[start - 1]) || code.as_bytes()[start - 1] == b':') {
                continue;
            }
            let len = code[start..].bytes().take_while(|&c| is_ident(c) || c == b':' || c == b'$').count();
            let path = code[start..start + len].trim_end_matches(':');
            // `super::*` and `crate::{..}` name nothing more here: the `use` scan
            // above expands them.
            if path.len() > root.len() - 2 {
                out.push((path.to_owned(), depth(start)));
            }
        }
    }
    out
}

fn find_all(hay: &str, needle: &str) -> Vec<usize> {
    hay.match_indices(needle).map(|(i, _)| i).collect()
}

fn edges(crate_dir: &Path, root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(&crate_dir.join("src"));
    let name = |m: &Module| mods[m].strip_prefix(root).unwrap().display().to_string();
    let mut graph = BTreeMap::new();
    for (module, file) in &mods {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let mut deps = BTreeSet::new();
        for (path, depth) in named_paths(&code) {
            // Inside `mod tests { .. }`, `super` is the file's own module.
            let path = if depth > 0 && path.starts_with("super::") {
                format!("self::{}", &path["super::".len()..])
            } else if depth > 0 && path.starts_with("self::") {
                continue;
            } else {
                path
            };
            if let Some(target) = resolve(&path, module, &mods) {
                if &target != module {
                    deps.insert(name(&target));
                }
            }
        }
        let from = name(module);
        deps.retain(|to| !KNOWN.contains(&(from.as_str(), to.as_str())));
        graph.insert(from, deps);
    }
    graph
}

/// Tarjan's strongly connected components of more than one file.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.found.push(group);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = String::new();
    for krate in ["kernel-build", "kernel-runtime", "models", "engine", "xtask", "."] {
        let graph = edges(&root.join(krate), root);
        for group in circles(&graph) {
            report.push_str(&format!("circle in {krate}:\n"));
            for from in &group {
                for to in graph[from].iter().filter(|t| group.contains(t)) {
                    report.push_str(&format!("    {from} -> {to}\n"));
                }
            }
        }
    }
    assert!(report.is_empty(), "import circles (move the shared items one floor down):\n{report}");
}

#[test]
fn the_checker_sees_a_circle() {
    let mods: BTreeMap<Module, PathBuf> =
        [(vec![], "lib.rs"), (vec!["a".to_owned()], "a.rs")].into_iter().map(|(m, f)| (m, PathBuf::from(f))).collect();
    let code = code_only("pub use a::X; // crate::nothing\nfn f() { let s = \"crate::a\"; }");
    let paths = named_paths(&code);
    assert_eq!(paths, [("a::X".to_owned(), 0)]);
    assert_eq!(resolve("a::X", &vec![], &mods), Some(vec!["a".to_owned()]));
    assert_eq!(resolve("crate::X", &vec!["a".to_owned()], &mods), Some(vec![]));
    let graph: BTreeMap<String, BTreeSet<String>> = [("lib.rs", "a.rs"), ("a.rs", "lib.rs")]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), BTreeSet::from([b.to_owned()])))
        .collect();
    assert_eq!(circles(&graph), [vec!["a.rs".to_owned(), "lib.rs".to_owned()]]);
}
