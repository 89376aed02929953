//! What keeps a stored block apart from equal tokens elsewhere: its LoRA adapter and cache
//! salt (the router's [`Namespace`], which seeds the chain's root) and its other extra keys
//! (multimodal identifiers, prompt-embedding digests; a digest per block).
//!
//! vLLM publishes each block's extra keys untagged, in the order it hashes them (its
//! `to_event_extra_keys`, vllm/v1/core/kv_cache_utils.py, 0.30-0.33): the LoRA name when the
//! request has an adapter, `(mm_identifier, offset)` pairs, the cache salt (on the request's
//! first block only), prompt-embedding digests (bytes). SGLang sends the salt beside the
//! blocks (`cache_salt`, or `metadata.cache_salt` in 0.5.18-0.5.19) and the adapter as
//! `lora_name`; TensorRT-LLM sends `lora_name` and its own extra keys.

use super::Stored;
use kvroute_core::Namespace;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use xxhash_rust::xxh3::Xxh3;

/// One extra key as published: msgpack strings, integers, bytes and lists are kept; floats,
/// booleans, maps and nil become [`KeyValue::Other`] with a digest of their content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// A string: a LoRA name, a cache salt, an identifier.
    Str(String),
    /// An integer (signed ones keep their value).
    Int(i128),
    /// Bytes: a digest.
    Bytes(Vec<u8>),
    /// A list: a `(identifier, offset)` pair.
    List(Vec<KeyValue>),
    /// Anything else, by a digest of its content.
    Other(u64),
}

impl KeyValue {
    fn digest_into(&self, h: &mut Xxh3) {
        match self {
            KeyValue::Str(s) => {
                h.update(&[1]);
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            KeyValue::Int(i) => {
                h.update(&[2]);
                h.update(&i.to_le_bytes());
            }
            KeyValue::Bytes(b) => {
                h.update(&[3]);
                h.update(&(b.len() as u64).to_le_bytes());
                h.update(b);
            }
            KeyValue::List(l) => {
                h.update(&[4]);
                h.update(&(l.len() as u64).to_le_bytes());
                for v in l {
                    v.digest_into(h);
                }
            }
            KeyValue::Other(d) => {
                h.update(&[5]);
                h.update(&d.to_le_bytes());
            }
        }
    }
}

/// A digest of keys, never 0 (0 means "no keys" to the index).
fn digest(keys: &[&KeyValue]) -> u64 {
    let mut h = Xxh3::new();
    for k in keys {
        k.digest_into(&mut h);
    }
    h.digest().max(1)
}

/// The namespace of a stored event's chain and each block's key digest (empty when no
/// block has keys besides the adapter and the salt).
pub(super) fn namespace_and_keys(s: &Stored) -> (Namespace, Vec<u64>) {
    let lora = s
        .lora_name
        .clone()
        .or_else(|| s.lora_id.map(|id| format!("#lora-id-{id}")));
    let mut salt = s.cache_salt.clone();
    let mut block_keys = Vec::new();
    for (i, keys) in s.extra_keys.iter().enumerate() {
        let Some(keys) = keys else { continue };
        let mut rest: Vec<&KeyValue> = keys.iter().collect();
        // The adapter's name leads each block's keys.
        if let (Some(KeyValue::Str(first)), Some(name)) = (rest.first(), &s.lora_name) {
            if first == name {
                rest.remove(0);
            }
        }
        // The salt is the one bare string of a request's first block.
        if i == 0 && s.parent.is_none() {
            if let Some(at) = rest.iter().position(|k| matches!(k, KeyValue::Str(_))) {
                if let KeyValue::Str(found) = rest.remove(at) {
                    salt.get_or_insert_with(|| found.clone());
                }
            }
        }
        if !rest.is_empty() {
            block_keys.resize(s.block_hashes.len().max(i + 1), 0);
            block_keys[i] = digest(&rest);
        }
    }
    (Namespace::new(lora.as_deref(), salt.as_deref()), block_keys)
}

impl<'de> Deserialize<'de> for KeyValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an extra key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyValue, E> {
                Ok(KeyValue::Str(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyValue, E> {
                Ok(KeyValue::Int(v.into()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyValue, E> {
                Ok(KeyValue::Int(v.into()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<KeyValue, E> {
                Ok(KeyValue::Bytes(v.to_vec()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyValue, E> {
                Ok(KeyValue::Other(xxhash_rust::xxh3::xxh3_64(
                    &v.to_le_bytes(),
                )))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyValue, E> {
                Ok(KeyValue::Other(u64::from(v) + 2))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyValue, E> {
                Ok(KeyValue::Other(1))
            }
            fn visit_none<E: de::Error>(self) -> Result<KeyValue, E> {
                Ok(KeyValue::Other(1))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyValue, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(v) = seq.next_element()? {
                    out.push(v);
                }
                Ok(KeyValue::List(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyValue, A::Error> {
                let mut h = Xxh3::new();
                while let Some((k, v)) = map.next_entry::<KeyValue, KeyValue>()? {
                    k.digest_into(&mut h);
                    v.digest_into(&mut h);
                }
                Ok(KeyValue::Other(h.digest()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for KeyValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KeyValue::Str(v) => s.serialize_str(v),
            KeyValue::Int(i) => match i64::try_from(*i) {
                Ok(v) => s.serialize_i64(v),
                Err(_) => s.serialize_u64(u64::try_from(*i).unwrap_or(u64::MAX)),
            },
            KeyValue::Bytes(b) => s.serialize_bytes(b),
            KeyValue::List(l) => l.serialize(s),
            KeyValue::Other(d) => s.serialize_u64(*d),
        }
    }
}
