//! `kvroute loadgen --tenants FILE`: several tenants at once, each its own key, headers and
//! load, a row each in the report (docs/loadgen.md). The file (TOML) lists `[[tenants]]`, each
//! a `name` and any of the run's settings (`LoadgenConfig`'s fields: `api_key`, `headers`,
//! `workload`, `concurrency`, `rate`, `conversations`, `chat`, `synthetic`, ...); what a tenant
//! does not set is the command line's (its seed: the command line's plus its place).

use anyhow::{bail, Context, Result};
use kvroute_loadgen::LoadgenConfig;
use serde::Deserialize;
use std::path::Path;

/// The file's form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    tenants: Vec<toml::Table>,
}

/// The tenants of `path`, each named, over `base` (the command line's settings).
pub(crate) fn read(path: &Path, base: &LoadgenConfig) -> Result<Vec<(String, LoadgenConfig)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text, base).with_context(|| format!("in {}", path.display()))
}

/// The tenants of `text` over `base`.
pub(crate) fn parse(text: &str, base: &LoadgenConfig) -> Result<Vec<(String, LoadgenConfig)>> {
    let spec: Spec = toml::from_str(text)?;
    if spec.tenants.is_empty() || spec.tenants.len() > kvroute_loadgen::MAX_TENANTS {
        bail!(
            "between 1 and {} [[tenants]], got {}",
            kvroute_loadgen::MAX_TENANTS,
            spec.tenants.len()
        );
    }
    let mut out: Vec<(String, LoadgenConfig)> = Vec::new();
    for (i, mut t) in spec.tenants.into_iter().enumerate() {
        let name = match t.remove("name") {
            Some(toml::Value::String(n)) if !n.is_empty() && n.len() <= 64 => n,
            _ => bail!("tenant {i}: a `name` (1-64 characters) is required"),
        };
        if out.iter().any(|(n, _)| *n == name) {
            bail!("tenant {name:?} is named twice");
        }
        let mut merged = toml::Table::try_from(base)?;
        if !t.contains_key("seed") {
            merged.insert(
                "seed".into(),
                toml::Value::Integer(base.seed.wrapping_add(i as u64) as i64),
            );
        }
        for (k, v) in t {
            merged.insert(k, v);
        }
        let mut config: LoadgenConfig = merged
            .try_into()
            .with_context(|| format!("tenant {name:?}"))?;
        if config.api_key.is_none() {
            config.api_key = base.api_key.clone();
        }
        config
            .validate()
            .with_context(|| format!("tenant {name:?}"))?;
        out.push((name, config));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_the_command_lines_settings_unless_they_set_their_own() {
        let base = LoadgenConfig {
            target: "http://127.0.0.1:9000".into(),
            seed: 7,
            api_key: Some("sk-base".into()),
            ..LoadgenConfig::default()
        };
        let t = parse(
            r#"
            [[tenants]]
            name = "chat"
            api_key = "sk-chat"
            headers = { "x-kvroute-class" = "interactive" }
            concurrency = 3

            [[tenants]]
            name = "batch"
            workload = "synthetic"
            rate = 2.5
            seed = 99
            "#,
            &base,
        )
        .unwrap();
        let (chat, batch) = (&t[0].1, &t[1].1);
        assert_eq!((t[0].0.as_str(), t[1].0.as_str()), ("chat", "batch"));
        assert_eq!(chat.target, base.target);
        assert_eq!((chat.concurrency, chat.seed), (3, 7));
        assert_eq!(chat.api_key.as_deref(), Some("sk-chat"));
        assert_eq!(chat.headers["x-kvroute-class"], "interactive");
        assert_eq!((batch.rate, batch.seed), (Some(2.5), 99));
        assert_eq!(batch.api_key.as_deref(), Some("sk-base"));
        assert!(batch.headers.is_empty());
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let base = LoadgenConfig::default();
        for (text, says) in [
            ("tenants = []", "between 1 and"),
            ("[[tenants]]\nconcurrency = 2", "`name`"),
            (
                "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"a\"",
                "named twice",
            ),
            ("[[tenants]]\nname = \"a\"\nconcurency = 2", "unknown field"),
            ("[[tenants]]\nname = \"a\"\nconcurrency = 0", "concurrency"),
            (
                "[[tenants]]\nname = \"a\"\nheaders = { \"bad name\" = \"x\" }",
                "header",
            ),
            ("[tenant]\nname = \"a\"", "unknown field"),
        ] {
            let e = format!("{:#}", parse(text, &base).unwrap_err());
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
