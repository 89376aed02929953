//! TensorRT-LLM's HTTP pull API (`POST /kv_cache_events`): JSON events, drained per call.
//!
//! The answer is a JSON array of `{event_id, data, window_size, attention_dp_rank?, ...}`
//! (unknown keys are ignored). `data.type` is `created` (`num_blocks_per_cache_level`),
//! `stored` (`parent_hash`, `blocks` of `{block_hash, tokens: [{token_id}], cache_level,
//! cache_salt?, mm_keys?: [{hash, start_offset}], lora_id?}`), `removed` (`block_hashes`) or
//! `updated` (`block_hash`, `cache_level: {old_value, new_value} | null`, `priority`); other
//! types decode to [`PulledData::Unknown`]. Hashes are JSON integers (unsigned up to 2^64-1,
//! or negative: bit pattern kept) or strings: up to 16 hex digits are the number they spell,
//! longer ones (a SHA-256 in hex) are hashed to u64 with xxh3.
//!
//! [`decode`] reads one answer; a [`Puller`] (one per engine, no IO, no clock) turns
//! successive answers into [`Event`]s for the index: it checks `event_id` continuity per
//! attention-DP rank (gaps and restarts become [`Event::Cleared`]), keeps the largest
//! attention window only, drops partial blocks and their removals, and maps host offloads
//! (`updated` cache level 0 -> 1) to removals and onboards (1 -> 0) back to stores.
//!
//! A puller merges the ranks it is given into one stream (a block removed by one rank is
//! removed even if another rank still holds the same hash; that only loses a hit). The
//! gateway gives it one engine's ranks together, or, for an engine with `dp_size` set, one
//! puller per rank with that rank's events only.

use super::decode::Hash;
use super::{Event, KeyValue, Removed, Stored};
use kvroute_core::EngineHash;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};

/// At most this many hashes of dropped blocks are remembered (the set is cleared when full).
const MAX_DROPPED: usize = 1 << 20;
/// At most this many blocks' parents and tokens are remembered for onboarding.
const MAX_REMEMBERED: usize = 1 << 16;
/// At most this many attention-DP ranks are tracked; events of further ranks pass unchecked.
const MAX_RANKS: usize = 1 << 12;

/// Why an answer could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpDecodeError {
    /// Not JSON, or not an array of objects with an `event_id` and `data`.
    #[error("the answer is not a JSON array of KV cache events: {0}")]
    Json(String),
    /// One event's `data` does not have its type's shape.
    #[error("KV cache event {event_id} (item {index} of the answer): {reason}")]
    Event {
        /// The event's position in the answer.
        index: usize,
        /// Its `event_id`.
        event_id: u64,
        /// What is wrong.
        reason: String,
    },
    /// A token id does not fit in 32 bits.
    #[error("KV cache event {event_id}: token id {token_id} does not fit in 32 bits")]
    TokenId {
        /// The event's `event_id`.
        event_id: u64,
        /// The token id.
        token_id: u64,
    },
}

/// One event of an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct PulledEvent {
    /// The engine's event counter (per rank, from 0 at every start).
    pub event_id: u64,
    /// The attention-DP rank (`attention_dp_rank`, 0 when absent).
    pub rank: i64,
    /// The attention window of the blocks' pool, when given.
    pub window_size: Option<u64>,
    /// What happened.
    pub data: PulledData,
}

/// An event's `data`.
#[derive(Clone, Debug, PartialEq)]
pub enum PulledData {
    /// The cache was created (at engine start, one per window size).
    Created {
        /// Blocks per cache level (0: device, 1: host).
        blocks_per_level: Vec<u64>,
    },
    /// Blocks were stored, as one chain after `parent` (None: the root).
    Stored {
        /// The block before the first one.
        parent: Option<EngineHash>,
        /// The blocks, in chain order.
        blocks: Vec<PulledBlock>,
    },
    /// Blocks left the cache.
    Removed {
        /// Their hashes.
        block_hashes: Vec<EngineHash>,
    },
    /// A block changed cache level and/or priority.
    Updated {
        /// The block.
        block_hash: EngineHash,
        /// Its cache level `(old, new)`, when that changed (None: a priority update).
        cache_level: Option<(i64, i64)>,
    },
    /// A type this decoder does not know: its tag.
    Unknown(String),
}

