//! KV tiers: where an engine keeps a block, what it costs to use it from there, and the
//! indexes of blocks an engine moved out of its device cache.
//!
//! Engines that offload KV blocks (vLLM's offloading connector, SGLang's hierarchical cache,
//! TensorRT-LLM's host cache) keep a block reusable after it leaves device memory: a request
//! whose prefix continues in host memory or on disk loads those blocks back instead of
//! computing them. The engine reports those blocks as cached (vLLM counts loaded tokens in
//! `cached_tokens`), but loading them takes time. So the router tracks each offloaded tier in
//! an index of its own ([`OffloadedTiers`]), finds per worker the run of prompt blocks after
//! its device match that a tier holds ([`Loadable`]), and charges each loaded token a
//! fraction of the time to compute it ([`TierConfig`]).
//!
//! Offloaded stores come in two forms: full (token ids and parent, like a device store) and
//! bare (only the engine hashes of blocks the engine already reported, as vLLM's offloading
//! connector sends unless `self_describing_kv_events` is set). A bare store is resolved
//! through the worker's device index, then its offloaded tiers; a parent likewise.

use crate::hashing::{EngineHash, SequenceHash};
use crate::index::{IndexError, KvEvent, PrefixIndex, StoredHashed};
use crate::types::{BlockSize, WorkerId};
use serde::{Deserialize, Serialize};

/// Where an engine keeps a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Device (GPU) memory: a hit costs nothing.
    #[default]
    Device,
    /// Host memory (CPU DRAM): loaded back over the host link.
    Host,
    /// Disk, remote or any slower store.
    Disk,
}

impl Tier {
    /// The offloaded tiers, fastest first.
    pub const OFFLOADED: [Tier; 2] = [Tier::Host, Tier::Disk];

    /// A stable snake_case name (metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

/// What loading a block back costs, per tier.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// Seconds to load a token's KV from host memory, as a fraction of the seconds to
    /// compute it by prefill (0: free, 1: as slow as recomputing it).
    pub host_load_ratio: f64,
    /// The same for disk and slower tiers.
    pub disk_load_ratio: f64,
}

impl Default for TierConfig {
    /// An 8B-parameter model in 16-bit precision holds 128 KiB of KV per token: about 5 us
    /// over a 25 GB/s host link against 50-100 us of prefill on one accelerator (a tenth),
    /// and 25 us from a 5 GB/s NVMe drive (two fifths).
    fn default() -> Self {
        Self {
            host_load_ratio: 0.1,
            disk_load_ratio: 0.4,
        }
    }
}

impl TierConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        for (name, r) in [
            ("host_load_ratio", self.host_load_ratio),
            ("disk_load_ratio", self.disk_load_ratio),
        ] {
            if !(r.is_finite() && (0.0..=1.0).contains(&r)) {
                return Err(format!("tiers {name} must be within 0..=1, got {r}"));
            }
        }
        Ok(())
    }

    /// The prefill-equivalent tokens of loading `loadable` blocks of `block_size` tokens.
    pub fn load_tokens(&self, loadable: Loadable, block_size: usize) -> f64 {
        let bs = block_size as f64;
        (loadable.host as f64 * self.host_load_ratio + loadable.disk as f64 * self.disk_load_ratio)
            * bs
    }
}

/// Prompt blocks a worker can load back after its device match, by tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loadable {
    /// Blocks in host memory.
    pub host: usize,
    /// Blocks on disk.
    pub disk: usize,
}

impl Loadable {
    /// All loadable blocks.
    pub fn blocks(&self) -> usize {
        self.host + self.disk
    }
}

/// The indexes of offloaded blocks, one per offloaded tier.
pub struct OffloadedTiers {
    host: PrefixIndex,
    disk: PrefixIndex,
}

impl OffloadedTiers {
    /// Empty indexes.
    pub fn new(block_size: BlockSize, max_workers: usize) -> Self {
        Self {
            host: PrefixIndex::with_max_workers(block_size, max_workers),
            disk: PrefixIndex::with_max_workers(block_size, max_workers),
        }
    }

    /// Keeps at most `limit` blocks per worker in each tier's index.
    pub fn set_max_blocks_per_worker(&mut self, limit: usize) {
        self.host.set_max_blocks_per_worker(limit);
        self.disk.set_max_blocks_per_worker(limit);
    }

    /// The index of an offloaded tier (None for the device).
    pub fn index(&self, tier: Tier) -> Option<&PrefixIndex> {
        match tier {
            Tier::Device => None,
            Tier::Host => Some(&self.host),
            Tier::Disk => Some(&self.disk),
        }
    }

