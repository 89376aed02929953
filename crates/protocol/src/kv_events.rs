//! The engines' KV event streams: vLLM, SGLang and TensorRT-LLM publish on a ZMQ PUB socket
//! with the same framing, and TensorRT-LLM also answers a JSON pull API ([`trtllm_http`]).
//!
//! A ZMQ message has three frames: the topic, the batch's sequence number (u64 big-endian)
//! and a msgpack payload `[ts, [event, ...], dp_rank]` (or the map form `{ts, events,
//! data_parallel_rank | attn_dp_rank}`; `dp_rank` may be missing or nil). An event is either
//! a map tagged by `"type"` (vLLM 0.24+, SGLang 0.5.21+, TensorRT-LLM) or a positional array
//! whose first element is the tag (older vLLM, SGLang up to 0.5.19):
//!
//! - `BlockStored`: `block_hashes`, `parent_block_hash` (nil at the root), `token_ids`,
//!   `block_size`, `lora_id`, `medium`, then (maps) `lora_name`, `extra_keys` (one entry per
//!   block: LoRA name, multimodal `(identifier, offset)` pairs, the cache salt on a request's
//!   first block, prompt-embedding digests), `group_idx`, `kv_cache_spec_kind`,
//!   `kv_cache_spec_sliding_window`, `cache_salt` (SGLang); positional ones end with
//!   SGLang's `metadata` map `{cache_salt, session_id}` or vLLM's `lora_name`, `extra_keys`;
//! - `BlockRemoved`: `block_hashes`, `medium`, `group_idx`;
//! - `AllBlocksCleared`.
//!
//! Unknown keys and trailing elements are ignored; an unknown event type decodes to
//! [`Event::Unknown`] so a newer engine does not stop the stream. Hashes may be any msgpack
//! integer (signed ones keep their bit pattern as u64) or bytes (hashed to u64 with xxh3).
//! Collections are preallocated cautiously (serde's bound), so a lying length prefix cannot
//! make the decoder reserve more than the message could hold.

mod decode;
mod encode;
mod keys;
pub mod trtllm_http;

pub use encode::{encode_message, encode_payload, EventFormat};
pub use keys::KeyValue;

pub use kvroute_core::Tier;
use kvroute_core::{EngineHash, KvEvent, StoredBlocks};

/// One decoded message.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The batch's sequence number (consecutive per publisher; a gap means loss, going
    /// backwards means the engine restarted).
    pub seq: u64,
    /// The engine's timestamp, in seconds.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// The data-parallel rank, when given.
    pub dp_rank: Option<i64>,
}

/// One KV event as the engine sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Blocks entered the cache, as one chain after their parent.
    Stored(Stored),
    /// Blocks left the cache.
    Removed(Removed),
    /// The whole cache was dropped.
    Cleared,
    /// An event type this decoder does not know: its tag.
    Unknown(String),
}

/// A `BlockStored` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stored {
    /// The engine's hash of each block.
    pub block_hashes: Vec<EngineHash>,
    /// The block before the first one (None: the root).
    pub parent: Option<EngineHash>,
    /// The blocks' token ids, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u64,
    /// The LoRA adapter's numeric id, when any (vLLM keeps it for compatibility).
    pub lora_id: Option<i64>,
    /// The LoRA adapter's name, when any.
    pub lora_name: Option<String>,
    /// Where the blocks live (`GPU`, `CPU`, `STORAGE`, ...), when given.
    pub medium: Option<String>,
    /// Each block's extra keys as published (empty when the event has none; else one entry
    /// per block, None for a block without keys).
    pub extra_keys: Vec<Option<Vec<KeyValue>>>,
    /// The KV cache group (hybrid models have several), when given.
    pub group_idx: Option<i64>,
    /// The group's kind (`full_attention`, `sliding_window`, `mamba`, ...), when given.
    pub spec_kind: Option<String>,
    /// The group's sliding window in tokens, when it has one.
    pub sliding_window: Option<u64>,
    /// The request's cache salt (SGLang sends it beside the blocks).
    pub cache_salt: Option<String>,
}

/// A `BlockRemoved` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Removed {
    /// The engine's hashes of the blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Where they lived, when given.
    pub medium: Option<String>,
    /// The KV cache group, when given.
    pub group_idx: Option<i64>,
}

/// Why a message could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not three frames.
    #[error("expected 3 frames (topic, sequence, payload), got {0}")]
    Frames(usize),
    /// The sequence frame is not 8 bytes.
    #[error("the sequence frame has {0} bytes, expected 8")]
    Sequence(usize),
    /// The payload is not a valid event batch.
    #[error("bad payload: {0}")]
    Payload(String),
}

