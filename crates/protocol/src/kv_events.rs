//! vLLM's (and SGLang's) KV event stream, as published on a ZMQ PUB socket.
//!
//! A message has three frames: the topic, the batch's sequence number (u64 big-endian) and a
//! msgpack payload `[ts, [event, ...], dp_rank]` (`dp_rank` may be missing or nil). An event
//! is either a map tagged by `"type"` (newer engines) or a positional array whose first
//! element is the tag (older ones):
//!
//! - `BlockStored`: `block_hashes`, `parent_block_hash` (nil at the root), `token_ids`,
//!   `block_size`, `lora_id`, `medium`, ...; positional in that order, trailing fields with
//!   defaults possibly omitted;
//! - `BlockRemoved`: `block_hashes`, `medium`;
//! - `AllBlocksCleared`.
//!
//! Unknown keys and trailing elements are ignored; an unknown event type decodes to
//! [`Event::Unknown`] so a newer engine does not stop the stream. Hashes may be any msgpack
//! integer (signed ones keep their bit pattern as u64) or bytes (hashed to u64 with xxh3).
//! Collections are preallocated cautiously (serde's bound), so a lying length prefix cannot
//! make the decoder reserve more than the message could hold.

mod encode;

pub use encode::{encode_message, encode_payload};

use kvroute_core::{EngineHash, KvEvent, Namespace, StoredBlocks};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

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
    /// Blocks entered the cache, as one chain after `parent`.
    Stored {
        /// The engine's hash of each block.
        block_hashes: Vec<EngineHash>,
        /// The block before the first one (None: the root).
        parent: Option<EngineHash>,
        /// The blocks' token ids, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u64,
        /// The LoRA adapter, when any.
        lora_id: Option<i64>,
        /// Where the blocks live (`GPU`, `CPU`, ...), when given.
        medium: Option<String>,
    },
    /// Blocks left the cache.
    Removed {
        /// The engine's hashes of the blocks.
        block_hashes: Vec<EngineHash>,
        /// Where they lived, when given.
        medium: Option<String>,
    },
    /// The whole cache was dropped.
    Cleared,
    /// An event type this decoder does not know: its tag.
    Unknown(String),
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

impl Event {
    /// Whether the event is about the device (GPU) cache: no medium given, or `GPU`. Events
    /// of offloaded tiers (CPU, disk) say nothing about which prefix a replica can reuse
    /// without a transfer.
    pub fn is_device(&self) -> bool {
        let medium = match self {
            Event::Stored { medium, .. } | Event::Removed { medium, .. } => medium.as_deref(),
            Event::Cleared | Event::Unknown(_) => None,
        };
        medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu"))
    }

