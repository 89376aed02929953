//! Config that composes: any number of TOML files (later ones override earlier ones, table by
//! table; an array or a value is replaced whole), then environment variables named
//! `KVROUTE__` (a simulated worker's: `KVROUTE_WORKER__`) + the key path with `__` between its
//! parts (`KVROUTE__ROUTER__ADMISSION__MODE=queue`; parts lower-cased; the value read as a
//! TOML value, else as a string; an inline table merged as a file's), for containers. Every
//! problem is reported with where it is: the file and line (or the variable) and the key path.
//! The one reader of config files for every subcommand (`serve`, `worker`, `demo`,
//! `check-config`).

use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};

/// The prefix of the environment variables that override config keys.
pub(crate) const ENV_PREFIX: &str = "KVROUTE__";
/// Most files layered.
const MAX_FILES: usize = 32;
/// Largest config file read, in bytes.
const MAX_FILE_BYTES: u64 = 4 << 20;
/// Most parts of an environment variable's key path.
const MAX_DEPTH: usize = 16;

/// One problem of a layered config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The file (or environment variable) it is in, when one is to blame.
    pub source: Option<String>,
    /// Its line there (from 1), when known.
    pub line: Option<usize>,
    /// The key path (`router.admission.mode`), when known.
    pub path: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.source, self.line) {
            (Some(s), Some(l)) => write!(f, "{s}:{l}: ")?,
            (Some(s), None) => write!(f, "{s}: ")?,
            _ => {}
        }
        if let Some(p) = self.path.as_deref().filter(|p| !p.is_empty() && *p != ".") {
            write!(f, "{p}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem of a layered config, one a line.
#[derive(Debug)]
pub(crate) struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(Problem::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl std::error::Error for Problems {}

/// The prefix of the environment variables that override a simulated worker's config keys
/// (its tree is another one: a gateway's variables must not reach it).
pub(crate) const WORKER_ENV_PREFIX: &str = "KVROUTE_WORKER__";

/// The environment's overrides: its variables named `prefix`... (a value that is not UTF-8
/// is kept, marked, to be refused by name).
pub(crate) fn env_overrides(prefix: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with(prefix).then(|| {
                let v = v.into_string().unwrap_or_else(|_| NOT_UTF8.to_string());
                (k, v)
            })
        })
        .collect()
}

/// The value given for a variable whose value is not UTF-8 (refused by its name).
const NOT_UTF8: &str = "\u{0}not UTF-8";

/// `paths` layered in order, then `env` (name, value) overrides, as a `T`; every problem
/// found (each file is also read alone, so that a mistake is named with its line).
pub(crate) fn load<T: DeserializeOwned>(
    paths: &[PathBuf],
    env: &[(String, String)],
) -> Result<T, Problems> {
    load_with(paths, env, ENV_PREFIX)
}

/// [`load`] for a tree whose variables are named `prefix`...
pub(crate) fn load_with<T: DeserializeOwned>(
    paths: &[PathBuf],
    env: &[(String, String)],
    prefix: &str,
) -> Result<T, Problems> {
    let mut problems = Vec::new();
    if paths.len() > MAX_FILES {
        problems.push(problem(
            None,
            format!("at most {MAX_FILES} config files, got {}", paths.len()),
        ));
        return Err(Problems(problems));
    }
    let mut merged = toml::Table::new();
    for path in paths {
        match read(path) {
            Ok(text) => match layer::<T>(&text, &path.display().to_string()) {
                Ok(table) => merge(&mut merged, table),
                Err(p) => problems.push(p),
            },
            Err(p) => problems.push(p),
        }
    }
    // In name order, whatever the environment's: a key set whole and a part of it set too
    // (`KVROUTE__PORT`, `KVROUTE__PORT__X`) is a problem either way round.
    let mut env: Vec<&(String, String)> = (env.iter())
        .filter(|(name, _)| name.starts_with(prefix))
        .collect();
    env.sort();
    for (name, value) in env.iter().copied() {
        if let Err(message) = set_from_env(&mut merged, prefix, name, value) {
            problems.push(Problem {
                source: Some(name.clone()),
                ..problem(None, message)
            });
        }
    }
    if !problems.is_empty() {
        return Err(Problems(problems));
    }
    serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
        let path = e.path().to_string();
        // The variable that set it, when one did.
        let source = env
            .iter()
            .copied()
            .find(|(name, _)| {
                env_path(prefix, name).is_some_and(|p| {
                    let p = p.join(".");
                    path == p || path.starts_with(&format!("{p}."))
                })
            })
            .map(|(name, _)| name.clone());
        Problems(vec![Problem {
            source,
            line: None,
            path: Some(path),
            message: e.inner().message().to_string(),
        }])
    })
}

fn problem(path: Option<String>, message: String) -> Problem {
    Problem {
        source: None,
        line: None,
        path,
        message,
    }
}

/// A file's text, bounded.
fn read(path: &Path) -> Result<String, Problem> {
    let source = Some(path.display().to_string());
    let fail = |message: String| Problem {
        source: source.clone(),
        ..problem(None, message)
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(format!(
            "larger than {MAX_FILE_BYTES} bytes ({})",
            meta.len()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read it: {e}")))
}

/// One file's table, checked alone as a `T` (its problem named with its line and key path).
fn layer<T: DeserializeOwned>(text: &str, source: &str) -> Result<toml::Table, Problem> {
    let at = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
    };
    let table: toml::Table = toml::from_str(text).map_err(|e| Problem {
        source: Some(source.to_string()),
        line: at(e.span()),
        path: None,
        message: e.message().to_string(),
    })?;
    let checked: Result<T, _> = serde_path_to_error::deserialize(toml::Deserializer::new(text));
    if let Err(e) = checked {
        return Err(Problem {
            source: Some(source.to_string()),
            line: at(e.inner().span()),
            path: Some(e.path().to_string()),
            message: e.inner().message().to_string(),
        });
    }
    Ok(table)
}

/// `over` laid over `base`: tables merged key by key, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The key path a variable names (`KVROUTE__ROUTER__POLICY__KIND` -> router, policy, kind).
fn env_path(prefix: &str, name: &str) -> Option<Vec<String>> {
    let rest = name.strip_prefix(prefix)?;
    let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    (parts.len() <= MAX_DEPTH && parts.iter().all(|p| !p.is_empty())).then_some(parts)
}

/// Sets the key `name` names to `value` (a TOML value, else a string; a table is merged
/// into the files' as a file's would be).
fn set_from_env(
    table: &mut toml::Table,
    prefix: &str,
    name: &str,
    value: &str,
) -> Result<(), String> {
    if value == NOT_UTF8 {
        return Err("its value is not UTF-8".into());
    }
    let parts = env_path(prefix, name).ok_or_else(|| {
        format!("not a key path: {prefix} then 1 to {MAX_DEPTH} non-empty parts between `__`")
    })?;
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let (last, tables) = parts.split_last().ok_or("an empty key path")?;
    let mut at = table;
    for (i, part) in tables.iter().enumerate() {
        let next = at
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = match next {
            toml::Value::Table(t) => t,
            _ => return Err(format!("{} is not a table", parts[..=i].join("."))),
        };
    }
    match (at.get_mut(last), parsed) {
        (Some(toml::Value::Table(base)), toml::Value::Table(over)) => merge(base, over),
        (_, v) => {
            at.insert(last.clone(), v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
