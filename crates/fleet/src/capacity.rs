//! Each engine's capacity, learned from what it publishes when not configured: vLLM's
//! `vllm:cache_config_info` info gauge carries `num_gpu_blocks` and `block_size` as labels
//! (one line per engine core, `engine="R"` for data-parallel rank R); SGLang's
//! `sglang:max_total_num_tokens` gauge is its KV pool in tokens (one line per scheduler,
//! `dp_rank="R"` with data parallelism). Admission (`queue`, `shed`) judges a worker busy by
//! the fraction of its KV blocks in use, so a worker whose capacity stays unknown is never
//! busy: the gateway says so loudly, once per worker. No engine publishes its batch limit
//! (`max_num_seqs`): without `max_batch` (the worker's, or the gateway's for workers that
//! give none) a worker is judged by its KV cache only, and the gateway says that too.

use crate::bookings::Waiter;
use crate::config::GatewayConfig;
use crate::registry::{Registry, WorkerEntry};
use crate::table::RoutingTable;
use kvroute_core::{AdmissionMode, WorkerCapacity};
use kvroute_protocol::prometheus_text::{samples, Sample};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One engine core's KV cache as its metrics give it: its data-parallel rank, its blocks and
/// their size in tokens (SGLang's pool is counted in tokens: blocks of 1 token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The rank label (vLLM `engine`, SGLang `dp_rank`), when it is a number.
    pub engine: Option<u32>,
    /// vLLM `num_gpu_blocks`; SGLang `max_total_num_tokens`.
    pub blocks: u64,
    /// vLLM `block_size`, tokens per block; 1 for SGLang.
    pub block_size: u64,
}

