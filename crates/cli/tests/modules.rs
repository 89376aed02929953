//! Module cycles as a guard: in every crate, the top-level modules that import each other in
//! a cycle (a strongly connected component of the `crate::` imports, tests and comments left
//! out) number at most [`MAX_CYCLE`]. A cycle that size or smaller is a pair or three of
//! modules that belong together; a larger one is a knot where no module can change alone.
//! A crate still above the bound while it is untangled is named in [`UNTANGLING`] with the
//! size it may not grow past (none today: the gateway's knot of 14 was cut by issue 39).
//!
//! Layers as a guard too: a crate whose codemap in ARCHITECTURE.md has a `| layer | modules |`
//! table (lowest layer first) must list every top-level module there once, and no module may
//! import one of a higher layer. The crates in [`LAYERED`] must have such a table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The largest cycle of top-level modules a crate may have.
const MAX_CYCLE: usize = 3;

/// Crates being untangled: their largest cycle now, which may only shrink.
const UNTANGLING: &[(&str, usize)] = &[];

/// Crates whose codemap must give their layers.
const LAYERED: &[&str] = &["fleet", "gateway"];

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

/// The top-level modules named after `crate::` in `code` (`crate::a::b`, `crate::{a, b::c}`),
/// and the first name of a `use` path without `crate::` (`use a::b`): a submodule named like a
/// top-level module reads as that module, so it counts as an import of it (name it apart).
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let l = line.trim_start();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(path) = l.strip_prefix("use ") {
            if let Some(name) = ident(path).filter(|n| path[n.len()..].starts_with("::")) {
                if !["crate", "self", "super"].contains(&name) {
                    out.insert(name.to_string());
                }
            }
        }
    }
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

/// Each crate's layer table in `architecture`: crate directory name -> layers, lowest first,
/// each the module names of its row.
fn layer_tables(architecture: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut out = BTreeMap::new();
    let mut krate: Option<String> = None;
    let mut in_table = false;
    for line in architecture.lines() {
        if let Some(rest) = line.strip_prefix("## Codemap: `crates/") {
            krate = rest.split('/').next().map(str::to_string);
            in_table = false;
            continue;
        }
        if line.starts_with("## ") {
            krate = None;
            in_table = false;
            continue;
        }
        let Some(k) = &krate else { continue };
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if line.starts_with('|') && cells.len() == 2 && cells[0] == "layer" && cells[1] == "modules"
        {
            in_table = true;
            out.insert(k.clone(), Vec::new());
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if cells.len() != 2 || cells[1].starts_with("---") {
            continue;
        }
        let modules: Vec<String> = cells[1]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        out.get_mut(k).expect("table started").push(modules);
    }
    out
}

/// What breaks a crate's layers: modules missing from the table or listed twice or unknown,
/// and imports that climb.
fn layer_violations(
    krate: &str,
    layers: &[Vec<String>],
    g: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut broken = Vec::new();
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, row) in layers.iter().enumerate() {
        for m in row {
            if layer_of.insert(m, i).is_some() {
                broken.push(format!("crates/{krate}: `{m}` is in two layers"));
            }
            if !g.contains_key(m) {
                broken.push(format!(
                    "crates/{krate}: the layer table names `{m}`, which is not a module"
                ));
            }
        }
    }
    for (m, to) in g {
        let Some(&lm) = layer_of.get(m.as_str()) else {
            broken.push(format!(
                "crates/{krate}: module `{m}` is in no layer of ARCHITECTURE.md"
            ));
            continue;
        };
        for t in to {
            if let Some(&lt) = layer_of.get(t.as_str()) {
                if lt > lm {
                    broken.push(format!(
                        "crates/{krate}: `{m}` (layer {}) imports `{t}` (layer {}): an import that climbs",
                        lm + 1,
                        lt + 1
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn no_module_imports_a_higher_layer() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let tables = layer_tables(&architecture);
    let mut broken = Vec::new();
    for k in LAYERED {
        if !tables.contains_key(*k) {
            broken.push(format!(
                "crates/{k}: its codemap has no `| layer | modules |` table"
            ));
        }
    }
    for (k, layers) in &tables {
        let g = graph(&root().join("crates").join(k).join("src"));
        broken.extend(layer_violations(k, layers, &g));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_layer_guard_sees_a_climbing_import_and_a_missing_module() {
    let md = "## Codemap: `crates/x/src`\n\n| layer | modules |\n| --- | --- |\n\
              | low | `a`, `b` |\n| high | `c` |\n\ntext\n## Other\n| layer | modules |\n| z | `q` |\n";
    let tables = layer_tables(md);
    assert_eq!(tables.len(), 1);
    assert_eq!(
        tables["x"],
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["c".to_string()]
        ]
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["c"]),
        ("b", vec!["a"]),
        ("c", vec!["a", "b"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    let broken = layer_violations("x", &tables["x"], &g);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].contains("`a` (layer 1) imports `c` (layer 2)"),
        "{broken:?}"
    );
    assert!(broken[1].contains("`d` is in no layer"), "{broken:?}");
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
                pub use k::L;\nuse self::m::N;\n\
                fn f() { crate::g::h(); kvroute_crate::x(); }\n\
                #[cfg(test)]\nmod tests {\n use crate::t;\n}\n";
    assert_eq!(
        imports(&code(text)),
        ["a", "b", "e", "g", "k"].map(String::from).into()
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
