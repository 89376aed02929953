//! Each engine's capacity, learned from what it publishes when not configured: vLLM's
//! `vllm:cache_config_info` info gauge carries `num_gpu_blocks` and `block_size` as labels
//! (one line per engine core, `engine="R"` for data-parallel rank R). Admission (`queue`,
//! `shed`) judges a worker busy by the fraction of its KV blocks in use, so a worker whose
//! capacity stays unknown is never busy: the gateway says so loudly, once per worker.

use crate::registry::WorkerEntry;
use crate::state::Gateway;
use kvroute_core::WorkerCapacity;
use std::sync::atomic::Ordering;

/// One `vllm:cache_config_info` line: the engine core's rank (its `engine` label), its KV
/// blocks and their size in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The `engine` label, when it is a number.
    pub engine: Option<u32>,
    /// `num_gpu_blocks`.
    pub blocks: u64,
    /// `block_size`, tokens per block.
    pub block_size: u64,
}

/// Every `vllm:cache_config_info` line of a metrics text that names its blocks and block
/// size (vLLM writes `None` before the cache is allocated: skipped).
pub fn cache_configs(text: &str) -> Vec<CacheConfig> {
    text.lines()
        .filter_map(|l| l.strip_prefix("vllm:cache_config_info{"))
        .filter_map(|rest| {
            let labels = rest.split_once('}')?.0;
            let label = |name: &str| -> Option<&str> {
                let key = format!("{name}=\"");
                let start = labels
                    .match_indices(&key)
                    .find(|(i, _)| *i == 0 || labels.as_bytes()[i - 1] == b',')?
                    .0
                    + key.len();
                let end = labels[start..].find('"')?;
                Some(&labels[start..start + end])
            };
            Some(CacheConfig {
                engine: label("engine").and_then(|v| v.parse().ok()),
                blocks: label("num_gpu_blocks")?.parse().ok()?,
                block_size: label("block_size")?.parse().ok()?,
            })
        })
        .filter(|c| c.blocks > 0 && c.block_size > 0)
        .collect()
}

/// The capacity of the worker playing data-parallel `rank` (None: the engine's only or
/// first core), in the router's blocks of `router_block_size` tokens.
pub fn blocks_for(
    configs: &[CacheConfig],
    rank: Option<u32>,
    router_block_size: u64,
) -> Option<u64> {
    let c = configs
        .iter()
        .find(|c| c.engine == Some(rank.unwrap_or(0)))
        .or_else(|| configs.first())?;
    let tokens = c.blocks.checked_mul(c.block_size)?;
    Some(tokens / router_block_size.max(1))
}

/// Applies what an engine's metrics text says to every worker at its URL whose capacity was
/// not configured; true when one of them learned it.
pub fn learn(gw: &Gateway, url: &str, text: &str) -> bool {
    let configs = cache_configs(text);
    let mut learned = false;
    for w in gw.registry.iter().filter(|w| w.spec.url == url) {
        if w.spec.kv_blocks.is_some() {
            continue;
        }
        let block_size = gw.config.router.block_size as u64;
        let Some(blocks) = blocks_for(&configs, w.spec.dp_rank, block_size) else {
            continue;
        };
        if w.learned_kv_blocks.swap(blocks, Ordering::Relaxed) == blocks {
            continue;
        }
        let capacity = WorkerCapacity {
            kv_blocks: Some(blocks),
            max_batch: w.spec.max_batch,
        };
        let mut router = gw.router();
        if let Some(tracking) = router.tracking(w.id) {
            if router.add_worker_with(w.id, capacity, tracking).is_ok() {
                learned = true;
                tracing::info!(worker = %w.name, kv_blocks = blocks, "capacity learned from the engine's vllm:cache_config_info");
            }
        }
    }
    learned
}

/// Whether `w` still needs its capacity learned.
pub fn unknown(w: &WorkerEntry) -> bool {
    w.spec.kv_blocks.is_none() && w.learned_kv_blocks.load(Ordering::Relaxed) == 0
}

/// Says, once per worker, that admission cannot judge it busy.
pub fn warn_unknown(gw: &Gateway) {
    if gw.config.router.admission.mode == kvroute_core::AdmissionMode::None {
        return;
    }
    for w in gw.registry.iter().filter(|w| unknown(w)) {
        if !w.capacity_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(worker = %w.name, "admission is off for this worker: its KV capacity is unknown (set kv_blocks, or run an engine that publishes vllm:cache_config_info); it is never judged busy, so nothing is queued or shed for it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_cache_config_lines_give_each_ranks_blocks_in_the_routers_block_size() {
        let text = "# HELP vllm:cache_config_info Information of the LLMCache\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",kv_cache_max_concurrency=\"2.58\",num_gpu_blocks=\"661\",num_cpu_blocks=\"None\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"700\"} 1.0\n\
            vllm:num_requests_running{model_name=\"m\"} 0\n";
        let c = cache_configs(text);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            CacheConfig {
                engine: Some(0),
                blocks: 661,
                block_size: 16
            }
        );
        assert_eq!(blocks_for(&c, None, 16), Some(661));
        assert_eq!(blocks_for(&c, Some(1), 16), Some(700));
        // Another block size: the same tokens in the router's blocks.
        assert_eq!(blocks_for(&c, Some(1), 32), Some(350));
        // An unknown rank falls back to the first core.
        assert_eq!(blocks_for(&c, Some(7), 16), Some(661));
        // Before the cache is allocated, and unrelated or broken lines.
        let none = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n\
            vllm:cache_config_info{xnum_gpu_blocks=\"5\",block_size=\"16\"} 1\n\
            vllm:cache_config_info{num_gpu_blocks=\"5\n\
            vllm:cache_config_info_other{num_gpu_blocks=\"5\",block_size=\"16\"} 1\n";
        assert!(cache_configs(none).is_empty(), "{:?}", cache_configs(none));
        assert_eq!(blocks_for(&[], None, 16), None);
    }
}