/// A stored block.
#[derive(Clone, Debug, PartialEq)]
pub struct PulledBlock {
    /// The engine's hash of the block.
    pub hash: EngineHash,
    /// Its token ids (fewer than the block size: a partial block).
    pub tokens: Vec<u32>,
    /// Its cache level (0: device, 1: host; 0 when absent).
    pub cache_level: i64,
    /// The request's cache salt, when given.
    pub cache_salt: Option<String>,
    /// Its multimodal keys, each as `[hash, start_offset]` (`[hash]` without an offset).
    pub mm_keys: Vec<KeyValue>,
    /// The LoRA adapter's numeric id, when given (current releases do not send it).
    pub lora_id: Option<i64>,
}

/// One event as sent; `data` is kept as its raw text and decoded once, by type (a
/// `serde_json::Value` tree of it would take about ten times the answer's size).
#[derive(Deserialize)]
struct RawEvent {
    event_id: u64,
    data: Box<RawValue>,
    window_size: Option<u64>,
    attention_dp_rank: Option<i64>,
}

/// A `data` object of a known type (the type's own fields are checked after).
#[derive(Deserialize)]
struct RawData {
    #[serde(rename = "type")]
    kind: String,
    num_blocks_per_cache_level: Option<Vec<u64>>,
    parent_hash: Option<Hash>,
    blocks: Option<Vec<RawBlock>>,
    block_hashes: Option<Vec<Hash>>,
    block_hash: Option<Hash>,
    cache_level: Option<RawDiff>,
}

#[derive(Deserialize)]
struct RawBlock {
    block_hash: Hash,
    tokens: Vec<RawToken>,
    cache_level: Option<i64>,
    cache_salt: Option<String>,
    mm_keys: Option<Vec<RawMmKey>>,
    lora_id: Option<i64>,
}

#[derive(Deserialize)]
struct RawToken {
    token_id: u64,
}

#[derive(Deserialize)]
struct RawMmKey {
    hash: KeyValue,
    start_offset: Option<i64>,
}

#[derive(Deserialize)]
struct RawDiff {
    old_value: i64,
    new_value: i64,
}

/// Why one event's `data` is bad.
enum DataError {
    Shape(String),
    Token(u64),
}

/// Only a `data` object's `type` (the other fields are skipped, not built).
#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: String,
}

fn decode_data(data: &RawValue) -> Result<PulledData, DataError> {
    let Ok(Kind { kind }) = serde_json::from_str::<Kind>(data.get()) else {
        return Err(DataError::Shape("`data` has no string `type`".into()));
    };
    if !matches!(kind.as_str(), "created" | "stored" | "removed" | "updated") {
        return Ok(PulledData::Unknown(kind));
    }
    let d: RawData =
        serde_json::from_str(data.get()).map_err(|e| DataError::Shape(e.to_string()))?;
    let missing = |field: &str| DataError::Shape(format!("missing field `{field}`"));
    Ok(match d.kind.as_str() {
        "created" => PulledData::Created {
            blocks_per_level: d.num_blocks_per_cache_level.unwrap_or_default(),
        },
        "stored" => PulledData::Stored {
            parent: d.parent_hash.map(|h| h.0),
            blocks: (d.blocks.ok_or_else(|| missing("blocks"))?.into_iter())
                .map(block)
                .collect::<Result<_, _>>()?,
        },
        "removed" => PulledData::Removed {
            block_hashes: (d
                .block_hashes
                .ok_or_else(|| missing("block_hashes"))?
                .into_iter())
            .map(|h| h.0)
            .collect(),
        },
        _ => PulledData::Updated {
            block_hash: d.block_hash.ok_or_else(|| missing("block_hash"))?.0,
            cache_level: d.cache_level.map(|c| (c.old_value, c.new_value)),
        },
    })
}

