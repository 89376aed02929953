//! ARCHITECTURE.md's crate table as a guard: every crate's `[dependencies]` on other kvroute
//! crates are among those its "may depend on" cell names, and a crate the table calls pure
//! (or without IO) depends on no async runtime, HTTP or socket library. The purity of the code
//! itself is guarded by each pure crate's `clippy.toml` (no clock, environment, file or
//! socket).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Libraries a pure crate must not depend on: async runtimes, HTTP, gRPC, WebSocket, message
/// and socket libraries, Kubernetes clients and TLS stacks. Not listed, as they do no IO:
/// `k8s-openapi` (Kubernetes' API types), `prost` (protobuf), `futures-*` (the preprocess
/// crate's reply channel), `rustls-pki-types`.
const IO_LIBRARIES: &[&str] = &[
    // async runtime
    "tokio",
    "tokio-util",
    "tokio-stream",
    "mio",
    // HTTP and gRPC
    "axum",
    "hyper",
    "hyper-util",
    "h2",
    "reqwest",
    "tower-http",
    "tonic",
    "tonic-health",
    "envoy-types",
    // messages and sockets
    "zmq",
    "async-nats",
    "socket2",
    "quinn",
    // WebSocket
    "tokio-tungstenite",
    "tungstenite",
    "tokio-websockets",
    // Kubernetes clients
    "kube",
    "kube-client",
    "kube-runtime",
    // TLS (rustls-native-certs reads the system's certificates)
    "rustls",
    "tokio-rustls",
    "hyper-rustls",
    "rustls-native-certs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The table's rows: (crate name, path, "may depend on" cell).
fn rows(architecture: &str) -> Vec<(String, String, String)> {
    architecture
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `kvroute"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            // The text between a cell's first pair of backticks.
            let unquote = |s: &str| s.split('`').nth(1).unwrap_or(s).to_string();
            (
                unquote(cells[0]),
                unquote(cells[1]),
                cells[cells.len() - 1].to_string(),
            )
        })
        .collect()
}

/// The names in a crate's `[dependencies]` table, optional ones (behind a feature) marked
/// `?name`.
fn dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let value: toml::Value = toml::from_str(&text).unwrap();
    let Some(table) = value.get("dependencies").and_then(toml::Value::as_table) else {
        return BTreeSet::new();
    };
    table
        .iter()
        .map(|(name, spec)| {
            let optional = spec.get("optional").and_then(toml::Value::as_bool) == Some(true);
            if optional {
                format!("?{name}")
            } else {
                name.clone()
            }
        })
        .collect()
}

/// What breaks the table's rules, given each row's path -> its dependencies.
fn violations(
    rows: &[(String, String, String)],
    deps_of: impl Fn(&str) -> BTreeSet<String>,
) -> Vec<String> {
    let mut broken = Vec::new();
    for (name, path, allowed) in rows {
        let deps = deps_of(path);
        let words: BTreeSet<&str> = allowed
            .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        for dep in deps
            .iter()
            .filter(|d| d.trim_start_matches('?').starts_with("kvroute-"))
        {
            let dep = dep.trim_start_matches('?');
            let short = dep.trim_start_matches("kvroute-");
            if !words.contains("all") && !words.contains(short) {
                broken.push(format!(
                    "{name} depends on {dep}; its row allows: {allowed}"
                ));
            }
        }
        let pure = allowed.contains("pure")
            || allowed.contains("no IO")
            || allowed.contains("nothing async");
        if pure {
            for dep in deps.iter().filter(|d| IO_LIBRARIES.contains(&d.as_str())) {
                broken.push(format!(
                    "{name} is pure by its row ({allowed}) but depends on {dep}"
                ));
            }
        } else if !words.contains("all") {
            // A crate with IO names each IO library it uses: kube and async-nats stay in
            // the crates whose rows say so, out of the one that serves requests.
            for dep in deps.iter().filter(|d| IO_LIBRARIES.contains(&d.as_str())) {
                if !words.contains(dep.as_str()) {
                    broken.push(format!(
                        "{name} depends on {dep}, which its row does not name: {allowed}"
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_crate_depends_only_on_what_architecture_md_allows() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let rows = rows(&architecture);
    let crates: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert!(crates.len() >= 10, "the table was not found: {crates:?}");
    // Every workspace crate has its row.
    for dir in std::fs::read_dir(root().join("crates")).unwrap() {
        let manifest = dir.unwrap().path().join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let value: toml::Value = toml::from_str(&text).unwrap();
        let name = value["package"]["name"].as_str().unwrap().to_string();
        assert!(
            crates.contains(&name),
            "{name} has no row in ARCHITECTURE.md's table"
        );
    }
    let broken = violations(&rows, |path| {
        dependencies(&root().join(path).join("Cargo.toml"))
    });
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_guard_sees_a_dependency_that_is_not_allowed() {
    let table = "| crate | path | what | may depend on |\n| --- | --- | --- | --- |\n\
                 | `kvroute-sim` | `crates/sim` | the simulator | core, engine; pure |\n";
    let rows = rows(table);
    assert_eq!(
        rows,
        [(
            "kvroute-sim".into(),
            "crates/sim".into(),
            "core, engine; pure".into()
        )]
    );
    let deps = |_: &str| -> BTreeSet<String> {
        ["kvroute-core", "kvroute-gateway", "tokio", "serde"]
            .map(String::from)
            .into()
    };
    let broken = violations(&rows, deps);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].contains("kvroute-gateway") && broken[1].contains("tokio"),
        "{broken:?}"
    );
    // A crate with IO may use only the IO libraries its row names.
    let table = "| `kvroute-gateway` | `crates/gateway` | the gateway | tokio, axum, core |\n";
    let deps = |_: &str| -> BTreeSet<String> {
        ["kvroute-core", "tokio", "kube", "serde"]
            .map(String::from)
            .into()
    };
    let broken = violations(&crate::rows(table), deps);
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].contains("kube"), "{broken:?}");
}
