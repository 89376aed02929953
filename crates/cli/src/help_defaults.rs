//! `--help` names each config flag's default from the one place it is written: the config
//! tree's `Default`, serialized, read at the key path the flag sets. Only the help text
//! changes: a flag not given leaves the config files' value (its `Option` stays unset).

use clap::Command;

/// `kvroute serve`'s (and `epp`'s) flags and the gateway config keys they set.
pub(crate) const GATEWAY_FLAGS: &[(&str, &str)] = &[
    ("host", "host"),
    ("port", "port"),
    ("disaggregation", "router.disaggregation.mode"),
    ("policy", "router.policy.kind"),
    ("tokenizer", "tokenizer"),
    ("block_size", "router.block_size"),
    ("max_batch", "max_batch"),
    ("admission", "router.admission.mode"),
    (
        "max_queue_wait_secs",
        "router.admission.max_queue_wait_secs",
    ),
    (
        "max_queued_requests",
        "router.admission.max_queued_requests",
    ),
    (
        "busy_prefill_tokens",
        "router.admission.busy_prefill_tokens",
    ),
    (
        "busy_active_fraction",
        "router.admission.busy_active_fraction",
    ),
    ("seed", "router.seed"),
];

/// `kvroute worker`'s flags and the worker config keys they set.
pub(crate) const WORKER_FLAGS: &[(&str, &str)] = &[
    ("profile", "profile"),
    ("speedup", "speedup"),
    ("block_size", "block_size"),
    ("max_num_seqs", "max_num_seqs"),
    ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("num_gpu_blocks", "num_gpu_blocks"),
    ("host_blocks", "host_blocks"),
    ("host_load_secs_per_token", "host_load_secs_per_token"),
    ("model", "model"),
    ("name", "worker_name"),
    ("event_format", "event_format"),
    ("data_parallel_rank", "data_parallel_rank"),
    ("scheduling_policy", "scheduling_policy"),
];

/// The value at `path` (`a.b.c`) of `defaults`, as help shows it; `none` for a key the
/// serialized defaults leave out (an unset option).
pub(crate) fn default_at(defaults: &toml::Table, path: &str) -> String {
    let mut at = defaults;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        match at.get(*part) {
            Some(toml::Value::Table(t)) if i + 1 < parts.len() => at = t,
            Some(toml::Value::String(s)) if i + 1 == parts.len() => return s.clone(),
            Some(v) if i + 1 == parts.len() => return v.to_string(),
            _ => return "none".into(),
        }
    }
    "none".into()
}

/// `cmd` with each of `flags` (argument id, key path) showing its default from `defaults`.
pub(crate) fn annotate(cmd: Command, defaults: &toml::Table, flags: &[(&str, &str)]) -> Command {
    flags.iter().fold(cmd, |cmd, (id, path)| {
        let shown = default_at(defaults, path);
        cmd.mut_arg(*id, |a| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            a.help(format!("{help} [default: {shown}]"))
        })
    })
}

/// `cmd` with each of `shown` (argument id, value) showing that value as its default: for
/// flags whose default is the configured part's own, read from where it is written.
pub(crate) fn annotate_values(cmd: Command, shown: &[(&str, String)]) -> Command {
    shown.iter().fold(cmd, |cmd, (id, value)| {
        cmd.mut_arg(*id, |a| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            a.help(format!("{help} [default: {value}]"))
        })
    })
}

/// `simulate`'s and `bench`'s objectives: the `goodput` policy's, in ms.
pub(crate) fn annotate_objectives(cmd: Command) -> Command {
    let d = kvroute_core::policy::GoodputConfig::default();
    let ms = |secs: f64| format!("{}", secs * 1e3);
    annotate_values(
        cmd,
        &[
            ("slo_ttft_ms", ms(d.ttft_secs)),
            ("slo_tpot_ms", ms(d.tpot_secs)),
        ],
    )
}

/// The defaults of a config tree `T`, serialized.
pub(crate) fn defaults_of<T: Default + serde::Serialize>() -> toml::Table {
    toml::Table::try_from(T::default()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_gateway::GatewayConfig;
    use kvroute_worker::WorkerConfig;

    /// Every key path names a key of the tree (its parent tables exist; a missing leaf is
    /// an unset option, which the tree's own fields list).
    fn check(defaults: &toml::Table, flags: &[(&str, &str)], fields: &str) {
        for (id, path) in flags {
            let (parent, leaf) = path.rsplit_once('.').unwrap_or(("", path));
            let mut at = defaults;
            for p in parent.split('.').filter(|p| !p.is_empty()) {
                at = at[p].as_table().unwrap_or_else(|| panic!("{id}: {path}"));
            }
            assert!(
                at.contains_key(leaf) || fields.contains(leaf),
                "{id}: {path} is no key"
            );
        }
    }

    #[test]
    fn the_key_paths_exist_and_the_defaults_are_the_trees() {
        let g = defaults_of::<GatewayConfig>();
        check(&g, GATEWAY_FLAGS, "tokenizer max_batch busy_prefill_tokens");
        assert_eq!(default_at(&g, "router.policy.kind"), "goodput");
        assert_eq!(
            default_at(&g, "router.admission.max_queue_wait_secs"),
            "30.0"
        );
        assert_eq!(default_at(&g, "tokenizer"), "none");
        let w = defaults_of::<WorkerConfig>();
        check(
            &w,
            WORKER_FLAGS,
            "block_size max_num_seqs max_num_batched_tokens num_gpu_blocks host_blocks host_load_secs_per_token worker_name data_parallel_rank",
        );
    }
}