fn block(b: RawBlock) -> Result<PulledBlock, DataError> {
    let tokens = b
        .tokens
        .into_iter()
        .map(|t| u32::try_from(t.token_id).map_err(|_| DataError::Token(t.token_id)))
        .collect::<Result<_, _>>()?;
    let mm_keys = b.mm_keys.unwrap_or_default().into_iter().map(|k| {
        let mut pair = vec![k.hash];
        pair.extend(k.start_offset.map(|o| KeyValue::Int(o.into())));
        KeyValue::List(pair)
    });
    Ok(PulledBlock {
        hash: b.block_hash.0,
        tokens,
        cache_level: b.cache_level.unwrap_or(0),
        cache_salt: b.cache_salt,
        mm_keys: mm_keys.collect(),
        lora_id: b.lora_id,
    })
}

/// Decodes one answer of `POST /kv_cache_events`. Any malformed event (a wrong type, a
/// missing field, a token id over 32 bits) makes the whole answer an error.
pub fn decode(body: &[u8]) -> Result<Vec<PulledEvent>, HttpDecodeError> {
    let raw: Vec<RawEvent> =
        serde_json::from_slice(body).map_err(|e| HttpDecodeError::Json(e.to_string()))?;
    raw.into_iter()
        .enumerate()
        .map(|(index, r)| {
            let event_id = r.event_id;
            let data = decode_data(&r.data).map_err(|e| match e {
                DataError::Shape(reason) => HttpDecodeError::Event {
                    index,
                    event_id,
                    reason,
                },
                DataError::Token(token_id) => HttpDecodeError::TokenId { event_id, token_id },
            })?;
            Ok(PulledEvent {
                event_id,
                rank: r.attention_dp_rank.unwrap_or(0),
                window_size: r.window_size,
                data,
            })
        })
        .collect()
}

/// What one answer changed, for the index and the logs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pulled {
    /// The routing events, in order. After a restart or a gap they begin with
    /// [`Event::Cleared`] (what came before it in the answer is left out): applying them in
    /// order is all the caller has to do.
    pub events: Vec<Event>,
    /// The engine restarted (`event_id` 0 again, or `created` after other events).
    pub restarted: bool,
    /// The first `event_id` gap `(expected, got)`: the engine's bounded buffer dropped
    /// events, which cannot be fetched again, so the worker's state was cleared.
    pub gap: Option<(u64, u64)>,
    /// Events without effect on the index (duplicates, other windows, priority-only updates,
    /// updates without a tier change, onboards of forgotten blocks, stores or removals of
    /// partial blocks only). `created` events are never counted.
    pub ignored: u64,
}

/// What is remembered of a block to store it again when it comes back from the host.
#[derive(Clone, Debug)]
struct BlockInfo {
    parent: Option<EngineHash>,
    tokens: Vec<u32>,
    salt: Option<String>,
    keys: Option<Vec<KeyValue>>,
    lora_id: Option<i64>,
}

/// Per rank: the last `event_id` and whether anything but `created` was seen.
#[derive(Clone, Copy, Debug)]
struct Rank {
    last: u64,
    changed: bool,
}

/// Turns one engine's successive answers into routing events (see the module docs).
///
/// Stored blocks keep their cache level: a run of blocks at level 0 is stored with medium
/// `GPU`, a run at another level with medium `CPU` (one stored event is split where the
/// level changes, each part chained after the previous block). A stored event whose parent
/// is a dropped block is dropped whole. An offloaded block's removal is published with
/// medium `CPU`. Parents and tokens of stored blocks are remembered (at most 2^16, only
/// while the engine may have a host tier: not after `created` announced none) so that an
/// onboard can store the block again.
///
/// A rank's first event may carry any id (the puller started after the engine: nothing to
/// clear yet). Ids going back to anything but 0 read as duplicates: TensorRT-LLM restarts
/// from 0 with its `created` events, so a restart is seen unless those were dropped too.
#[derive(Clone, Debug)]
pub struct Puller {
    block_size: u64,
    ranks: HashMap<i64, Rank>,
    /// The largest attention window seen.
    window: Option<u64>,
    /// Whether the engine has a host tier (None: unknown).
    host_tier: Option<bool>,
    /// Hashes of blocks the index does not know (partial ones, a broken chain's rest).
    dropped: HashSet<EngineHash>,
    /// Device blocks, for a later offload.
    device: HashMap<EngineHash, BlockInfo>,
    /// Host blocks (None: offloaded but not remembered).
    host: HashMap<EngineHash, Option<BlockInfo>>,
}

