//! Encoding KV events the way each engine publishes them, for the simulated worker's PUB
//! socket and replay answers (`kvroute worker --event-format`), so every decoder runs end to
//! end in the integration tests:
//!
//! - [`EventFormat::Vllm`]: vLLM 0.32 (vllm/distributed/kv_events.py): events as maps in
//!   declaration order, `lora_id`, `medium`, `lora_name` always written, `extra_keys` (one
//!   entry per block: the LoRA name, the cache salt on a request's first block), `group_idx`
//!   0 and `kv_cache_spec_kind` `full_attention`;
//! - [`EventFormat::Sglang`]: SGLang 0.5.23 (sglang/srt/disaggregation/kv_events.py): hashes
//!   as signed integers, `medium`, `cache_salt` and `lora_name` only when set;
//! - [`EventFormat::Trtllm`]: TensorRT-LLM's ZMQ publisher
//!   (tensorrt_llm/_torch/pyexecutor/kv_cache_events.py): vLLM's fields without the hybrid
//!   metadata, hashes as signed integers; `lora_name` and `extra_keys` as its schema defines
//!   them (its publisher leaves both nil so far, so a real TensorRT-LLM does not tell
//!   adapters and salts apart over ZMQ: see docs/engines.md).
//!
//! The batch is the positional array `[ts, events, dp_rank]` in all three.

use super::{Event, KeyValue, Removed, Stored};
use kvroute_core::{EngineHash, KvEvent};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// Which engine's wire form to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventFormat {
    /// vLLM 0.32.
    #[default]
    Vllm,
    /// SGLang 0.5.23.
    Sglang,
    /// TensorRT-LLM's ZMQ publisher.
    #[serde(alias = "tensorrt-llm")]
    Trtllm,
}

impl std::str::FromStr for EventFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            "trtllm" | "tensorrt-llm" => Ok(Self::Trtllm),
            _ => Err(format!(
                "unknown event format {s:?} (expected vllm, sglang or trtllm)"
            )),
        }
    }
}

impl Event {
    /// The wire event of a core event, with the chain's adapter name and cache salt (the
    /// core event holds only their hash); None for the in-process `StoredHashed`, which has
    /// no token ids to publish.
    pub fn from_kv_event(e: &KvEvent, lora: Option<&str>, salt: Option<&str>) -> Option<Event> {
        Some(match e {
            KvEvent::Stored(s) => {
                let n = s.block_hashes.len();
                // vLLM's extra keys: the adapter on every block, the salt on the request's
                // first one.
                let extra_keys = if lora.is_none() && (salt.is_none() || s.parent.is_some()) {
                    Vec::new()
                } else {
                    (0..n)
                        .map(|i| {
                            let mut keys: Vec<KeyValue> =
                                lora.map(|l| KeyValue::Str(l.into())).into_iter().collect();
                            if i == 0 && s.parent.is_none() {
                                keys.extend(salt.map(|t| KeyValue::Str(t.into())));
                            }
                            (!keys.is_empty()).then_some(keys)
                        })
                        .collect()
                };
                Event::Stored(Stored {
                    block_hashes: s.block_hashes.clone(),
                    parent: s.parent,
                    token_ids: s.token_ids.clone(),
                    block_size: s.block_size as u64,
                    lora_id: None,
                    lora_name: lora.map(str::to_string),
                    medium: Some("GPU".into()),
                    extra_keys,
                    group_idx: Some(0),
                    spec_kind: Some("full_attention".into()),
                    sliding_window: None,
                    cache_salt: salt.map(str::to_string),
                })
            }
            KvEvent::Removed { block_hashes } => Event::Removed(Removed {
                block_hashes: block_hashes.clone(),
                medium: Some("GPU".into()),
                group_idx: Some(0),
            }),
            KvEvent::Cleared => Event::Cleared,
            KvEvent::StoredHashed(_) => return None,
        })
    }
}

/// Hashes as the format writes them: vLLM unsigned, SGLang and TensorRT-LLM signed.
struct Hashes<'a>(&'a [EngineHash], EventFormat);

