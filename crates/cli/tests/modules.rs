//! Module cycles as a guard: in every crate, the top-level modules that import each other in
//! a cycle (a strongly connected component of the `crate::` imports, tests and comments left
//! out) number at most [`MAX_CYCLE`]. A cycle that size or smaller is a pair or three of
//! modules that belong together; a larger one is a knot where no module can change alone.
//! A crate still above the bound while it is untangled is named in [`UNTANGLING`] with the
//! size it may not grow past (none today: the gateway's knot of 14 was cut to 3 by issue 39).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The largest cycle of top-level modules a crate may have.
const MAX_CYCLE: usize = 3;

/// Crates being untangled: their largest cycle now, which may only shrink.
const UNTANGLING: &[(&str, usize)] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The code of a file without comment lines and without its inline `mod tests`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> Option<&str> {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0 && !s.starts_with(|c: char| c.is_ascii_digit())).then(|| &s[..end])
}

/// The top-level modules named after `crate::` in `code` (`crate::a::b`, `crate::{a, b::c}`).
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // Not the tail of another path (`kvroute_crate::`).
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The first name of every item at the group's top level.
            let (mut depth, mut start) = (1usize, 0usize);
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        if let Some(name) = ident(group[start..k].trim()) {
                            out.insert(name.to_string());
                        }
                        start = k + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
        } else if let Some(name) = ident(rest) {
            out.insert(name.to_string());
        }
    }
    out
}

/// Every `.rs` file under `dir`, test files (`tests.rs`, `tests/`) left out.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if name != "tests" {
                files(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

/// A crate's import graph: top-level module -> the top-level modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            let mut fs = Vec::new();
            files(&p, &mut fs);
            modules.entry(name).or_default().extend(fs);
        } else if p.extension().is_some_and(|x| x == "rs")
            && !["lib", "main", "tests"].contains(&name.as_str())
        {
            modules.entry(name).or_default().push(p);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, fs)| {
            let mut to = BTreeSet::new();
            for f in fs {
                let text = std::fs::read_to_string(f).unwrap();
                to.extend(
                    imports(&code(&text))
                        .into_iter()
                        .filter(|t| t != m && names.contains(t)),
                );
            }
            (m.clone(), to)
        })
        .collect()
}

/// The largest strongly connected component (Tarjan's algorithm).
fn largest_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    struct State<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        best: BTreeSet<String>,
    }
    fn visit<'a>(s: &mut State<'a>, n: &'a str) {
        let i = s.index.len();
        s.index.insert(n, i);
        s.low.insert(n, i);
        s.stack.push(n);
        s.on.insert(n);
        for w in s.g.get(n).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let ln = s.low.get_mut(n).unwrap();
                *ln = (*ln).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let ln = s.low.get_mut(n).unwrap();
                *ln = (*ln).min(iw);
            }
        }
        if s.low[n] == s.index[n] {
            let mut comp = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.insert(w.to_string());
                if w == n {
                    break;
                }
            }
            if comp.len() > s.best.len() {
                s.best = comp;
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        best: BTreeSet::new(),
    };
    for n in g.keys() {
        if !s.index.contains_key(n.as_str()) {
            visit(&mut s, n);
        }
    }
    s.best
}

#[test]
fn no_crate_has_a_module_cycle_larger_than_three() {
    let mut report = Vec::new();
    let mut broken = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = e.unwrap().path();
        let krate = dir.file_name().unwrap().to_string_lossy().to_string();
        let cycle = largest_cycle(&graph(&dir.join("src")));
        let bound = UNTANGLING
            .iter()
            .find(|(c, _)| *c == krate)
            .map_or(MAX_CYCLE, |(_, n)| *n);
        report.push(format!("{krate}: {} {cycle:?}", cycle.len()));
        if cycle.len() > bound {
            broken.push(format!(
                "crates/{krate}: {} modules import each other in one cycle (at most {bound}): {cycle:?}",
                cycle.len()
            ));
        }
    }
    println!("{}", report.join("\n"));
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_guard_reads_imports_and_finds_a_cycle() {
    let text = "//! uses crate::z in a comment\nuse crate::{a, b::{c, d}, e::F};\n\
                fn f() { crate::g::h(); kvroute_crate::x(); }\n\
                #[cfg(test)]\nmod tests {\n use crate::t;\n}\n";
    assert_eq!(
        imports(&code(text)),
        ["a", "b", "e", "g"].map(String::from).into()
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(largest_cycle(&g), ["a", "b", "c"].map(String::from).into());
}