impl Puller {
    /// A puller for an engine with `block_size` tokens per block (`tokens_per_block`).
    pub fn new(block_size: u64) -> Self {
        Self {
            block_size,
            ranks: HashMap::new(),
            window: None,
            host_tier: None,
            dropped: HashSet::new(),
            device: HashMap::new(),
            host: HashMap::new(),
        }
    }

    /// Takes one decoded answer.
    pub fn accept(&mut self, events: Vec<PulledEvent>) -> Pulled {
        let mut out = Pulled::default();
        for e in events {
            if !self.in_sequence(&e, &mut out) {
                out.ignored += 1;
                continue;
            }
            if let Some(ws) = e.window_size {
                let largest = self.window.map_or(ws, |w| w.max(ws));
                self.window = Some(largest);
                if ws < largest && !matches!(e.data, PulledData::Created { .. }) {
                    out.ignored += 1;
                    continue;
                }
            }
            let before = out.events.len();
            match e.data {
                PulledData::Created { blocks_per_level } => {
                    let host = blocks_per_level.iter().skip(1).any(|&n| n > 0);
                    self.host_tier = Some(self.host_tier.unwrap_or(false) || host);
                    continue;
                }
                PulledData::Stored { parent, blocks } => self.stored(parent, blocks, &mut out),
                PulledData::Removed { block_hashes } => self.removed(block_hashes, &mut out),
                PulledData::Updated {
                    block_hash,
                    cache_level: Some((old, new)),
                } => self.updated(block_hash, old, new, &mut out),
                PulledData::Updated { .. } => {}
                PulledData::Unknown(tag) => out.events.push(Event::Unknown(tag)),
            }
            if out.events.len() == before {
                out.ignored += 1;
            }
        }
        out
    }

    /// Checks `e`'s id against its rank's last one: false for a duplicate; clears the state
    /// on a restart or a gap.
    fn in_sequence(&mut self, e: &PulledEvent, out: &mut Pulled) -> bool {
        let created = matches!(e.data, PulledData::Created { .. });
        if let Some(r) = self.ranks.get(&e.rank).copied() {
            if e.event_id == 0 || (created && r.changed) {
                self.reset();
                out.restarted = true;
                out.events.clear();
                out.events.push(Event::Cleared);
            } else if e.event_id <= r.last {
                return false;
            } else if e.event_id != r.last + 1 {
                out.gap.get_or_insert((r.last + 1, e.event_id));
                out.events.clear();
                out.events.push(Event::Cleared);
            }
        }
        if self.ranks.len() < MAX_RANKS || self.ranks.contains_key(&e.rank) {
            let r = self.ranks.entry(e.rank).or_insert(Rank {
                last: e.event_id,
                changed: false,
            });
            r.last = e.event_id;
            r.changed |= !created;
        }
        true
    }

    /// Forgets everything (the engine restarted).
    fn reset(&mut self) {
        *self = Self::new(self.block_size);
    }

    fn remembers_device(&self) -> bool {
        self.host_tier != Some(false)
    }

    fn drop_hash(&mut self, h: EngineHash) {
        if self.dropped.len() >= MAX_DROPPED {
            self.dropped.clear();
        }
        self.dropped.insert(h);
    }

