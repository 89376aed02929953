//! The dependency graph as a guard (issue 39), over `cargo metadata --locked` for x86_64
//! Linux (what CI and the image build): every package the lock file resolves there, normal,
//! build and dev dependencies alike (so also what only tests, benchmarks and build scripts use,
//! and what only a weak feature names),
//! - has a license expression the licenses in `ALLOWED_LICENSES` satisfy (SPDX: `OR` takes
//!   either side, `AND` both, `/` is the old spelling of `OR`), or no license field and an entry
//!   in `WITHOUT_LICENSE` saying why it may ship;
//! - is the only version of its name, or its name is in `DUPLICATES` with exactly the versions
//!   present (semver series: `0.22`, `1`) and why they cannot be one today. A new duplicate
//!   fails, and so does an entry that no longer is one, so the list stays true.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The platform whose resolve is checked: what kvroute ships for (CI, the container image).
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Licenses an Apache-2.0 binary linked statically may carry: permissive ones, notice kept.
/// Not here, so a package under one fails until someone decides: copyleft of any strength
/// (GPL, LGPL, MPL-2.0: none in the lock file but as an alternative to MIT), `Unlicense` and
/// `0BSD` (only ever offered beside MIT here).
const ALLOWED_LICENSES: &[&str] = &[
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "MIT",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    // Unicode's data files: unicode-ident, ICU4X's crates (under url's idna).
    "Unicode-3.0",
    // Boost: xxhash-rust (the block hashes), ryu.
    "BSL-1.0",
    // Data under a permissive licence: webpki-roots' copy of Mozilla's root certificates.
    "CDLA-Permissive-2.0",
];

/// Packages without a license field: (name, why it may ship). None today.
const WITHOUT_LICENSE: &[(&str, &str)] = &[];