impl Serialize for Hashes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|h| Hash(*h, self.1)))
    }
}

struct Hash(EngineHash, EventFormat);

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.1 {
            EventFormat::Vllm => s.serialize_u64(self.0 .0),
            EventFormat::Sglang | EventFormat::Trtllm => s.serialize_i64(self.0 .0 as i64),
        }
    }
}

/// One event in a format.
struct Wire<'a>(&'a Event, EventFormat);

impl Serialize for Wire<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let f = self.1;
        let mut m = ser.serialize_map(None)?;
        match self.0 {
            Event::Stored(s) => {
                m.serialize_entry("type", "BlockStored")?;
                m.serialize_entry("block_hashes", &Hashes(&s.block_hashes, f))?;
                m.serialize_entry("parent_block_hash", &s.parent.map(|p| Hash(p, f)))?;
                m.serialize_entry("token_ids", &s.token_ids)?;
                m.serialize_entry("block_size", &s.block_size)?;
                m.serialize_entry("lora_id", &s.lora_id)?;
                match f {
                    EventFormat::Vllm | EventFormat::Trtllm => {
                        m.serialize_entry("medium", &s.medium)?;
                        m.serialize_entry("lora_name", &s.lora_name)?;
                        if !s.extra_keys.is_empty() {
                            m.serialize_entry("extra_keys", &s.extra_keys)?;
                        }
                        if f == EventFormat::Vllm {
                            if let Some(g) = s.group_idx {
                                m.serialize_entry("group_idx", &g)?;
                            }
                            if let Some(k) = &s.spec_kind {
                                m.serialize_entry("kv_cache_spec_kind", k)?;
                            }
                            if let Some(w) = s.sliding_window {
                                m.serialize_entry("kv_cache_spec_sliding_window", &w)?;
                            }
                        }
                    }
                    EventFormat::Sglang => {
                        if let Some(md) = &s.medium {
                            m.serialize_entry("medium", md)?;
                        }
                        if let Some(salt) = &s.cache_salt {
                            m.serialize_entry("cache_salt", salt)?;
                        }
                        if let Some(l) = &s.lora_name {
                            m.serialize_entry("lora_name", l)?;
                        }
                    }
                }
            }
            Event::Removed(r) => {
                m.serialize_entry("type", "BlockRemoved")?;
                m.serialize_entry("block_hashes", &Hashes(&r.block_hashes, f))?;
                match f {
                    EventFormat::Vllm | EventFormat::Trtllm => {
                        m.serialize_entry("medium", &r.medium)?;
                        if let (EventFormat::Vllm, Some(g)) = (f, r.group_idx) {
                            m.serialize_entry("group_idx", &g)?;
                        }
                    }
                    EventFormat::Sglang => {
                        if let Some(md) = &r.medium {
                            m.serialize_entry("medium", md)?;
                        }
                    }
                }
            }
            Event::Cleared => m.serialize_entry("type", "AllBlocksCleared")?,
            Event::Unknown(tag) => m.serialize_entry("type", tag)?,
        }
        m.end()
    }
}

/// Encodes a payload `[ts, [event, ...], dp_rank]` in `format`. Unknown events are skipped.
pub fn encode_payload(
    format: EventFormat,
    ts: f64,
    events: &[Event],
    dp_rank: Option<i64>,
) -> Vec<u8> {
    let wire: Vec<Wire<'_>> = events
        .iter()
        .filter(|e| !matches!(e, Event::Unknown(_)))
        .map(|e| Wire(e, format))
        .collect();
    // Plain data (numbers, strings, vectors) always serialises.
    rmp_serde::to_vec_named(&(ts, wire, dp_rank)).unwrap_or_default()
}

/// The three frames of a message: topic, sequence number (u64 big-endian), payload.
pub fn encode_message(topic: &str, seq: u64, payload: Vec<u8>) -> [Vec<u8>; 3] {
    [
        topic.as_bytes().to_vec(),
        seq.to_be_bytes().to_vec(),
        payload,
    ]
}