    fn stored(&mut self, parent: Option<EngineHash>, blocks: Vec<PulledBlock>, out: &mut Pulled) {
        let mut broken = parent.is_some_and(|p| self.dropped.contains(&p));
        let mut prev = parent;
        let mut run: Option<Stored> = None;
        for b in blocks {
            if broken || b.tokens.len() as u64 != self.block_size {
                broken = true;
                self.drop_hash(b.hash);
                continue;
            }
            self.dropped.remove(&b.hash);
            let medium = if b.cache_level == 0 { "GPU" } else { "CPU" };
            if run
                .as_ref()
                .is_some_and(|r| r.medium.as_deref() != Some(medium))
            {
                out.events.extend(run.take().map(Event::Stored));
            }
            let info = BlockInfo {
                parent: prev,
                tokens: b.tokens,
                salt: b.cache_salt,
                keys: (!b.mm_keys.is_empty()).then_some(b.mm_keys),
                lora_id: b.lora_id,
            };
            let r = run.get_or_insert_with(|| self.start(&info, medium));
            r.block_hashes.push(b.hash);
            r.token_ids.extend_from_slice(&info.tokens);
            if info.keys.is_some() || !r.extra_keys.is_empty() {
                r.extra_keys.resize(r.block_hashes.len() - 1, None);
                r.extra_keys.push(info.keys.clone());
            }
            prev = Some(b.hash);
            if b.cache_level == 0 {
                self.host.remove(&b.hash);
                if self.remembers_device() {
                    remember(&mut self.device, b.hash, info);
                }
            } else {
                self.device.remove(&b.hash);
                if self.host_tier == Some(false) {
                    self.host_tier = None;
                }
                remember(&mut self.host, b.hash, Some(info));
            }
        }
        out.events.extend(run.map(Event::Stored));
    }

    /// A stored event's start: its first block's parent, salt (at the root) and adapter.
    fn start(&self, first: &BlockInfo, medium: &str) -> Stored {
        Stored {
            parent: first.parent,
            block_size: self.block_size,
            lora_id: first.lora_id,
            medium: Some(medium.into()),
            cache_salt: first.salt.clone().filter(|_| first.parent.is_none()),
            ..Stored::default()
        }
    }

    fn removed(&mut self, hashes: Vec<EngineHash>, out: &mut Pulled) {
        let (mut device, mut host) = (Vec::new(), Vec::new());
        for h in hashes {
            if self.dropped.remove(&h) {
                continue;
            }
            self.device.remove(&h);
            if self.host.remove(&h).is_some() {
                host.push(h);
            } else {
                device.push(h);
            }
        }
        for (block_hashes, medium) in [(device, "GPU"), (host, "CPU")] {
            if !block_hashes.is_empty() {
                out.events.push(Event::Removed(Removed {
                    block_hashes,
                    medium: Some(medium.into()),
                    group_idx: None,
                }));
            }
        }
    }

    fn updated(&mut self, h: EngineHash, old: i64, new: i64, out: &mut Pulled) {
        if self.dropped.contains(&h) || (old == 0) == (new == 0) {
            return;
        }
        if old == 0 {
            // Offloaded to the host: it left the device tier.
            if self.host_tier == Some(false) {
                self.host_tier = None;
            }
            let info = self.device.remove(&h);
            remember(&mut self.host, h, info);
            out.events.push(Event::Removed(Removed {
                block_hashes: vec![h],
                medium: Some("GPU".into()),
                group_idx: None,
            }));
            return;
        }
        // Onboarded back to the device: stored again if we know where it goes.
        let Some(Some(info)) = self.host.remove(&h) else {
            self.drop_hash(h);
            return;
        };
        let mut s = self.start(&info, "GPU");
        s.block_hashes.push(h);
        s.token_ids.clone_from(&info.tokens);
        s.extra_keys = info.keys.iter().map(|k| Some(k.clone())).collect();
        out.events.push(Event::Stored(s));
        if self.remembers_device() {
            remember(&mut self.device, h, info);
        }
    }
}

/// Inserts into a bounded map, evicting an arbitrary entry when full.
fn remember<V>(map: &mut HashMap<EngineHash, V>, h: EngineHash, v: V) {
    if map.len() >= MAX_REMEMBERED && !map.contains_key(&h) {
        if let Some(old) = map.keys().next().copied() {
            map.remove(&old);
        }
    }
    map.insert(h, v);
}

#[cfg(test)]
mod tests;
