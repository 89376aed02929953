//! The msgpack decoders of a batch and its events, in both forms (maps tagged by `"type"`,
//! positional arrays led by the tag), for every engine's variant of the fields.

use super::{Event, KeyValue, Removed, Stored};
use kvroute_core::EngineHash;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// A batch's payload.
pub(super) struct Payload {
    pub ts: f64,
    pub events: Vec<Event>,
    pub dp_rank: Option<i64>,
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
                        "data_parallel_rank" | "dp_rank" | "attn_dp_rank" => {
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

/// A block hash as engines write it: any integer (signed ones keep their bit pattern), bytes
/// (their xxh3 digest), or a string (up to 16 hex digits are their value, anything else its
/// xxh3 digest). Shared by the ZMQ decoder and TensorRT-LLM's JSON pull API.
pub(super) struct Hash(pub(super) EngineHash);

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a block hash (an integer, bytes or a string)")
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
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Hash, E> {
                Ok(Hash(EngineHash(hash_of_str(v))))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string hash: up to 16 hex digits are their value, anything else its xxh3 digest.
fn hash_of_str(s: &str) -> u64 {
    let short_hex = !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    short_hex
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
        .unwrap_or_else(|| xxhash_rust::xxh3::xxh3_64(s.as_bytes()))
}

fn hashes(v: Vec<Hash>) -> Vec<EngineHash> {
    v.into_iter().map(|h| h.0).collect()
}

/// SGLang's per-event metadata (`{cache_salt, session_id}`), or whatever else a positional
/// event carries after `medium`: a string there is vLLM's `lora_name`.
#[derive(Default)]
struct Trailer {
    cache_salt: Option<String>,
    lora_name: Option<String>,
}

impl<'de> Deserialize<'de> for Trailer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Trailer;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a metadata map, a LoRA name or nil")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Trailer, E> {
                Ok(Trailer::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Trailer, E> {
                Ok(Trailer::default())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Trailer, E> {
                Ok(Trailer {
                    lora_name: Some(v.to_string()),
                    ..Trailer::default()
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Trailer, A::Error> {
                let mut t = Trailer::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "cache_salt" => t.cache_salt = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_any(V)
    }
}

/// The fields of an event, whichever form it came in.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<Hash>>,
    parent: Option<Option<Hash>>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u64>,
    lora_id: Option<i64>,
    lora_name: Option<String>,
    medium: Option<String>,
    extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
    group_idx: Option<i64>,
    spec_kind: Option<String>,
    sliding_window: Option<u64>,
    cache_salt: Option<String>,
}

impl Fields {
    fn build<E: de::Error>(self, tag: String) -> Result<Event, E> {
        let need = |name: &'static str| E::missing_field(name);
        Ok(match tag.as_str() {
            "BlockStored" => Event::Stored(Stored {
                block_hashes: hashes(self.block_hashes.ok_or_else(|| need("block_hashes"))?),
                parent: self.parent.flatten().map(|h| h.0),
                token_ids: self.token_ids.ok_or_else(|| need("token_ids"))?,
                block_size: self.block_size.ok_or_else(|| need("block_size"))?,
                lora_id: self.lora_id,
                lora_name: self.lora_name,
                medium: self.medium,
                extra_keys: self.extra_keys.unwrap_or_default(),
                group_idx: self.group_idx,
                spec_kind: self.spec_kind,
                sliding_window: self.sliding_window,
                cache_salt: self.cache_salt,
            }),
            "BlockRemoved" => Event::Removed(Removed {
                block_hashes: hashes(self.block_hashes.ok_or_else(|| need("block_hashes"))?),
                medium: self.medium,
                group_idx: self.group_idx,
            }),
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
                        if let Some(t) = seq.next_element::<Trailer>()? {
                            f.cache_salt = t.cache_salt;
                            f.lora_name = t.lora_name;
                            // vLLM's order goes on with the extra keys.
                            f.extra_keys = seq
                                .next_element::<Option<Vec<Option<Vec<KeyValue>>>>>()?
                                .flatten();
                        }
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
                        Key::LoraName => f.lora_name = map.next_value()?,
                        Key::Medium => f.medium = map.next_value()?,
                        Key::ExtraKeys => f.extra_keys = map.next_value()?,
                        Key::GroupIdx => f.group_idx = map.next_value()?,
                        Key::SpecKind => f.spec_kind = map.next_value()?,
                        Key::SlidingWindow => f.sliding_window = map.next_value()?,
                        Key::CacheSalt => f.cache_salt = map.next_value()?,
                        Key::Metadata => {
                            let t: Trailer = map.next_value()?;
                            f.cache_salt = f.cache_salt.or(t.cache_salt);
                        }
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
    LoraName,
    Medium,
    ExtraKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    CacheSalt,
    Metadata,
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
                    "lora_name" => Key::LoraName,
                    "medium" => Key::Medium,
                    "extra_keys" => Key::ExtraKeys,
                    "group_idx" => Key::GroupIdx,
                    "kv_cache_spec_kind" => Key::SpecKind,
                    "kv_cache_spec_sliding_window" => Key::SlidingWindow,
                    "cache_salt" => Key::CacheSalt,
                    "metadata" => Key::Metadata,
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