    /// The routing core's event, with the blocks' namespace chosen by the caller (from the
    /// LoRA adapter); None for unknown events.
    pub fn to_kv_event(&self, namespace: Namespace) -> Option<KvEvent> {
        match self {
            Event::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                ..
            } => Some(KvEvent::Stored(StoredBlocks {
                parent: *parent,
                block_hashes: block_hashes.clone(),
                token_ids: token_ids.clone(),
                block_size: usize::try_from(*block_size).unwrap_or(usize::MAX),
                namespace,
                block_keys: Vec::new(),
            })),
            Event::Removed { block_hashes, .. } => Some(KvEvent::Removed {
                block_hashes: block_hashes.clone(),
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

/// Decodes a payload `[ts, events, dp_rank]` (or the map form
/// `{"ts", "events", "data_parallel_rank"}` that newer engines send).
pub fn decode_payload(payload: &[u8]) -> Result<(f64, Vec<Event>, Option<i64>), DecodeError> {
    let p: Payload =
        rmp_serde::from_slice(payload).map_err(|e| DecodeError::Payload(e.to_string()))?;
    Ok((p.ts, p.events, p.dp_rank))
}

struct Payload {
    ts: f64,
    events: Vec<Event>,
    dp_rank: Option<i64>,
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Payload;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array [ts, events, dp_rank] or a map with ts and events")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
                let (mut ts, mut events, mut dp_rank) = (None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "ts" => ts = Some(map.next_value::<f64>()?),
                        "events" => events = Some(map.next_value::<Vec<Event>>()?),
                        "data_parallel_rank" | "dp_rank" => {
                            dp_rank = map.next_value::<Option<i64>>()?
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Payload {
                    ts: ts.ok_or_else(|| de::Error::missing_field("ts"))?,
                    events: events.ok_or_else(|| de::Error::missing_field("events"))?,
                    dp_rank,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Payload, A::Error> {
                let ts = seq
                    .next_element::<f64>()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let events = seq
                    .next_element::<Vec<Event>>()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                let dp_rank = seq.next_element::<Option<i64>>()?.flatten();
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Payload {
                    ts,
                    events,
                    dp_rank,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// A block hash: any integer, or bytes.
struct Hash(EngineHash);

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a block hash (an integer or bytes)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Hash, E> {
                Ok(Hash(EngineHash(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Hash, E> {
                Ok(Hash(EngineHash::from_i64(v)))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Hash, E> {
                Ok(Hash(EngineHash(xxhash_rust::xxh3::xxh3_64(v))))
            }
        }
        d.deserialize_any(V)
    }
}

fn hashes(v: Vec<Hash>) -> Vec<EngineHash> {
    v.into_iter().map(|h| h.0).collect()
}

/// The fields of an event, whichever form it came in.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<Hash>>,
    parent: Option<Option<Hash>>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u64>,
    lora_id: Option<i64>,
    medium: Option<String>,
}

impl Fields {
    fn build<E: de::Error>(self, tag: String) -> Result<Event, E> {
        let need = |name: &'static str| E::missing_field(name);
        Ok(match tag.as_str() {
            "BlockStored" => Event::Stored {
                block_hashes: hashes(self.block_hashes.ok_or_else(|| need("block_hashes"))?),
                parent: self.parent.flatten().map(|h| h.0),
                token_ids: self.token_ids.ok_or_else(|| need("token_ids"))?,
                block_size: self.block_size.ok_or_else(|| need("block_size"))?,
                lora_id: self.lora_id,
                medium: self.medium,
            },
            "BlockRemoved" => Event::Removed {
                block_hashes: hashes(self.block_hashes.ok_or_else(|| need("block_hashes"))?),
                medium: self.medium,
            },
            "AllBlocksCleared" => Event::Cleared,
            _ => Event::Unknown(tag),
        })
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Event;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a KV event (a map with \"type\", or an array led by its type)")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Event, A::Error> {
                let tag: String = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let mut f = Fields::default();
                match tag.as_str() {
                    "BlockStored" => {
                        f.block_hashes = seq.next_element()?;
                        f.parent = seq.next_element()?;
                        f.token_ids = seq.next_element()?;
                        f.block_size = seq.next_element()?;
                        f.lora_id = seq.next_element::<Option<i64>>()?.flatten();
                        f.medium = seq.next_element::<Option<String>>()?.flatten();
                        if f.parent.is_none() {
                            return Err(de::Error::missing_field("parent_block_hash"));
                        }
                    }
                    "BlockRemoved" => {
                        f.block_hashes = seq.next_element()?;
                        f.medium = seq.next_element::<Option<String>>()?.flatten();
                    }
                    _ => {}
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                f.build(tag)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
                let mut tag: Option<String> = None;
                let mut f = Fields::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Type => tag = Some(map.next_value()?),
                        Key::BlockHashes => f.block_hashes = Some(map.next_value()?),
                        Key::Parent => f.parent = Some(map.next_value()?),
                        Key::TokenIds => f.token_ids = Some(map.next_value()?),
                        Key::BlockSize => f.block_size = Some(map.next_value()?),
                        Key::LoraId => f.lora_id = map.next_value()?,
                        Key::Medium => f.medium = map.next_value()?,
                        Key::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let tag = tag.ok_or_else(|| de::Error::missing_field("type"))?;
                f.build(tag)
            }
        }
        d.deserialize_any(V)
    }
}

/// The keys of the map form this decoder reads; anything else is skipped.
enum Key {
    Type,
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "type" => Key::Type,
                    "block_hashes" => Key::BlockHashes,
                    "parent_block_hash" => Key::Parent,
                    "token_ids" => Key::TokenIds,
                    "block_size" => Key::BlockSize,
                    "lora_id" => Key::LoraId,
                    "medium" => Key::Medium,
                    _ => Key::Other,
                })
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key, E> {
                Ok(std::str::from_utf8(v)
                    .map_or(Key::Other, |s| self.visit_str::<E>(s).unwrap_or(Key::Other)))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Key, E> {
                Ok(Key::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Key, E> {
                Ok(Key::Other)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests;