/// Every engine core's KV cache a metrics text names: vLLM's `vllm:cache_config_info` lines
/// with their blocks and block size (vLLM writes `None` before the cache is allocated:
/// skipped) and SGLang's `sglang:max_total_num_tokens` lines.
pub fn cache_configs(text: &str) -> Vec<CacheConfig> {
    fn number<T: std::str::FromStr>(s: &Sample, label: &str) -> Option<T> {
        s.label(label)?.parse().ok()
    }
    samples(text)
        .filter_map(|s| match s.name {
            "vllm:cache_config_info" => Some(CacheConfig {
                engine: number(&s, "engine"),
                blocks: number(&s, "num_gpu_blocks")?,
                block_size: number(&s, "block_size")?,
            }),
            "sglang:max_total_num_tokens" => Some(CacheConfig {
                engine: number(&s, "dp_rank"),
                // A gauge of a whole number of tokens; NaN and negatives are refused below.
                blocks: if (1.0..1e15).contains(&s.value) {
                    s.value as u64
                } else {
                    0
                },
                block_size: 1,
            }),
            _ => None,
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

/// Capacity learning: on the registry (what is configured and learned) and the routing table
/// (where a worker's capacity counts).
pub struct Capacity {
    registry: Arc<Registry>,
    table: Arc<RoutingTable<Waiter>>,
    /// The router's block size.
    block_size: u64,
    /// The gateway's `max_batch`, for workers that give none.
    max_batch: Option<u32>,
    /// Admission judges workers busy (not `none`).
    admission: bool,
    /// Admission judges a worker's batch (`busy_batch_fraction` set).
    judges_batch: bool,
}

impl Capacity {
    /// Capacity learning for workers in `registry`, routed by `table`, with `config`'s
    /// router and admission settings.
    pub fn new(
        registry: Arc<Registry>,
        table: Arc<RoutingTable<Waiter>>,
        config: &GatewayConfig,
    ) -> Self {
        Self {
            registry,
            table,
            block_size: config.router.block_size as u64,
            max_batch: config.max_batch,
            admission: config.router.admission.mode != AdmissionMode::None,
            judges_batch: config.router.admission.busy_batch_fraction.is_some(),
        }
    }

    /// Applies what an engine's metrics text says to every worker at its URL whose capacity was
    /// not configured; true when one of them learned it.
    pub fn learn(&self, url: &str, text: &str) -> bool {
        let configs = cache_configs(text);
        let mut learned = false;
        for w in self.registry.all().iter().filter(|w| w.spec.url == url) {
            if w.spec.kv_blocks.is_some() {
                continue;
            }
            let Some(blocks) = blocks_for(&configs, w.spec.dp_rank, self.block_size) else {
                continue;
            };
            if w.learned_kv_blocks.swap(blocks, Ordering::Relaxed) == blocks {
                continue;
            }
            let capacity = WorkerCapacity {
                kv_blocks: Some(blocks),
                max_batch: w.spec.capacity(self.max_batch).max_batch,
            };
            let added = self.table.update(|r| {
                r.tracking(w.id)
                    .is_some_and(|t| r.add_worker_with(w.id, capacity, t).is_ok())
            });
            if added {
                learned = true;
                tracing::info!(worker = %w.name, kv_blocks = blocks, "capacity learned from the engine's metrics");
            }
        }
        learned
    }

    /// Says, once per worker, that admission cannot judge it busy.
    pub fn warn_unknown(&self) {
        if !self.admission {
            return;
        }
        for w in self.registry.all().iter().filter(|w| unknown(w)) {
            if !w.capacity_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(worker = %w.name, "admission is off for this worker: its KV capacity is unknown (set kv_blocks, or run an engine that publishes vllm:cache_config_info or sglang:max_total_num_tokens); it is never judged busy, so nothing is queued or shed for it");
            }
        }
        if !self.judges_batch {
            return;
        }
        for w in self
            .registry
            .all()
            .iter()
            .filter(|w| !unknown(w) && w.spec.capacity(self.max_batch).max_batch.is_none())
        {
            if !w.batch_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(worker = %w.name, "admission judges this worker by its KV cache only: its batch limit (max_batch, vLLM's max_num_seqs) is unknown, as no engine publishes it; set the worker's max_batch or the gateway's (--max-batch), or requests past it wait in the engine's own queue instead of the gateway's (or being shed)");
            }
        }
    }
}

/// Whether `w` still needs its capacity learned.
pub fn unknown(w: &WorkerEntry) -> bool {
    w.spec.kv_blocks.is_none() && w.learned_kv_blocks.load(Ordering::Relaxed) == 0
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

    #[test]
    fn a_real_vllm_engines_metrics_give_its_cache() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../cli/tests/fixtures/vllm-0.32.0-metrics.txt"
        );
        let c = cache_configs(&std::fs::read_to_string(path).unwrap());
        assert_eq!(
            c,
            [CacheConfig {
                engine: Some(0),
                blocks: 2048,
                block_size: 32
            }]
        );
        assert_eq!(blocks_for(&c, None, 16), Some(4096));
    }

    #[test]
    fn sglang_pool_sizes_give_each_ranks_blocks_in_the_routers_block_size() {
        let text = "# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.\n\
            # TYPE sglang:max_total_num_tokens gauge\n\
            sglang:max_total_num_tokens{dp_rank=\"0\",engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 161721.0\n\
            sglang:max_total_num_tokens{dp_rank=\"1\",model_name=\"m\"} 1.6e+05\n\
            sglang:max_total_num_tokens_other{model_name=\"m\"} 5.0\n\
            sglang:num_used_tokens{model_name=\"m\"} 12.0\n";
        let c = cache_configs(text);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(
            c[0],
            CacheConfig {
                engine: Some(0),
                blocks: 161_721,
                block_size: 1
            }
        );
        // In the router's blocks of 16 tokens: the whole blocks the pool holds.
        assert_eq!(blocks_for(&c, None, 16), Some(10_107));
        assert_eq!(blocks_for(&c, Some(1), 16), Some(10_000));
        // Without labels, and values no pool has.
        assert_eq!(
            cache_configs("sglang:max_total_num_tokens 4096\n"),
            vec![CacheConfig {
                engine: None,
                blocks: 4096,
                block_size: 1
            }]
        );
        for bad in ["NaN", "+Inf", "-5", "0", "0.5", "1e300", "x"] {
            let line = format!("sglang:max_total_num_tokens{{model_name=\"m\"}} {bad}\n");
            assert!(cache_configs(&line).is_empty(), "{bad}");
        }
    }
}
