//! Which settings two configs differ in, as key paths (`router.admission.mode`; an array is
//! one value, named whole: `workers`), for a reload to say what it applied and what waits
//! for a restart. Keys are never compared: they are not serialized.

use super::GatewayConfig;

/// The key paths whose values differ between `old` and `new`, sorted. Keys (never
/// serialized) are compared apart and named by where they are: `auth.api_keys`,
/// `auth.admin_key`, `upstream.api_key`, `workers` (a worker's), the tenants'
/// (`router.admission.flow`).
pub fn changed_keys(old: &GatewayConfig, new: &GatewayConfig) -> Vec<String> {
    let tree = |c: &GatewayConfig| toml::Table::try_from(c).unwrap_or_default();
    let mut out = Vec::new();
    walk("", &tree(old), &tree(new), &mut out);
    let secrets = [
        ("auth.api_keys", old.auth.api_keys != new.auth.api_keys),
        ("auth.admin_key", old.auth.admin_key != new.auth.admin_key),
        (
            "upstream.api_key",
            old.upstream.api_key != new.upstream.api_key,
        ),
        ("workers", old.workers != new.workers),
        (
            "router.admission.flow",
            old.router.admission.flow != new.router.admission.flow,
        ),
    ];
    for (key, differs) in secrets {
        let named = out
            .iter()
            .any(|k| k == key || k.starts_with(&format!("{key}.")));
        if differs && !named {
            out.push(key.to_string());
        }
    }
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
        // A key's change is named by where it is, never shown.
        new = old.clone();
        new.auth.api_keys = vec![super::super::Secret("sk-x".into())];
        assert_eq!(changed_keys(&old, &new), ["auth.api_keys"]);
        new = old.clone();
        new.upstream.api_key = Some(super::super::Secret("sk-y".into()));
        assert_eq!(changed_keys(&old, &new), ["upstream.api_key"]);
    }
}