/// Names present in several versions: (name, semver series, who pulls each and why they cannot
/// be one today). `cargo tree -i NAME@VERSION --target all -e normal,build,dev` shows the chains.
const DUPLICATES: &[(&str, &[&str], &str)] = &[
    (
        "base64",
        &["0.13", "0.22", "0.23"],
        "0.13: spm_precompiled (tokenizers' normalizer); 0.22: axum, reqwest, tonic, async-nats, \
         k8s-openapi, tower-http 0.7, tokio-websockets, pem 3; 0.23: hyper-util, kube-client, \
         pem 4, serde-saphyr. None is ours to move",
    ),
    (
        "bit-set",
        &["0.8", "0.11"],
        "0.8: fancy-regex (fastokens); 0.11: proptest (tests only)",
    ),
    (
        "bit-vec",
        &["0.8", "0.10"],
        "under bit-set: fancy-regex's 0.8; proptest's 0.10",
    ),
    (
        "bitflags",
        &["1", "2"],
        "1: zmq 0.10 (the newest) and png 0.17 (plotters' bitmap backend, through image); \
         2: the rest",
    ),
    (
        "block-buffer",
        &["0.10", "0.12"],
        "RustCrypto's two generations: digest 0.10 under sha1 0.10 (axum's and tungstenite's \
         WebSocket handshakes), digest 0.11 under sha2 0.11 (rust-embed-utils)",
    ),
    (
        "cpufeatures",
        &["0.2", "0.3"],
        "0.2: sha1 0.10 (axum, tungstenite); 0.3: sha2 0.11 (rust-embed-utils), chacha20 \
         (rand 0.10)",
    ),
    (
        "crypto-common",
        &["0.1", "0.2"],
        "under digest 0.10 (sha1: axum, tungstenite) and 0.11 (sha2: rust-embed-utils)",
    ),
    (
        "digest",
        &["0.10", "0.11"],
        "0.10: sha1 0.10 (axum, tungstenite); 0.11: sha2 0.11 (rust-embed-utils)",
    ),
    (
        "foldhash",
        &["0.1", "0.2"],
        "0.1: ours (core, engine, workload: 0.2 made the index lookup 2.6% slower, 2026-11-27); 0.2: hashbrown 0.16 (kube-runtime)",
    ),
    (
        "getrandom",
        &["0.2", "0.3", "0.4"],
        "one per generation of rand_core: 0.2 under rand 0.8 and ring; 0.3 under rand 0.9, \
         ahash and tokenizers; 0.4 under rand 0.10 and tempfile",
    ),
    (
        "hashbrown",
        &["0.15", "0.16", "0.17"],
        "0.15: ours (core, engine, workload: 0.17 with foldhash 0.2 made the index lookup 2.6% slower, 2026-11-27); 0.16: kube-runtime; 0.17: indexmap",
    ),
    (
        "itertools",
        &["0.10", "0.14"],
        "0.10: criterion 0.5 (benchmarks only: a newer criterion changes every benchmark); \
         0.14: tokenizers, rayon-cond, prost-derive",
    ),
    (
        "miniz_oxide",
        &["0.8", "0.9"],
        "0.8: png 0.17 (plotters, through image, which pins png 0.17); 0.9: flate2 (png's too)",
    ),
    (
        "openssl-probe",
        &["0.1", "0.2"],
        "under rustls-native-certs 0.7 (async-nats 0.46, the newest) and 0.8 (hyper-rustls, \
         rustls-platform-verifier)",
    ),
    (
        "pem",
        &["3", "4"],
        "3: rcgen 0.13 (the tests' self-signed certificates); 4: kube-client",
    ),
    (
        "rand",
        &["0.8", "0.9", "0.10"],
        "0.8: ours (core and workload: every seeded stream, so every simulated result, would \
         change with 0.9), async-nats, tokio-websockets; 0.9: tokenizers, tungstenite; 0.10: \
         proptest (tests only), quinn-proto (reqwest)",
    ),
    (
        "rand_chacha",
        &["0.3", "0.9"],
        "under rand 0.8 (ours: the seeded streams) and rand 0.9",
    ),
    (
        "rand_core",
        &["0.6", "0.9", "0.10"],
        "one per rand: 0.8, 0.9 and 0.10",
    ),
    (
        "rustls-native-certs",
        &["0.7", "0.8"],
        "0.7: async-nats 0.46 (the newest); 0.8: hyper-rustls, rustls-platform-verifier (kube)",
    ),
    (
        "rustls-webpki",
        &["0.102", "0.103"],
        "0.102: async-nats 0.46 (the newest); 0.103: rustls 0.23, rustls-platform-verifier",
    ),
    (
        "syn",
        &["2", "3"],
        "proc macros move to syn 3 one by one: serde_derive, clap_derive, tokio-macros, \
         thiserror-impl 2 and others are there; tracing-attributes, prost-derive, \
         rust-embed-impl, ts-rs-macros, zerocopy-derive and others are not",
    ),
    (
        "thiserror",
        &["1", "2"],
        "1: async-nats 0.46 (the newest); 2: ours and the rest",
    ),
    (
        "thiserror-impl",
        &["1", "2"],
        "under thiserror 1 (async-nats) and 2",
    ),
    (
        "toml_datetime",
        &["0.6", "1"],
        "0.6: toml 0.8, ours and system-deps' (zmq-sys' build script), which requires toml 0.8: \
         moving ours would add a toml; 1: toml_edit 0.25 (proc-macro-crate, under proptest's \
         borsh-derive)",
    ),
    (
        "toml_edit",
        &["0.22", "0.25"],
        "0.22: toml 0.8 (ours and system-deps', which requires 0.8); 0.25: proc-macro-crate",
    ),
    (
        "tower-http",
        &["0.6", "0.7"],
        "0.6: reqwest 0.12; 0.7: kube-client 5",
    ),
    (
        "webpki-roots",
        &["0.26", "1"],
        "0.26: tokio-websockets (async-nats' WebSocket transport); 0.26.11 is a shim over 1",
    ),
    (
        "winnow",
        &["0.7", "1"],
        "0.7: toml_edit 0.22 (toml 0.8: ours and system-deps'); 1: toml_edit 0.25, toml_parser",
    ),
];

/// A package of the resolve: name, version, license expression.
struct Package {
    name: String,
    version: String,
    license: Option<String>,
}

/// Per (name, version): its dependents, as "name version".
type Dependents = BTreeMap<(String, String), BTreeSet<String>>;

/// `cargo metadata` for `TARGET`: the packages and who depends on each.
fn metadata() -> (Vec<Package>, Dependents) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(&root)
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--filter-platform", TARGET])
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata --locked failed (is Cargo.lock up to date?):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut by_id = BTreeMap::new();
    let packages = value["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let package = Package {
                name: p["name"].as_str().unwrap().to_string(),
                version: p["version"].as_str().unwrap().to_string(),
                license: p["license"].as_str().map(String::from),
            };
            let id = p["id"].as_str().unwrap().to_string();
            by_id.insert(id, (package.name.clone(), package.version.clone()));
            package
        })
        .collect();
    let mut dependents = Dependents::new();
    for node in value["resolve"]["nodes"].as_array().unwrap() {
        let (name, version) = &by_id[node["id"].as_str().unwrap()];
        for dep in node["deps"].as_array().unwrap() {
            let target = by_id[dep["pkg"].as_str().unwrap()].clone();
            dependents
                .entry(target)
                .or_default()
                .insert(format!("{name} {version}"));
        }
    }
    (packages, dependents)
}

