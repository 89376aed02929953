//! Which settings two configs differ in, as key paths (`router.admission.mode`; an array is
//! one value, named whole: `workers`), for a reload to say what it applied and what waits
//! for a restart. Keys are never compared: they are not serialized.

use super::GatewayConfig;

/// The key paths whose values differ between `old` and `new`, sorted.
pub fn changed_keys(old: &GatewayConfig, new: &GatewayConfig) -> Vec<String> {
    let tree = |c: &GatewayConfig| toml::Table::try_from(c).unwrap_or_default();
    let mut out = Vec::new();
    walk("", &tree(old), &tree(new), &mut out);
    out.sort();
    out
}

fn walk(prefix: &str, old: &toml::Table, new: &toml::Table, out: &mut Vec<String>) {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for k in keys {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (old.get(k), new.get(k)) {
            (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => walk(&path, a, b, out),
            (a, b) if a != b => out.push(path),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_settings_are_named_by_their_key_path() {
        let old = GatewayConfig::default();
        assert!(changed_keys(&old, &old).is_empty());
        let mut new = old.clone();
        new.port = 9001;
        new.router.admission.max_queued_requests = 7;
        new.models = vec!["m".into()];
        new.tokenizer = Some("builtin".into());
        assert_eq!(
            changed_keys(&old, &new),
            [
                "models",
                "port",
                "router.admission.max_queued_requests",
                "tokenizer"
            ]
        );
        // Keys never count (nor show).
        new = old.clone();
        new.auth.api_keys = vec![super::super::Secret("sk-x".into())];
        assert!(changed_keys(&old, &new).is_empty());
    }
}