    fn index_mut(&mut self, tier: Tier) -> Option<&mut PrefixIndex> {
        match tier {
            Tier::Device => None,
            Tier::Host => Some(&mut self.host),
            Tier::Disk => Some(&mut self.disk),
        }
    }

    /// Blocks `worker` holds in `tier` (0 for the device).
    pub fn block_count(&self, worker: WorkerId, tier: Tier) -> usize {
        self.index(tier).map_or(0, |i| i.block_count(worker))
    }

    /// Whether any worker holds an offloaded block.
    pub fn is_empty(&self) -> bool {
        self.host.entries() == 0 && self.disk.entries() == 0
    }

    /// Bytes held by both indexes.
    pub fn memory_bytes(&self) -> usize {
        self.host.memory_bytes() + self.disk.memory_bytes()
    }

    /// The sequence hash of a block `worker` reported under `engine`: in `device`, then the
    /// offloaded tiers, `first` first.
    fn resolve(
        &self,
        device: &PrefixIndex,
        worker: WorkerId,
        first: Tier,
        engine: EngineHash,
    ) -> Option<SequenceHash> {
        device
            .sequence_of(worker, engine)
            .or_else(|| self.index(first)?.sequence_of(worker, engine))
            .or_else(|| {
                Tier::OFFLOADED
                    .into_iter()
                    .filter(|t| *t != first)
                    .find_map(|t| self.index(t)?.sequence_of(worker, engine))
            })
    }

    /// Applies an event of `worker` about offloaded `tier` (a device event is refused by the
    /// caller). A stored chain is resolved against `device` as the module explains.
    pub fn apply(
        &mut self,
        device: &PrefixIndex,
        worker: WorkerId,
        tier: Tier,
        event: &KvEvent,
    ) -> Result<(), IndexError> {
        let hashed = match event {
            KvEvent::Stored(s) if s.token_ids.is_empty() && !s.block_hashes.is_empty() => {
                // A bare store: blocks the worker reported before.
                let seqs: Vec<Option<SequenceHash>> = s
                    .block_hashes
                    .iter()
                    .map(|h| self.resolve(device, worker, tier, *h))
                    .collect();
                let unknown = seqs.iter().filter(|s| s.is_none()).count();
                let known = s
                    .block_hashes
                    .iter()
                    .zip(&seqs)
                    .filter_map(|(h, q)| Some((*h, (*q)?)));
                let (block_hashes, sequence_hashes) = known.unzip();
                let hashed = StoredHashed {
                    parent: None,
                    block_hashes,
                    sequence_hashes,
                };
                if unknown > 0 {
                    let index = self.index_mut(tier).expect("an offloaded tier");
                    index.apply(worker, &KvEvent::StoredHashed(hashed))?;
                    return Err(IndexError::UnknownBlock {
                        worker,
                        unknown,
                        total: s.block_hashes.len(),
                    });
                }
                KvEvent::StoredHashed(hashed)
            }
            KvEvent::Stored(s) => {
                let index = self.index(tier).expect("an offloaded tier");
                let sequence_hashes =
                    index.chain_stored(worker, s, |p| self.resolve(device, worker, tier, p))?;
                KvEvent::StoredHashed(StoredHashed {
                    parent: None,
                    block_hashes: s.block_hashes.clone(),
                    sequence_hashes,
                })
            }
            other => other.clone(),
        };
        let index = self.index_mut(tier).expect("an offloaded tier");
        index.apply(worker, &hashed)
    }

    /// Drops every offloaded block of `worker`, keeping it registered.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        self.host.clear_worker(worker);
        self.disk.clear_worker(worker);
    }

    /// Forgets `worker`.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.host.remove_worker(worker);
        self.disk.remove_worker(worker);
    }

    /// The run of `seqs[from..to]` that `worker` can load back: each block from the fastest
    /// tier holding it, up to the first block no tier holds.
    pub fn loadable(
        &self,
        worker: WorkerId,
        seqs: &[SequenceHash],
        from: usize,
        to: usize,
    ) -> Loadable {
        let mut out = Loadable::default();
        let host = self.host.block_count(worker) > 0;
        let disk = self.disk.block_count(worker) > 0;
        if !host && !disk {
            return out;
        }
        for &seq in seqs.iter().take(to).skip(from) {
            if host && self.host.contains(worker, seq) {
                out.host += 1;
            } else if disk && self.disk.contains(worker, seq) {
                out.disk += 1;
            } else {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