/// Whether the licenses in `allowed` satisfy an SPDX expression; `Err` if it does not parse.
fn satisfied(expression: &str, allowed: &[&str]) -> Result<bool, String> {
    let spaced = expression
        .replace('(', " ( ")
        .replace(')', " ) ")
        .replace('/', " OR ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut parser = Parser {
        tokens: &tokens,
        at: 0,
        allowed,
    };
    let value = parser.any()?;
    match parser.tokens.get(parser.at) {
        None => Ok(value),
        Some(extra) => Err(format!("unexpected `{extra}`")),
    }
}

/// A recursive-descent reader of SPDX expressions that evaluates as it reads.
struct Parser<'a> {
    tokens: &'a [&'a str],
    at: usize,
    allowed: &'a [&'a str],
}

impl Parser<'_> {
    fn next_is(&mut self, word: &str) -> bool {
        let is = self.tokens.get(self.at) == Some(&word);
        self.at += usize::from(is);
        is
    }

    /// `a OR b OR ...`: either side.
    fn any(&mut self) -> Result<bool, String> {
        let mut value = self.all()?;
        while self.next_is("OR") {
            value |= self.all()?;
        }
        Ok(value)
    }

    /// `a AND b AND ...`: both sides.
    fn all(&mut self) -> Result<bool, String> {
        let mut value = self.one()?;
        while self.next_is("AND") {
            value &= self.one()?;
        }
        Ok(value)
    }

    /// `( ... )`, or a license with an optional `WITH exception`.
    fn one(&mut self) -> Result<bool, String> {
        if self.next_is("(") {
            let value = self.any()?;
            return if self.next_is(")") {
                Ok(value)
            } else {
                Err("unclosed `(`".into())
            };
        }
        let is_license = |t: &&str| !["(", ")", "OR", "AND", "WITH"].contains(t);
        let Some(license) = self.tokens.get(self.at).copied().filter(is_license) else {
            return Err(format!("a license expected at token {}", self.at));
        };
        self.at += 1;
        let mut license = license.to_string();
        if self.next_is("WITH") {
            let Some(exception) = self.tokens.get(self.at).copied().filter(is_license) else {
                return Err("an exception expected after WITH".into());
            };
            self.at += 1;
            license = format!("{license} WITH {exception}");
        }
        Ok(self.allowed.contains(&license.as_str()))
    }
}

/// The packages whose license is not allowed, or missing and not listed; listed packages that
/// no longer lack a license field.
fn license_violations(packages: &[Package], without: &[(&str, &str)]) -> Vec<String> {
    let mut broken = Vec::new();
    for p in packages {
        match &p.license {
            Some(expression) => match satisfied(expression, ALLOWED_LICENSES) {
                Ok(true) => {}
                Ok(false) => broken.push(format!(
                    "{} {}: license `{expression}` is not among ALLOWED_LICENSES",
                    p.name, p.version
                )),
                Err(why) => broken.push(format!(
                    "{} {}: license `{expression}` does not parse: {why}",
                    p.name, p.version
                )),
            },
            None if without.iter().any(|(name, _)| *name == p.name) => {}
            None => broken.push(format!(
                "{} {}: no license field; list it in WITHOUT_LICENSE with why it may ship",
                p.name, p.version
            )),
        }
    }
    for (name, _) in without {
        if !packages
            .iter()
            .any(|p| p.name == *name && p.license.is_none())
        {
            broken.push(format!(
                "{name} is in WITHOUT_LICENSE but no package of that name lacks a license field: \
                 remove its entry"
            ));
        }
    }
    broken
}

/// A version's semver series: `0.22.1` -> `0.22`, `1.1.3+spec-1.1.0` -> `1`, `0.0.3` -> `0.0.3`.
fn series(version: &str) -> String {
    let core = version.split(['+', '-']).next().unwrap_or(version);
    let parts: Vec<&str> = core.split('.').collect();
    match parts.as_slice() {
        ["0", "0", patch, ..] => format!("0.0.{patch}"),
        ["0", minor, ..] => format!("0.{minor}"),
        [major, ..] => major.to_string(),
        [] => version.to_string(),
    }
}

/// Names in several versions that `listed` does not name with exactly those series, and listed
/// names that are no longer duplicated. `who` tells who pulls a (name, version).
fn duplicate_violations(
    packages: &[Package],
    listed: &[(&str, &[&str], &str)],
    who: impl Fn(&str, &str) -> String,
) -> Vec<String> {
    let mut versions: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for p in packages {
        versions.entry(&p.name).or_default().insert(&p.version);
    }
    let mut broken = Vec::new();
    for (name, present) in versions.iter().filter(|(_, v)| v.len() > 1) {
        let found: BTreeSet<String> = present.iter().map(|v| series(v)).collect();
        let entry = listed.iter().find(|(n, _, _)| n == name);
        let expected: Option<BTreeSet<String>> =
            entry.map(|(_, v, _)| v.iter().map(|s| s.to_string()).collect());
        if expected.as_ref() != Some(&found) {
            let pulled: Vec<String> = present
                .iter()
                .map(|v| format!("{v} <- {}", who(name, v)))
                .collect();
            broken.push(format!(
                "{name} is present in versions {found:?} (DUPLICATES lists {:?}): {}; align \
                 our manifests if that makes it one, else list it with why",
                expected.unwrap_or_default(),
                pulled.join("; ")
            ));
        }
    }
    for (name, _, why) in listed {
        if versions.get(name).is_none_or(|v| v.len() < 2) {
            broken.push(format!(
                "{name} is in DUPLICATES but is no longer duplicated: remove its entry"
            ));
        }
        if why.trim().is_empty() {
            broken.push(format!("{name}'s DUPLICATES entry says not why"));
        }
    }
    broken
}