/// Medium names of host memory (case ignored; a name starting with `CPU` counts too):
/// vLLM's and SGLang's `CPU`, TensorRT-LLM's host cache level (decoded as `CPU`).
pub const HOST_MEDIUMS: [&str; 4] = ["CPU", "HOST", "DRAM", "L2"];

/// The tier of a medium name: none or `GPU` is the device, [`HOST_MEDIUMS`] host memory, any
/// other name (vLLM's `STORAGE`, disks, remote stores) the disk tier.
pub fn tier_of(medium: Option<&str>) -> Tier {
    match medium {
        None => Tier::Device,
        Some(m) if m.eq_ignore_ascii_case("gpu") => Tier::Device,
        Some(m)
            if HOST_MEDIUMS.iter().any(|h| m.eq_ignore_ascii_case(h))
                || m.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("cpu")) =>
        {
            Tier::Host
        }
        Some(_) => Tier::Disk,
    }
}

/// The kinds of KV cache group whose blocks make a reusable prefix on their own: full
/// attention in its variants. Sliding-window, chunked-local, Mamba and other groups do not.
pub const PREFIX_GROUP_KINDS: [&str; 3] =
    ["full_attention", "mla_attention", "sink_full_attention"];

impl Stored {
    /// Whether this group's blocks alone make a prefix hit: no kind given (engines without
    /// hybrid groups), or a full-attention kind without a sliding window.
    pub fn is_prefix_group(&self) -> bool {
        self.sliding_window.is_none()
            && self
                .spec_kind
                .as_deref()
                .is_none_or(|k| PREFIX_GROUP_KINDS.iter().any(|p| k.eq_ignore_ascii_case(p)))
    }

    /// The routing core's event: the namespace (LoRA adapter, cache salt) and each block's
    /// other extra keys derived from what the engine sent ([`keys`]).
    pub fn to_kv_event(&self) -> KvEvent {
        let (namespace, block_keys) = keys::namespace_and_keys(self);
        KvEvent::Stored(StoredBlocks {
            parent: self.parent,
            block_hashes: self.block_hashes.clone(),
            token_ids: self.token_ids.clone(),
            block_size: usize::try_from(self.block_size).unwrap_or(usize::MAX),
            namespace,
            block_keys,
        })
    }
}

impl Event {
    /// The tier of the event's blocks ([`Tier::Device`] for `Cleared` and unknown events).
    pub fn tier(&self) -> Tier {
        match self {
            Event::Stored(s) => tier_of(s.medium.as_deref()),
            Event::Removed(r) => tier_of(r.medium.as_deref()),
            Event::Cleared | Event::Unknown(_) => Tier::Device,
        }
    }

    /// Whether the event is about the device (GPU) cache.
    pub fn is_device(&self) -> bool {
        self.tier() == Tier::Device
    }

    /// The routing core's event; None for unknown events.
    pub fn to_kv_event(&self) -> Option<KvEvent> {
        match self {
            Event::Stored(s) => Some(s.to_kv_event()),
            Event::Removed(r) => Some(KvEvent::Removed {
                block_hashes: r.block_hashes.clone(),
            }),
            Event::Cleared => Some(KvEvent::Cleared),
            Event::Unknown(_) => None,
        }
    }
}

/// Decodes a message from its frames `[topic, sequence, payload]`.
pub fn decode_message(frames: &[&[u8]]) -> Result<EventBatch, DecodeError> {
    let [_topic, seq, payload] = frames else {
        return Err(DecodeError::Frames(frames.len()));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| DecodeError::Sequence(seq.len()))?;
    let (ts, events, dp_rank) = decode_payload(payload)?;
    Ok(EventBatch {
        seq: u64::from_be_bytes(seq),
        ts,
        events,
        dp_rank,
    })
}

/// Decodes a payload `[ts, events, dp_rank]` (or the map form `{"ts", "events",
/// "data_parallel_rank" | "attn_dp_rank"}`).
pub fn decode_payload(payload: &[u8]) -> Result<(f64, Vec<Event>, Option<i64>), DecodeError> {
    let p: decode::Payload =
        rmp_serde::from_slice(payload).map_err(|e| DecodeError::Payload(e.to_string()))?;
    Ok((p.ts, p.events, p.dp_rank))
}

#[cfg(test)]
mod tests;
