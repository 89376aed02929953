//! The dashboard's TypeScript types of the control API (`ui/src/types.generated.ts`) are
//! generated from the Rust types the API serializes (ts-rs, the crates' `ts` feature), and this
//! test fails when the committed file is not what they give: a change to an answer's shape
//! in Rust must come with the regenerated file, which the UI's type check then judges.
//!
//! Regenerate with `KVROUTE_WRITE_TS=1 cargo test -p kvroute-loadgen --test ts_types`.

use kvroute_loadgen::api::{ConfigAnswer, ConversationsAnswer, FleetsAnswer, LevelsAnswer};
use kvroute_loadgen::conversations::ConversationDetail;
use kvroute_loadgen::LiveStats;
use std::any::TypeId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use ts_rs::{Config, TypeVisitor, TS};

/// The command that rewrites the file.
const COMMAND: &str = "KVROUTE_WRITE_TS=1 cargo test -p kvroute-loadgen --test ts_types";

/// The generated file, from the repository's root.
const FILE: &str = "ui/src/types.generated.ts";

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(FILE)
}

/// Every declaration reached from the roots, by TypeScript name.
struct Collect<'a> {
    cfg: &'a Config,
    seen: BTreeSet<TypeId>,
    decls: BTreeMap<String, String>,
}

impl TypeVisitor for Collect<'_> {
    fn visit<T: TS + 'static + ?Sized>(&mut self) {
        // Only declared types (derived ones) have a file of their own; primitives and
        // containers do not, and are written inline.
        if T::output_path().is_none() || !self.seen.insert(TypeId::of::<T>()) {
            return;
        }
        let name = T::ident(self.cfg);
        let decl = format!(
            "{}export {}",
            T::docs().unwrap_or_default(),
            layout(&T::decl(self.cfg))
        );
        if let Some(other) = self.decls.insert(name.clone(), decl) {
            panic!("two Rust types are named {name} in TypeScript; the other: {other}");
        }
        T::visit_dependencies(self);
    }
}

/// A declaration laid out one field a line, indented: ts-rs writes an object's fields with
/// their doc comments flush left and its closing brace after the last field.
fn layout(decl: &str) -> String {
    let Some((head, body)) = decl.split_once("= { \n") else {
        return decl.to_string();
    };
    let Some(body) = body.strip_suffix(" };") else {
        return decl.to_string();
    };
    let mut out = format!("{head}= {{\n");
    for line in body.lines() {
        out.push_str("  ");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("};");
    out
}

/// The file's text: every type the dashboard reads (the API's answers and what they hold), in
/// name order.
fn typescript() -> String {
    // JSON numbers are JavaScript numbers: u64 counts and milliseconds are not BigInts.
    let cfg = Config::new().with_large_int("number");
    let mut c = Collect {
        cfg: &cfg,
        seen: BTreeSet::new(),
        decls: BTreeMap::new(),
    };
    // The answers of the routes the dashboard calls (`/api/ws` and `/api/status` send
    // `LiveStats`)...
    c.visit::<LiveStats>();
    c.visit::<ConfigAnswer>();
    c.visit::<FleetsAnswer>();
    c.visit::<LevelsAnswer>();
    c.visit::<ConversationsAnswer>();
    c.visit::<ConversationDetail>();
    // ... and the baseline files `DashboardConfig::baselines` holds (JSON values in Rust,
    // checked against this type by the command line when it reads them).
    c.visit::<kvroute_report::Baseline>();
    let mut out = format!(
        "// Generated from the Rust types of the load generator's control API by ts-rs: do not\n\
         // edit. Regenerate with `{COMMAND}`\n\
         // (crates/loadgen/tests/ts_types.rs); the UI imports these through `types.ts`.\n"
    );
    for decl in c.decls.values() {
        out.push('\n');
        out.push_str(decl);
        out.push('\n');
    }
    out
}

#[test]
fn the_dashboards_typescript_types_are_generated_from_the_rust_types() {
    let want = typescript();
    let path = path();
    if std::env::var_os("KVROUTE_WRITE_TS").is_some_and(|v| v != "0") {
        std::fs::write(&path, &want).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "{FILE} is not what the Rust types give (first difference at line {}):\n  \
             committed: {}\n  generated: {}\nRegenerate it with `{COMMAND}` and commit it.",
            line + 1,
            have.lines().nth(line).unwrap_or("(end of file)"),
            want.lines().nth(line).unwrap_or("(end of file)"),
        );
    }
}

#[test]
fn every_type_a_declaration_names_is_declared() {
    let text = typescript();
    // The code alone: no comments, no string literals.
    let mut code = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, after)| after);
    }
    code.push_str(rest);
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
        .split('"')
        .step_by(2)
        .collect();
    let declared: BTreeSet<&str> = code
        .split("export type ")
        .skip(1)
        .filter_map(|d| d.split([' ', '<']).next())
        .collect();
    let words = code.split(|c: char| !c.is_ascii_alphanumeric() && c != '_');
    for word in words.filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase())) {
        assert!(
            word == "Array" || declared.contains(word),
            "{word} is used in {FILE} but not declared there"
        );
    }
}