#[test]
fn every_package_carries_an_allowed_license() {
    let (packages, _) = metadata();
    assert!(packages.len() > 100, "{} packages", packages.len());
    let broken = license_violations(&packages, WITHOUT_LICENSE);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn duplicate_versions_are_the_listed_ones() {
    let (packages, dependents) = metadata();
    let who = |name: &str, version: &str| {
        let key = (name.to_string(), version.to_string());
        let names: Vec<&str> = dependents
            .get(&key)
            .map(|d| d.iter().map(String::as_str).collect())
            .unwrap_or_default();
        names.join(", ")
    };
    let broken = duplicate_violations(&packages, DUPLICATES, who);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_license_guard_reads_spdx_expressions() {
    let allowed = ["MIT", "Apache-2.0", "Apache-2.0 WITH LLVM-exception"];
    let ok = |e: &str| satisfied(e, &allowed);
    assert_eq!(ok("MIT"), Ok(true));
    assert_eq!(ok("MIT OR Apache-2.0"), Ok(true));
    assert_eq!(ok("MIT/Apache-2.0"), Ok(true));
    assert_eq!(ok("Apache-2.0 / MIT"), Ok(true));
    assert_eq!(ok("GPL-3.0-only OR MIT"), Ok(true));
    assert_eq!(ok("(MIT OR Apache-2.0) AND GPL-3.0-only"), Ok(false));
    assert_eq!(ok("MIT AND Apache-2.0"), Ok(true));
    assert_eq!(
        ok("Apache-2.0 WITH LLVM-exception OR GPL-2.0-only"),
        Ok(true)
    );
    assert_eq!(ok("GPL-2.0-only WITH Classpath-exception-2.0"), Ok(false));
    assert_eq!(ok("MPL-2.0"), Ok(false));
    assert!(ok("MIT OR").is_err());
    assert!(ok("(MIT").is_err());
    assert!(ok("MIT Apache-2.0").is_err());

    let package = |name: &str, license: Option<&str>| Package {
        name: name.into(),
        version: "1.0.0".into(),
        license: license.map(String::from),
    };
    let packages = [
        package("fine", Some("MIT OR Apache-2.0")),
        package("copyleft", Some("GPL-3.0-only")),
        package("bare", None),
    ];
    let broken = license_violations(&packages, &[("gone", "was bare")]);
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(broken[0].starts_with("copyleft 1.0.0"), "{broken:?}");
    assert!(broken[1].starts_with("bare 1.0.0"), "{broken:?}");
    assert!(
        broken[2].starts_with("gone is in WITHOUT_LICENSE"),
        "{broken:?}"
    );
    assert!(license_violations(&packages[2..], &[("bare", "data only")]).is_empty());
}

#[test]
fn the_duplicate_guard_sees_new_and_stale_entries() {
    assert_eq!(series("0.22.1"), "0.22");
    assert_eq!(series("1.1.3+spec-1.1.0"), "1");
    assert_eq!(series("2.0.0-rc.1"), "2");
    assert_eq!(series("0.0.3"), "0.0.3");
    let package = |name: &str, version: &str| Package {
        name: name.into(),
        version: version.into(),
        license: None,
    };
    let packages = [
        package("listed", "0.1.0"),
        package("listed", "0.2.5"),
        package("new", "1.0.0"),
        package("new", "2.0.0"),
        package("grown", "1.0.0"),
        package("grown", "2.0.0"),
        package("grown", "3.1.0"),
        package("single", "1.0.0"),
    ];
    let listed: &[(&str, &[&str], &str)] = &[
        ("listed", &["0.1", "0.2"], "a and b"),
        ("grown", &["1", "2"], "c and d"),
        ("single", &["1", "2"], "was two"),
    ];
    let broken = duplicate_violations(&packages, listed, |n, v| format!("user-of-{n}-{v}"));
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(
        broken[0].starts_with("grown is present") && broken[0].contains("user-of-grown-3.1.0"),
        "{broken:?}"
    );
    assert!(broken[1].starts_with("new is present"), "{broken:?}");
    assert!(
        broken[2].starts_with("single is in DUPLICATES"),
        "{broken:?}"
    );
}
